"""LRUPolicy: least recently used first, as a doubly linked list threaded through the index's slots.

The master tracks up to millions of objects per tier, so the policy holds no per-object Python object: `prev` and
`next` are int32 arrays indexed by slot (8 B per slot, grown by doubling), in the spirit of vLLM's free-block queue.
An OrderedDict of 16-byte keys cost ~105 B per object.
```
 head (cold) ─▶ c ⇄ b ⇄ a ◀─ tail (hot)      _next[c] = b, _prev[a] = b, _next[a] = NIL, untracked: _next = OUT
```
A chain (prefix order, parent first) is moved to the hot end tail-first, so the parent ends up hotter than its
tail and ties are broken tails-before-parents: insert_chain([a, b, c]) gives victims c, b, a. Orphans
(`mark_orphans`) are moved to the cold end, so they are the next victims; a touch moves them hot like any slot.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence

import numpy as np

NIL = -1   # end of the list
OUT = -2   # _next of an untracked slot
_SPLICE_LOOP = 128   # chains up to this long are checked for adjacency in Python (_splice)


def grow(arr: array, size: int, fill: int) -> None:
    """Extend `arr` to at least `size` entries (doubling) with `fill`."""
    if len(arr) < size:
        arr.extend(array(arr.typecode, [fill]) * (max(size, 2 * len(arr), 64) - len(arr)))


class LRUPolicy:
    """O(1) insert/touch/remove per slot. Not thread-safe: the master serialises calls. Slots are ints >= 0.

    `links`: (prev, next) arrays to thread this list through, shared with other lists whose slot sets are disjoint
    (the master's per-tenant lists, store/quota.py: one pair of arrays for all of them instead of one per list).
    A shared slot is "in" whichever list the caller put it in: membership tests (`slot in lru`) then say "in some
    list", so the caller must address the right list itself."""

    name = "lru"
    __slots__ = ("_prev", "_next", "_head", "_tail", "_len")

    def __init__(self, links: tuple[array, array] | None = None) -> None:
        self._prev, self._next = links if links is not None else (array("i"), array("i"))
        self._head = NIL
        self._tail = NIL
        self._len = 0

    def insert_chain(self, slots: Sequence[int], keys: Sequence[bytes] | None = None) -> None:
        """`keys` is accepted for the interface's sake (S3-FIFO's ghost needs them); LRU does not use them."""
        if slots:
            top = max(slots)
            if top >= len(self._next):
                grow(self._prev, top + 1, NIL)
                grow(self._next, top + 1, OUT)
        nxt = self._next
        for slot in reversed(slots):
            if nxt[slot] == OUT:
                self._len += 1
            elif slot == self._tail:
                continue
            else:
                self._unlink(slot)
            self._push_hot(slot)

    def touch_chain(self, slots: Sequence[int] | np.ndarray) -> None:
        """A numpy array of slots is welcome: a chain touched again (already adjacent, in chain order) is then
        checked in one vectorised compare and moved to the hot end as one block."""
        if len(slots) > 16 and self._splice(slots):
            return
        if isinstance(slots, np.ndarray):
            slots = slots.tolist()
        # Unlink + push-hot inlined with locals: this runs for every key of every leased lookup (a 1,000-key
        # chain in one RPC), where method calls and attribute lookups would cost ~5x the list surgery itself.
        prev, nxt = self._prev, self._next
        n = len(nxt)
        head, tail = self._head, self._tail
        for slot in reversed(slots):
            if slot >= n or slot == tail:
                continue
            q = nxt[slot]
            if q == OUT:
                continue
            p = prev[slot]                  # slot is tracked and not the tail: q is a slot, the list non-empty
            if p == NIL:
                head = q
            else:
                nxt[p] = q
            prev[q] = p
            prev[slot] = tail
            nxt[slot] = NIL
            nxt[tail] = slot
            tail = slot
        self._head, self._tail = head, tail

    def _splice(self, slots) -> bool:
        """If `slots` already sit adjacent from cold to hot as slots[-1] ... slots[0], move them to the hot end as
        one block and return True; else change nothing and return False. Up to _SPLICE_LOOP slots the adjacency is
        checked in a Python loop over the list (a few numpy calls cost more than the whole walk), beyond in numpy."""
        if len(slots) <= _SPLICE_LOOP:
            sl = slots.tolist() if isinstance(slots, np.ndarray) else list(slots)
            nxt = self._next
            if min(sl) < 0 or max(sl) >= len(nxt):
                return False
            above = sl[0]
            for slot in sl[1:]:
                if nxt[slot] != above:
                    return False
                above = slot
            cold, hot = sl[-1], sl[0]
        else:
            s = np.asarray(slots, dtype=np.int64)
            if s.ndim != 1 or s.min() < 0 or s.max() >= len(self._next):
                return False
            view = np.frombuffer(self._next, dtype=np.int32)   # no copy; released before the array can grow
            adjacent = bool((view[s[1:]] == s[:-1]).all())
            del view
            if not adjacent:
                return False
            cold, hot = int(s[-1]), int(s[0])
        if hot == self._tail:
            return True
        prev, nxt = self._prev, self._next
        p, q = prev[cold], nxt[hot]         # hot is tracked and not the tail: q is a slot
        if p == NIL:
            self._head = q
        else:
            nxt[p] = q
        prev[q] = p
        prev[cold] = self._tail
        nxt[self._tail] = cold
        nxt[hot] = NIL
        self._tail = hot
        return True

    def mark_orphans(self, slots: Sequence[int]) -> None:
        """Each slot in prefix order goes to the cold end, so the last (the deepest tail) is the first victim."""
        for slot in slots:
            if slot not in self or slot == self._head:
                continue
            self._unlink(slot)
            self._push_cold(slot)

    def remove(self, slot: int, key: bytes | None = None) -> bool:
        if slot not in self:
            return False
        self._unlink(slot)
        self._next[slot] = OUT
        self._len -= 1
        return True

    def victims(self) -> Iterator[int]:
        # The caller evicts (removes) and skips (leased) while iterating. The next slot is read before yielding;
        # if the caller removed or moved it meanwhile, restart from the cold end past what was already yielded.
        yielded: set[int] = set()
        cur = self._head
        while cur != NIL:
            after = self._next[cur]
            yielded.add(cur)
            yield cur
            if after != NIL and self._next[after] != OUT and after not in yielded:
                cur = after
                continue
            cur = self._head
            while cur != NIL and cur in yielded:
                cur = self._next[cur]

    def clear(self) -> None:
        self._prev = array("i")
        self._next = array("i")
        self._head = self._tail = NIL
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __contains__(self, slot: object) -> bool:
        return isinstance(slot, int) and 0 <= slot < len(self._next) and self._next[slot] != OUT

    def __repr__(self) -> str:
        return f"LRUPolicy({self._len} slots)"

    def _unlink(self, slot: int) -> None:
        prev, nxt = self._prev, self._next
        p, n = prev[slot], nxt[slot]
        if p == NIL:
            self._head = n
        else:
            nxt[p] = n
        if n == NIL:
            self._tail = p
        else:
            prev[n] = p

    def _push_cold(self, slot: int) -> None:
        head = self._head
        self._next[slot] = head
        self._prev[slot] = NIL
        if head == NIL:
            self._tail = slot
        else:
            self._prev[head] = slot
        self._head = slot

    def _push_hot(self, slot: int) -> None:
        tail = self._tail
        self._prev[slot] = tail
        self._next[slot] = NIL
        if tail == NIL:
            self._head = slot
        else:
            self._next[tail] = slot
        self._tail = slot
