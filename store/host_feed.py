"""HostIndexFeed: the master's half of the nodes' host indexes (tiers/host_index.py).

    master.put_commit, master._publish_moved (demoted, promoted, drained), master._republish (after a removal or a
    registration cleared it)
                      ─ committed(node, DRAM/SSD objects) ─┐
    master.lookup (a use report's misses, a chain a reader found stale: then also its hits' current rows)
                                              ─ gone(node) ─┼─▶ per-node queue ─▶ one sender thread ─ Publish ─▶ node
    master._tell_removed ─ removed(node) ───────────────────┘    (coalesced)                           (its index)

Commits are queued under the master's lock (an append) and sent by one thread, so no commit waits on a node. Rounds
of sends are at least `interval_s` (SEND_INTERVAL_S, 5 ms) apart: the first commit after a quiet spell goes at once;
under a stream of puts the commits of a few share one Publish call, where a call per commit cost a node ~0.6 ms and
the master ~0.2 ms of CPU per same-host put of 32 x 64 KiB (gRPC, both ends: scratch, 2-core box, 2026-11-29). A
same-host client that finds a chain in a node's index reads it with no Lookup at all (kvpool/client.py); one that
finds nothing (not published yet, or the node did not answer: logged and dropped) asks the master as before. The
feed only ever delays or loses a publication, never changes what a read returns: every row is checked again by the
read fence.

Backfills: a node that registered again keeping its memory (its master restarted), or that cleared its index after a
removal, gets every object it holds published again. `backfill(node, chunk)` hands that to the feed's backfill thread,
so the call that asked for it (RegisterNode, Remove) returns at once: `chunk(first)` publishes one chunk of the
master's index from slot `first` under the master's lock and says where the next starts. A chunk waits until its
node's queue has room for all it may add, so a backfill of any size loses nothing to MAX_QUEUED; a node that takes
its publications slowly delays only its own backfill. A registration or a full removal (`reset`, `removed(node)`)
drops the node's backfill in progress: the master starts it again from the first slot.

Removals: `removed(node)` runs before the node is told of a removal (which clears its index). It drops what is
queued for that node and waits for a send in flight, so no publication made before the removal lands after the
node cleared its index; a batch the thread took before the removal is dropped when it sees the node's epoch moved.
A `remove` tells a node that says `removes_keys` which keys went (`removed(node, keys)`): its index forgets only those
rows, only their queued entries are dropped, and nothing is published again; what a batch dropped that way held of
other keys is lost (those objects cost their clients a Lookup), as a publication to a node that did not answer is.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvpool.store.node import Publication, PublishOps
from kvpool.tiers.types import Tier

log = logging.getLogger(__name__)

MAX_BATCH = 8192        # entries per Publish call
SEND_INTERVAL_S = 0.005 # the least time between two rounds of Publish calls: the first commit after a quiet spell
                        # goes at once, and under a stream of puts the commits of a few puts share one call
MAX_QUEUED = 1 << 20    # entries queued per node; past it the oldest go (counted `dropped`): a node that cannot keep
                        # up loses publications (its clients ask the master), the master never its memory


@dataclass(slots=True)
class _Backfill:
    chunk: Callable[[int], int | None]  # publishes one chunk from a slot (the master's lock taken): the next, or None
    room: int                           # the most entries one chunk may queue
    pause: Callable[[], None]           # between two chunks (the master's lock not held)
    first: int = 0                      # where the next chunk starts


@dataclass(slots=True)
class _Queue:
    ops: PublishOps
    epoch: int = 0
    keys: list[bytes] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    checksums: list[int] = field(default_factory=list)
    gone: list[bytes] = field(default_factory=list)
    gone_at: list[int] = field(default_factory=list)    # per gone key: how many entries were queued before it
    tiers: list[Tier] = field(default_factory=list)
    send_lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> list[Publication]:
        """Everything queued, as Publications. A node applies a Publication's `gone` before its entries, so the order
        of the calls is settled here first: the last word on a key wins (an entry queued before a gone of its key
        is dropped; a gone followed by a new entry of its key is, since that entry replaces the node's row)."""
        if self.gone:
            last_gone = dict(zip(self.gone, self.gone_at))
            keep = [i for i, k in enumerate(self.keys) if i >= last_gone.get(k, 0)]
            if len(keep) < len(self.keys):
                for col in (self.keys, self.offsets, self.sizes, self.checksums, self.tiers):
                    col[:] = [col[i] for i in keep]
            again = {k for k in self.keys if k in last_gone}
            self.gone = [k for k in last_gone if k not in again]
            self.gone_at = []
        out = []
        while self.keys or self.gone:
            out.append(Publication(tuple(self.keys[:MAX_BATCH]), tuple(self.offsets[:MAX_BATCH]),
                                   tuple(self.sizes[:MAX_BATCH]), tuple(self.checksums[:MAX_BATCH]),
                                   tuple(self.gone[:MAX_BATCH]), tuple(self.tiers[:MAX_BATCH])))
            for col in (self.keys, self.offsets, self.sizes, self.checksums, self.gone, self.tiers):
                del col[:MAX_BATCH]
        return out


    def drop_keys(self, keys: set[bytes]) -> int:
        """Drop the queued entries of `keys` (their gones stay: forgetting a row twice is harmless). Returns how many
        were dropped."""
        keep = [i for i, k in enumerate(self.keys) if k not in keys]
        dropped = len(self.keys) - len(keep)
        if dropped:
            before = [0] * (len(self.keys) + 1)     # before[i]: entries kept among the first i
            for i, k in enumerate(self.keys):
                before[i + 1] = before[i] + (k not in keys)
            self.gone_at = [before[at] for at in self.gone_at]
            for col in (self.keys, self.offsets, self.sizes, self.checksums, self.tiers):
                col[:] = [col[i] for i in keep]
        return dropped


class HostIndexFeed:
    """Counters: `published` entries and `gone` keys the nodes accepted, `failed` Publish calls lost to a node that
    did not answer, `dropped` entries a removal or a re-registration made moot (or a full queue pushed out)."""

    def __init__(self, *, interval_s: float = SEND_INTERVAL_S) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not interval_s >= 0:
            raise ValueError(f"interval_s must be a number >= 0 (seconds), got {interval_s!r}")
        self.interval_s = interval_s    # the least time between two rounds of sends (see SEND_INTERVAL_S)
        self._cond = threading.Condition()
        self._queues: dict[str, _Queue] = {}
        self._busy = 0                  # batches taken and not yet sent (flush waits for 0)
        self._closed = False
        self._thread: threading.Thread | None = None
        self._backfills: dict[str, _Backfill] = {}
        self._backfiller: threading.Thread | None = None    # runs while there are backfills
        self.published = 0
        self.gone_sent = 0
        self.failed = 0
        self.dropped = 0

    def committed(self, node_id: str, ops: PublishOps, keys: list[bytes], offsets: list[int], sizes: list[int],
                  checksums: list[int], tiers: list[Tier]) -> None:
        """Objects just committed (or moved) in `node_id`'s DRAM or SSD tier, tiers[i] each (called under the
        master's lock: appends only)."""
        with self._cond:
            q = self._queue(node_id, ops)
            q.keys += keys
            q.offsets += offsets
            q.sizes += sizes
            q.checksums += checksums
            q.tiers += tiers
            if len(q.keys) > MAX_QUEUED:
                cut = len(q.keys) - MAX_QUEUED
                for col in (q.keys, q.offsets, q.sizes, q.checksums, q.tiers):
                    del col[:cut]
                q.gone_at = [max(0, at - cut) for at in q.gone_at]
                self.dropped += cut
            self._cond.notify()

    def gone(self, node_id: str, ops: PublishOps, keys: list[bytes]) -> None:
        """Keys the master no longer has, which a same-host client of `node_id` may have found in its index."""
        with self._cond:
            q = self._queue(node_id, ops)
            q.gone += keys
            q.gone_at += [len(q.keys)] * len(keys)      # the order of the calls, settled when the queue is taken
            self._cond.notify()

    def backfill(self, node_id: str, chunk: Callable[[int], int | None], *, room: int,
                 pause: Callable[[], None]) -> None:
        """Publish again everything `node_id` holds, off the caller's thread (module docstring): `chunk(first)` from
        slot 0 until it returns None, each call queueing at most `room` entries, `pause()` between two. Replaces a
        backfill of the node in progress."""
        if isinstance(room, bool) or not isinstance(room, int) or not 1 <= room <= MAX_QUEUED:
            raise ValueError(f"room must be an int in [1, MAX_QUEUED={MAX_QUEUED}], got {room!r}")
        with self._cond:
            if self._closed:
                return
            self._backfills.pop(node_id, None)  # to the end of the round
            self._backfills[node_id] = _Backfill(chunk, room, pause)
            if self._backfiller is None:
                self._backfiller = threading.Thread(target=self._run_backfills, name="kvpool-host-backfill",
                                                    daemon=True)
                self._backfiller.start()
            self._cond.notify_all()

    def backfilling(self) -> list[str]:
        """The nodes with a backfill in progress."""
        with self._cond:
            return list(self._backfills)

    def reset(self, node_id: str) -> None:
        """Drop what is queued for `node_id`, and its backfill (it registered again: its index starts empty)."""
        with self._cond:
            self._backfills.pop(node_id, None)
            q = self._queues.get(node_id)
            if q is not None:
                q.epoch += 1
                self.dropped += sum(len(p.keys) + len(p.gone) for p in q.take())

    def removed(self, node_id: str, keys: list[bytes] | None = None) -> None:
        """Before `node_id` is told of a removal: nothing published before now lands after it (module docstring).
        `keys`: the node forgets only these (NodeInfo.removes_keys), so only their queued entries are dropped (and a
        batch taken but not sent yet, which may hold them); None: everything queued."""
        with self._cond:
            if keys is None:
                self._backfills.pop(node_id, None)  # it clears its index: the master backfills it again after
            q = self._queues.get(node_id)
            if q is None:
                return
            q.epoch += 1
            if keys is None:
                self.dropped += sum(len(p.keys) + len(p.gone) for p in q.take())
            else:
                self.dropped += q.drop_keys(set(keys))
        with q.send_lock:       # a send in flight finishes first
            pass

    def as_dict(self) -> dict[str, int]:
        """The counters, for the master's stats ("host_index")."""
        return {"published": self.published, "gone": self.gone_sent, "failed": self.failed, "dropped": self.dropped}

    def flush(self, timeout: float) -> bool:
        """Wait until every backfill ended and everything queued so far was sent (tests and benchmarks); False on
        timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._busy == 0 and not self._backfills and not any(
                q.keys or q.gone for q in self._queues.values()), timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._backfills.clear()
            self._cond.notify_all()
            threads = [t for t in (self._thread, self._backfiller) if t is not None]
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout=10)

    def _queue(self, node_id: str, ops: PublishOps) -> _Queue:
        q = self._queues.get(node_id)
        if q is None or q.ops is not ops:       # a node that registered again has new ops
            q = self._queues[node_id] = _Queue(ops)
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="kvpool-host-feed", daemon=True)
            self._thread.start()
        return q

    def _room(self, node_id: str, backfill: _Backfill) -> bool:
        q = self._queues.get(node_id)
        return q is None or len(q.keys) + backfill.room <= MAX_QUEUED

    def _run_backfills(self) -> None:
        """The backfill thread: one chunk of each backfill in turn, of those whose node's queue has room."""
        while True:
            with self._cond:
                ready = lambda: self._closed or not self._backfills or any(     # noqa: E731
                    self._room(n, b) for n, b in self._backfills.items())
                self._cond.wait_for(ready)
                if self._closed or not self._backfills:
                    self._backfiller = None
                    return
                node_id, backfill = next((n, b) for n, b in self._backfills.items() if self._room(n, b))
                first = backfill.first
            try:
                nxt = backfill.chunk(first)
            except Exception as exc:  # noqa: BLE001 - a lost backfill costs those objects a Lookup, as a lost send
                log.warning("node %s: host index backfill stopped at slot %d (its same-host clients ask the master "
                            "for the rest): %s", node_id, first, exc)
                nxt = None
            with self._cond:
                ours = self._backfills.get(node_id) is backfill  # not replaced or dropped meanwhile
                if ours:
                    del self._backfills[node_id]
                    if nxt is not None:
                        backfill.first = nxt
                        self._backfills[node_id] = backfill     # to the end of the round
                self._cond.notify_all()
            if ours and nxt is not None:
                backfill.pause()

    def _run(self) -> None:
        last = -math.inf
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or any(q.keys or q.gone for q in self._queues.values()))
                early = last + self.interval_s - time.monotonic()
                if early > 0:           # the commits of the next few puts go in the same call
                    self._cond.wait_for(lambda: self._closed, early)
                if self._closed:
                    return
                last = time.monotonic()
                work = [(node_id, q, q.epoch, q.take()) for node_id, q in self._queues.items() if q.keys or q.gone]
                self._busy += len(work)
                self._cond.notify_all()     # room in the queues: a backfill may go on
            for node_id, q, epoch, batches in work:
                try:
                    with q.send_lock:
                        for p in batches:
                            with self._cond:
                                moot = q.epoch != epoch
                                if moot:
                                    self.dropped += len(p.keys) + len(p.gone)
                            if moot:
                                continue
                            q.ops.publish(p)
                            self.published += len(p.keys)
                            self.gone_sent += len(p.gone)
                except Exception as exc:  # noqa: BLE001 - a lost publication only costs those objects a Lookup
                    self.failed += 1
                    log.warning("node %s: host index publication lost (its same-host clients ask the master for "
                                "those objects): %s", node_id, exc)
                finally:
                    with self._cond:
                        self._busy -= 1
                        self._cond.notify_all()
