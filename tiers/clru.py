"""ClassLRUPolicy ("clru"): blocks seen once go before every reused block; reused blocks age by class, the
most-used slowest; a long ghost remembers how often an evicted key was used, so a block coming back is ranked by
its history, not as new.

Why (measured on the Mooncake FAST'25 synthetic trace, ../shared/traces): the chance that a block is used again
within the next 100 requests is ~0.04 after its first use at any age, ~0.12 after its second (flat with age up to
~800 requests), and 0.32 falling to 0.11 by age 400 after its third or later. So a block seen once is worth a
third or less of any reused block, whatever their ages: LRU (and wlru's mild 3x) lets every new one-off chain push
reused prefixes out, and at 5% of the unique blocks the pool turns over every ~85 requests while a block's second
use comes a median ~570 requests after its first. Here new blocks only push out other new blocks (weight 1000, in
effect strict), reused ones compete among themselves (weights 3 and 2), and because the second use comes back so
late the ghost must reach far: 16 entries per tracked slot (with wlru's ghost, 4 per slot gave +0.5 point at
5% where 16 gave +1.7). Weights between (1000, 1, 1) and (1000, 10, 7) all gave +1.3..+1.9 points at 5% and
+1.1..+1.5 at 10%: a smaller pool favours keeping the most-used blocks, a larger one the twice-used.

Mechanics are wlru's (tiers/wlru.py: per-class LRU lists over int32 slot links, weighted age = (clock - last use)
* WEIGHTS[class], prefix-safe because a parent never has fewer uses than its child, orphans first), with:

    WEIGHTS = (1000, 3, 2)           classes: uses 1, 2, 3+ (a ghost hit counts the remembered uses)
    ghost: u16 entries, 4-way sets, 16-32 entries per tracked slot: 14-bit tag | 2-bit class; set and tag come
           from disjoint bits of a 64-bit hash of the key's first 8 bytes (what a recorded trace keeps)

A false ghost match needs a 14-bit tag collision among 4 ways (~1 in 4,096 lookups) and only promotes one block.
The table doubles by concatenating itself (set s of the old table becomes sets s and s + old size of the new one,
one of which is the right set for each key; the other copy is a stale hint that ages out FIFO).

Memory per tracked slot: 17 B of wlru's arrays + 32-64 B of ghost + 4-8 B of per-set cursors (nbytes(); measured
in tests/tiers/test_clru.py) against LRU's 8 B. Weights and ghost size were picked on the one trace we have; other
traffic may want other values (bench/trace_replay.py prints the comparison). Where the pool is big enough to hold
new blocks until their second use, strict demotion throws that use away: on tests/tiers/test_wlru.py's seeded
conversations clru wins ~8 points over LRU at 5-8% of the unique blocks but loses ~5 at 15%.

Leaf-first eviction (a radix tree's rule: never evict a block with a cached child) is not needed on top: every
ranking here already puts a child before its parent, and on the trace at 5-25% a leaf-only filter over LRU
changed no hit (the share of cached blocks no prefix lookup could reach stayed below 0.01%).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from .wlru import WeightedLRUPolicy

WEIGHTS = (1000, 3, 2)
GHOST_PER_SLOT = 16
_M64 = (1 << 64) - 1
_TAG_SHIFT = 48            # tag bits 48..61 of the hash; set bits come from the low end (< 2**48 sets)


def fingerprint(key: bytes) -> int:
    """A 62-bit hash of the key's first 8 bytes, shifted left by 2 (the low bits carry a class)."""
    h = (int.from_bytes(key[:8], "little") * 0x9E3779B97F4A7C15) & _M64
    h ^= h >> 29
    h = (h * 0xBF58476D1CE4E5B9) & _M64
    return ((h ^ (h >> 32)) & ((1 << 62) - 1)) << 2


class ClassLRUPolicy(WeightedLRUPolicy):
    """Not thread-safe: the master serialises calls. Slots are ints >= 0; `keys` (same order) feed the ghost."""

    name = "clru"
    __slots__ = ()

    _fingerprint = staticmethod(fingerprint)

    def __init__(self, weights: Sequence[int] = WEIGHTS) -> None:
        super().__init__(weights)

    def clear(self) -> None:
        super().clear()
        self._ghost = array("H", [0]) * 64
        self._ghost_next = bytearray(16)
        self._ghost_mask = 15

    def nbytes(self) -> int:
        return (len(self._prev) * 4 + len(self._next) * 4 + len(self._stamp) * 8 + len(self._cls)
                + len(self._ghost) * 2 + len(self._ghost_next))

    # ---- ghost: 4-way sets of u16 (tag << 2 | class), FIFO within a set ----

    def _ghost_add(self, entry: int) -> None:
        h = entry >> 2
        s = h & self._ghost_mask
        way = self._ghost_next[s]
        self._ghost_next[s] = (way + 1) & 3
        self._ghost[(s << 2) | way] = (((h >> _TAG_SHIFT) & 0x3FFF) or 1) << 2 | (entry & 3)

    def _ghost_pop(self, fp: int) -> int:
        """The class remembered for the key with fingerprint `fp` (forgotten on the way), or 0."""
        h = fp >> 2
        tag = ((h >> _TAG_SHIFT) & 0x3FFF) or 1
        base = (h & self._ghost_mask) << 2
        ghost = self._ghost
        for i in range(base, base + 4):
            entry = ghost[i]
            if entry >> 2 == tag:
                ghost[i] = 0
                return entry & 3
        return 0

    def _ghost_grow(self) -> None:
        want = GHOST_PER_SLOT * len(self)
        while len(self._ghost) < want:
            # Set s splits into s and s + old size; which one a key belongs to is one more hash bit than the
            # entry kept, so both inherit the set (the wrong copy never matches its key's lookups and ages out).
            self._ghost = self._ghost + self._ghost
            self._ghost_next = self._ghost_next + self._ghost_next
            self._ghost_mask = (len(self._ghost) >> 2) - 1
