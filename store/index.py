"""The master's object index: key -> where the object lives and what state it is in. Compact by construction.

Goal: <= 200 bytes per indexed object at 1M objects (measured in tests/store/test_index.py, bench/master_memory.py
and bench/pool_remote.py; 86.5 B for the whole master since the C key table and the in-place rows, 2026-12-07).
A dataclass per object costs ~150 B on its own, so fields live in parallel numpy columns addressed by a slot number:

    _keys:    key table, 16-byte key <-> slot (store/keytable.py): in C, each slot's key in a 16 B column and an
              open-addressing table of slot numbers at most half full, ~25-33 B per object, grown a little at every
              call; where the extension is not built, a dict and a list, ~126 B (a bytes and an int object per key,
              the dict's entry, a pointer)
    _rows:    numpy structured array, one packed 46 B row per slot, columns exposed as views (index.offset[slot]),
              in a reservation that grows in place (store/rows.py: no copy when the index doubles):
              node u16 | tier u8 | state u8 | ns u16 | leases u16 | offset i64 | size u32 | checksum u64 | atime u32
              | parent i32 | child i32 | copy u32 | tenant u16

Every column is as narrow as its bound allows, because each byte is a megabyte per million objects: `size` u32
(MasterConfig.max_object_bytes < 4 GiB), `ns` u16 (at most MAX_NAMESPACES distinct namespace digests per master
lifetime; the next one is refused with NamespaceTableFull, RESOURCE_EXHAUSTED on the wire, before anything changes),
`leases` u16 (read leases plus the master's own pins of one object: a lookup stops its hits before an object with
LEASE_CAP holders, so the count never wraps; the master's pins, at most one each from promotion, migration and the
write-behind copier, fit in the headroom above LEASE_CAP).

`parent` / `child` thread the prefix chains through the slots (store/chains.py: the parent's slot, ROOT = -1 unknown
or none, ORPHAN = -2 an ancestor left; the only child's slot, NONE = -1, MANY = -2 with the children in a side table):
what lets the master find the blocks no prefix lookup can reach once a block leaves. `copy` is the inclusive SSD
tier's extent of an object on a faster tier (store/placement.py), in 4 KiB pages (SSD records are page aligned),
NO_COPY = 2**32 - 1: 16 TiB of SSD per node in four bytes.

`tenant` is the owner's id (store/tenants.py; 0 = the unscoped space, every object when auth is off). The index keeps
the payload bytes of every slot (pending, committed and doomed alike: bytes held; not LEAVING ones, whose bytes went
with their node) per (tenant, tier) up to date as slots are added, freed, change tier (`set_tier`) or leave
(`leave`): quotas read it per put, so it is counted, never scanned. An
inclusive SSD copy of a faster-tier object is a cache of it, not counted again.

`atime` is the last access (commit or lookup hit) in the master's ticks: tenths of a second since the master
started (store/master.py ATIME_TICKS_PER_S), saturating at 2**32 - 1 (13.6 years). Four bytes instead of a float64
because it is per object; 0.1 s is plenty for "evict what nobody used for an hour".

`retained` (store/retention.py) maps the slots that carry a retention hint (a put's `pin_s`) to the hint's end, in
whole seconds since the master started. A side dict, not a column: only pinned slots pay for it (~100 B each), and
pinned bytes are capped per tenant, so an index without pins costs nothing more per object (a u32 column would cost
every object 4 B). Pinned payload bytes and slots are counted per tenant like `_usage`; `free` unpins.

Invariants: a slot is FREE iff it is on the free list and holds no key (`_keys.key_at` is None); every linked key
(`_keys.linked()`) is held by a non-FREE slot, and `find` gives that slot. Namespace digests and node ids are
interned into small tables. Not thread-safe: the master serialises access under its lock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvpool.store.keytable import KEY_BYTES, new_key_table
from kvpool.store.rows import GrowingRows
from kvpool.tiers.types import Tier


class NamespaceTableFull(ValueError):
    """The index interned MAX_NAMESPACES namespace digests already (RESOURCE_EXHAUSTED on the wire)."""


class State(enum.IntEnum):
    FREE = 0
    PENDING = 1    # granted, bytes being written: invisible to readers, never evicted
    COMMITTED = 2  # visible
    DOOMED = 3     # removed while leased: invisible, space freed when the last lease ends
    LEAVING = 4    # committed on a node that left the pool: invisible, forgotten a chunk at a time
                   # (Placement.forget_leaving), its key still held until then


# The states as plain ints, for per-key loops and numpy comparisons: an enum attribute lookup costs ~1 us.
FREE, PENDING, COMMITTED, DOOMED, LEAVING = (int(s) for s in State)
NO_COPY = 0xFFFFFFFF    # `copy` of an object without an SSD copy
MAX_NAMESPACES = 0x10000    # distinct namespace digests one index interns (the u16 `ns` column)
LEASE_CAP = 0xFFFF - 16     # read leases one object may hold at once (the u16 `leases` column, less the master's pins)
MAX_SIZE = 0xFFFFFFFF       # the largest object the u32 `size` column holds
COPY_PAGE = 4096        # `copy` unit (tiers.ssd.ALIGN: every SSD record starts on a page)


@dataclass(slots=True)
class ObjectMeta:
    """A readable copy of one index row (for listing, persistence, tests); the index itself stores columns."""

    key: bytes
    slot: int
    node: int
    tier: Tier
    state: State
    ns: int
    leases: int
    offset: int
    size: int
    checksum: int
    atime: int = 0
    tenant: int = 0


_NT = len(Tier)  # usage entries per tenant

ROW = np.dtype([("node", np.uint16), ("tier", np.uint8), ("state", np.uint8), ("ns", np.uint16),
                ("leases", np.uint16), ("offset", np.int64), ("size", np.uint32), ("checksum", np.uint64),
                ("atime", np.uint32), ("parent", np.int32), ("child", np.int32), ("copy", np.uint32),
                ("tenant", np.uint16)])  # 46 B
_COLUMNS = ROW.names


class Index:
    node: np.ndarray
    tier: np.ndarray
    state: np.ndarray
    ns: np.ndarray
    leases: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    checksum: np.ndarray
    atime: np.ndarray
    parent: np.ndarray
    child: np.ndarray
    copy: np.ndarray
    tenant: np.ndarray

    def __init__(self, initial_slots: int = 1024) -> None:
        self._keys = new_key_table()    # key <-> slot (store/keytable.py)
        # `find(key, -1)`: the table's own get, bound once (the table is never replaced), for per-key loops.
        self.find = self._keys.get
        self._free: list[int] = []      # freed slots, reused last-freed first
        self._next = 0                  # slots from here to the capacity were never used (lowest first)
        self._capacity = 0
        self._store = GrowingRows(ROW)  # grows in place: no copy, no pause under the master's lock
        self._rows = self._store.rows
        self._grow(max(1, initial_slots))
        self._ns_digests: list[bytes] = []
        self._ns_ids: dict[bytes, int] = {}
        # payload bytes and slots per tenant: _usage[tenant * _NT + tier], _count[tenant] (grown on first use)
        self._usage: list[int] = [0] * _NT
        self._count: list[int] = [0]
        self.retained: dict[int, int] = {}   # slot -> end of its retention hint (store/retention.py)
        self._retained_bytes: list[int] = [0]
        self._retained_count: list[int] = [0]

    def _grow(self, capacity: int) -> None:
        rows = self._rows = self._store.grow(capacity)
        # Column views (`index.offset[slot]`): rebound on every growth, so callers must not keep them.
        for name in _COLUMNS:
            setattr(self, name, rows[name])
        self._keys.reserve(capacity)
        self._capacity = capacity

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys

    def slot_of(self, key: bytes) -> int:
        """Slot of `key`, or -1."""
        return self._keys.get(key, -1)

    def key_at(self, slot: int) -> bytes:
        key = self._keys.key_at(slot)
        assert key is not None, f"slot {slot} is free"
        return key

    def keys_of(self, slots: np.ndarray) -> Iterator[bytes]:
        """The keys of `slots` (none free), in their order."""
        return iter(self._keys.keys_of(slots.tolist()))

    def intern_ns(self, digest: bytes) -> int:
        ns_id = self._ns_ids.get(digest)
        if ns_id is None:
            if len(self._ns_digests) >= MAX_NAMESPACES:
                raise NamespaceTableFull(f"namespace: this master already holds {MAX_NAMESPACES} distinct namespaces "
                                         "(the index's u16 column); restart it empty to start over")
            ns_id = self._ns_ids[digest] = len(self._ns_digests)
            self._ns_digests.append(bytes(digest))
        return ns_id

    def ns_digest(self, ns_id: int) -> bytes:
        return self._ns_digests[ns_id]

    def ns_id_of(self, digest: bytes) -> int:
        """The interned id of a namespace digest, or -1 if no object ever had it (nothing is interned)."""
        return self._ns_ids.get(bytes(digest), -1)

    def committed_prefix(self, keys) -> list[int]:
        """Slots of the leading keys that are committed objects (a prefix lookup stops at the first miss)."""
        find, state = self._keys.get, self.state
        found: list[int] = []
        for key in keys:
            slot = find(key, -1)
            if slot < 0 or state[slot] != COMMITTED:
                break
            found.append(slot)
        return found

    def committed(self, keys) -> list[bool]:
        find, state = self._keys.get, self.state
        return [(s := find(k, -1)) >= 0 and state[s] == COMMITTED for k in keys]

    def add(self, key: bytes, *, node: int, tier: Tier, state: State, offset: int, size: int, ns: int,
            checksum: int = 0, atime: int = 0, tenant: int = 0) -> int:
        """Index a new object; the key must not be present."""
        if key in self._keys:
            raise KeyError(f"key {bytes(key).hex()} already indexed")
        if len(key) != KEY_BYTES:
            raise ValueError(f"key: must be {KEY_BYTES} bytes, got {len(key)}")
        if self._free:
            slot = self._free.pop()
        else:   # a fresh index fills slots 0, 1, 2, ...
            if self._next == self._capacity:
                self._grow(self._capacity * 2)
            slot = self._next
            self._next += 1
        self._keys.link(key, slot)
        self._rows[slot] = (node, tier, state, ns, 0, offset, size, checksum, atime, -1, -1, NO_COPY, tenant)
        if tenant >= len(self._count):
            self._count.extend([0] * (tenant + 1 - len(self._count)))
            self._usage.extend([0] * (len(self._count) * _NT - len(self._usage)))
            self._retained_bytes.extend([0] * (len(self._count) - len(self._retained_bytes)))
            self._retained_count.extend([0] * (len(self._count) - len(self._retained_count)))
        self._usage[tenant * _NT + tier] += size
        self._count[tenant] += 1
        return slot

    def set_tier(self, slot: int, tier: Tier) -> None:
        """The object moved to another tier (demotion in place of its slot): its bytes are counted there now."""
        tenant, size = int(self.tenant[slot]), int(self.size[slot])
        self._usage[tenant * _NT + int(self.tier[slot])] -= size
        self._usage[tenant * _NT + tier] += size
        self.tier[slot] = tier

    def tenant_bytes(self, tenant: int, tier: Tier | None = None) -> int:
        """Payload bytes of `tenant`'s slots in `tier` (None: every tier): pending and committed ones (a DOOMED or
        LEAVING slot stopped counting when it turned so)."""
        if tenant >= len(self._count):
            return 0
        base = tenant * _NT
        return self._usage[base + tier] if tier is not None else sum(self._usage[base:base + _NT])

    def tenant_slots(self, tenant: int) -> int:
        return self._count[tenant] if tenant < len(self._count) else 0

    def retain(self, slot: int, until: int) -> None:
        """Pin `slot` until `until` (seconds since the master started), extending a pin it already has."""
        old = self.retained.get(slot)
        if old is None:
            tenant = int(self.tenant[slot])
            self._retained_bytes[tenant] += int(self.size[slot])
            self._retained_count[tenant] += 1
            self.retained[slot] = until
        elif until > old:
            self.retained[slot] = until

    def unretain(self, slot: int) -> None:
        if self.retained.pop(slot, None) is not None:
            tenant = int(self.tenant[slot])
            self._retained_bytes[tenant] -= int(self.size[slot])
            self._retained_count[tenant] -= 1

    def retained_bytes(self, tenant: int | None = None) -> int:
        """Payload bytes of pinned slots (expired pins not yet swept included) of `tenant` (None: every tenant)."""
        if tenant is None:
            return sum(self._retained_bytes)
        return self._retained_bytes[tenant] if tenant < len(self._retained_bytes) else 0

    def retained_slots(self, tenant: int | None = None) -> int:
        if tenant is None:
            return len(self.retained)
        return self._retained_count[tenant] if tenant < len(self._retained_count) else 0

    def leave(self, slots: np.ndarray) -> None:
        """Committed objects of a node that left the pool turn LEAVING (Placement.remove_node): invisible to readers,
        and their bytes no longer counted per (tenant, tier) nor pinned, at once (they went with the node), so a
        tenant's quota is not taken up by them while they wait to be forgotten. One numpy pass; `free` of a LEAVING
        slot counts nothing again."""
        if not len(slots):
            return
        where = self.tenant[slots].astype(np.int64) * _NT + self.tier[slots]
        held = np.bincount(where, weights=self.size[slots].astype(np.float64))    # exact below 2**53 bytes
        for i in np.flatnonzero(held).tolist():
            self._usage[i] -= int(held[i])
        counted = np.bincount(self.tenant[slots])
        for t in np.flatnonzero(counted).tolist():
            self._count[t] -= int(counted[t])
        self.state[slots] = LEAVING
        if self.retained:
            for slot in [s for s in self.retained if self.state[s] == LEAVING]:
                self.unretain(slot)

    def doom(self, slot: int) -> None:
        """A removed object still leased: its key unlinked, the slot DOOMED until its last release frees it. Its bytes
        stop counting for its tenant now, as a LEAVING slot's do (`leave`): the object is gone for its owner (a quota
        has room for what replaces it), while its space stays reserved until the last reader or copy lets go."""
        if self.state[slot] != LEAVING:
            tenant = int(self.tenant[slot])
            self._usage[tenant * _NT + int(self.tier[slot])] -= int(self.size[slot])
            self._count[tenant] -= 1
        self.unlink_key(slot)
        self.state[slot] = State.DOOMED

    def unlink_key(self, slot: int) -> None:
        """Make the key unfindable while the slot stays reserved (DOOMED objects still leased)."""
        unlinked = self._keys.unlink(slot)
        assert unlinked, f"slot {slot} has no linked key"
        if self.retained:
            self.unretain(slot)   # nobody can find it: nothing left to keep

    def free(self, slot: int) -> None:
        """Release the slot; the key (if still linked) disappears."""
        self.key_at(slot)           # (asserts the slot is not free already)
        self._keys.clear(slot)
        if self.retained:
            self.unretain(slot)
        if self.state[slot] != LEAVING and self.state[slot] != DOOMED:  # stopped counting then (`leave`, `doom`)
            tenant = int(self.tenant[slot])
            self._usage[tenant * _NT + int(self.tier[slot])] -= int(self.size[slot])
            self._count[tenant] -= 1
        self.state[slot] = State.FREE
        self._free.append(slot)

    def meta(self, slot: int) -> ObjectMeta:
        return ObjectMeta(key=self.key_at(slot), slot=slot, node=int(self.node[slot]), tier=Tier(int(self.tier[slot])),
                          state=State(int(self.state[slot])), ns=int(self.ns[slot]), leases=int(self.leases[slot]),
                          offset=int(self.offset[slot]), size=int(self.size[slot]),
                          checksum=int(self.checksum[slot]), atime=int(self.atime[slot]),
                          tenant=int(self.tenant[slot]))

    @property
    def rows_reserved(self) -> bool:
        """Whether the rows grow in place (store/rows.py), not by copying (the reservation was refused here)."""
        return self._store.reserved

    @property
    def capacity(self) -> int:
        """Slots the index has now (it grows; slots never move)."""
        return self._capacity

    def slots(self, first: int = 0, end: int | None = None) -> np.ndarray:
        """Every non-free slot (including DOOMED ones whose key is unlinked), or those in [first, end)."""
        end = self._capacity if end is None else min(end, self._capacity)
        return np.flatnonzero(self.state[first:end] != State.FREE) + first

    def check_invariants(self) -> None:
        linked = self._keys.linked()
        assert len(linked) == len(self._keys), f"{len(linked)} keys linked, the table counts {len(self._keys)}"
        for key, slot in linked:
            assert self._keys.get(key) == slot, f"slot {slot} holds {key.hex()}, found at {self._keys.get(key)}"
            assert self.state[slot] != State.FREE, f"linked key {key.hex()} on a free slot"
        free = set(self._free)
        assert len(free) == len(self._free), "slot on the free list twice"
        assert all(slot < self._next for slot in free), "a never-used slot on the free list"
        free.update(range(self._next, self._capacity))
        for slot in range(self._capacity):
            assert (slot in free) == (self._keys.key_at(slot) is None), f"slot {slot}: free list and key table disagree"
            assert (slot in free) == (self.state[slot] == State.FREE), f"slot {slot}: free list and state disagree"
        states = self.state[: self._capacity]
        used = np.flatnonzero((states == State.PENDING) | (states == State.COMMITTED))   # counted: see `leave`, `doom`
        for t in range(len(self._count)):
            mine = used[self.tenant[used] == t]
            assert self._count[t] == len(mine), f"tenant {t}: counted {self._count[t]} slots, holds {len(mine)}"
            for tier in Tier:
                held = int(self.size[mine[self.tier[mine] == tier]].sum())
                assert self.tenant_bytes(t, tier) == held, f"tenant {t} {tier.label}: usage disagrees with the rows"
        for slot in self.retained:
            assert self._keys.key_at(slot) is not None, f"pinned slot {slot} is free"
            assert self.state[slot] != LEAVING, f"pinned slot {slot} is LEAVING (`leave` unpins)"
        pinned = np.fromiter(self.retained, dtype=np.int64, count=len(self.retained))
        for t in range(len(self._count)):
            mine = pinned[self.tenant[pinned] == t]
            assert self.retained_slots(t) == len(mine), f"tenant {t}: pinned slot count disagrees"
            assert self.retained_bytes(t) == int(self.size[mine].sum()), f"tenant {t}: pinned bytes disagree"
