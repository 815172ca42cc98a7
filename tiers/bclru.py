"""BalancedClassLRUPolicy ("bclru"): clru (tiers/clru.py: per-use-class LRU lists, weighted age, a long ghost of
evicted keys' classes) with a new block weighted 15x instead of 1000x: a block seen once goes before a reused block
that is up to 5x older (15 / 3), not before every reused block.

Why (bench/trace_replay.py with Belady's OPT, kvpool/belady.py, as the reference; 2026-11-24): the chance that a
block is used again within the next 300 requests, by its uses so far and its age,

    Mooncake FAST'25 synthetic trace    seen once 0.13-0.14 at every age up to 400 requests; twice ~0.30, flat
    second trace (conversations)        seen once 0.16 at age 0 -> 0.07 at 100; twice 0.69 -> 0.45 -> 0.26 at 200

On the first a new block is worth under half of any reused one at any age, so clru's strict demotion pays; on the
second a conversation's new turn is worth as much as a reused block some 10x older, and strict demotion throws away
the next turn's hit once the pool could have held it (clru: -1.5 points at 10% of the unique blocks there). The
new-block weight is the one knob that trades the two: swept over 15..1000 (with 3 and 2 for reused blocks), 15 was
the only value that loses nowhere to LRU on either trace while keeping most of clru's gain at 10% on the first.
It is picked on these two traces; other traffic may want another value (the planner shows it on a recorded log).

What did not pay (same sweep, planner replays): more classes (use counts up to 15 with falling weights), GreedyDual
over use counts with dynamic aging (LFU-DA: its aging spends a block's credit within ~100 requests, far shorter
than the reuse gaps of 400-640 requests), and ARC-style online tuning of the new-block weight from ghost hits (new
blocks return often on the Mooncake trace, but too late to be worth keeping: it tuned toward the wrong end).

Memory per tracked slot: clru's (its arrays and ghost; nbytes()).
"""

from __future__ import annotations

from .clru import ClassLRUPolicy

WEIGHTS = (15, 3, 2)


class BalancedClassLRUPolicy(ClassLRUPolicy):
    """Not thread-safe: the master serialises calls. Slots are ints >= 0; `keys` (same order) feed the ghost."""

    name = "bclru"
    __slots__ = ()

    def __init__(self, weights=WEIGHTS) -> None:
        super().__init__(weights)
