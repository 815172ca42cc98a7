"""FairLock: a mutex handed to its waiters in the order they came.

The master's lock is taken by every RPC, and some operations take it again and again (an admin evict one chunk at
a time, a write-behind round per node). CPython's `threading.Lock` lets the thread that releases it take it straight
back while a waiter is still waking up, so a lookup could wait out twenty chunks of an evict in a row (0.24 s at
50,000 objects on a 2-core box; one chunk is ~12 ms). Here a release with waiters hands the lock to the oldest one:
the releaser, coming back, queues behind it. Uncontended it costs one more short `threading.Lock` hold per acquire
and per release (well under a microsecond).
"""

from __future__ import annotations

import threading
from collections import deque


class FairLock:
    """First come, first served. Not reentrant; use as a context manager or acquire()/release()."""

    __slots__ = ("_mutex", "_waiters", "_held")

    def __init__(self) -> None:
        self._mutex = threading.Lock()      # guards _held and _waiters; held only for a few bytecodes
        self._waiters: deque[threading.Lock] = deque()
        self._held = False

    def acquire(self) -> bool:
        mutex = self._mutex
        mutex.acquire()
        if not self._held:
            self._held = True
            mutex.release()
            return True
        gate = threading.Lock()
        gate.acquire()
        self._waiters.append(gate)
        mutex.release()
        try:
            gate.acquire()                  # released by the holder's release(): the lock is ours, still held
        except BaseException:               # interrupted while waiting (a signal in the main thread)
            with mutex:
                try:
                    self._waiters.remove(gate)
                except ValueError:          # it was handed to us meanwhile: hand it on
                    self._hand_on()
            raise
        return True

    def release(self) -> None:
        with self._mutex:
            if not self._held:
                raise RuntimeError("release of an unheld FairLock")
            self._hand_on()

    def _hand_on(self) -> None:
        """To the oldest waiter (`_held` stays True), or free (mutex held)."""
        if self._waiters:
            self._waiters.popleft().release()
        else:
            self._held = False

    def locked(self) -> bool:
        return self._held

    def waiting(self) -> int:
        """Threads queued for the lock now."""
        return len(self._waiters)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["FairLock"]
