"""WeightedLRUPolicy: LRU per use class, where blocks seen once age faster than blocks reused; evicted keys'
use classes are remembered (ghost), so a block coming back after eviction is not mistaken for a new one.

Why not plain LRU: on prefix-chain traffic (Mooncake traces) a block used twice is about twice as likely to be used
again as a block seen once (0.42 vs 0.84 on the synthetic trace, 0.24 vs 0.42 on the conversation one), yet LRU
ranks a brand-new chain tail exactly like a prefix that was just hit. Why not S3-FIFO/ARC-style probation: reuse
gaps there are hundreds of requests, far longer than a small probation queue, so probation throws reused prefixes
away (S3-FIFO loses 4-6 points to LRU on that trace). Here nothing is thrown away early; a new block just counts
as older than it is:

    class c = min(uses, 3) - 1          uses = commits + hits (+ the class a ghost remembered on re-insertion)
    weighted age = (clock - last use) * WEIGHTS[c],  WEIGHTS = (6, 3, 2)    (seen once: x3, twice: x1.5, 3+: x1)
    clock = blocks inserted or touched so far

`victims()` compares the cold ends of the three per-class LRU lists and yields the largest weighted age (ties: the
older, then the lower class). Prefix safety: a parent has at least its child's uses and was touched no earlier, so
its weighted age is never larger (weights fall with the class): tails go before the parents that make them useful.
Chains are stamped tail first (the tail one tick older), so within a chain touched at once the tail goes first.
Orphans (`mark_orphans`) go to the cold end of class 0 with stamps older than any use (a second clock counting down
from -2**62), so their weighted age beats every other block's; a touch stamps them like any block again.

Layout per tracked slot (no per-object Python object; the master tracks millions): prev/next int32 (8 B), last-use
stamp int64 (8 B), class byte (1 B), in three doubly linked lists threaded through the arrays as in lru.py; plus
the ghost, a direct-mapped u32 table of 4-8 entries per tracked slot (16-32 B): 30 bits of key fingerprint and the
class in the low 2 bits. A collision overwrites an entry (the ghost is a hint: losing one only makes a returning key
start as class 0). Weights were picked on the Mooncake FAST'25 synthetic and conversation traces
(bench/trace_replay.py prints the comparison).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence

from .lru import NIL, grow

CLASSES = 3
WEIGHTS = (6, 3, 2)            # age multiplier per class: uses 1, 2, 3+
GHOST_PER_SLOT = 4             # ghost entries per tracked slot (the table is a power of two at least this big)
_OUT = 255                     # class byte of an untracked slot
_M64 = (1 << 64) - 1


def fingerprint(key: bytes) -> int:
    """30 bits of a key, shifted left by 2 (the low bits carry the remembered class); never 0."""
    # Only the key's first 8 bytes: a recorded trace keeps exactly those (store/traffic.py key ids), so a replay
    # through the planner (other high bytes) fills the ghost as the live pool did and gets the same hits.
    h = (int.from_bytes(key[:8], "little") * 0x9E3779B97F4A7C15) & _M64
    return ((((h >> 32) ^ h) & 0x3FFFFFFF) or 1) << 2


class WeightedLRUPolicy:
    """Not thread-safe: the master serialises calls. Slots are ints >= 0; `keys` (same order) feed the ghost."""

    name = "wlru"
    __slots__ = ("_prev", "_next", "_stamp", "_cls", "_head", "_tail", "_count", "_clock", "_ghost", "_ghost_next",
                 "_ghost_mask", "_weights", "_orphan_clock")

    def __init__(self, weights: Sequence[int] = WEIGHTS) -> None:
        if (len(weights) != CLASSES or any(isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in weights)
                or any(a < b for a, b in zip(weights, weights[1:]))):
            raise ValueError(f"weights must be {CLASSES} ints > 0, non-increasing, got {weights!r}")
        self._weights = tuple(weights)
        self.clear()

    def insert_chain(self, slots: Sequence[int], keys: Sequence[bytes] | None = None) -> None:
        if keys is not None and len(keys) != len(slots):
            raise ValueError(f"keys has {len(keys)} entries, slots has {len(slots)}")
        if not len(slots):
            return
        self._ensure(max(slots) + 1)
        cls = self._cls
        top = CLASSES - 1
        want = []
        for i, slot in enumerate(slots):            # parent first: a block never ranks above its parent
            c = cls[slot]
            if c != _OUT:
                c = c + 1 if c < top else c
            elif keys is not None:
                c = self._ghost_pop(self._fingerprint(keys[i]))
            else:
                c = 0
            top = min(top, c)
            want.append(top)
        for i in range(len(slots) - 1, -1, -1):    # tail first: the parent ends up a tick younger
            slot = slots[i]
            self._clock += 1
            if cls[slot] != _OUT:
                self._unlink(slot)
            self._push(slot, want[i])
        self._ghost_grow()

    def touch_chain(self, slots: Sequence[int]) -> None:
        if hasattr(slots, "tolist"):               # a numpy array from the master: plain ints index faster
            slots = slots.tolist()
        cls = self._cls
        n = len(cls)
        top = CLASSES - 1
        want = []
        for slot in slots:                          # parent first: a block never ranks above its parent
            c = cls[slot] if slot < n else _OUT
            if c != _OUT:
                top = min(top, c + 1 if c + 1 < CLASSES else c)
            want.append(top)
        for i in range(len(slots) - 1, -1, -1):
            slot = slots[i]
            if slot < n and cls[slot] != _OUT:
                self._clock += 1
                self._unlink(slot)
                self._push(slot, want[i])

    def mark_orphans(self, slots: Sequence[int]) -> None:
        """Each tracked slot (prefix order) moves to the cold end of class 0, stamped older than anything, the last
        one given (the deepest tail) oldest of all."""
        cls = self._cls
        n = len(cls)
        for slot in slots:
            if slot < n and cls[slot] != _OUT:
                self._unlink(slot)
                self._orphan_clock -= 1
                self._push_cold(slot, 0, self._orphan_clock)

    def remove(self, slot: int, key: bytes | None = None) -> bool:
        if slot not in self:
            return False
        if key is not None:                         # remember the class it reached (next time it starts one up)
            c = self._cls[slot]
            self._ghost_add(self._fingerprint(key) | (c + 1 if c + 1 < CLASSES else c))
        self._unlink(slot)
        return True

    def victims(self) -> Iterator[int]:
        """Coldest first. The caller may remove (evict) or skip (leased) each; a skipped one is not offered again."""
        offered: set[int] = set()
        cursor = list(self._head)
        cls, nxt, stamp, weights = self._cls, self._next, self._stamp, self._weights
        while True:
            best, best_rank, best_stamp = NIL, -1, 0
            for c in range(len(weights)):   # one list per weight (subclasses may keep more lists)
                slot = cursor[c]
                if slot != NIL and (cls[slot] != c or slot in offered):
                    slot = cursor[c] = self._first_fresh(c, offered)   # stale cursor: rescan from the cold end
                if slot == NIL:
                    continue
                s = stamp[slot]
                rank = (self._clock - s) * weights[c]
                if rank > best_rank or (rank == best_rank and s < best_stamp):
                    best, best_rank, best_stamp = slot, rank, s
            if best == NIL:
                return
            c = cls[best]
            after = nxt[best]
            offered.add(best)
            yield best
            cursor[c] = nxt[best] if cls[best] == c else after

    def clear(self) -> None:
        self._prev = array("i")
        self._next = array("i")
        self._stamp = array("q")
        self._cls = bytearray()
        self._head = [NIL] * CLASSES
        self._tail = [NIL] * CLASSES
        self._count = [0] * CLASSES
        self._clock = 0
        self._orphan_clock = -(1 << 62)
        self._ghost = array("I", [0]) * 64
        self._ghost_next = bytearray(16)
        self._ghost_mask = 15

    def __len__(self) -> int:
        return self._count[0] + self._count[1] + self._count[2]

    _fingerprint = staticmethod(fingerprint)   # key -> ghost entry with the class bits clear (tiers/clru.py: wider)

    def __contains__(self, slot: object) -> bool:
        return isinstance(slot, int) and 0 <= slot < len(self._cls) and self._cls[slot] != _OUT

    def __repr__(self) -> str:
        return f"WeightedLRUPolicy(by class {self._count})"

    def class_of(self, slot: int) -> int:
        """0, 1 or 2 (uses 1, 2, 3+) for a tracked slot; -1 otherwise."""
        return self._cls[slot] if slot in self else -1

    def nbytes(self) -> int:
        """Bytes held by the per-slot arrays and the ghost (tests and the benchmark divide by len())."""
        return (len(self._prev) * 4 + len(self._next) * 4 + len(self._stamp) * 8 + len(self._cls)
                + len(self._ghost) * 4 + len(self._ghost_next))

    # ---- lists ----

    def _ensure(self, size: int) -> None:
        if size > len(self._cls):
            grow(self._prev, size, NIL)
            grow(self._next, size, NIL)
            grow(self._stamp, size, 0)
            self._cls.extend(bytes([_OUT]) * (len(self._prev) - len(self._cls)))

    def _push(self, slot: int, c: int) -> None:
        tail = self._tail[c]
        self._prev[slot] = tail
        self._next[slot] = NIL
        if tail == NIL:
            self._head[c] = slot
        else:
            self._next[tail] = slot
        self._tail[c] = slot
        self._cls[slot] = c
        self._stamp[slot] = self._clock
        self._count[c] += 1

    def _push_cold(self, slot: int, c: int, stamp: int) -> None:
        head = self._head[c]
        self._next[slot] = head
        self._prev[slot] = NIL
        if head == NIL:
            self._tail[c] = slot
        else:
            self._prev[head] = slot
        self._head[c] = slot
        self._cls[slot] = c
        self._stamp[slot] = stamp
        self._count[c] += 1

    def _unlink(self, slot: int) -> None:
        c = self._cls[slot]
        p, n = self._prev[slot], self._next[slot]
        if p == NIL:
            self._head[c] = n
        else:
            self._next[p] = n
        if n == NIL:
            self._tail[c] = p
        else:
            self._prev[n] = p
        self._cls[slot] = _OUT
        self._count[c] -= 1

    def _first_fresh(self, c: int, offered: set[int]) -> int:
        slot = self._head[c]
        while slot != NIL and slot in offered:
            slot = self._next[slot]
        return slot

    # ---- ghost ----
    # 4-way set associative, FIFO within a set (a per-set round-robin cursor): an entry outlives about as many
    # later evictions as the table has entries. Direct mapping lost ~40% of entries inside that window, and a lost
    # entry is costly: the key comes back as class 0 under a child restored as class 2 (measured: 1-2 points).

    def _ghost_add(self, entry: int) -> None:
        s = (entry >> 2) & self._ghost_mask
        way = self._ghost_next[s]
        self._ghost_next[s] = (way + 1) & 3
        self._ghost[(s << 2) | way] = entry

    def _ghost_pop(self, fp: int) -> int:
        """The class remembered for the key with fingerprint `fp` (forgotten on the way), or 0."""
        base = ((fp >> 2) & self._ghost_mask) << 2
        ghost = self._ghost
        for i in range(base, base + 4):
            entry = ghost[i]
            if entry >> 2 == fp >> 2:
                ghost[i] = 0
                return entry & 3
        return 0

    def _ghost_grow(self) -> None:
        want = GHOST_PER_SLOT * len(self)
        size = len(self._ghost)
        if want <= size:
            return
        while size < want:
            size *= 2
        old = self._ghost
        self._ghost = array("I", [0]) * size
        self._ghost_next = bytearray(size >> 2)
        self._ghost_mask = (size >> 2) - 1
        for entry in old:                   # set order, not age order: a rare early loss on growth is fine
            if entry:
                self._ghost_add(entry)
