"""Write-behind: the bytes of objects on a fast tier are copied to the SSD extent reserved for them at put time
(store/copies.py), after the commit and outside the master lock, so a node restart (clean
stop, SIGKILL, a crash) finds on its SSD what its DRAM held.

    put_commit (lock held)      the object has a reserved copy: its key joins `Copies.dirty` (commit order, so
                                a chain's parents are copied before its tails)
    start (lock held)           the oldest dirty keys still on a fast tier, up to `max_bytes`: the key leaves
                                `dirty`, the object is pinned (nothing evicts, demotes or frees it while the node
                                reads it), one Move (fast tier -> its reserved SSD extent) per object, grouped by node
    node.demote(batch)          one batched NodeOps call per node, WITHOUT the master lock: the node writes a normal
                                SSD record (header, payload, the committed checksum) and keeps the source
    finish (lock held)          copied: the copy is clean. Refused or node unreachable: the key is dirty again (the
                                next round retries; a demotion meanwhile writes it itself). The object left
                                meanwhile: nothing to do, its copy extent is freed and erased with it (the record
                                just written included) when its last pin goes.

The lag is bounded by the caller's period (MasterConfig.write_behind_s: the server's writer thread, the embedded
pool's) plus one round's copy time; under a put rate the SSD cannot absorb, `dirty` grows, and DRAM victims that
are still dirty are copied by their demotion instead, which is exactly the exclusive tier's cost. `flush` (a clean
stop) copies every dirty object of one node and reports how many are left (0 unless its copies fail).
Owned by the Master; `start` and `finish` run under its lock.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from kvpool.store.index import COMMITTED, COPY_PAGE, NO_COPY, Index
from kvpool.store.leases import Leases
from kvpool.store.node import Move, NodeOps
from kvpool.store.placement import NodeState, Placement
from kvpool.tiers.types import Tier

log = logging.getLogger(__name__)

_TIERS = tuple(Tier)
_SSD = int(Tier.SSD)


@dataclass(slots=True)
class CopyJob:
    slot: int          # pinned until finish
    move: Move         # fast tier -> the reserved SSD extent


@dataclass(slots=True)
class CopyBatch:
    """The copies of one node, written in one NodeOps call."""

    node: NodeState
    ops: NodeOps
    jobs: list[CopyJob]

    @property
    def moves(self) -> list[Move]:
        return [j.move for j in self.jobs]


@dataclass(slots=True)
class WriteBehindCounters:
    copied: int = 0         # objects whose copy was written
    copied_bytes: int = 0   # their payload bytes (what write-behind adds to the SSD's write load)
    failed: int = 0         # copies the node refused or could not be asked for (retried)

    def as_dict(self, pending: int) -> dict[str, int]:
        return {"pending": pending, "copied": self.copied, "copied_bytes": self.copied_bytes, "failed": self.failed}


class WriteBehind:
    def __init__(self, index: Index, placement: Placement, leases: Leases) -> None:
        self.index = index
        self.placement = placement
        self.leases = leases
        self.counters = WriteBehindCounters()
        self._copying: set[int] = set()     # slots a round took (`start`) and has not finished: each pinned once

    def copying(self, slot: int) -> bool:
        """A round has taken this object's copy and not finished it (its record may be half written)."""
        return slot in self._copying

    def pinned_alone(self, slot: int) -> bool:
        """Whether a round's copy is the only pin on `slot` (no reader holds it): a tenant's total quota may evict it
        (store/quota.py); it then leaves as any object removed mid-copy does (`finish`)."""
        return slot in self._copying and int(self.index.leases[slot]) == 1

    @property
    def pending(self) -> int:
        """Objects whose copy is not written yet: queued, or being written right now."""
        return len(self.placement.copies.dirty) + len(self._copying)

    def pending_on(self, number: int) -> int:
        index, find, dirty = self.index, self.index.find, self.placement.copies.dirty
        return sum(1 for key in dirty if (s := find(key, -1)) >= 0 and int(index.node[s]) == number)

    def start(self, exclude: set[int], busy, max_bytes: int, *, only: int | None = None) -> list[CopyBatch]:
        """Take the oldest dirty keys (all nodes, or node number `only`) up to `max_bytes` (at least one object):
        pinned, grouped by node. Keys of nodes in `exclude` (not connected, draining) stay dirty; keys whose object
        is gone, on SSD, or without a copy are dropped; `busy(slot)`: moved by something else, stays dirty."""
        index, placement, dirty = self.index, self.placement, self.placement.copies.dirty
        batches: dict[int, CopyBatch] = {}
        taken: list[bytes] = []
        stale: list[bytes] = []
        total = 0
        for key in dirty:
            slot = index.find(key, -1)
            if slot < 0 or int(index.state[slot]) != COMMITTED or int(index.tier[slot]) >= _SSD \
                    or int(index.copy[slot]) == NO_COPY:
                stale.append(key)
                continue
            number = int(index.node[slot])
            if number in exclude or (only is not None and number != only) or busy(slot):
                continue
            node = placement.by_number[number]
            if node is None:
                stale.append(key)
                continue
            size = int(index.size[slot])
            if taken and total + size > max_bytes:
                break
            total += size
            taken.append(key)
            self.leases.pin(slot)
            self._copying.add(slot)
            move = Move(key, index.ns_digest(int(index.ns[slot])), size, int(index.checksum[slot]),
                        _TIERS[int(index.tier[slot])], int(index.offset[slot]), Tier.SSD,
                        int(index.copy[slot]) * COPY_PAGE)
            batch = batches.get(number)
            if batch is None:
                batch = batches[number] = CopyBatch(node, node.ops, [])
            batch.jobs.append(CopyJob(slot, move))
        for key in stale:
            del dirty[key]
        for key in taken:
            del dirty[key]
        return list(batches.values())

    def finish(self, batch: CopyBatch, results: list[bool] | None) -> int:
        """Apply one node's copy results (None: the node could not be asked). Returns how many copies are clean."""
        index, placement = self.index, self.placement
        clean = 0
        for i, job in enumerate(batch.jobs):
            self._copying.discard(job.slot)
            ok = results is not None and bool(results[i])
            slot, key = job.slot, job.move.key
            current = (index.find(key, -1) == slot and int(index.state[slot]) == COMMITTED
                       and int(index.copy[slot]) * COPY_PAGE == job.move.dst_offset)
            if ok:
                self.counters.copied += 1
                self.counters.copied_bytes += job.move.size
                clean += current
            else:
                self.counters.failed += 1
                if current:
                    placement.copies.dirty[key] = None      # retried next round (or written by its demotion)
            if self.leases.unpin(slot):
                placement.forget(slot)               # it left meanwhile: frees and erases its copy too
        return clean


ROUND_BYTES = 16 << 20
"""What a round copies at most (`Master.copy_pending`, `flush_node`; 64 MiB before 2026-12-06). A round's `start`
holds the master's lock ~4 us per object (1,024 objects of 64 KiB: 4.5 ms in process, 2.5-4.7 ms in a master
process under load, 2026-12-06), so rounds of 16 MiB keep each hold near a millisecond; the backlog drains as fast,
in more calls."""


def write_behind_loop(master, stop: threading.Event) -> None:
    """The writer thread of a master process and of the embedded pool: every `write_behind_s`, copy the backlog in
    rounds of `ROUND_BYTES` (`Master.copy_pending`) until a round writes nothing."""
    while not stop.wait(master.config.write_behind_s):
        try:
            while master.copy_pending(ROUND_BYTES) and not stop.is_set():
                pass
        except Exception:  # noqa: BLE001 - a failed round leaves its objects dirty: the next one retries
            log.exception("write-behind round failed")


__all__ = ["WriteBehind", "CopyBatch", "CopyJob", "WriteBehindCounters", "write_behind_loop", "ROUND_BYTES"]
