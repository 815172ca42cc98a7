"""Placement: the master's view of every node's tiers, and the one place that moves objects between them.

    NodeState (one per registered node)
      ├─ spaces[HBM]  = TierSpace(OffsetAllocator, EvictionPolicy)   only on a node with a CUDA device
      ├─ spaces[DRAM] = TierSpace(OffsetAllocator, EvictionPolicy)   DRAM extents hold the payload
      └─ spaces[SSD]  = TierSpace(OffsetAllocator, EvictionPolicy)   SSD extents hold header + payload

`allocate(node, tier, size)` makes room by the rules of docs/internals.md: take victims coldest-first from the
tier's policy, skipping leased objects (uncommitted ones are never in a policy: objects enter it on commit);
a victim is demoted to the node's next slower tier (HBM -> DRAM -> SSD) when it has one and room can be made there
(by the same rule, one tier down: the chain ends at the slowest tier, whose victims are evicted), else evicted.
Victims are taken in rounds of "just enough bytes", so with equal-sized objects the order of eviction is exactly
the policy order. Every byte move goes through the node's `NodeOps`, batched per round.
Drops are sent before the writes that may reuse their extents (an SSD erase must never land on a new record).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from kvpool.store.index import COMMITTED, PENDING, Index, State
from kvpool.store.journal import Journal
from kvpool.store.node import Drop, Move, NodeOps
from kvpool.store.records import NodeInfo, ObjectRecord
from kvpool.tiers.allocator import OffsetAllocator
from kvpool.tiers.policy import make_policy
from kvpool.tiers.types import Tier

log = logging.getLogger(__name__)

# Enum attribute lookups cost ~1 us on Python 3.11; these run per object.
_TIERS = tuple(Tier)
_SSD = Tier.SSD
_PLACE_ORDER = (Tier.HBM, Tier.DRAM, Tier.SSD)  # fastest first: a put lands on the fastest tier with room


@dataclass(slots=True)
class TierSpace:
    tier: Tier
    allocator: OffsetAllocator
    policy: object
    overhead: int = 0  # bytes an extent needs beyond the payload (SSD record header)

    def extent_size(self, size: int) -> int:
        return size + self.overhead


@dataclass(slots=True)
class NodeState:
    """A node's place in the pool: its tiers' allocators and policies, and how to move bytes on it. Membership
    (epoch, heartbeats, connected) is the NodeRegistry's (store/registry.py)."""

    node_id: str
    number: int                     # the u16 stored in the index
    info: NodeInfo
    ops: NodeOps
    spaces: dict[Tier, TierSpace]


@dataclass(slots=True)
class Counters:
    """Object movements, each by the tier the object LEFT. The tiers every pool has start at 0 (so their series
    exist from the start); "hbm" appears on first use."""

    evictions: dict[str, int] = field(default_factory=lambda: {"dram": 0, "ssd": 0})
    demotions: dict[str, int] = field(default_factory=lambda: {"dram": 0})
    promotions: dict[str, int] = field(default_factory=lambda: {"ssd": 0})
    ssd_corrupt: int = 0
    dram_corrupt: int = 0           # DRAM/HBM objects a reader found changed under their checksum (a late write)

    def count(self, what: dict[str, int], tier: Tier, n: int = 1) -> None:
        what[tier.label] = what.get(tier.label, 0) + n


def _slower(node: NodeState, tier: Tier) -> Tier | None:
    """The node's next tier below `tier` (where its victims are demoted), or None: `tier` is its slowest."""
    for t in node.spaces:  # fastest first
        if t > tier:
            return t
    return None


class Placement:
    """Not thread-safe: called under the master lock. Index changes are reported to the journal."""

    def __init__(self, index: Index, policy_name: str, journal: Journal) -> None:
        self.index = index
        self.policy_name = policy_name
        self.journal = journal
        self.nodes: dict[str, NodeState] = {}
        self.by_number: list[NodeState | None] = []
        self.counters = Counters()
        self.has_hbm = False            # some node registered an HBM tier: DRAM hits are worth promoting

    # ---- nodes ----

    def add_node(self, info: NodeInfo, ops: NodeOps) -> NodeState:
        spaces = {}
        if info.hbm_bytes > 0:
            self.has_hbm = True
            spaces[Tier.HBM] = TierSpace(Tier.HBM, OffsetAllocator(info.hbm_bytes, info.alignment),
                                         make_policy(self.policy_name))
        if info.dram_bytes > 0:
            spaces[Tier.DRAM] = TierSpace(Tier.DRAM, OffsetAllocator(info.dram_bytes, info.alignment),
                                          make_policy(self.policy_name))
        if info.ssd_bytes > 0:
            spaces[Tier.SSD] = TierSpace(Tier.SSD, OffsetAllocator(info.ssd_bytes, info.alignment),
                                         make_policy(self.policy_name), overhead=info.ssd_record_overhead)
        # Numbers are never reused: a DOOMED slot of a dropped node must not free an extent of its successor.
        number = len(self.by_number)
        if number > 0xFFFF:
            raise ValueError("node_id: more than 65536 node registrations in one master lifetime")
        state = NodeState(info.node_id, number, info, ops, spaces)
        self.by_number.append(state)
        self.nodes[info.node_id] = state
        return state

    def remove_node(self, node_id: str) -> int:
        """Forget a node and every object on it (they become misses). Returns the number of objects dropped."""
        state = self.nodes.pop(node_id)
        n = 0
        for slot in self.index.slots():
            if self.index.node[slot] == state.number:
                n += self.index.state[slot] == State.COMMITTED
                if self.index.state[slot] == State.DOOMED and self.index.leases[slot] > 0:
                    continue  # still leased: the last release frees the slot (the reader's lease names it)
                self.forget(int(slot), free_extent=False)
        self.by_number[state.number] = None
        return n

    def node_of(self, slot: int) -> NodeState | None:
        return self.by_number[int(self.index.node[slot])]

    def node(self, node_id: str) -> NodeState:
        node = self.nodes.get(node_id)
        if node is None:
            raise KeyError(f"node_id {node_id!r} is not registered")
        return node

    def free_dram(self, node: NodeState) -> int:
        space = node.spaces.get(Tier.DRAM)
        return space.allocator.free_bytes if space is not None else 0

    def fastest_tier(self, node: NodeState) -> Tier | None:
        return next(iter(node.spaces), None)  # spaces are built fastest first

    def record(self, slot: int) -> ObjectRecord:
        i = self.index
        return ObjectRecord(key=i.key_at(slot), ns_digest=i.ns_digest(int(i.ns[slot])),
                            node_id=self.by_number[int(i.node[slot])].node_id, tier=Tier(int(i.tier[slot])),
                            offset=int(i.offset[slot]), size=int(i.size[slot]), checksum=int(i.checksum[slot]))

    # ---- where a new object goes ----

    def place(self, size: int, prefer_node: str | None, exclude: set[int], max_atime: int | None = None
              ) -> tuple[NodeState, Tier, int] | None:
        """The fastest tier first (HBM where a node has it, then DRAM, then SSD): on the preferred node, else on the
        node with the most free DRAM (evicting/demoting there if needed), else the same order one tier down, down to
        SSD (objects larger than any DRAM tier, or DRAM full of leased/uncommitted objects). Never on a node whose
        number is in `exclude` (draining, or not connected). `max_atime`: see `allocate`."""
        nodes = [n for n in self.nodes.values() if n.number not in exclude]
        if len(nodes) > 1:
            nodes.sort(key=lambda n: (n.node_id != prefer_node, -self.free_dram(n)))
        for tier in _PLACE_ORDER:
            for node in nodes:
                offset = self.allocate(node, tier, size, max_atime)
                if offset is not None:
                    return node, tier, offset
        return None

    # ---- policies ----

    def insert_committed(self, slots: list[int], keys: list[bytes]) -> None:
        """Newly committed objects enter their tier's policy, one chain per (node, tier) in the order given."""
        index = self.index
        chains: dict[tuple[int, int], tuple[list[int], list[bytes]]] = {}
        for slot, key in zip(slots, keys):
            chain = chains.get(n_t := (int(index.node[slot]), int(index.tier[slot])))
            if chain is None:
                chain = chains[n_t] = ([], [])
            chain[0].append(slot)
            chain[1].append(key)
        for (number, tier), (chain_slots, chain_keys) in chains.items():
            self.by_number[number].spaces[_TIERS[tier]].policy.insert_chain(chain_slots, chain_keys)

    def touch(self, slots: np.ndarray) -> None:
        """A hit on a chain: its policies see it used, parents before tails."""
        if not len(slots):
            return
        index = self.index
        nodes, tiers = index.node[slots], index.tier[slots]
        by_number = self.by_number
        if (nodes == nodes[0]).all() and (tiers == tiers[0]).all():  # the common case: one chain, one tier
            by_number[int(nodes[0])].spaces[_TIERS[int(tiers[0])]].policy.touch_chain(slots)  # numpy: see LRUPolicy
            return
        chains: dict[tuple[int, int], list[int]] = {}
        for slot, n, t in zip(slots.tolist(), nodes.tolist(), tiers.tolist()):
            chains.setdefault((n, t), []).append(slot)
        for (number, tier), chain in chains.items():
            by_number[number].spaces[_TIERS[tier]].policy.touch_chain(chain)

    # ---- object lifecycle ----

    def forget(self, slot: int, *, free_extent: bool = True, drops: list[Drop] | None = None) -> None:
        """Remove an object from the index, its policy and (optionally) its allocator. A leased object is only
        unlinked (DOOMED); `release` frees it when the last lease ends. Freeing an SSD extent tells the node to
        erase the record: appended to `drops` (the caller sends them before reusing space) or sent now."""
        index = self.index
        key = index.key_at(slot)
        node = self.node_of(slot)
        space = node.spaces.get(_TIERS[index.tier[slot]]) if node is not None else None
        state = int(index.state[slot])
        if state == COMMITTED or state == PENDING:
            if state == COMMITTED:
                self.journal.gone(key, slot)
                if space is not None:
                    space.policy.remove(slot, key)
            if index.leases[slot] > 0:
                index.unlink_key(slot)
                index.state[slot] = State.DOOMED
                return
        if free_extent and space is not None:
            offset = int(index.offset[slot])
            space.allocator.free(offset)
            if space.tier is _SSD:
                drop = Drop(key, _SSD, offset, int(index.size[slot]))
                if drops is None:
                    node.ops.drop([drop])
                else:
                    drops.append(drop)
        index.free(slot)

    # ---- allocation with eviction ----

    def allocate(self, node: NodeState, tier: Tier, size: int, max_atime: int | None = None) -> int | None:
        """`max_atime` (a drain moving an object in): only victims last used at or before that tick may go, so a
        departing node's cold objects never push out the hotter objects already here."""
        space = node.spaces.get(tier)
        if space is None:
            return None
        extent = space.extent_size(size)
        if space.allocator.rounded(extent) > space.allocator.capacity:
            return None
        offset = space.allocator.allocate(extent)
        while offset is None:
            victims = self._pick_victims(space, extent, max_atime)
            if not victims:
                return None
            lower = _slower(node, tier)
            if lower is not None:
                self._demote(node, tier, lower, victims, max_atime)
            else:
                self._evict(node, space, victims)
            offset = space.allocator.allocate(extent)
        return offset

    def _pick_victims(self, space: TierSpace, extent: int, max_atime: int | None = None) -> list[int]:
        alloc = space.allocator
        need = alloc.rounded(extent) - alloc.free_bytes
        index = self.index
        victims: list[int] = []
        freed = 0
        for slot in space.policy.victims():
            if index.leases[slot] > 0 or index.state[slot] != COMMITTED:
                continue
            if max_atime is not None and int(index.atime[slot]) > max_atime:
                continue
            victims.append(slot)
            freed += alloc.rounded(space.extent_size(int(index.size[slot])))
            if freed >= need:
                break
        return victims

    def _evict(self, node: NodeState, space: TierSpace, victims: list[int]) -> None:
        drops: list[Drop] = []
        for slot in victims:
            self.forget(slot, drops=drops)
        if drops:
            node.ops.drop(drops)
        self.count_evictions(space.tier, len(victims))

    def count_evictions(self, tier: Tier, n: int) -> None:
        self.counters.count(self.counters.evictions, tier, n)

    def _demote(self, node: NodeState, src_tier: Tier, dst_tier: Tier, victims: list[int],
                max_atime: int | None = None) -> None:
        index = self.index
        src = node.spaces[src_tier]
        dst = node.spaces[dst_tier]
        # Room below first (it may push that tier's own victims further down, never these), then one batched copy.
        targets = [self.allocate(node, dst_tier, int(index.size[s]), max_atime) for s in victims]
        moves = [Move(index.key_at(s), index.ns_digest(int(index.ns[s])), int(index.size[s]),
                      int(index.checksum[s]), src_tier, int(index.offset[s]), dst_tier, t)
                 for s, t in zip(victims, targets) if t is not None]
        results = iter(node.ops.demote(moves) if moves else [])
        for slot, target in zip(victims, targets):
            ok = target is not None and next(results)
            if not ok:
                if target is not None:
                    dst.allocator.free(target)
                self.forget(slot)
                self.count_evictions(src_tier, 1)
                continue
            key = index.key_at(slot)
            src.allocator.free(int(index.offset[slot]))
            src.policy.remove(slot, key)
            index.tier[slot] = dst_tier
            index.offset[slot] = target
            dst.policy.insert_chain([slot], [key])
            self.journal.touched(slot)
            self.counters.count(self.counters.demotions, src_tier)

    def relocate(self, slot: int, node: NodeState, tier: Tier, offset: int) -> int:
        """Re-index a committed object at a new extent (its bytes were copied there): a new slot with the same key,
        namespace, checksum and last use, entered into the new tier's policy as just used. The old slot must be
        pinned by the caller: `forget` then only unlinks it (DOOMED), so readers holding a lease on the old extent
        keep their bytes; the caller's unpin frees it once nobody reads it. Returns the new slot."""
        index = self.index
        key = index.key_at(slot)
        ns, checksum, atime, size = int(index.ns[slot]), int(index.checksum[slot]), int(index.atime[slot]), \
            int(index.size[slot])
        self.forget(slot)
        new = index.add(key, node=node.number, tier=tier, state=State.COMMITTED, offset=offset, size=size, ns=ns,
                        checksum=checksum, atime=atime)
        node.spaces[tier].policy.insert_chain([new], [key])
        self.journal.touched(new)
        return new

    # ---- recovery ----

    def same_place(self, slot: int, node: NodeState, r: ObjectRecord) -> bool:
        i = self.index
        return (int(i.node[slot]) == node.number and int(i.tier[slot]) == r.tier and int(i.offset[slot]) == r.offset
                and int(i.size[slot]) == r.size)

    def adopt(self, node: NodeState, records: list[ObjectRecord], dropped: list[bytes], atime: int = 0) -> int:
        """Index records (new keys, on tiers the node has) as committed objects at their reported extents, last
        accessed at `atime` (master ticks). Records whose extent overlaps anything already allocated are appended to
        `dropped`. Returns how many were adopted."""
        by_tier: dict[Tier, list[ObjectRecord]] = {}
        for r in records:
            by_tier.setdefault(Tier(r.tier), []).append(r)
        adopted = 0
        for tier, group in by_tier.items():
            space = node.spaces[tier]
            try:
                space.allocator.reserve_many([(r.offset, space.extent_size(r.size)) for r in group])
                kept = group
            except ValueError:
                kept = []
                for r in group:  # slow path: something overlaps; find out which, one by one
                    try:
                        space.allocator.reserve(r.offset, space.extent_size(r.size))
                        kept.append(r)
                    except ValueError:
                        dropped.append(r.key)
            slots = []
            for r in kept:
                slot = self.index.add(r.key, node=node.number, tier=tier, state=State.COMMITTED, offset=r.offset,
                                      size=r.size, ns=self.index.intern_ns(r.ns_digest), checksum=r.checksum,
                                      atime=atime)
                self.journal.touched(slot)
                slots.append(slot)
            for slot, r in zip(slots, kept):  # recency is unknown after a restart: scan order, one at a time
                space.policy.insert_chain([slot], [r.key])
            adopted += len(kept)
        return adopted
