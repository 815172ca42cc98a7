"""Removal tombstones: what keeps an object an admin removed from coming back with a node that was away.

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
  store/tenants.py), each bounded by `scope_limit` and folded into that space's own floor (`scope_floors`), never
  into the pool's: a tenant can name keys it never stored (they may be on the node that is away), and filling its
  tombstones then costs only its own records;
- `namespaces`: namespace digest -> time of its last whole-namespace evict (`Master.evict(ns)` with no idle filter);
- `floor`: records written before it are refused whatever their key (`evict` of everything, and where the admin's
  tombstones beyond `limit` went: the oldest are folded into it, so memory stays bounded and the rule still holds,
  at the price of refusing more than needed).
An idle evict (`older_than_s` > 0) and evictions for room are cache policy, not purges: no tombstone.

The times are wall-clock microseconds, forced to increase (a restarted master starts after every time it kept):
a master restarted on the memory backend keeps no tombstone, but the records written before it still compare
right against removals made after it. A record with no time (0: a node or a file from before) is refused when a
tombstone of its key or namespace exists, or any floor.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvpool.store.tenants import TAG_BYTES

_FOLD_TO = 0.9      # a fold keeps this share of `limit`: one fold per ~limit/10 removals, not one per removal


def wall_us() -> int:
    return time.time_ns() // 1000


@dataclass(slots=True)
class TombstoneState:
    """What a backend persists and loads: the live tombstones and the floor."""

    keys: dict[bytes, int] = field(default_factory=dict)
    namespaces: dict[bytes, int] = field(default_factory=dict)
    floor: int = 0
    scoped: dict[bytes, int] = field(default_factory=dict)          # tenants' tombstones (the scope: key[:4])
    scope_floors: dict[bytes, int] = field(default_factory=dict)    # tag -> that key space's floor


@dataclass(slots=True)
class TombstoneChanges:
    """What changed since the last `take_changes`: upserts, deletions (folded or below a floor) and the floors."""

    keys: dict[bytes, int] = field(default_factory=dict)
    namespaces: dict[bytes, int] = field(default_factory=dict)
    gone_keys: set[bytes] = field(default_factory=set)
    gone_namespaces: set[bytes] = field(default_factory=set)
    floor: int | None = None
    scoped: dict[bytes, int] = field(default_factory=dict)
    gone_scoped: set[bytes] = field(default_factory=set)
    scope_floors: dict[bytes, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.keys or self.namespaces or self.gone_keys or self.gone_namespaces
                    or self.floor is not None or self.scoped or self.gone_scoped or self.scope_floors)


class Tombstones:
    """The master's removal tombstones (module docstring). Called under the master's lock."""

    def __init__(self, limit: int, *, scope_limit: int | None = None, clock: Callable[[], int] = wall_us,
                 track: bool = False) -> None:
        """`limit`: the admin's tombstones kept (keys and namespaces together) before the oldest fold into the
        floor; `scope_limit` (default `limit`): each tenant key space's, before its oldest fold into its own floor.
        `track`: collect the changes for a persistent journal (`take_changes`)."""
        scope_limit = limit if scope_limit is None else scope_limit
        for name, value in (("tombstones", limit), ("scope_limit", scope_limit)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.limit = limit
        self.scope_limit = scope_limit
        self._clock = clock
        self._last = 0                      # the last time handed out
        self._keys: dict[bytes, int] = {}
        self._namespaces: dict[bytes, int] = {}
        self.floor = 0
        self._scoped: dict[bytes, dict[bytes, int]] = {}    # tag -> {stored key: time}
        self._scope_floors: dict[bytes, int] = {}
        self.refused = 0                    # reported records refused by a tombstone or the floor
        self.folded = 0                     # tombstones folded into the floor (beyond `limit`)
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
        """Tombstones for these stored keys (a removal); returns its time."""
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
        if self._scope_floors or self._scoped:
            tag = key[:TAG_BYTES]
            scoped = self._scoped.get(tag)
            if written_us < self._scope_floors.get(tag, 0) or (scoped is not None and written_us < scoped.get(key, 0)):
                self.refused += 1
                return True
        return False

    def floor_of(self, key: bytes) -> int:
        """The time before which any record of `key` is refused: the pool's floor or its key space's."""
        return max(self.floor, self._scope_floors.get(bytes(key[:TAG_BYTES]), 0))

    # ---------------------------------------------------------------- persistence

    def load(self, state: TombstoneState) -> None:
        """What a persistent backend kept (a master starting on it); times handed out start after all of it."""
        self._keys = dict(state.keys)
        self._namespaces = dict(state.namespaces)
        self.floor = state.floor
        self._scoped = {}
        for key, t in state.scoped.items():
            self._scoped.setdefault(key[:TAG_BYTES], {})[key] = t
        self._scope_floors = dict(state.scope_floors)
        self._last = max([self._last, self.floor, *self._keys.values(), *self._namespaces.values(),
                          *state.scoped.values(), *self._scope_floors.values()])
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
        for tag, floor in changes.scope_floors.items():
            if newer.scope_floors.get(tag, 0) < floor:
                newer.scope_floors[tag] = floor

    def __len__(self) -> int:
        return len(self._keys) + len(self._namespaces) + sum(len(table) for table in self._scoped.values())

    # ---------------------------------------------------------------- internals

    def _set(self, table: dict[bytes, int], upserts: dict[bytes, int], gone: set[bytes], name: bytes, t: int) -> None:
        """`name`'s tombstone at `t` (a later removal's time replaces an earlier one), and the change noted."""
        table[name] = t
        if self._track:
            upserts[name] = t
            gone.discard(name)

    def _fold(self) -> None:
        """Beyond `limit`, the admin's oldest tombstones go into the floor (down to _FOLD_TO of it)."""
        if len(self._keys) + len(self._namespaces) <= self.limit:
            return
        keep = int(self.limit * _FOLD_TO)
        times = sorted([*self._keys.values(), *self._namespaces.values()])
        cut = times[len(times) - keep - 1]      # the newest time folded
        n = len(self)
        self._raise_floor(cut + 1)
        self.folded += n - len(self)

    def _fold_scope(self, tag: bytes) -> None:
        """Beyond `scope_limit`, a tenant key space's oldest tombstones go into its own floor (down to _FOLD_TO)."""
        table = self._scoped.get(tag)
        if table is None or len(table) <= self.scope_limit:
            return
        keep = int(self.scope_limit * _FOLD_TO)
        times = sorted(table.values())
        floor = times[len(times) - keep - 1] + 1    # after the newest time folded
        if floor <= self._scope_floors.get(tag, 0):
            return
        self._scope_floors[tag] = floor
        old = [k for k, t in table.items() if t < floor]
        for k in old:
            del table[k]
        self.folded += len(old)
        if self._track:
            changes = self._changes
            for k in old:
                changes.scoped.pop(k, None)
                changes.gone_scoped.add(k)
            changes.scope_floors[tag] = floor

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
