"""Removal tombstones: what keeps an object an admin or a tenant removed from coming back with a node that was away.

A removal erases the records of every node in the pool. A node out of the pool then (stopped, dropped, restarting,
removed) still holds its SSD records; when it comes back as a new process it reports them, and the master used to
adopt any key it did not know: a removed key was a hit again. A Drop that failed, then a node restart, did the same.

The rule: **a record written before a removal of its key is never re-adopted.** Two clocks make that decidable:
- every SSD record carries `written_us` (tiers/ssd.py), the master time its node had last heard when it wrote it
  (registration and heartbeat replies carry `master_time_us`); that is at most the master time of the write;
- every removal is stamped with `now_us()`, strictly later than every time handed out before it.
So a record written before the removal has `written_us` < the tombstone's time; one written after may have a smaller
stamp too (its node had not heard a newer time yet) and is then refused as well: a cache miss, never a stale hit.

What is kept (owned here, persisted through the journal's backend with the index):
- `keys`: stored key -> time of its last removal by an admin (`Master.remove`, per key, whether or not the master
  knew it: the key may be only on the node that is away);
- `scoped`: the same for a tenant's removals, per tenant key space (the 4-byte tag its stored keys start with,
  store/tenants.py), each bounded by `scope_limit` on its own: a tenant can name keys it never stored (they may be
  on the node that is away), and filling its tombstones then costs only its own records;
- `namespaces`: namespace digest -> time of its last whole-namespace evict (`Master.evict(ns)` with no idle filter);
- `floor`: records written before it are refused whatever their key (`evict` of everything);
- `buckets`: where the tombstones beyond a limit went. Past `limit` the admin's oldest fold, each into one of
  `buckets` time slots picked by a hash of its key (a slot keeps the newest time folded into it); past
  `scope_limit` a tenant's into its key space's own `scope_buckets` slots. A record is refused when written before
  its key's slot, so the rule still holds with memory bounded, and the price is the records of keys never removed
  that share a slot with a folded one: about (keys folded after the record was written) / slots of them, where
  folding into one floor (until 2026-12-06) refused them all. A folded namespace raises the floor.
An idle evict (`older_than_s` > 0) and evictions for room are cache policy, not purges: no tombstone.

The times are wall-clock microseconds, forced to increase (a restarted master starts after every time it kept):
a master restarted on the memory backend keeps no tombstone, but the records written before it still compare
right against removals made after it. A record with no time (0: a node or a file from before) is refused when a
tombstone of its key or namespace exists, or its key's slot or the floor holds any time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import xxhash

from kvpool.store.tenants import TAG_BYTES

_FOLD_TO = 0.9              # a fold keeps this share of a limit: one fold per ~limit/10 removals, not one per removal
ADMIN_BUCKETS = 1 << 20     # the admin's fold slots: 8 MiB of master memory once its tombstones first fold
SCOPE_BUCKETS = 1 << 17     # each tenant key space's: 1 MiB once its own first fold
_INDEX_BYTES = 4            # a slot's index in a persisted `buckets` field: scope (b"" or a tag) + u32 big-endian


def slot_of(key: bytes, slots: int) -> int:
    """The slot of `slots` (a power of two) a key folds into: by a hash of it, so keys that are not content hashes
    (a store API user's own, sequential ones) spread too."""
    return xxhash.xxh3_64_intdigest(key) & (slots - 1)


def wall_us() -> int:
    return time.time_ns() // 1000


@dataclass(slots=True)
class TombstoneState:
    """What a backend persists and loads: the live tombstones, the folded slots and the floor."""

    keys: dict[bytes, int] = field(default_factory=dict)
    namespaces: dict[bytes, int] = field(default_factory=dict)
    floor: int = 0
    scoped: dict[bytes, int] = field(default_factory=dict)      # tenants' tombstones (the key space: key[:4])
    buckets: dict[bytes, int] = field(default_factory=dict)     # scope + u32 slot index -> time folded into it


@dataclass(slots=True)
class TombstoneChanges:
    """What changed since the last `take_changes`: upserts, deletions (folded or below the floor), the slots a fold
    raised and the floor."""

    keys: dict[bytes, int] = field(default_factory=dict)
    namespaces: dict[bytes, int] = field(default_factory=dict)
    gone_keys: set[bytes] = field(default_factory=set)
    gone_namespaces: set[bytes] = field(default_factory=set)
    floor: int | None = None
    scoped: dict[bytes, int] = field(default_factory=dict)
    gone_scoped: set[bytes] = field(default_factory=set)
    buckets: dict[bytes, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.keys or self.namespaces or self.gone_keys or self.gone_namespaces
                    or self.floor is not None or self.scoped or self.gone_scoped or self.buckets)


def _power_of_two(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1) \
            or value > 1 << 32:
        raise ValueError(f"{name} must be a power of two in [1, 2**32], got {value!r}")
    return value


class Tombstones:
    """The master's removal tombstones (module docstring). Called under the master's lock."""

    def __init__(self, limit: int, *, scope_limit: int | None = None, buckets: int = ADMIN_BUCKETS,
                 scope_buckets: int = SCOPE_BUCKETS, clock: Callable[[], int] = wall_us,
                 track: bool = False) -> None:
        """`limit`: the admin's tombstones kept (keys and namespaces together) before the oldest fold into its
        `buckets` slots; `scope_limit` (default `limit`): each tenant key space's, before its oldest fold into that
        space's `scope_buckets` slots. `track`: collect the changes for a persistent journal (`take_changes`)."""
        scope_limit = limit if scope_limit is None else scope_limit
        for name, value in (("tombstones", limit), ("scope_limit", scope_limit)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.limit = limit
        self.scope_limit = scope_limit
        self._admin_slots = _power_of_two("buckets", buckets)
        self._scope_slots = _power_of_two("scope_buckets", scope_buckets)
        self._clock = clock
        self._last = 0                      # the last time handed out
        self._keys: dict[bytes, int] = {}
        self._namespaces: dict[bytes, int] = {}
        self.floor = 0
        self._scoped: dict[bytes, dict[bytes, int]] = {}    # tag -> {stored key: time}
        self._buckets: dict[bytes, np.ndarray] = {}         # scope (b"": the admin's, else a tag) -> slot times
        self.refused = 0                    # reported records refused by a tombstone, a slot or the floor
        self.folded = 0                     # tombstones folded (beyond a limit) or dropped below the floor
        self._track = track
        self._changes = TombstoneChanges()

    # ---------------------------------------------------------------- time

    def now_us(self) -> int:
        """The master's time for node stamps and removals: wall-clock µs, strictly increasing."""
        t = max(self._clock(), self._last + 1)
        self._last = t
        return t

    # ---------------------------------------------------------------- removals

    def bury(self, keys: Iterable[bytes]) -> int:
        """Tombstones for an admin's removal of these stored keys; returns its time."""
        t = self.now_us()
        changes = self._changes
        for key in keys:
            self._set(self._keys, changes.keys, changes.gone_keys, bytes(key), t)
        self._fold()
        return t

    def bury_scoped(self, keys: Iterable[bytes]) -> int:
        """Tombstones for a tenant's removal of these stored keys (each in the key space its tag names; whether or
        not the master knew them); returns its time."""
        t = self.now_us()
        changes = self._changes
        touched: set[bytes] = set()
        for key in keys:
            key = bytes(key)
            tag = key[:TAG_BYTES]
            self._set(self._scoped.setdefault(tag, {}), changes.scoped, changes.gone_scoped, key, t)
            touched.add(tag)
        for tag in touched:
            self._fold_scope(tag)
        return t

    def bury_namespace(self, ns_digest: bytes) -> int:
        """A tombstone for a whole namespace (every object of it evicted); returns its time."""
        t = self.now_us()
        changes = self._changes
        self._set(self._namespaces, changes.namespaces, changes.gone_namespaces, bytes(ns_digest), t)
        self._fold()
        return t

    def bury_all(self) -> int:
        """Every record written before now is refused (everything evicted); returns that time."""
        t = self.now_us()
        self._raise_floor(t)
        return t

    # ---------------------------------------------------------------- reports

    def refuses(self, key: bytes, ns_digest: bytes, written_us: int) -> bool:
        """Whether a reported record of `key` written at `written_us` predates a removal of it (counted)."""
        if written_us < self.floor or written_us < self._keys.get(key, 0) \
                or written_us < self._namespaces.get(ns_digest, 0):
            self.refused += 1
            return True
        if self._scoped or self._buckets:
            scoped = self._scoped.get(key[:TAG_BYTES])
            if (scoped is not None and written_us < scoped.get(key, 0)) or written_us < self._folded_time(key):
                self.refused += 1
                return True
        return False

    def floor_of(self, key: bytes) -> int:
        """The time before which any record of `key` is refused, whatever its own tombstone: the floor, or the
        slots its key folds into."""
        return max(self.floor, self._folded_time(bytes(key)))

    # ---------------------------------------------------------------- persistence

    def load(self, state: TombstoneState) -> None:
        """What a persistent backend kept (a master starting on it); times handed out start after all of it."""
        self._keys = dict(state.keys)
        self._namespaces = dict(state.namespaces)
        self.floor = state.floor
        self._scoped = {}
        for key, t in state.scoped.items():
            self._scoped.setdefault(key[:TAG_BYTES], {})[key] = t
        self._buckets = {}
        for name, t in state.buckets.items():
            scope, index = name[:-_INDEX_BYTES], int.from_bytes(name[-_INDEX_BYTES:], "big")
            slots = self._slots_of(scope)
            index &= len(slots) - 1         # slots kept by a master with more of them: merged, never lost
            slots[index] = max(int(slots[index]), t)
        self._last = max([self._last, self.floor, *self._keys.values(), *self._namespaces.values(),
                          *state.scoped.values(), *state.buckets.values()])
        self._changes = TombstoneChanges()
        self._fold()
        for tag in list(self._scoped):
            self._fold_scope(tag)

    def take_changes(self) -> TombstoneChanges:
        """The changes since the last call (empty unless `track`), for the journal to write."""
        changes, self._changes = self._changes, TombstoneChanges()
        return changes

    def restore_changes(self, changes: TombstoneChanges) -> None:
        """A write of `changes` failed: they go again with the next one (newer changes win)."""
        newer = self._changes
        for key in changes.keys.keys() - newer.keys.keys() - newer.gone_keys:
            newer.keys[key] = changes.keys[key]
        for ns in changes.namespaces.keys() - newer.namespaces.keys() - newer.gone_namespaces:
            newer.namespaces[ns] = changes.namespaces[ns]
        for key in changes.scoped.keys() - newer.scoped.keys() - newer.gone_scoped:
            newer.scoped[key] = changes.scoped[key]
        newer.gone_keys |= changes.gone_keys - newer.keys.keys()
        newer.gone_namespaces |= changes.gone_namespaces - newer.namespaces.keys()
        newer.gone_scoped |= changes.gone_scoped - newer.scoped.keys()
        if changes.floor is not None and (newer.floor is None or newer.floor < changes.floor):
            newer.floor = changes.floor
        for name, t in changes.buckets.items():             # a slot's time only grows
            if newer.buckets.get(name, 0) < t:
                newer.buckets[name] = t

    def __len__(self) -> int:
        return len(self._keys) + len(self._namespaces) + sum(len(table) for table in self._scoped.values())

    # ---------------------------------------------------------------- internals

    def _set(self, table: dict[bytes, int], upserts: dict[bytes, int], gone: set[bytes], name: bytes, t: int) -> None:
        """`name`'s tombstone at `t` (a later removal's time replaces an earlier one), and the change noted."""
        table[name] = t
        if self._track:
            upserts[name] = t
            gone.discard(name)

    def _slots_of(self, scope: bytes) -> np.ndarray:
        """A scope's fold slots, made at its first fold."""
        slots = self._buckets.get(scope)
        if slots is None:
            n = self._admin_slots if scope == b"" else self._scope_slots
            slots = self._buckets[scope] = np.zeros(n, dtype=np.uint64)
        return slots

    def _folded_time(self, key: bytes) -> int:
        """The newest time folded into `key`'s slot, of the admin's slots or its key space's (0: none)."""
        if not self._buckets:
            return 0
        h = xxhash.xxh3_64_intdigest(key)       # slot_of's hash, once for both scopes
        best = 0
        for scope in (b"", key[:TAG_BYTES]):
            slots = self._buckets.get(scope)
            if slots is not None:
                best = max(best, int(slots[h & (len(slots) - 1)]))
        return best

    def _fold_into(self, scope: bytes, table: dict[bytes, int], upserts: dict[bytes, int], gone: set[bytes],
                   cut: int) -> None:
        """`table`'s tombstones up to time `cut` go into `scope`'s slots (each slot keeps the newest time)."""
        old = [(k, t) for k, t in table.items() if t <= cut]
        if not old:
            return
        slots = self._slots_of(scope)
        n = len(slots)
        index = np.fromiter((slot_of(k, n) for k, _ in old), dtype=np.int64, count=len(old))
        np.maximum.at(slots, index, np.fromiter((t for _, t in old), dtype=np.uint64, count=len(old)))
        if self._track:
            bucket_changes = self._changes.buckets
            for i in np.unique(index).tolist():
                bucket_changes[scope + i.to_bytes(_INDEX_BYTES, "big")] = int(slots[i])
        for k, _ in old:
            del table[k]
        if self._track:
            for k, _ in old:
                upserts.pop(k, None)
            gone.update(k for k, _ in old)
        self.folded += len(old)

    @staticmethod
    def _cut(times: list[int], limit: int) -> int:
        """The newest time a fold of `times` (more than `limit`) takes, keeping _FOLD_TO of `limit`."""
        times.sort()
        return times[len(times) - int(limit * _FOLD_TO) - 1]

    def _fold(self) -> None:
        """Beyond `limit`, the admin's oldest tombstones fold: keys into its slots, namespaces into the floor."""
        if len(self._keys) + len(self._namespaces) <= self.limit:
            return
        cut = self._cut([*self._keys.values(), *self._namespaces.values()], self.limit)
        folded_ns = [t for t in self._namespaces.values() if t <= cut]
        if folded_ns:
            n = len(self)
            self._raise_floor(max(folded_ns) + 1)
            self.folded += n - len(self)
        changes = self._changes
        self._fold_into(b"", self._keys, changes.keys, changes.gone_keys, cut)

    def _fold_scope(self, tag: bytes) -> None:
        """Beyond `scope_limit`, a tenant key space's oldest tombstones go into its own slots."""
        table = self._scoped.get(tag)
        if table is not None and len(table) > self.scope_limit:
            changes = self._changes
            self._fold_into(tag, table, changes.scoped, changes.gone_scoped,
                            self._cut(list(table.values()), self.scope_limit))

    def _raise_floor(self, floor: int) -> None:
        """Records written before `floor` are refused: the tombstones older than it say nothing more."""
        if floor <= self.floor:
            return
        self.floor = floor
        changes = self._changes
        tables = [(self._keys, changes.keys, changes.gone_keys),
                  (self._namespaces, changes.namespaces, changes.gone_namespaces)]
        tables += [(table, changes.scoped, changes.gone_scoped) for table in self._scoped.values()]
        for table, upserts, gone in tables:
            old = [k for k, t in table.items() if t < floor]
            for k in old:
                del table[k]
                if self._track:
                    upserts.pop(k, None)
                    gone.add(k)
        if self._track:
            self._changes.floor = floor
