"""LRUPolicy: least recently used first, on an OrderedDict (cold end first, hot end last).

A chain (prefix order, parent first) is moved to the hot end tail-first, so the parent ends up hotter than its
tail and ties are broken tails-before-parents:
```
 insert_chain([a, b, c])      cold ─▶ ... c b a ◀─ hot          victims: c, b, a
```
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from itertools import islice


class LRUPolicy:
    """O(1) insert/touch/remove per key. Not thread-safe: the master serialises calls."""

    name = "lru"
    __slots__ = ("_order",)

    def __init__(self) -> None:
        self._order: OrderedDict[bytes, None] = OrderedDict()

    def insert_chain(self, keys: Sequence[bytes]) -> None:
        order = self._order
        for key in reversed(keys):
            order[key] = None
            order.move_to_end(key)

    def touch_chain(self, keys: Sequence[bytes]) -> None:
        order = self._order
        for key in reversed(keys):
            if key in order:
                order.move_to_end(key)

    def remove(self, key: bytes) -> bool:
        return self._order.pop(key, 0) is None

    def victims(self) -> Iterator[bytes]:
        # An OrderedDict iterator breaks when the dict changes, and the caller evicts while iterating. So take
        # small snapshots of the cold end, growing geometrically; keys already yielded (e.g. skipped because
        # leased) are passed over on the next snapshot. Total cost stays linear in the keys yielded.
        yielded: set[bytes] = set()
        batch = 64
        while True:
            snapshot = list(islice(self._order, len(yielded) + batch))
            fresh = [k for k in snapshot if k not in yielded]
            if not fresh:
                return
            for key in fresh:
                if key in self._order and key not in yielded:
                    yielded.add(key)
                    yield key
            batch *= 2

    def clear(self) -> None:
        self._order.clear()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def __repr__(self) -> str:
        return f"LRUPolicy({len(self._order)} keys)"
