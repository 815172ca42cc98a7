"""Promotion: hits on a slow tier move up to their node's fastest tier, after the lookup that found them and
outside the master lock.

    lookup (lock held)      a leased hit on a slower tier than its node's fastest: its key is queued (`want`); the
                            reply says where the object is NOW, and the reader copies from there
    start (lock held)       per queued key still committed on a slow tier: a target extent on the fastest tier
                            (`Placement.allocate`: may demote that tier's victims one tier down) and a pin on the
                            source slot, so nothing evicts or frees it while the node copies
    node.promote(batch)     one batched NodeOps call per node, with NO master lock held: a slow node stalls only
                            the promoter, never the clients
    finish (lock held)      copied and still the key's object: re-indexed at the target (`Placement.relocate`; the
                            source stays allocated for readers that hold a lease on it, and is freed, and its SSD
                            record erased, when the last of them releases). Copy refused because the SSD record
                            failed verification: the object is forgotten and counted in ssd_corrupt. Node call
                            failed, node gone, or object removed meanwhile: the target is freed, nothing else.

A hit counts in the stats where it was found (lookup), never where a promotion put it. `allowed(slot, tier)` may veto
a promotion (a tenant at its DRAM quota, store/quota.py): the object then stays where it is. The queue is bounded
(`max_wanted`): a flood of slow hits promotes the first ones and drops the rest, which the next hits re-queue.
Owned by the Master; `want`, `start` and `finish` run under its lock, `Master.promote_pending` drives them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from kvpool.store.index import COMMITTED, Index
from kvpool.store.leases import Leases
from kvpool.store.node import Drop, Move, NodeOps
from kvpool.store.placement import NodeState, Placement
from kvpool.tiers.types import Tier

_TIERS = tuple(Tier)
log = logging.getLogger(__name__)


@dataclass(slots=True)
class Promotion:
    slot: int          # the source slot, pinned until finish
    number: int        # the node it is on
    move: Move         # source -> target on the node's fastest tier


@dataclass(slots=True)
class PromotionBatch:
    """The promotions of one node, to copy in one NodeOps call."""

    node: NodeState
    ops: NodeOps
    items: list[Promotion]

    @property
    def moves(self) -> list[Move]:
        return [p.move for p in self.items]


class Promotions:
    def __init__(self, index: Index, placement: Placement, leases: Leases, *, max_wanted: int = 4096) -> None:
        self.index = index
        self.placement = placement
        self.leases = leases
        self.max_wanted = max_wanted
        self._wanted: dict[bytes, None] = {}   # keys in arrival order (an ordered set)
        self._inflight: set[int] = set()        # source slots pinned by a promotion being copied
        self.allowed = lambda slot, tier: True

    @property
    def pending(self) -> int:
        return len(self._wanted)

    def want(self, slots: np.ndarray, tiers: list[int] | None = None) -> int:
        """Queue the hits among `slots` that sit below their node's fastest tier; returns how many were queued.
        SSD hits qualify once some node has a faster tier (`Placement.has_fast`: none in an SSD-only pool); DRAM hits
        once some node has HBM (`Placement.has_hbm`). `tiers`: the slots' tiers when the caller has them already
        (a lookup whose hits are all fast returns at once)."""
        if not self.placement.has_fast:
            return 0
        index = self.index
        floor = int(Tier.DRAM) if self.placement.has_hbm else int(Tier.SSD)
        if tiers is not None and (not tiers or max(tiers) < floor):
            return 0
        slow = np.flatnonzero(index.tier[slots] >= floor)
        queued = 0
        for i in slow.tolist():
            if len(self._wanted) >= self.max_wanted:
                break
            key = index.key_at(int(slots[i]))
            if key not in self._wanted:
                self._wanted[key] = None
                queued += 1
        return queued

    def start(self, exclude: set[int], busy) -> list[PromotionBatch]:
        """Take the queue: targets allocated, sources pinned, grouped by node. `exclude`: node numbers not to
        promote on (draining or not connected); `busy(slot)`: the object is being moved by something else."""
        index, placement = self.index, self.placement
        wanted, self._wanted = self._wanted, {}
        batches: dict[int, PromotionBatch] = {}
        for key in wanted:
            slot = index.find(key, -1)
            if slot < 0 or index.state[slot] != COMMITTED or slot in self._inflight or busy(slot):
                continue
            node = placement.node_of(slot)
            if node is None or node.number in exclude:
                continue
            src_tier = _TIERS[int(index.tier[slot])]
            dst_tier = placement.fastest_tier(node)
            if dst_tier is None or dst_tier >= src_tier or not self.allowed(slot, dst_tier):
                continue
            size = int(index.size[slot])
            # Pin first: making room may demote or evict this tier's victims, never the object we are moving.
            self.leases.pin(slot)
            try:
                target = placement.allocate(node, dst_tier, size)
            except ValueError as exc:  # an object no tier can hold (e.g. size 0 from a bad report): never pin it
                log.warning("promotion of %s refused: %s", key.hex(), exc)
                target = None
            if target is None:
                self._unpin(slot)
                continue
            move = Move(key, index.ns_digest(int(index.ns[slot])), size, int(index.checksum[slot]), src_tier,
                        int(index.offset[slot]), dst_tier, target)
            self._inflight.add(slot)
            batch = batches.get(node.number)
            if batch is None:
                batch = batches[node.number] = PromotionBatch(node, node.ops, [])
            batch.items.append(Promotion(slot, node.number, move))
        return list(batches.values())

    def finish(self, batch: PromotionBatch, results: list[bool] | None) -> int:
        """Apply one node's copy results (None: the node call failed). Returns how many objects moved up."""
        index, placement = self.index, self.placement
        node = placement.by_number[batch.node.number]
        alive = node is batch.node and not node.leaving  # the node left (or restarted as a new number) meanwhile
        moved = 0
        drops: list[Drop] = []
        for i, p in enumerate(batch.items):
            ok = results[i] if results is not None else None
            self._inflight.discard(p.slot)
            current = index.find(p.move.key, -1) == p.slot and index.state[p.slot] == COMMITTED
            if alive and ok and current:
                placement.relocate(p.slot, node, p.move.dst_tier, p.move.dst_offset)
                placement.counters.count(placement.counters.promotions, p.move.src_tier)
                moved += 1
            else:
                if alive:
                    node.spaces[p.move.dst_tier].allocator.free(p.move.dst_offset)
                if alive and ok is False and current:  # the node found the source record bad: never serve it
                    placement.forget(p.slot)
                    placement.counters.ssd_corrupt += 1
            self._unpin(p.slot, drops)
        if drops and alive:
            node.ops.drop(drops)  # before the lock is released: the freed SSD extents are reusable after it
        return moved

    def _unpin(self, slot: int, drops: list[Drop] | None = None) -> None:
        if self.leases.unpin(slot):
            self.placement.forget(slot, drops=drops)


__all__ = ["Promotions", "PromotionBatch", "Promotion"]
