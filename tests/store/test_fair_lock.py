"""FairLock (store/fair_lock.py), the master's lock: waiters get it in the order they came, and a thread that lets
it go and takes it straight back queues behind the waiters (CPython's Lock lets it barge in, which let an admin
evict's chunks starve a lookup)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from kvpool.store.fair_lock import FairLock


def _queued(lock: FairLock, n: int) -> None:
    """Wait (bounded) until `n` threads are queued for the lock."""
    end = time.monotonic() + 10
    while lock.waiting() < n:
        assert time.monotonic() < end, f"{lock.waiting()} threads queued, expected {n}"
        time.sleep(0.001)


def test_waiters_get_the_lock_in_the_order_they_came():
    lock, order = FairLock(), []

    def take(name: str) -> None:
        with lock:
            order.append(name)

    lock.acquire()
    threads = []
    for i, name in enumerate(["w1", "w2", "w3", "w4"]):
        threads.append(threading.Thread(target=take, args=(name,)))
        threads[-1].start()
        _queued(lock, i + 1)
    lock.release()
    for t in threads:
        t.join(10)
    assert order == ["w1", "w2", "w3", "w4"]
    assert not lock.locked() and lock.waiting() == 0


def test_a_thread_taking_it_straight_back_queues_behind_a_waiter():
    lock, order = FairLock(), []

    def waiter() -> None:
        with lock:
            order.append("waiter")

    lock.acquire()
    t = threading.Thread(target=waiter)
    t.start()
    _queued(lock, 1)
    for _ in range(3):                  # the evict's pattern: one chunk, let go, the next chunk
        lock.release()
        lock.acquire()
        order.append("bulk")
    lock.release()
    t.join(10)
    assert order == ["waiter", "bulk", "bulk", "bulk"]


def test_releasing_an_unheld_lock_is_refused_and_changes_nothing():
    lock = FairLock()
    with pytest.raises(RuntimeError, match="release of an unheld FairLock"):
        lock.release()
    assert not lock.locked()
    with lock:
        assert lock.locked()
    assert not lock.locked()


class _Interrupted(Exception):
    pass


def test_a_waiter_interrupted_by_a_signal_leaves_the_queue_and_the_lock_goes_on():
    """A signal handler raising in the main thread while it waits (Ctrl-C in an embedded pool's caller): its place in
    the queue is given up, so the holder's release frees the lock instead of handing it to no one."""
    lock, holder_may_go = FairLock(), threading.Event()

    def holder() -> None:
        with lock:
            holder_may_go.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    end = time.monotonic() + 10
    while not lock.locked():
        assert time.monotonic() < end
        time.sleep(0.001)

    def on_alarm(signum, frame):
        raise _Interrupted

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(_Interrupted):
            lock.acquire()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert lock.waiting() == 0
    holder_may_go.set()
    t.join(10)
    assert not lock.locked()
    with lock:
        assert lock.locked()
