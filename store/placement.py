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
the policy order; orphans (blocks whose parent left the pool, store/chains.py) come first; objects with a live
retention hint (store/retention.py) come last, only when the unpinned ones cannot make the room. Every byte move goes
through the node's `NodeOps`, batched per round, and inside `batched_ops` (a put_start, a promotion round, a drain's
migrate_start) per operation: one Demote call per node carrying the drops (store/node_calls.py).
Drops are sent before the writes that may reuse their extents (an SSD erase must never land on a new record); a
put's calls whose extents it handed out again (a Drop of them; a Demote of dirty victims from them) are sent by
put_start after the lock (`batched_ops(defer=True)`), their objects in flight until it settles them. In a master
process a put's drops-only calls are queued instead (`erasures`, store/erasures.py), sent after its answer by the
eraser thread; every call that writes a node's SSD extents flushes that node's queue first.

Inclusive SSD tier (`write_behind`, store/copies.py): an object placed on a faster tier of a node with an SSD
also gets an SSD extent at once; a demotion onto a clean copy moves no bytes, a promoted SSD record stays as the
copy, and an object leaving frees and erases its copy with it.

Where a new object goes (`place`): a fast tier with free room, and free room for its copy, on any node (the
preferred node, then the most free); only when no node has that, room is made by demotion on a node whose slowest
tier still has room (the most free first), so with N equal nodes nothing is evicted until the whole pool is full.

With tenant quotas (store/quota.py) every policy is wrapped so each tenant's own recency lists follow it; `evict`
and `shed` take a tenant's own victims out (`shed` one tier down, without evicting anyone else's objects there),
inside the put's batch like any other room made.

Why one module of ~1,020 lines: placement, the eviction rounds, demotion and promotion moves (and their batched node
calls' settling, a put's deferred calls' too), drain targets, a node's removal (its objects LEAVING, then forgotten
a chunk at a time) and the adoption of a restarted node's records all change the same per-node allocators and
policies, in one order, under the master's lock; the inclusive copies' bookkeeping and the queued node calls are
apart (store/copies.py, store/node_calls.py).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from kvpool.store.chains import ORPHAN, Chains
from kvpool.store.copies import Copies
from kvpool.store.erasures import Erasures
from kvpool.store.index import COMMITTED, LEAVING, MAX_SIZE, NO_COPY, PENDING, Index, State
from kvpool.store.journal import Journal
from kvpool.store.node import Drop, Move, NodeOps
from kvpool.store.node_calls import Deferred, DeferredCall, Demotion, NodeCalls
from kvpool.store.records import NodeInfo, ObjectRecord
from kvpool.store.retention import Retention
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
    leaving: bool = False           # removed: its objects are being forgotten (`Placement.forget_leaving`)
    # The key this master signs the node's write grants with where the node says `write_keys` (store/tokens.py),
    # handed to it at registration: new with every NodeState, so a grant made for an earlier process of the node, or
    # by an earlier master process, does not verify at this one (its extent may be someone else's by now)
    write_key: bytes = field(default_factory=lambda: os.urandom(32))


@dataclass(slots=True)
class Leaving:
    """A removed node whose objects are being forgotten (`Placement.forget_leaving`)."""

    node: NodeState
    slots: np.ndarray               # its objects' slots when it left (LEAVING), in slot order
    done: int = 0                   # how many of them have been passed


@dataclass(slots=True)
class Counters:
    """Object movements, each by the tier the object LEFT. The tiers every pool has start at 0 (so their series
    exist from the start); "hbm" appears on first use."""

    evictions: dict[str, int] = field(default_factory=lambda: {"dram": 0, "ssd": 0})
    demotions: dict[str, int] = field(default_factory=lambda: {"dram": 0})
    promotions: dict[str, int] = field(default_factory=lambda: {"ssd": 0})
    ssd_corrupt: int = 0
    dram_corrupt: int = 0           # DRAM/HBM objects a reader found changed under their checksum (a late write)
    orphaned: int = 0               # blocks that lost an ancestor while they stayed (offered first for eviction)

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

    def __init__(self, index: Index, policy_name: str, journal: Journal, *, write_behind: bool = False) -> None:
        self.index = index
        self.policy_name = policy_name
        self.journal = journal
        self.chains = Chains(index)
        self.copies = Copies(index, write_behind, self.allocate)
        self.retention = Retention(index)
        self.nodes: dict[str, NodeState] = {}
        self.by_number: list[NodeState | None] = []
        self.counters = Counters()
        self.has_hbm = False            # some node registered an HBM tier: DRAM hits are worth promoting
        self.has_fast = False           # some node registered HBM or DRAM: SSD hits are worth promoting
        self.track = None               # store.quota.TenantLists: per-tenant recency beside each policy (quotas)
        self.owner_of = lambda key: 0   # the tenant of a re-adopted object, by its stored key (store/tenants.py)
        self.tenant_name = lambda tenant: ""  # a tenant id's name, for records
        self._moved: list[int] = []     # slots whose object changed extent since `take_moved` (demoted, relocated)
        self._evicted: list[tuple[int, int, bytes]] = []    # (node number, tenant id, key) that left a node since
                                                            # `take_evicted` (evicted, or drained elsewhere)
        self._calls: dict[int, NodeCalls] | None = None     # per node number, inside `batched_ops`
        self.erasures = Erasures()      # a put's SSD erases sent after its answer (store/erasures.py)
        self._in_flight: set[int] = set()   # slots a deferred move carries, until `settle_deferred`
        self._leaving: dict[int, Leaving] = {}     # per removed node's number, oldest removal first

    def _new_policy(self, tier: Tier):
        policy = make_policy(self.policy_name)
        if self.track is not None:
            from kvpool.store.quota import TrackedPolicy

            policy = TrackedPolicy(policy, self.track, tier)
        return policy

    # ---- nodes ----

    def add_node(self, info: NodeInfo, ops: NodeOps) -> NodeState:
        spaces = {}
        self.has_fast = self.has_fast or info.hbm_bytes > 0 or info.dram_bytes > 0
        if info.hbm_bytes > 0:
            self.has_hbm = True
            spaces[Tier.HBM] = TierSpace(Tier.HBM, OffsetAllocator(info.hbm_bytes, info.alignment),
                                         self._new_policy(Tier.HBM))
        if info.dram_bytes > 0:
            spaces[Tier.DRAM] = TierSpace(Tier.DRAM, OffsetAllocator(info.dram_bytes, info.alignment),
                                          self._new_policy(Tier.DRAM))
        if info.ssd_bytes > 0:
            spaces[Tier.SSD] = TierSpace(Tier.SSD, OffsetAllocator(info.ssd_bytes, info.alignment),
                                         self._new_policy(Tier.SSD), overhead=info.ssd_record_overhead)
        # Numbers are never reused: a DOOMED slot of a dropped node must not free an extent of its successor.
        number = len(self.by_number)
        if number > 0xFFFF:
            raise ValueError("node_id: more than 65536 node registrations in one master lifetime")
        state = NodeState(info.node_id, number, info, ops, spaces)
        self.by_number.append(state)
        self.nodes[info.node_id] = state
        return state

    def remove_node(self, node_id: str) -> int:
        """Take a node out of the pool; returns how many committed objects it held (misses from now on).

        At once, whatever the node's size: it leaves `nodes` (nothing lands on it, and its id may register again as a
        new number), and its committed objects turn LEAVING in one numpy pass (`Index.leave`). LEAVING is not
        COMMITTED, so every reader of the index passes them by from this moment, as it passes uncommitted ones:
        lookups, `contains`, inspect and list, evictions, quotas, promotions, copy rounds, drains. Its uncommitted
        slots are forgotten now.
        The LEAVING ones are forgotten by `forget_leaving`, a chunk per call, so the master's lock is never held for
        all of them at once (a node of a million objects took ~3 s in one piece); a key put or reported again before
        its turn is forgotten first (`forget_leaving_keys`). The NodeState stays in `by_number`, marked `leaving`, until
        the last is forgotten: freeing its extents is skipped (its allocators go with it), its policies still drop
        each object (the per-tenant lists of store/quota.py follow them). A DOOMED slot still leased stays until its
        last release, as before."""
        state = self.nodes.pop(node_id)
        state.leaving = True
        self.erasures.forget(state.number)      # its queued erases go nowhere (a new process reports afresh)
        index = self.index
        slots = index.slots()
        slots = slots[index.node[slots] == state.number]
        states = index.state[slots]
        committed = slots[states == COMMITTED]
        index.leave(committed)
        # uncommitted ones (their grants ended with the node): now; a DOOMED slot still leased stays (the reader's
        # lease names it: its last release frees it)
        for slot in slots[(states == PENDING) | ((states == State.DOOMED) & (index.leases[slots] == 0))].tolist():
            self.forget(slot, free_extent=False)
        self.copies.forget_node(state.number)
        if len(committed):
            self._leaving[state.number] = Leaving(state, committed)
        else:
            self.by_number[state.number] = None
        return len(committed)

    @property
    def leaving(self) -> int:
        """Objects of removed nodes not forgotten yet (`forget_leaving`): 0 at once when no node is leaving, else one
        numpy pass over their remaining slots."""
        index = self.index
        n = 0
        for number, entry in self._leaving.items():
            rest = entry.slots[entry.done:]
            n += int(np.count_nonzero((index.state[rest] == LEAVING) & (index.node[rest] == number)))
        return n

    def forget_leaving(self, limit: int) -> tuple[int, bool]:
        """Forget up to `limit` objects of removed nodes (`remove_node`), oldest removal first. Returns (how many
        slots were passed, whether any are left). A slot forgotten meanwhile (`forget_leaving_keys`, and perhaps
        taken by an object of another node since) is passed by. A node whose last object goes leaves `by_number`."""
        index = self.index
        done = 0
        for number, entry in list(self._leaving.items()):
            slots, start = entry.slots, entry.done
            end = min(start + limit - done, len(slots))
            chunk = slots[start:end]
            for slot in chunk[(index.state[chunk] == LEAVING) & (index.node[chunk] == number)].tolist():
                self.forget(slot)
            entry.done = end
            done += end - start
            if end == len(slots):
                del self._leaving[number]
                self.by_number[number] = None
            if done >= limit:
                break
        return done, bool(self._leaving)

    def forget_leaving_keys(self, keys: Sequence[bytes]) -> None:
        """Forget now the objects of removed nodes among `keys` (a put or a node's report of them must find them
        gone, not EXISTS or a conflict). Nothing to do, as almost always: returns at once."""
        if not self._leaving:
            return
        find, state = self.index.find, self.index.state
        for key in keys:
            slot = find(key, -1)
            if slot >= 0 and state[slot] == LEAVING:
                self.forget(slot)

    def node_of(self, slot: int) -> NodeState | None:
        return self.by_number[int(self.index.node[slot])]

    def node(self, node_id: str) -> NodeState:
        node = self.nodes.get(node_id)
        if node is None:
            raise KeyError(f"node_id {node_id!r} is not registered")
        return node

    def holds_shared(self, node: NodeState) -> bool:
        """Whether `node` has any extent in its DRAM or SSD tier (what its host index can show)."""
        return any(space.allocator.num_allocations for tier, space in node.spaces.items()
                   if tier in (Tier.DRAM, Tier.SSD))

    def capacity(self) -> int:
        """Bytes of every tier of every node (what retention caps are a share of)."""
        return sum(space.allocator.capacity for node in self.nodes.values() for space in node.spaces.values())

    def free_dram(self, node: NodeState) -> int:
        space = node.spaces.get(Tier.DRAM)
        return space.allocator.free_bytes if space is not None else 0

    def fastest_tier(self, node: NodeState) -> Tier | None:
        return next(iter(node.spaces), None)  # spaces are built fastest first

    def record(self, slot: int) -> ObjectRecord:
        i = self.index
        return ObjectRecord(key=i.key_at(slot), ns_digest=i.ns_digest(int(i.ns[slot])),
                            node_id=self.by_number[int(i.node[slot])].node_id, tier=Tier(int(i.tier[slot])),
                            offset=int(i.offset[slot]), size=int(i.size[slot]), checksum=int(i.checksum[slot]),
                            tenant=self.tenant_name(int(i.tenant[slot])),
                            pinned_until=self.retention.end_of(slot) if i.retained else 0.0)

    # ---- where a new object goes ----

    def place(self, size: int, prefer_node: str | None, exclude: set[int], max_atime: int | None = None,
              skip: frozenset = frozenset()) -> tuple[NodeState, Tier, int] | None:
        """Where a new object of `size` bytes goes (see the module docstring). Never on a node whose number is in
        `exclude` (draining, stopping, or not connected), never on a tier in `skip` (a tenant at its DRAM quota,
        store/quota.py). `max_atime`: see `allocate`. The caller reserves the SSD copy (`copies.reserve`) once the
        object has a slot."""
        nodes = [n for n in self.nodes.values() if n.number not in exclude]
        if not nodes:
            return None
        best = None
        for node in nodes:  # 1. free room on a node's fastest tier (and for its copy): nothing moves
            tier = self.fastest_tier(node)
            if tier is None or tier is _SSD or tier in skip:
                continue
            space = node.spaces[tier]
            if not space.allocator.can_allocate(space.extent_size(size)):
                continue
            if self.copies.on(node, tier) and not self.copies.fits(node, size):
                continue
            rank = (tier, node.node_id != prefer_node, -space.allocator.free_bytes)
            if best is None or rank < best[0]:
                best = (rank, node, space)
        if best is not None:
            _, node, space = best
            return node, space.tier, space.allocator.allocate(space.extent_size(size))
        # 2. room made by moving objects down: first where that evicts nothing (the bottom tier has room for one
        # more extent of this size), the object landing on the fastest tier that can hold it, the node with the most
        # free bottom first; evicting only where no node can avoid it, i.e. when the pool is full
        def rank(n: NodeState) -> tuple:
            bottom = next(reversed(n.spaces.values()))       # spaces are built fastest first
            land = next((t for t, sp in n.spaces.items() if sp.allocator.rounded(sp.extent_size(size))
                         <= sp.allocator.capacity), _SSD)
            return (not bottom.allocator.can_allocate(bottom.extent_size(size)), land, -bottom.allocator.free_bytes,
                    n.node_id != prefer_node)

        nodes = [n for n in nodes if n.spaces]
        nodes.sort(key=rank)
        for node in nodes:
            for tier in (_PLACE_ORDER if not skip else [t for t in _PLACE_ORDER if t not in skip]):
                offset = self.allocate(node, tier, size, max_atime)
                if offset is not None:
                    return node, tier, offset
        return None

    def place_new(self, keys: Sequence[bytes], sizes: Sequence[int], prefer_node: str | None,
                  exclude: set[int]) -> list[tuple[NodeState, Tier, int]]:
        """`place_many` for the keys of a put batch that are not stored yet, each key once (a repeat finds the
        first one's grant): their placements in order, as far as free room takes them. Only for a batch whose new
        objects are all one size (KV blocks are); otherwise none."""
        find = self.index.find
        seen: set[bytes] = set()
        size = -1
        for key, n in zip(keys, sizes):
            if key in seen or find(key, -1) >= 0:
                continue
            seen.add(key)
            if size != n:
                if size != -1:
                    return []
                size = n
        return self.place_many(size, len(seen), prefer_node, exclude) if seen else []

    def place_many(self, size: int, count: int, prefer_node: str | None,
                   exclude: set[int]) -> list[tuple[NodeState, Tier, int]]:
        """What `count` calls of `place(size, prefer_node, exclude)` would return, in order, as long as
        each lands in free room, moving nothing (rule 1, or rule 2 landing on an SSD-only node's free room); it
        stops before the first that would move or evict objects, which the caller places with `place`. A node's
        objects are carved in one allocator call (`allocate_many`) while it stays the first choice: always, unless
        another node ties with it (same tier and preference, or two SSD-only nodes), in which case the most free
        bytes decides object by object, as `place` does. Empty when objects get SSD copies (the copy's room is part
        of each choice): the caller places those one by one."""
        cands = []
        for node in self.nodes.values():
            if node.number in exclude:
                continue
            tier = self.fastest_tier(node)
            if tier is None or tier is _SSD:
                continue
            if self.copies.on(node, tier):
                return []
            space = node.spaces[tier]
            cands.append((tier, node.node_id != prefer_node, node, space.allocator, space.extent_size(size)))
        out: list[tuple[NodeState, Tier, int]] = []
        self._carve(cands, count, out)
        if len(out) < count:
            # Rule 2 moves nothing when it lands on an SSD-only node's free room: that is its first choice when
            # every other node's slowest tier is full (a node with a faster tier and room below it would demote)
            ssd_only = []
            for node in self.nodes.values():
                if node.number in exclude or not node.spaces:
                    continue
                bottom = next(reversed(node.spaces.values()))
                if self.fastest_tier(node) is _SSD:
                    ssd_only.append((_SSD, False, node, bottom.allocator, bottom.extent_size(size)))
                elif bottom.allocator.can_allocate(bottom.extent_size(size)):
                    return out
            self._carve(ssd_only, count, out, prefer_node=prefer_node)   # the most free, then the preferred node
        return out

    @staticmethod
    def _carve(cands: list[tuple], count: int, out: list, prefer_node: str | None = None) -> None:
        """Allocate for `place_many` on the best candidate (tier, rank, node, allocator, extent) by (tier, rank,
        most free bytes[, preferred when `prefer_node`]), one allocator call per run on the same node."""
        while len(out) < count:
            best = None
            for c in cands:
                alloc = c[3]
                if alloc.can_allocate(c[4]):
                    rank = (c[0], c[1], -alloc.free_bytes, c[2].node_id != prefer_node)
                    if best is None or rank < best[0]:
                        best = (rank, c)
            if best is None:
                return
            tier, _, node, alloc, extent = c = best[1]
            rivals = any(d is not c and d[:2] == c[:2] and d[3].can_allocate(d[4]) for d in cands)
            want = 1 if rivals else count - len(out)
            out.extend((node, tier, off) for off in alloc.allocate_many(extent, want))

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
        if slots:
            arr = np.asarray(slots, dtype=np.int64)
            orphans = arr[index.parent[arr] == ORPHAN]   # put below a block that left meanwhile
            if len(orphans):
                self.mark_orphans(orphans.tolist())

    def mark_orphans(self, slots: list[int]) -> None:
        """Blocks no prefix lookup can reach any more: their policies offer them first (committed ones only; the
        others are in no policy yet)."""
        index = self.index
        by_space: dict[tuple[int, int], list[int]] = {}
        for slot in slots:
            if int(index.state[slot]) == COMMITTED:
                by_space.setdefault((int(index.node[slot]), int(index.tier[slot])), []).append(slot)
        for (number, tier), group in by_space.items():
            node = self.by_number[number]
            if node is not None and _TIERS[tier] in node.spaces:
                node.spaces[_TIERS[tier]].policy.mark_orphans(group)
                self.counters.orphaned += len(group)

    def touch(self, slots: np.ndarray, tiers: list[int] | None = None) -> None:
        """A hit on a chain: its links are confirmed and its policies see it used, parents before tails. `tiers`:
        the slots' tiers as a list, when the caller has them already."""
        if not len(slots):
            return
        self.chains.confirm(slots)
        index = self.index
        nodes = index.node[slots].tolist()
        if tiers is None:
            tiers = index.tier[slots].tolist()
        by_number = self.by_number
        if nodes.count(nodes[0]) == len(nodes) and tiers.count(tiers[0]) == len(tiers):  # one chain, one tier
            by_number[nodes[0]].spaces[_TIERS[tiers[0]]].policy.touch_chain(slots)  # numpy: see LRUPolicy
            return
        chains: dict[tuple[int, int], list[int]] = {}
        for slot, n, t in zip(slots.tolist(), nodes, tiers):
            chains.setdefault((n, t), []).append(slot)
        for (number, tier), chain in chains.items():
            by_number[number].spaces[_TIERS[tier]].policy.touch_chain(chain)

    # ---- object lifecycle ----

    def forget(self, slot: int, *, free_extent: bool = True, drops: list[Drop] | None = None,
               keep_extent: bool = False) -> None:
        """Remove an object from the index, its policy, its chain and (optionally) its allocators. A leased object is
        only unlinked (DOOMED); `release` frees it when the last lease ends. Freeing an SSD extent (the object's, or
        its copy's) tells the node to erase the record: appended to `drops` (the caller sends them before reusing
        space), else sent now, or inside `batched_ops` with the operation's one call per node. Blocks below it lose
        their way in: they are marked orphans."""
        index = self.index
        key = index.key_at(slot)
        node = self.node_of(slot)
        space = node.spaces.get(_TIERS[index.tier[slot]]) if node is not None else None
        state = int(index.state[slot])
        leaving = state == LEAVING
        if leaving:     # its node was removed (`remove_node`): a committed object whose extents went with it, and
            state, free_extent = COMMITTED, False   # whose journal record went with the node's (`Journal.node_gone`)
        if state == COMMITTED or state == PENDING:
            if state == COMMITTED:
                if not leaving:
                    self.journal.gone(key, slot)
                if space is not None:
                    space.policy.remove(slot, key)
            self.copies.dirty.pop(key, None)
            orphans = self.chains.detach(slot)
            if orphans:
                self.mark_orphans(orphans)
            if index.leases[slot] > 0:
                index.doom(slot)
                return
        if free_extent and node is not None and not node.leaving:
            own: list[Drop] = []
            offset = int(index.offset[slot])
            if space is not None and offset >= 0 and not keep_extent:   # < 0: its extent went on (`relocate`);
                # keep_extent: the caller frees it later (`free_held`: an expired grant a writer may still fill)
                if space.tier is _SSD:
                    self.copies.free_ssd(node, key, offset, int(index.size[slot]), own)
                else:
                    space.allocator.free(offset)
            copy = self.copies.offset(slot)
            if copy is not None and _SSD in node.spaces:
                self.copies.free_ssd(node, key, copy, int(index.size[slot]), own)
            if own:
                if drops is None:
                    self._drop(node, own)     # now, or with the operation's batch (`batched_ops`)
                else:
                    drops.extend(own)
        index.free(slot)

    def free_held(self, number: int, offsets: list[int]) -> None:
        """Free DRAM extents of node `number` that `forget(..., keep_extent=True)` kept allocated (store/
        held_extents.py). Nothing to do for a node that left: its allocators went with it."""
        node = self.by_number[number] if number < len(self.by_number) else None
        if node is None or node.leaving:
            return
        allocator = node.spaces[Tier.DRAM].allocator
        for offset in offsets:
            allocator.free(offset)

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
            if self.settle(victims):
                # a victim moved in this batch: its move went first, and its answer may have evicted it already
                offset = space.allocator.allocate(extent)
                continue
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
        pinned = index.retained
        protects = self.retention.protects
        held: list[int] = []        # pinned victims, coldest first: they go only if the unpinned ones are not enough
        for slot in space.policy.victims():
            if index.leases[slot] > 0 or index.state[slot] != COMMITTED:
                continue
            if max_atime is not None and int(index.atime[slot]) > max_atime:
                continue
            if pinned and protects(slot):
                held.append(slot)
                continue
            victims.append(slot)
            freed += alloc.rounded(space.extent_size(int(index.size[slot])))
            if freed >= need:
                self.pass_over(held)
                return victims
        for slot in held:       # a pin is a hint: it yields rather than make the pool refuse a put
            victims.append(slot)
            self.retention.counters.yielded += 1
            freed += alloc.rounded(space.extent_size(int(index.size[slot])))
            if freed >= need:
                break
        return victims

    def pass_over(self, held: list[int]) -> None:
        """Pinned objects a victim pick passed over (coldest first) go to the hot end of their policies, their order
        kept (the coldest pin still yields first): a pass counts as a use. Else every later pick on a full tier, or
        of a tenant at its quota (store/quota.py), walks the whole pinned set again first: 138.7 ms per 32-object
        put with 8,192 pinned objects, 0.8 ms with none."""
        if not held:
            return
        index = self.index
        groups: dict[tuple[int, int], list[int]] = {}
        for slot in held:
            groups.setdefault((int(index.node[slot]), int(index.tier[slot])), []).append(slot)
        for (number, tier), slots in groups.items():
            self.by_number[number].spaces[_TIERS[tier]].policy.touch_chain(slots[::-1])

    def settle(self, victims: Sequence[int]) -> bool:
        """Inside `batched_ops`: send, and settle, the queued calls of each node where one of `victims` was moved in
        this batch, so that move goes first and its answer (a refused move evicts its object) is in the index before
        the victim is touched again; the caller then picks its victims again. Returns whether anything was sent."""
        if not self._calls:
            return False
        sent = False
        for calls in self._calls.values():
            if calls.slots and not calls.slots.isdisjoint(victims):
                self._send(calls)
                sent = True
        return sent

    def evict(self, victims: Sequence[int]) -> None:
        """Evict committed, unleased objects wherever they are (a tenant over its total quota, store/quota.py):
        forgotten, their SSD records erased (queued inside `batched_ops`), their nodes' host indexes told. The
        caller has settled them (`settle`)."""
        groups: dict[tuple[int, int], list[int]] = {}
        for slot in victims:
            groups.setdefault((int(self.index.node[slot]), int(self.index.tier[slot])), []).append(slot)
        for (number, tier), slots in groups.items():
            node = self.by_number[number]
            self._evict(node, node.spaces[_TIERS[tier]], slots)

    def _evict(self, node: NodeState, space: TierSpace, victims: list[int]) -> None:
        drops: list[Drop] = []
        index = self.index
        for slot in victims:
            self._evicted.append((node.number, int(index.tenant[slot]), index.key_at(slot)))
            self.forget(slot, drops=drops)
        if drops:
            self._drop(node, drops)
        self.count_evictions(space.tier, len(victims))

    def count_evictions(self, tier: Tier, n: int) -> None:
        self.counters.count(self.counters.evictions, tier, n)

    def shed(self, victims: list[int]) -> tuple[int, int]:
        """Move committed, unleased objects out of their tier (a tenant over its DRAM quota, store/quota.py): one tier
        down on their node where that tier has free room now (nobody else's object is pushed out for them), else
        evicted. Returns (demoted, evicted)."""
        groups: dict[tuple[int, int], list[int]] = {}
        for slot in victims:
            groups.setdefault((int(self.index.node[slot]), int(self.index.tier[slot])), []).append(slot)
        demoted = 0
        for (number, tier), slots in groups.items():
            node = self.by_number[number]
            lower = _slower(node, _TIERS[tier])
            if lower is not None:
                demoted += self._demote(node, _TIERS[tier], lower, slots, make_room=False)
            else:
                self._evict(node, node.spaces[_TIERS[tier]], slots)
        return demoted, len(victims) - demoted

    def _demote(self, node: NodeState, src_tier: Tier, dst_tier: Tier, victims: list[int],
                max_atime: int | None = None, make_room: bool = True) -> int:
        """Returns how many moved (the others were evicted). `make_room` False: only free room below is used."""
        index = self.index
        src = node.spaces[src_tier]
        dst = node.spaces[dst_tier]
        # Where each victim goes: its own SSD copy (clean: nothing to move; dirty: written now), else room below
        # (which may push that tier's own victims further down, never these), then one batched copy.
        targets: list[int | None] = []
        reserved: list[bool] = []
        clean: list[bool] = []
        for s in victims:
            copy = self.copies.offset(s) if dst_tier is _SSD else None
            if copy is not None:
                targets.append(copy)
                reserved.append(True)
                clean.append(index.key_at(s) not in self.copies.dirty)
            elif make_room:
                targets.append(self.allocate(node, dst_tier, int(index.size[s]), max_atime))
                reserved.append(False)
                clean.append(False)
            else:  # only room already free below (a tenant's own quota shedding pushes nobody else out)
                targets.append(dst.allocator.allocate(dst.extent_size(int(index.size[s]))))
                reserved.append(False)
                clean.append(False)
        moves = [Move(index.key_at(s), index.ns_digest(int(index.ns[s])), int(index.size[s]),
                      int(index.checksum[s]), src_tier, int(index.offset[s]), dst_tier, t)
                 for s, t, c in zip(victims, targets, clean) if t is not None and not c]
        if self._calls is not None:
            return self._queue_demotions(node, src_tier, dst_tier, victims, targets, reserved, clean, moves)
        results = iter(node.ops.demote(moves) if moves else [])
        moved = 0
        for slot, target, own, done in zip(victims, targets, reserved, clean):
            ok = target is not None and (done or next(results))
            if not ok:
                if target is not None and not own:
                    dst.allocator.free(target)
                self._evict_one(node, slot, src_tier)  # frees a reserved copy with the object
                continue
            self._move_index(slot, src, dst, target, own)
            self._demoted(slot, src_tier)
            moved += 1
        return moved

    def _move_index(self, slot: int, src: TierSpace, dst: TierSpace, target: int, own: bool) -> None:
        """Index a demoted object at its target extent of the tier below (`own`: its SSD copy, which is the object
        now): the source extent freed, the policies switched."""
        index = self.index
        key = index.key_at(slot)
        src.allocator.free(int(index.offset[slot]))
        src.policy.remove(slot, key)
        index.set_tier(slot, dst.tier)
        index.offset[slot] = target
        if own:
            index.copy[slot] = NO_COPY
            self.copies.dirty.pop(key, None)
        dst.policy.insert_chain([slot], [key])

    def _evict_one(self, node: NodeState, slot: int, tier: Tier, drops: list[Drop] | None = None) -> None:
        """An object that could not be moved down leaves the pool."""
        self._evicted.append((node.number, int(self.index.tenant[slot]), self.index.key_at(slot)))
        self.forget(slot, drops=drops)
        self.count_evictions(tier, 1)

    # ---- node calls batched per operation (store/node_calls.py) ----

    @contextmanager
    def batched_ops(self, *, defer: bool = False, pin=None) -> Iterator[Deferred]:
        """Inside it, the drops and demotions that making room decides are queued per node and sent when it ends
        (one Demote call per node carrying the drops, unless the order forces more); their state is applied as they are
        decided and settled by the nodes' answers (store/node_calls.py). Nested: the outermost one sends.

        `defer` (a put_start): a node's calls whose every extent this batch has handed out again are not sent here
        but left in the `Deferred` yielded, for the caller to send once it has let go of the master's lock and
        before it answers (`send_deferred`), then settle under the lock again (`settle_deferred`): a Drop alone whose
        every record's extent is used again, or a Demote whose every move's source extent is, its drops such erases
        too. Why that is safe: nothing else can write those extents until then (they are this operation's grants and
        copy reservations, written by its client after the answer, or by a copy round after that client's commit,
        or the targets of the same call's earlier moves), and no other operation can be given them (they are in
        use). A deferred move's objects are in flight until settled (`in_flight`), pinned (`pin(slot)`, the
        caller's Leases.pin: nothing evicts, demotes or frees them, a removal only unlinks them) as they are
        deferred, and lookups, promotions, copy rounds and drains pass them by, since their targets do not hold
        their bytes yet. Any other call is sent here as before. A body that raises defers nothing."""
        if defer and pin is None:
            raise ValueError("pin: a batch that defers moves pins their objects (Leases.pin)")
        deferred = Deferred()
        if self._calls is not None:
            yield deferred
            return
        self._calls = {}
        done = False
        try:
            yield deferred
            done = True
        finally:
            calls = self._calls
            try:
                for node_calls in calls.values():
                    if done and defer and self.erasures.background and node_calls.drops \
                            and not node_calls.demotions:
                        self.erasures.queue(node_calls.node, node_calls.take()[0])
                    elif done and defer and self._reused(node_calls):
                        drops, demotions = node_calls.take()
                        if demotions:
                            deferred.moves.append(DeferredCall(node_calls.node, drops, demotions))
                            for d in demotions:
                                pin(d.slot)
                                self._in_flight.add(d.slot)
                        else:
                            deferred.erases.append((node_calls.node, drops))
                    else:
                        self._send(node_calls)
            finally:
                self._calls = None

    @staticmethod
    def _reused(calls: NodeCalls) -> bool:
        """Something is queued, and every extent it reads or erases is in use again: a used extent starts at each
        dropped record's offset (one this batch allocated after freeing the record, over the page the erase writes),
        and at each move's source offset, covering the object's whole extent (the grant or the earlier move's target
        that took it)."""
        if not calls.drops and not calls.demotions:
            return False
        spaces = calls.node.spaces
        if calls.drops:
            ssd = spaces.get(_SSD)
            if ssd is None or not all(d.offset in ssd.allocator for d in calls.drops):
                return False
        for d in calls.demotions:
            move = d.move
            space = spaces.get(move.src_tier)
            if space is None:
                return False
            alloc = space.allocator
            if move.src_offset not in alloc or \
                    alloc.size_of(move.src_offset) < alloc.rounded(space.extent_size(move.size)):
                return False
        return True

    def in_flight(self, slot: int) -> bool:
        """A deferred move carries this object: its index entry is at a target that does not hold its bytes yet."""
        return slot in self._in_flight

    def landed(self, slots: Sequence[int]) -> int:
        """How many leading `slots` are not in flight (a lookup's hits end before the first that is)."""
        flying = self._in_flight
        if not flying:
            return len(slots)
        return next((i for i, s in enumerate(slots) if s in flying), len(slots))

    def send_deferred(self, deferred: Deferred) -> None:
        """Send the calls a batch deferred (`batched_ops(defer=True)`), without the master's lock: the erases, then
        each Demote (its drops carried, or erased first), keeping its answer for `settle_deferred`. A move call that
        made no move may not have erased its carried drops: they are erased here again (extents still this put's)."""
        for node, drops in deferred.erases:
            Erasures.send(node, drops)
        for call in deferred.moves:
            call.results, erase = self._call(call.node, call.drops, call.demotions)
            Erasures.send(call.node, erase)

    def settle_deferred(self, deferred: Deferred, unpin) -> None:
        """Under the lock again, after `send_deferred`: each deferred move's pin goes (`unpin(slot)`, the caller's
        Leases.unpin: True for an object removed meanwhile and held by nobody else, which is freed now, its target
        erased after the move wrote it; one removed and still held elsewhere is freed by the last holder) and its
        object lands (indexed where it went, the nodes' host indexes told with the other moves) or, refused, is
        evicted, as `_send` settles a move."""
        for call in deferred.moves:
            node = call.node
            results = call.results if call.results is not None else [False] * len(call.demotions)  # never sent
            erase: list[Drop] = []
            for d, ok in zip(call.demotions, results):
                self._in_flight.discard(d.slot)
                if unpin(d.slot):
                    self.forget(d.slot, drops=erase)
                elif int(self.index.state[d.slot]) != COMMITTED:
                    continue
                elif ok:
                    self._demoted(d.slot, d.src_tier)
                else:
                    self._evict_one(node, d.slot, d.src_tier, erase)
            Erasures.send(node, erase)
        deferred.moves = []

    def _drop(self, node: NodeState, drops: list[Drop]) -> None:
        """Erase these SSD records on the node: now, or queued in the batch. None of them is a queued move's target:
        an object moved in the batch is settled before it can be a victim (`allocate`)."""
        if self._calls is None:
            node.ops.drop(drops)
        else:
            self._queue(node).drops.extend(drops)

    def _queue(self, node: NodeState) -> NodeCalls:
        calls = self._calls.get(node.number)
        if calls is None:
            calls = self._calls[node.number] = NodeCalls(node)
        return calls

    def _queue_demotions(self, node: NodeState, src_tier: Tier, dst_tier: Tier, victims: list[int],
                         targets: list[int | None], reserved: list[bool], clean: list[bool], moves: list[Move]) -> int:
        """`_demote` inside `batched_ops`: each victim is indexed at its target now, as if its move succeeded; the
        moves are queued (a clean copy needs none: done). A victim with no target is evicted, as before."""
        src = node.spaces[src_tier]
        dst = node.spaces[dst_tier]
        calls = self._queue(node)
        queued = iter(moves)
        moved = 0
        for slot, target, own, done in zip(victims, targets, reserved, clean):
            if target is None:
                self._evict_one(node, slot, src_tier)
                continue
            self._move_index(slot, src, dst, target, own)
            if done:
                self._demoted(slot, src_tier)
            else:
                calls.add_move(Demotion(slot, next(queued), src_tier))
            moved += 1
        return moved

    def _demoted(self, slot: int, src_tier: Tier) -> None:
        self._moved.append(slot)
        self.journal.touched(slot)
        self.counters.count(self.counters.demotions, src_tier)

    def _send(self, calls: NodeCalls) -> None:
        """Send one node's queued calls (drops, then moves) and settle the moves by its answers: a move the node
        did not make evicts its object, as a failed per-object move did."""
        node = calls.node
        drops, demotions = calls.take()
        results, erase = self._call(node, drops, demotions)
        for d, ok in zip(demotions, results):
            if ok:
                self._demoted(d.slot, d.src_tier)
                continue
            # the object sits, in the index, at its target: forgetting it frees that extent (erasing the record a
            # failed write may have begun there) and its policy entry
            self._evict_one(node, d.slot, d.src_tier, erase)
        Erasures.send(node, erase)

    def _call(self, node: NodeState, drops: list[Drop], demotions: list[Demotion]) -> tuple[list[bool], list[Drop]]:
        """The node calls of `_send`: a node that says `move_drops` gets the drops and moves in one Demote call (it
        erases before it moves); an older one a Drop call first. Returns each move's answer (all False when the
        call failed) and the carried drops to erase again: with no move made, the call may have failed before they
        were erased (no move wrote anything they could erase now); after a move was made, they were erased before
        it."""
        carried = drops if demotions and node.info.move_drops else []
        if not carried:
            Erasures.send(node, drops)
        if not demotions:
            return [], []
        self.erasures.flush(node.number)    # the moves write SSD extents: the erases queued before them land first
        moves = [d.move for d in demotions]
        try:
            results = list(node.ops.demote(moves, carried))
        except Exception:  # noqa: BLE001 - the operation goes on; the objects the node did not move are evicted
            log.exception("node %s: demotion of %d objects failed", node.node_id, len(demotions))
            results = [False] * len(demotions)
        return results, (list(carried) if carried and not any(results) else [])

    def relocate(self, slot: int, node: NodeState, tier: Tier, offset: int) -> int:
        """Re-index a committed object at a new extent (its bytes were copied there): a new slot with the same key,
        namespace, checksum, last use and chain links, entered into the new tier's policy as just used. The old
        slot must be pinned by the caller: `forget` then only unlinks it (DOOMED), so readers holding a lease on the
        old extent keep their bytes; the caller's unpin frees it once nobody reads it. On the same node an SSD copy
        stays with the object: a promoted SSD record becomes the copy (if readers still hold leases on the old
        slot, both slots hold the extent and the last one to go frees it), a promoted DRAM object keeps its copy;
        anywhere else a fast-tier destination gets a copy reserved and queued for the write-behind. Returns the
        new slot."""
        index = self.index
        key = index.key_at(slot)
        ns, checksum, atime, size = int(index.ns[slot]), int(index.checksum[slot]), int(index.atime[slot]), \
            int(index.size[slot])
        copy, dirty = self.copies.move_to(slot, node, tier)
        links = self.chains.take(slot)
        tenant = int(index.tenant[slot])
        pin = index.retained.get(slot)
        left = int(index.node[slot])
        self.forget(slot)
        new = index.add(key, node=node.number, tier=tier, state=State.COMMITTED, offset=offset, size=size, ns=ns,
                        checksum=checksum, atime=atime, tenant=tenant)
        if pin is not None:
            index.retain(new, pin)      # a moved object keeps its retention hint
        self.chains.give(new, links)
        index.copy[new] = copy
        if copy == NO_COPY:
            dirty = self.copies.reserve(new, node)
        if dirty:
            self.copies.dirty[key] = None
        node.spaces[tier].policy.insert_chain([new], [key])
        self.journal.touched(new)
        self._moved.append(new)
        if left != node.number:         # drained: the old node's host index forgets it (take_evicted)
            self._evicted.append((left, tenant, key))
        return new

    def take_moved(self) -> list[int]:
        """The slots whose object changed extent (a demotion, a promotion, a drain move) since the last call, once
        each, in order: the master tells the nodes' host indexes where those objects are now."""
        if not self._moved:
            return []
        moved, self._moved = self._moved, []
        return list(dict.fromkeys(moved))

    def take_evicted(self) -> list[tuple[int, int, bytes]]:
        """(node number, tenant id, key) of each object that left a node since the last call (evicted for room, or
        relocated to another node by a drain), in order: the master has that node's host index forget it, so a
        same-host reader asks the master (or reads the new node's row) instead of reading a freed extent or an
        erased record first."""
        if not self._evicted:
            return []
        evicted, self._evicted = self._evicted, []
        return evicted

    # ---- recovery ----

    def same_place(self, slot: int, node: NodeState, r: ObjectRecord) -> bool:
        """The record is this object (or its SSD copy) where the index has it."""
        i = self.index
        if int(i.node[slot]) != node.number or int(i.size[slot]) != r.size:
            return False
        return ((int(i.tier[slot]) == r.tier and int(i.offset[slot]) == r.offset)
                or (r.tier == _SSD and self.copies.offset(slot) == r.offset))

    def adopt(self, node: NodeState, records: list[ObjectRecord], dropped: list[bytes], atime: int = 0) -> int:
        """Index records (new keys, on tiers the node has) as committed objects at their reported extents, last
        accessed at `atime` (master ticks). Records whose extent overlaps anything already allocated are appended to
        `dropped`. Returns how many were adopted."""
        by_tier: dict[Tier, list[ObjectRecord]] = {}
        for r in records:
            try:   # what the index cannot hold is not adopted (the node erases unadopted records)
                if r.size > MAX_SIZE:
                    raise ValueError(f"size {r.size} over the index's u32 column")
                self.index.intern_ns(r.ns_digest)
            except ValueError as exc:
                log.warning("node %s: record %s not adopted: %s", node.node_id, r.key.hex(), exc)
                dropped.append(r.key)
                continue
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
                                      atime=atime, tenant=self.owner_of(r.key))
                self.journal.touched(slot)
                slots.append(slot)
            for slot, r in zip(slots, kept):  # recency is unknown after a restart: scan order, one at a time
                space.policy.insert_chain([slot], [r.key])
            adopted += len(kept)
        return adopted
