"""The master index's key <-> slot map: which slot a 16-byte key is linked to, and which key each slot holds.

Two implementations with one interface, chosen by `new_key_table()`:

- `kvpool.store._keytable.KeyTable` (store/_keytable.c, built by `pip install` where a C compiler is found): the keys
  in one 16-byte column by slot, an open-addressing table of slot numbers at most half full, hashed with Python's
  own (seeded) bytes hash, grown a little at every call instead of all at once. ~25-33 B per object, no Python
  object per key. Besides the interface below: `stats()` and `settle()` (finish a growth under way now).
- `DictKeyTable` here: a dict key -> slot and a list slot -> key, ~126 B per object (the key's bytes object, the
  slot's int object, the dict's entry, the list's pointer). Where the extension is not built, or with
  `KVPOOL_NATIVE_KEYS=0` in the environment.

The interface (the index is its only user, under the master's lock):

    get(key, default=None)  the slot `key` is linked to, else default (the index binds it as `find`)
    key in t, len(t)        linked keys
    link(key, slot)         store the 16-byte `key` at `slot` and make it findable (KeyError if the key is
                            linked already, ValueError if it is not 16 bytes or the slot holds a key; nothing changes)
    unlink(slot) -> bool    the slot's key no longer findable; the slot keeps it (a DOOMED object: key_at answers)
    clear(slot)             unlink, and forget the key (the slot is free)
    key_at(slot)            the key the slot holds, linked or not; None for a slot that holds none
    keys_of(slots)          [key_at(s) for s in slots]
    linked()                [(key, slot)] of every findable key, in slot order
    reserve(slots)          room for keys at slots below `slots` (the index grows its rows and this together)
"""

from __future__ import annotations

import os
from collections.abc import Sequence

KEY_BYTES = 16


def _native():
    setting = os.environ.get("KVPOOL_NATIVE_KEYS", "1")
    if setting not in ("0", "1"):
        raise ValueError(f"KVPOOL_NATIVE_KEYS must be 0 (the dict) or 1 (the C table, the default), got {setting!r}")
    if setting == "0":
        return None
    try:
        from kvpool.store._keytable import KeyTable
    except ImportError:     # no C compiler at install: the dict
        return None
    return KeyTable


def native_available() -> bool:
    """Whether `new_key_table()` gives the C table in this process."""
    return _native() is not None


def new_key_table(slots: int = 0, *, native: bool | None = None):
    """A key table with room for `slots` keys. `native`: force the C table (True; ImportError where it is not built)
    or the dict (False); None: the C table unless KVPOOL_NATIVE_KEYS=0 or it is not built."""
    if native is None:
        cls = _native()
    elif native:
        from kvpool.store._keytable import KeyTable as cls
    else:
        cls = None
    return cls(slots) if cls is not None else DictKeyTable(slots)


class DictKeyTable:
    """The key table as a dict and a list (the fallback; the same behaviour as the C table)."""

    def __init__(self, slots: int = 0) -> None:
        self._slot_of: dict[bytes, int] = {}
        self._keys: list[bytes | None] = []
        self.get = self._slot_of.get
        self.reserve(slots)

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, key) -> bool:
        return key in self._slot_of

    def reserve(self, slots: int) -> None:
        if slots > len(self._keys):
            self._keys.extend([None] * (slots - len(self._keys)))

    def link(self, key, slot: int) -> None:
        if not isinstance(key, (bytes, bytearray, memoryview)) or len(key) != KEY_BYTES:
            raise ValueError(f"key: must be {KEY_BYTES} bytes")
        if slot < 0:
            raise ValueError(f"slot: must be >= 0, got {slot}")
        key = bytes(key)
        if key in self._slot_of:
            raise KeyError(f"key {key!r} already linked")
        if slot < len(self._keys) and self._keys[slot] is not None:
            raise ValueError(f"slot: {slot} already holds a key")
        self.reserve(max(slot + 1, 2 * len(self._keys)) if slot >= len(self._keys) else 0)
        self._slot_of[key] = slot
        self._keys[slot] = key

    def unlink(self, slot: int) -> bool:
        key = self.key_at(slot)
        if key is None or self._slot_of.get(key) != slot:    # none, or a newer object's key now (this one DOOMED)
            return False
        del self._slot_of[key]
        return True

    def clear(self, slot: int) -> None:
        self.unlink(slot)
        if slot < len(self._keys):
            self._keys[slot] = None

    def key_at(self, slot: int) -> bytes | None:
        return self._keys[slot] if 0 <= slot < len(self._keys) else None

    def keys_of(self, slots: Sequence[int]) -> list[bytes | None]:
        return [self.key_at(s) for s in slots]

    def linked(self) -> list[tuple[bytes, int]]:
        return sorted(((k, s) for k, s in self._slot_of.items()), key=lambda item: item[1])
