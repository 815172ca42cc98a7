"""Erasures: the SSD record erases a put decided, sent after its answer instead of before it.

A put on a pool whose tiers are full evicts SSD objects to make room (with the inclusive SSD tier, for its own
objects' copies). Each evicted record must be erased on its node (tiers/ssd.py: a stale header would be scanned
again after a restart, and would hide the records written inside its extent), and until 2026-12-07 the put waited
for that Drop call before it answered: 73% of a both-full put_start was that one round trip to the node
(docs/benchmarks.md, the thirty-ninth session's profile).

The erase only has to land before anything writes the freed extents. So, in a master process (`background`), a
put's drops-only node calls are queued here per node under the master's lock, the put answers, and the master's
eraser thread (`erase_loop`) sends them. The rule that keeps that safe: **every call that makes a node write an SSD
extent first flushes that node** (`flush`: every erase queued before it began is sent and answered):

    writer of an SSD extent                           where it flushes
    the put's client, on an SSD grant                 Master.put_start, before it answers (for the grants' nodes)
    a drain's client, on an SSD destination           Master.migrate_start / migrate_next, before they answer
    a Demote (moves onto SSD, write-behind copies)    Placement._call and Master._copy, before the call

An erase is queued in the same hold of the master's lock that freed its extent (when the put's batch ends), so
whatever is given that extent later flushes it first; only a put's drops-only calls are queued (a call that also
moves objects is sent as before, its drops carried). A Drop call that fails is logged and forgotten, as a failed
Drop always was (a record it leaves is dropped by the node's next report: store/registry.py `reattached`, or its
extent's overlap). A node that leaves or restarts takes its queue with it (`forget`): its calls go nowhere after
that (registry.DisconnectedOps), and a new process of it reports its records afresh. A master that restarts loses
its queues the same way, and each node's report to the new master drops the records whose keys it does not know.

Without `background` (the embedded pool, in-process tests) nothing is queued: the put sends its erases itself, as
before. Thread-safe: `queue` runs under the master's lock; `flush` from any thread, without it or with it (the
eraser thread never takes the master's lock, so waiting on it cannot deadlock)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from kvpool.store.node import Drop

log = logging.getLogger(__name__)


class _NodeQueue:
    """One node's erases not sent yet. `sending` is held for a whole Drop call, so a flush that returns has seen
    every call made before it answered."""

    __slots__ = ("node", "pending", "lock", "sending")

    def __init__(self, node) -> None:
        self.node = node                    # placement.NodeState (its `ops` become DisconnectedOps when it leaves)
        self.pending: list[Drop] = []
        self.lock = threading.Lock()
        self.sending = threading.Lock()


class Erasures:
    def __init__(self) -> None:
        self.background = False             # True: queue a put's erases for the eraser thread (a master process)
        self.wanted = threading.Event()     # set when something is queued (the eraser thread waits on it)
        self._queues: dict[int, _NodeQueue] = {}    # node number -> queue (numbers are never reused)
        self._lock = threading.Lock()
        self.sent = 0                       # erases sent in background (stats, tests)
        self.calls = 0                      # Drop calls that sent them

    def queue(self, node, drops: list[Drop]) -> None:
        """Erase these records of `node` later (`background`), or now."""
        if not drops:
            return
        if not self.background:
            self.send(node, drops)
            return
        with self._lock:
            q = self._queues.get(node.number)
            if q is None:
                q = self._queues[node.number] = _NodeQueue(node)
        with q.lock:
            q.pending.extend(drops)
        self.wanted.set()

    def pending(self, number: int | None = None) -> int:
        """Erases queued and not sent yet (of one node, or of all)."""
        with self._lock:
            queues = list(self._queues.values()) if number is None else [self._queues.get(number)]
        return sum(len(q.pending) for q in queues if q is not None)

    def flush(self, number: int) -> None:
        """Return once every erase queued for node `number` before this call has been sent and answered (or its
        call failed)."""
        with self._lock:
            q = self._queues.get(number)
        if q is None:
            return
        with q.sending:
            with q.lock:
                drops, q.pending = q.pending, []
            if drops:
                self.send(q.node, drops)
                with self._lock:
                    self.sent += len(drops)
                    self.calls += 1

    def flush_nodes(self, numbers: Iterable[int]) -> None:
        for number in sorted(set(numbers)):
            self.flush(number)

    def flush_all(self) -> None:
        self.wanted.clear()
        with self._lock:
            numbers = list(self._queues)
        self.flush_nodes(numbers)

    def as_dict(self) -> dict[str, int]:
        """`kvpool status`'s "erasures": queued and not sent yet, sent in background, and the Drop calls that sent
        them."""
        return {"pending": self.pending(), "sent": self.sent, "calls": self.calls}

    def forget(self, number: int) -> None:
        """The node left (or a new process of it registered): its queued erases are not sent."""
        with self._lock:
            q = self._queues.pop(number, None)
        if q is not None:
            with q.lock:
                q.pending = []

    @staticmethod
    def send(node, drops: list[Drop]) -> None:
        """Erase `drops` on `node` now (one Drop call; none for an empty list). A failure is logged, and the
        operation goes on, as a failed Drop always did."""
        if not drops:
            return
        try:
            node.ops.drop(drops)
        except Exception:  # noqa: BLE001 - as a failed Drop always was: logged, the node's next report drops it
            log.exception("node %s: drop of %d records failed", node.node_id, len(drops))


LINGER_S = 0.02
"""How long the eraser thread lets erases gather after the first is queued, so that puts close together share one
Drop call (nothing waits on it: a call that needs them sends them itself, `Erasures.flush`)."""


def erase_loop(master, stop: threading.Event) -> None:
    """The eraser thread of a master process: send the queued erases (`Master.erase_pending`), `LINGER_S` after the
    first of them."""
    wanted = master.erase_wanted
    while not stop.is_set():
        if not wanted.wait(0.5) or stop.wait(LINGER_S):
            continue
        try:
            master.erase_pending()
        except Exception:  # noqa: BLE001 - the thread must outlive one bad call (each send logs its own failure)
            log.exception("erase round failed")


__all__ = ["Erasures", "erase_loop", "LINGER_S"]
