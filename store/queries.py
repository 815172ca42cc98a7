"""Admin queries over the index: inspect, list (paginated, by namespace and/or node), and evict by namespace or age.

These read many objects at once (numpy masks over the index columns, or a sort of the matching keys), so they are
admin calls, not data-path calls. Arguments are validated by the Master before the lock is taken; these functions
run under it and are not thread-safe by themselves.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

import numpy as np

from kvpool.store.index import COMMITTED, Index
from kvpool.store.node import Drop
from kvpool.store.placement import Placement
from kvpool.store.records import ObjectRecord
from kvpool.store.tenants import UNSCOPED
from kvpool.tiers.types import Tier

_TIERS = tuple(Tier)


def inspect(index: Index, placement: Placement, keys) -> list[ObjectRecord | None]:
    return [placement.record(s) if (s := index.find(k, -1)) >= 0 and index.state[s] == COMMITTED else None
            for k in keys]


LIST_CHUNK = 1 << 16
"""Index slots a listing scans per hold of the master's lock (~8 ms at full occupancy on a 2-core box): a lookup
waits a chunk or two, not a whole page's scan (~150 ms at 1,000,000 objects; bench/admin_list.py)."""


@dataclass(slots=True, frozen=True)
class ListFilter:
    """What a listing takes: committed objects, of one namespace / node / tenant where given (None: any)."""

    ns_id: int | None = None
    node_number: int | None = None
    tenant: int | None = None

    def listed(self, index: Index, slots: np.ndarray) -> np.ndarray:
        mask = index.state[slots] == COMMITTED
        if self.ns_id is not None:
            mask &= index.ns[slots] == self.ns_id
        if self.node_number is not None:
            mask &= index.node[slots] == self.node_number
        if self.tenant is not None:
            mask &= index.tenant[slots] == self.tenant
        return mask


def list_smallest(index: Index, first: int, end: int, listing: ListFilter, start_after: bytes, best: list[bytes],
                  limit: int) -> list[bytes]:
    """One chunk of a listing (lock held): the `limit` + 1 smallest keys after `start_after` among `best` (the
    chunks before) and the listed objects of slots [first, end). One pass keeping the smallest (heapq, C comparisons
    of the key bytes): the rest are never sorted (sorting every key took ~530 ms a page at 1,000,000 objects). A key
    of `best` may be here again (removed, then put into a slot of this chunk): twice as many are kept, so `limit` +
    1 distinct ones remain."""
    slots = index.slots(first, end)
    keys = index.keys_of(slots[listing.listed(index, slots)])
    if start_after:
        keys = filter(start_after.__lt__, keys)
    merged = heapq.nsmallest(2 * (limit + 1), itertools.chain(best, keys))
    return [k for i, k in enumerate(merged) if not i or k != merged[i - 1]][:limit + 1]


def list_page(index: Index, placement: Placement, best: list[bytes], listing: ListFilter,
              limit: int) -> tuple[list[ObjectRecord], bytes]:
    """A listing's page from its last chunk's `best` (lock held): the records of the first `limit` still listed (one
    removed meanwhile is left out: the lock was let go between chunks) and the next start_after (b"": done)."""
    page = best[:limit]
    slots = np.array([index.find(k, -1) for k in page], dtype=np.int64)
    found = slots >= 0
    kept = np.zeros(len(page), dtype=bool)
    kept[found] = listing.listed(index, slots[found])
    records = [placement.record(int(slot)) for slot in slots[kept]]
    return records, (page[-1] if len(best) > limit and page else b"")


REMOVAL_CHUNK = 1024
"""Objects a removal (a client's `remove`, an admin evict) takes per hold of the master's lock (~12 ms on a 2-core
box): lookups wait one chunk, not the whole removal (an evict of 50,000 objects held the lock 0.66 s in one piece)."""


def evict_candidates(index: Index, ns_id: int | None, older_than_ticks: int | None, now_ticks: int) -> np.ndarray:
    """Slots an evict by namespace (`ns_id`, None = any) and/or idle age would take now, in slot order."""
    slots = index.slots()
    return slots[_evictable(index, slots, ns_id, older_than_ticks, now_ticks)]


def evict(index: Index, placement: Placement, slots: np.ndarray, ns_id: int | None, older_than_ticks: int | None,
          now_ticks: int) -> tuple[int, list[bytes]]:
    """Evict those of `slots` (one chunk of `evict_candidates`) that still match: committed, unleased, of the
    namespace, idle long enough. The lock was let go since the candidates were chosen, so each is checked again; a
    slot freed and taken by another object meanwhile is evicted only if that object matches too. SSD records are
    erased with one batched drop per node before their extents can be reused. Returns (evicted, the stored keys of
    the unscoped ones: what host indexes may hold)."""
    chosen = slots[_evictable(index, slots, ns_id, older_than_ticks, now_ticks)].tolist()
    drops: dict[int, list[Drop]] = {}
    published: list[bytes] = []
    tenant = index.tenant
    for slot in chosen:
        number, tier = int(index.node[slot]), _TIERS[int(index.tier[slot])]
        if tenant[slot] == UNSCOPED:
            published.append(index.key_at(slot))
        placement.forget(slot, drops=drops.setdefault(number, []))
        placement.count_evictions(tier, 1)
    for number, node_drops in drops.items():
        if node_drops:
            placement.by_number[number].ops.drop(node_drops)
    return len(chosen), published


def _evictable(index: Index, slots: np.ndarray, ns_id: int | None, older_than_ticks: int | None,
               now_ticks: int) -> np.ndarray:
    mask = (index.state[slots] == COMMITTED) & (index.leases[slots] == 0)
    if ns_id is not None:
        mask &= index.ns[slots] == ns_id
    if older_than_ticks is not None:
        idle = now_ticks - index.atime[slots].astype("int64")
        mask &= idle >= older_than_ticks
    return mask


def idle_ticks(older_than_s: float, ticks_per_s: int) -> int:
    return math.ceil(older_than_s * ticks_per_s - 1e-9)


__all__ = ["inspect", "LIST_CHUNK", "ListFilter", "list_smallest", "list_page", "REMOVAL_CHUNK", "evict_candidates",
           "evict", "idle_ticks"]
