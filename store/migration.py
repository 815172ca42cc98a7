"""Draining a node: the master's side of moving its objects to the other nodes before it leaves.

The master decides, a client moves the bytes (docs/internals.md "Ownership"), exactly like a put:

    begin_drain(node)      node is DRAINING: no new placement on it; its objects are still served from it
    migrate_start(keys)    per committed key on a draining node: a destination extent on another (non-draining)
                           node, placed like put_start (evicting there only objects not used more recently than this
                           one, see `Placement.allocate(max_atime=)`), plus a pin on the source (a lease the master
                           holds itself, so nothing evicts, demotes, promotes or frees the source while it is read)
                           -> read token for the source, write token for the destination
    (client)               reads the source, writes the destination through the normal data path
    migrate_commit(ids, checksums)  the checksum must equal the object's: the key's index entry is re-made at the
                           destination; the old source slot becomes DOOMED, so readers that still hold a lease on the
                           source keep their bytes until their last release, which frees the source extent (the same
                           rule as `remove` of a leased object). No commit ever waits for or races with a reader.
    migrate_abort(ids)     destination extent freed (erased first if it is on SSD), source unpinned
    remove_node(node)      (Master) forgets the node with whatever is left on it (counted as dropped)

A move that is neither committed nor aborted within grant_ttl_s is reaped like a grant. A move whose object vanished
in the meantime (removed, evicted by `evict()`... though pinned objects are skipped) or whose destination node left
is refused at commit (False) and cleaned up. Called only with the master lock held; not thread-safe by itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from kvpool.store import tokens
from kvpool.store.index import COMMITTED, PENDING, Index
from kvpool.store.leases import Leases
from kvpool.store.node import Drop
from kvpool.store.placement import Placement
from kvpool.store.records import Location
from kvpool.tiers.types import Tier

_TIERS = tuple(Tier)


class MigrateStatus(str, enum.Enum):
    MOVING = "moving"      # a move was set up: copy the bytes, then migrate_commit
    GONE = "gone"          # not a committed object on a draining node (removed, never there, already moved)
    NO_SPACE = "no_space"  # no other node has room for it (the object stays where it is, and is dropped with it)
    BUSY = "busy"          # already being moved by another call


@dataclass(slots=True)
class Migration:
    """One key's answer from migrate_start. `source` + `read_token` (signed with the call's read_id) read the object,
    `dest` + `write_token` (signed with move_id) write it, exactly like a lease location and a grant."""

    status: MigrateStatus
    move_id: int = 0
    source: Location | None = None
    dest: Location | None = None
    checksum: int = 0
    ns_digest: bytes = b""
    read_token: bytes = b""
    write_token: bytes = b""


@dataclass(slots=True)
class MigrateStartResult:
    moves: list[Migration] = field(default_factory=list)
    read_id: int = 0         # the id the read tokens are signed with (a lease id as far as the node can tell)
    expires_at: float = 0.0  # every move of one call expires together
    keys: list[bytes] = field(default_factory=list)  # the keys `moves` answer (picked ones for migrate_next)
    next_cursor: int = 0     # migrate_next: pass it back for the next batch; 0 = this pass saw every slot


@dataclass(slots=True)
class _Move:
    slot: int
    key: bytes
    src_number: int
    dst_number: int
    dst_tier: Tier
    dst_offset: int
    size: int
    expires_at: float


class Drains:
    """Draining node ids and the moves in flight. Owned by the Master; every method runs under its lock."""

    def __init__(self, index: Index, placement: Placement, leases: Leases) -> None:
        self.index = index
        self.placement = placement
        self.leases = leases
        self.draining: set[str] = set()
        self._moves: dict[int, _Move] = {}
        self._by_slot: dict[int, int] = {}  # source slot -> move_id (one move per object at a time)
        self.skip_tiers = lambda slot: frozenset()

    def draining_numbers(self) -> set[int]:
        nodes = self.placement.nodes
        return {nodes[n].number for n in self.draining if n in nodes}

    # ---- node state

    def begin(self, node_id: str) -> tuple[int, int]:
        """Mark a node draining (idempotent). Returns (committed objects on it, uncommitted grants on it)."""
        node = self.placement.node(node_id)
        self.draining.add(node_id)
        index = self.index
        slots = index.slots()
        on_node = index.node[slots] == node.number
        committed = int((on_node & (index.state[slots] == COMMITTED)).sum())
        pending = int((on_node & (index.state[slots] == PENDING)).sum())
        return committed, pending

    def forget_node(self, number: int, node_id: str, *, leaving: bool = True) -> None:
        """A node leaves (drained or silent; `leaving`) or restarted: end every move from or to it. A restarted
        node that was draining stays draining."""
        if leaving:
            self.draining.discard(node_id)
        for move_id in [i for i, mv in self._moves.items() if number in (mv.src_number, mv.dst_number)]:
            self._end(move_id, drop_dest=True)

    # ---- moves

    def pick(self, node_id: str, cursor: int, limit: int, max_bytes: int) -> tuple[list[bytes], int]:
        """Up to `limit` committed objects of a draining node (at least one, then at most `max_bytes` in total), in
        index slot order from slot `cursor`; returns (keys, next cursor, 0 = no more). Vectorised over the index,
        so paging through a node of n objects costs O(n) per batch in numpy, not a sort of its keys."""
        node = self.placement.node(node_id)
        if node_id not in self.draining:
            raise ValueError(f"node_id {node_id!r} is not draining: call begin_drain (BeginDrain) first")
        index = self.index
        rest = np.flatnonzero((index.node[cursor:] == node.number) & (index.state[cursor:] == COMMITTED))
        if not len(rest):
            return [], 0
        slots = rest[:limit] + cursor
        sizes = np.cumsum(index.size[slots])
        take = max(1, int(np.searchsorted(sizes, max_bytes, side="right"))) if max_bytes else len(slots)
        slots = slots[:take]
        more = len(rest) > take
        return [index.key_at(int(s)) for s in slots], (int(slots[-1]) + 1 if more else 0)

    def moving(self, slot: int) -> bool:
        return slot in self._by_slot

    def start(self, keys: Sequence[bytes], expires_at: float, exclude: set[int]) -> MigrateStartResult:
        """`exclude`: node numbers nothing may be placed on besides the draining ones (not connected). The
        destination avoids the tiers `skip_tiers(slot)` names (a tenant at its DRAM quota, store/quota.py)."""
        index, placement, leases = self.index, self.placement, self.leases
        exclude = exclude | self.draining_numbers()
        result = MigrateStartResult(read_id=leases.new_id(), expires_at=expires_at, keys=list(keys))
        for key in keys:
            slot = index.find(key, -1)
            src = placement.node_of(slot) if slot >= 0 and index.state[slot] == COMMITTED else None
            if src is None or src.node_id not in self.draining:
                result.moves.append(Migration(MigrateStatus.GONE))
                continue
            if slot in self._by_slot or placement.in_flight(slot):     # (a put's deferred move: store/node_calls.py)
                result.moves.append(Migration(MigrateStatus.BUSY))
                continue
            size, atime = int(index.size[slot]), int(index.atime[slot])
            placed = placement.place(size, None, exclude, max_atime=atime, skip=self.skip_tiers(slot))
            if placed is None:
                result.moves.append(Migration(MigrateStatus.NO_SPACE))
                continue
            dst, tier, offset = placed
            # Placing may have evicted or demoted objects on the destination, never this one (it is on a draining
            # node, which is never a destination), so `slot` is still ours; pin it now.
            leases.pin(slot)
            move_id = leases.new_id()
            self._moves[move_id] = _Move(slot, bytes(key), src.number, dst.number, tier, offset, size, expires_at)
            self._by_slot[slot] = move_id
            src_tier, src_offset = _TIERS[int(index.tier[slot])], int(index.offset[slot])
            result.moves.append(Migration(
                MigrateStatus.MOVING, move_id, Location(src.node_id, src_tier, src_offset, size),
                Location(dst.node_id, tier, offset, size), int(index.checksum[slot]),
                index.ns_digest(int(index.ns[slot])),
                read_token=leases.sign(leases.read_key, tokens.READ, result.read_id, src_tier, src_offset, size,
                                       expires_at),
                write_token=leases.sign(leases.write_key(dst), tokens.WRITE, move_id, tier, offset, size, expires_at)))
        return result

    def commit(self, move_ids: Sequence[int], checksums: Sequence[int]) -> list[bool]:
        index, placement = self.index, self.placement
        ok: list[bool] = []
        for move_id, checksum in zip(move_ids, checksums):
            mv = self._moves.get(move_id)
            if mv is None:
                ok.append(False)
                continue
            slot = mv.slot
            dst = placement.by_number[mv.dst_number]
            same = (index.find(mv.key, -1) == slot and int(index.state[slot]) == COMMITTED
                    and int(index.node[slot]) == mv.src_number)
            if not same or dst is None or int(index.checksum[slot]) != int(checksum):
                self._end(move_id, drop_dest=True)
                ok.append(False)
                continue
            del self._moves[move_id]
            del self._by_slot[slot]
            # Our pin keeps the source extent allocated until the last lease on it (ours, or a reader's) ends.
            placement.relocate(slot, dst, mv.dst_tier, mv.dst_offset)
            self._unpin(slot)
            ok.append(True)
        return ok

    def abort(self, move_ids: Sequence[int]) -> int:
        return sum(self._end(move_id, drop_dest=True) for move_id in move_ids)

    def reap(self, now: float) -> int:
        expired = [i for i, mv in self._moves.items() if mv.expires_at <= now]
        for move_id in expired:
            self._end(move_id, drop_dest=True)
        return len(expired)

    def pinned(self) -> int:
        return len(self._moves)

    # ---- internals

    def _end(self, move_id: int, *, drop_dest: bool) -> int:
        mv = self._moves.pop(move_id, None)
        if mv is None:
            return 0
        self._by_slot.pop(mv.slot, None)
        dst = self.placement.by_number[mv.dst_number]
        if drop_dest and dst is not None:
            space = dst.spaces[mv.dst_tier]
            if mv.dst_tier is Tier.SSD:  # the client may have written a record there: erase before reuse
                dst.ops.drop([Drop(mv.key, Tier.SSD, mv.dst_offset, mv.size)])
            space.allocator.free(mv.dst_offset)
        self._unpin(mv.slot)
        return 1

    def _unpin(self, slot: int) -> None:
        if self.leases.unpin(slot):
            self.placement.forget(slot)
