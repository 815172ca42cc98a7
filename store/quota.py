"""Tenant quotas: a tenant over its byte quota makes room among ITS OWN objects, coldest first, never another's.

    TenantLists    one LRU list per (tenant, tier) of committed objects, all threaded through ONE pair of int32 link
                   arrays over the index's slots (8 B per slot however many tenants: a slot is in at most one list)
    TrackedPolicy  wraps each per-(node, tier) pool policy (store/placement.py) so the tenant lists follow every
                   insert / touch / remove the pool makes: commit, hit, demotion, promotion, drain, eviction
    Quotas.admit   at put_start, per key, before placement:
                     total quota  evict the tenant's coldest objects, slowest tier first (SSD, then DRAM, then HBM),
                                  until the new object fits (one the write-behind is copying counts: it leaves when
                                  its copy ends); if its own unleased objects are not enough: no_space
                     DRAM quota   demote its coldest DRAM objects one tier down where that tier has free room (nobody
                                  else's object is pushed out for them), else evict them; if that cannot make room,
                                  the object is placed below DRAM (SSD) instead

Why separate lists rather than the pool's policies: a pool policy orders every tenant's objects of one (node, tier);
finding one tenant's coldest there means walking past everyone else's, O(pool) per put. A tenant's own list costs
O(victims + its own leased objects skipped) per put. The per-(node, tier) policies still decide whenever a TIER is
full (pool pressure evicts the pool's coldest, whoever owns them: a quota is a ceiling, not a reservation).

Quota bytes are payload bytes (what the client put), of every object the tenant holds: pending writes count; an
object removed or evicted while still being read or copied stops counting at once (it is gone for its owner; its
space is freed when the last reader or copy lets go, store/index.py `doom`). A hit is not promoted into DRAM past
its tenant's DRAM quota (`may_promote`): it is served from where it is, and a drain does not move an object into
DRAM past it (`move_skip`). Retention hints (store/retention.py) hold here as under pool pressure: a tenant's
pinned objects are its last victims, taken (coldest first, counted in `pinned_evictions`) only when its unpinned ones
cannot make the room. Not thread-safe: the master's lock serialises every call.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from kvpool.store.index import COMMITTED, Index
from kvpool.store.placement import Placement
from kvpool.store.tenants import Tenants
from kvpool.tiers.lru import LRUPolicy
from kvpool.tiers.types import Tier

ANY_TIER: frozenset = frozenset()
BELOW_DRAM: frozenset = frozenset({Tier.HBM, Tier.DRAM})
_NT = len(Tier)
_TOTAL_ORDER = (Tier.SSD, Tier.DRAM, Tier.HBM)  # a tenant over its total quota loses its slowest objects first


class TenantLists:
    def __init__(self, index: Index) -> None:
        self.index = index
        self._links = (array("i"), array("i"))
        self._lists: dict[int, LRUPolicy] = {}

    def _list(self, tenant: int, tier: int) -> LRUPolicy:
        lst = self._lists.get(tenant * _NT + tier)
        if lst is None:
            lst = self._lists[tenant * _NT + tier] = LRUPolicy(self._links)
        return lst

    def _by_tenant(self, slots) -> Iterator[tuple[int, Sequence[int]]]:
        """The chain split by owner (one tenant in practice: a put or a hit is one client's)."""
        tenants = self.index.tenant[np.asarray(slots, dtype=np.int64)]
        if (tenants == tenants[0]).all():
            yield int(tenants[0]), slots
            return
        seen: dict[int, list[int]] = {}
        for slot, t in zip(list(slots), tenants.tolist()):
            seen.setdefault(t, []).append(int(slot))
        yield from seen.items()

    def insert_chain(self, slots: Sequence[int], tier: int) -> None:
        if len(slots):
            for tenant, chain in self._by_tenant(slots):
                self._list(tenant, tier).insert_chain(list(chain))

    def touch_chain(self, slots, tier: int) -> None:
        if len(slots):
            for tenant, chain in self._by_tenant(slots):
                self._list(tenant, tier).touch_chain(chain)

    def remove(self, slot: int, tier: int) -> None:
        self._list(int(self.index.tenant[slot]), tier).remove(slot)

    def mark_orphans(self, slots: Sequence[int], tier: int) -> None:
        """Orphans (an ancestor left, store/chains.py) go first among their tenant's victims too."""
        if len(slots):
            for tenant, chain in self._by_tenant(slots):
                self._list(tenant, tier).mark_orphans(list(chain))

    def victims(self, tenant: int, tier: int) -> Iterator[int]:
        lst = self._lists.get(tenant * _NT + tier)
        return iter(()) if lst is None else lst.victims()

    def __len__(self) -> int:
        return sum(len(lst) for lst in self._lists.values())


class TrackedPolicy:
    """A pool policy whose every change is mirrored into the tenant lists of its tier."""

    __slots__ = ("inner", "lists", "tier")

    def __init__(self, inner, lists: TenantLists, tier: Tier) -> None:
        self.inner, self.lists, self.tier = inner, lists, int(tier)

    @property
    def name(self) -> str:
        return self.inner.name

    def insert_chain(self, slots, keys=None) -> None:
        self.inner.insert_chain(slots, keys)
        self.lists.insert_chain(slots, self.tier)

    def touch_chain(self, slots) -> None:
        self.inner.touch_chain(slots)
        self.lists.touch_chain(slots, self.tier)

    def remove(self, slot: int, key: bytes | None = None) -> bool:
        if not self.inner.remove(slot, key):
            return False
        self.lists.remove(slot, self.tier)
        return True

    def mark_orphans(self, slots) -> None:
        self.inner.mark_orphans(slots)
        self.lists.mark_orphans(slots, self.tier)

    def victims(self) -> Iterator[int]:
        return self.inner.victims()

    def __len__(self) -> int:
        return len(self.inner)

    def __contains__(self, slot: object) -> bool:
        return slot in self.inner


class Quotas:
    """Enforces `tenants`' quotas on the index through `placement` (whose policies it wraps: call before any node
    registers)."""

    def __init__(self, index: Index, placement: Placement, tenants: Tenants,
                 copy_pinned_alone: Callable[[int], bool]) -> None:
        """`copy_pinned_alone(slot)`: whether the write-behind's copy is the only pin on it
        (WriteBehind.pinned_alone): such an object may still be a total quota's victim."""
        if placement.nodes:
            raise RuntimeError("Quotas must be set up before the first node registers")
        self.index, self.placement, self.tenants = index, placement, tenants
        self.copy_pinned_alone = copy_pinned_alone
        self.lists = TenantLists(index)
        placement.track = self.lists

    def admit(self, tenant: int, size: int) -> frozenset | None:
        """Make room for `size` more bytes of `tenant` within its quota: None = no_space (nothing of its own can go),
        else the tiers the object must not be placed on."""
        quota = self.tenants.quota(tenant)
        if quota is None:
            return ANY_TIER
        if quota.total_bytes and not self._fit(tenant, size, quota.total_bytes, None):
            self.tenants.counters[tenant].no_space += 1
            return None
        if quota.dram_bytes and not self._fit(tenant, size, quota.dram_bytes, Tier.DRAM):
            return BELOW_DRAM
        return ANY_TIER

    def limits(self, tenant: int) -> bool:
        """Whether `tenant` has a quota (its puts are admitted object by object)."""
        return self.tenants.quota(tenant) is not None

    def may_promote(self, slot: int, tier: Tier) -> bool:
        """Whether moving `slot` up into `tier` keeps its tenant within its DRAM quota."""
        tenant = int(self.index.tenant[slot])
        quota = self.tenants.quota(tenant)
        if quota is None or not quota.dram_bytes or tier != Tier.DRAM:
            return True
        return self.index.tenant_bytes(tenant, Tier.DRAM) + int(self.index.size[slot]) <= quota.dram_bytes

    def move_skip(self, slot: int) -> frozenset:
        """Tiers a drain must not move `slot` into: DRAM when the object is not in DRAM now and its tenant's DRAM
        quota has no room for it (a DRAM object moving DRAM -> DRAM changes nothing of its usage)."""
        tenant = int(self.index.tenant[slot])
        quota = self.tenants.quota(tenant)
        if quota is None or not quota.dram_bytes or int(self.index.tier[slot]) == Tier.DRAM:
            return ANY_TIER
        fits = self.index.tenant_bytes(tenant, Tier.DRAM) + int(self.index.size[slot]) <= quota.dram_bytes
        return ANY_TIER if fits else BELOW_DRAM

    def _fit(self, tenant: int, size: int, limit: int, tier: Tier | None) -> bool:
        """Whether `size` more bytes of `tenant` fit under `limit` (its total quota, `tier` None: its coldest objects
        evicted, slowest tier first; its DRAM quota: its coldest DRAM objects shed one tier down), after taking the
        fewest of its own objects out. If they cannot make the room, nothing is taken.

        Inside a put's `batched_ops`, a victim may be an object a queued move of the same put has just moved: that
        node's calls are sent (and settled) first (Placement.settle), and what is over the quota is counted again
        from what the answers left (a refused move evicted its object), so no object is evicted or moved twice, no
        erase is queued behind the move it must follow, and no more is taken than the per-object calls took."""
        index, counters = self.index, self.tenants.counters[tenant]
        while True:
            over = index.tenant_bytes(tenant, tier) + size - limit
            if over <= 0:
                return True
            if size > limit:
                return False
            victims, freed, pins, passed = self._walk(tenant, _TOTAL_ORDER if tier is None else (tier,), over,
                                                      evicting=tier is None)
            if freed < over:
                return False    # not enough of its own: nothing taken (the tenant keeps what it has)
            if not self.placement.settle(victims):
                break
        self.placement.pass_over(passed)
        self.placement.retention.counters.yielded += pins
        if tier is None:
            self.placement.evict(victims)
            counters.quota_evictions += len(victims)
        else:
            demoted, evicted = self.placement.shed(victims)
            counters.quota_demotions += demoted
            counters.quota_evictions += evicted
        return True

    def _walk(self, tenant: int, tiers: Sequence[Tier], need: int, *,
              evicting: bool) -> tuple[list[int], int, int, list[int]]:
        """The tenant's coldest committed, unleased objects in `tiers` (in that order) until `need` payload bytes:
        unpinned ones first, then (as pool pressure does, store/retention.py) its pinned ones, coldest first, only
        if the unpinned cannot make the room. `evicting` (the total quota): an object whose only pin is the
        write-behind's copy counts as unleased: evicted, it leaves when its copy ends, as an object removed mid-copy
        does, so a tenant whose coldest objects are being copied is not refused its put (a move, the DRAM quota's,
        still waits for the copy). Changes nothing. Returns (victims, bytes, how many of them are pinned, the pinned
        objects passed over: `pass_over` once the victims are taken)."""
        index = self.index
        state, leases, size = index.state, index.leases, index.size
        pinned, protects = index.retained, self.placement.retention.protects
        copying = self.copy_pinned_alone
        picked: list[int] = []
        held: list[int] = []
        freed = 0
        for tier in tiers:
            for slot in self.lists.victims(tenant, int(tier)):
                if state[slot] != COMMITTED or (leases[slot] > 0 and not (evicting and copying(slot))):
                    continue
                if pinned and protects(slot):
                    held.append(slot)
                    continue
                picked.append(slot)
                freed += int(size[slot])
                if freed >= need:
                    return picked, freed, 0, held
        for n, slot in enumerate(held, 1):
            picked.append(slot)
            freed += int(size[slot])
            if freed >= need:
                return picked, freed, n, []
        return picked, freed, len(held), []


__all__ = ["Quotas", "TenantLists", "TrackedPolicy", "ANY_TIER", "BELOW_DRAM"]
