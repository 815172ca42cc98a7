"""Grants and leases: who may write or read which index slot until when, and the tokens that let a node check it.

    grant   one PENDING slot a writer may fill until `expires_at`; committing or aborting it ends it
    lease   a set of COMMITTED slots a reader may copy out of until `expires_at`; `release` ends it
    pin     +1 on a slot's `leases` column: what a lease holds per slot, and what the master holds itself while it
            moves an object (drain, promotion). A pinned slot is never evicted, demoted or freed: `Placement.forget`
            of a pinned object only unlinks its key (DOOMED), and the last unpin hands the slot back to be freed.

One counter hands out every id (grants, leases, moves, the read ids of a move batch), so an id never means two
things to a node checking a token. It starts where no earlier master process's ids reach (`first_id`: the process's
start time in microseconds times ID_STRIDE), so an id a client got from a master that has since restarted (a
PutCommit or PutAbort of a stalled writer, a Release queued before the restart) is unknown to the new one, never one
of its own: before 2026-12-07 every master numbered from 1, and such a commit ended the new master's grant of the
same number (an acknowledged object lost, tests/faults/test_stale_grants.py).
Tokens are HMACs over (kind, id, tier, offset, size, expiry) (store/tokens.py): read tokens signed with the master's
secret, write grants with the key of the node's registration (`NodeState.write_key`, handed to the node with the
secret) where the node says `write_keys`; a master with no secret (an in-process pool) signs nothing, its tokens are
empty.
Owned by the Master and called under its lock; not thread-safe by itself.
"""

from __future__ import annotations

import time
from typing import Iterable, Sequence

import numpy as np

from kvpool.store import tokens
from kvpool.store.index import COMMITTED, DOOMED, LEASE_CAP, Index


ID_STRIDE = 1 << 11    # ids a master may hand out per microsecond of its life before reaching a later one's first


def first_id(now_ns: int | None = None) -> int:
    """The first id of a master process started at `now_ns` (unix ns, now by default): its start in microseconds
    times ID_STRIDE. A process started later begins above every id an earlier one handed out unless that one handed
    out more than ID_STRIDE ids (~2e9 a second) per microsecond between the two starts as the wall clock reads them:
    only a clock stepped back by about the earlier process's whole life brings them that close. Below 2**63 until the
    year 2112."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    return max(now_ns // 1000, 1) * ID_STRIDE


class Leases:
    def __init__(self, index: Index, token_secret: bytes | None, *, first: int | None = None) -> None:
        self.index = index
        self.signs = token_secret is not None
        self.read_key = token_secret or b""     # what read tokens are signed with
        self._grants: dict[int, tuple[int, float]] = {}         # grant_id -> (slot, expires_at)
        self._leases: dict[int, tuple[np.ndarray, float]] = {}  # lease_id -> (slots, expires_at)
        if first is not None and (isinstance(first, bool) or not isinstance(first, int) or not 0 < first < 1 << 63):
            raise ValueError(f"first must be an int in [1, 2**63), got {first!r}")
        self._next_id = first_id() if first is None else first

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    @property
    def open_grants(self) -> int:
        return len(self._grants)

    @property
    def open_leases(self) -> int:
        return len(self._leases)

    def write_key(self, node) -> bytes:
        """What write grants to `node` (a NodeState) are signed with: its registration's key where it says
        `write_keys`, else the master's secret (a node from before 2026-12-07). Under the master's lock."""
        return node.write_key if node.info.write_keys else self.read_key

    def sign(self, key: bytes, kind: bytes, ident: int, tier: int, offset: int, size: int, expires_at: float) -> bytes:
        """The token a node that verifies with `key` (`read_key`, `write_key(node)`) accepts for this extent until
        `expires_at`; b"" where this master signs nothing."""
        if not self.signs:
            return b""
        return tokens.sign(key, kind, ident, tier, offset, size, int(expires_at * 1000))

    # ---- grants

    def grant(self, slot: int, expires_at: float) -> int:
        grant_id = self.new_id()
        self._grants[grant_id] = (slot, expires_at)
        return grant_id

    def take_grant(self, grant_id: int, owner: int | None = None) -> tuple[int, float] | None:
        """End a grant (commit or abort): its (slot, expires_at), or None if unknown or already ended. With `owner`
        (a tenant id), a grant of another tenant's object counts as unknown and stays: ids are small integers,
        and one tenant must not end (or commit into) another's writes by guessing them."""
        entry = self._grants.get(grant_id)
        if entry is None or (owner is not None and int(self.index.tenant[entry[0]]) != owner):
            return None
        return self._grants.pop(grant_id)

    def drop_grants_where(self, on_slot) -> int:
        """End every grant whose slot satisfies `on_slot(slot)` (a node left or restarted); returns how many."""
        gone = [g for g, (slot, _) in self._grants.items() if on_slot(slot)]
        for grant_id in gone:
            del self._grants[grant_id]
        return len(gone)

    def expired_grants(self, now: float) -> list[int]:
        """End every grant expired at `now`; returns their slots (PENDING: the caller frees them)."""
        gone = [g for g, (_, exp) in self._grants.items() if exp <= now]
        return [self._grants.pop(g)[0] for g in gone]

    # ---- leases

    def leasable(self, slots: np.ndarray) -> int:
        """How many leading `slots` one more lease may pin: the u16 count of an object stops at LEASE_CAP (a lookup
        ends its hits before such an object, a miss for this reader only). One vector max in the common case; the
        per-slot walk runs only when a batch could reach the cap (repeats of one key in a batch count each)."""
        if not len(slots):
            return 0
        held = self.index.leases[slots]
        if int(held.max()) + len(slots) <= LEASE_CAP:
            return len(slots)
        seen: dict[int, int] = {}
        for i, (slot, n) in enumerate(zip(slots.tolist(), held.tolist())):
            count = seen.get(slot, n) + 1
            if count > LEASE_CAP:
                return i
            seen[slot] = count
        return len(slots)

    def lease(self, slots: np.ndarray, expires_at: float) -> int:
        """Pin `slots` (int64 array, no repeats needed) under a new lease id."""
        _pin(self.index.leases, slots, up=True)
        lease_id = self.new_id()
        self._leases[lease_id] = (slots, expires_at)
        return lease_id

    def slots_of(self, lease_id: int) -> np.ndarray | None:
        entry = self._leases.get(lease_id)
        return None if entry is None else entry[0]

    def release(self, lease_id: int, owner: int | None = None) -> list[int] | None:
        """End a lease: unpin its slots. Returns the DOOMED slots that nobody pins any more (the caller frees them),
        or None if the lease was unknown (already released or expired). With `owner`, another tenant's lease counts
        as unknown (releasing it early would let its extents be reused under a reader)."""
        entry = self._leases.get(lease_id)
        if entry is None or (owner is not None and len(entry[0]) and int(self.index.tenant[entry[0][0]]) != owner):
            return None
        del self._leases[lease_id]
        return self.unpin_array(entry[0])

    def expired_leases(self, now: float) -> list[int]:
        return [lease for lease, (_, exp) in self._leases.items() if exp <= now]

    # ---- pins held by the master itself

    def pin(self, slot: int) -> None:
        self.index.leases[slot] += 1

    def unpin(self, slot: int) -> bool:
        """True when this was the last pin of a DOOMED slot: the caller frees it."""
        index = self.index
        index.leases[slot] -= 1
        return bool(index.leases[slot] == 0 and index.state[slot] == DOOMED)

    def unpin_many(self, slots: Iterable[int]) -> list[int]:
        return [s for s in slots if self.unpin(s)]

    def pin_committed(self, keys: Sequence[bytes]) -> np.ndarray:
        """`pin` the committed objects among `keys` (stored keys); returns their slots, for `unpin_array`."""
        index = self.index
        find = index.find
        slots = np.fromiter((find(k, -1) for k in keys), np.int64, len(keys))
        slots = slots[slots >= 0]
        slots = slots[index.state[slots] == COMMITTED]
        _pin(index.leases, slots, up=True)
        return slots

    def unpin_array(self, slots: np.ndarray) -> list[int]:
        """`unpin` each of `slots`; returns the DOOMED ones nobody pins any more (the caller frees them)."""
        index = self.index
        _pin(index.leases, slots, up=False)
        return slots[(index.leases[slots] == 0) & (index.state[slots] == DOOMED)].tolist()


def _pin(column: np.ndarray, slots: np.ndarray, *, up: bool) -> None:
    """column[s] += 1 (up) or -= 1 for each s in slots, repeats counted (np.add.at); a plain fancy-index add when
    the slots are distinct, as a chain's are (np.add.at costs ~5 us even for 32 slots, the set check under 1 us)."""
    if len(slots) < 2 or len(set(slots.tolist())) == len(slots):
        if up:
            column[slots] += 1
        else:
            column[slots] -= 1
    elif up:
        np.add.at(column, slots, 1)
    else:
        np.subtract.at(column, slots, 1)


__all__ = ["Leases"]
