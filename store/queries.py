"""Admin queries over the index: inspect, list (paginated, by namespace and/or node), and evict by namespace or age.

These read many objects at once (numpy masks over the index columns, or a sort of the matching keys), so they are
admin calls, not data-path calls. Arguments are validated by the Master before the lock is taken; these functions
run under it and are not thread-safe by themselves.
"""

from __future__ import annotations

import bisect
import math

from kvpool.store.index import COMMITTED, Index
from kvpool.store.node import Drop
from kvpool.store.placement import Placement
from kvpool.store.records import ObjectRecord
from kvpool.tiers.types import Tier

_TIERS = tuple(Tier)


def inspect(index: Index, placement: Placement, keys) -> list[ObjectRecord | None]:
    return [placement.record(s) if (s := index.find(k, -1)) >= 0 and index.state[s] == COMMITTED else None
            for k in keys]


def list_objects(index: Index, placement: Placement, ns_digest: bytes, start_after: bytes, limit: int,
                 node_number: int | None, tenant: int | None = None) -> tuple[list[ObjectRecord], bytes]:
    """Committed objects in key order after `start_after`; (records, next_start_after or b"" when done). Sorts the
    matching keys: O(n log n) in the index size."""
    slots = index.slots()
    mask = index.state[slots] == COMMITTED
    if ns_digest:
        mask &= index.ns[slots] == index.ns_id_of(ns_digest)
    if node_number is not None:
        mask &= index.node[slots] == node_number
    if tenant is not None:
        mask &= index.tenant[slots] == tenant
    keys = sorted(index.key_at(s) for s in slots[mask].tolist())
    start = bisect.bisect_right(keys, bytes(start_after)) if start_after else 0
    page = keys[start:start + limit]
    more = start + limit < len(keys)
    return [placement.record(index.find(k)) for k in page], (page[-1] if more and page else b"")


def evict(index: Index, placement: Placement, ns_digest: bytes, older_than_ticks: int | None, now_ticks: int) -> int:
    """Evict committed, unleased objects of a namespace (empty = any) and/or idle at least `older_than_ticks`.
    SSD records are erased with one batched drop per node before their extents can be reused."""
    slots = index.slots()
    mask = (index.state[slots] == COMMITTED) & (index.leases[slots] == 0)
    if ns_digest:
        mask &= index.ns[slots] == index.ns_id_of(ns_digest)
    if older_than_ticks is not None:
        idle = now_ticks - index.atime[slots].astype("int64")
        mask &= idle >= older_than_ticks
    drops: dict[int, list[Drop]] = {}
    for slot in slots[mask].tolist():
        number, tier = int(index.node[slot]), _TIERS[int(index.tier[slot])]
        placement.forget(slot, drops=drops.setdefault(number, []))
        placement.count_evictions(tier, 1)
    for number, node_drops in drops.items():
        if node_drops:
            placement.by_number[number].ops.drop(node_drops)
    return int(mask.sum())


def idle_ticks(older_than_s: float, ticks_per_s: int) -> int:
    return math.ceil(older_than_s * ticks_per_s - 1e-9)


__all__ = ["inspect", "list_objects", "evict", "idle_ticks"]
