"""WeightedLRUPolicy: exact victim order (weighted ages, tails first), class caps along chains, the ghost, safe
iteration, memory per slot, and a seeded prefix-chain workload replayed through the real Master on which it must
beat LRU."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvpool.planner import replay
from kvpool.tiers.policy import EvictionPolicy, make_policy
from kvpool.tiers.wlru import WeightedLRUPolicy
from kvpool.trace import MOONCAKE_BLOCK_TOKENS, Trace

_SLOTS: dict[str, int] = {}


def k(name: str) -> int:
    """The slot standing for `name` (sparse on purpose: policies index arrays by slot)."""
    return _SLOTS.setdefault(name, 2 * len(_SLOTS) + 1)


def key(slot: int) -> bytes:
    return names([slot])[0].encode().ljust(16, b".")


def names(slots) -> list[str]:
    by_slot = {s: n for n, s in _SLOTS.items()}
    return [by_slot[s] for s in slots]


def ins(p, *labels: str) -> None:
    slots = [k(x) for x in labels]
    p.insert_chain(slots, [key(s) for s in slots])


def evict(p, n: int) -> list[str]:
    out = []
    for victim in p.victims():
        p.remove(victim, key(victim))
        out.append(victim)
        if len(out) == n:
            break
    return names(out)


def test_make_policy_protocol_and_bad_weights():
    p = make_policy("wlru")
    assert isinstance(p, WeightedLRUPolicy) and isinstance(p, EvictionPolicy) and len(p) == 0
    for bad in [(1, 2, 3), (6, 3), (6, 3, 0), (6.0, 3, 2)]:
        with pytest.raises(ValueError, match="weights must be 3 ints > 0, non-increasing"):
            WeightedLRUPolicy(bad)


def test_new_chains_leave_in_lru_order_tails_first():
    p = WeightedLRUPolicy()
    ins(p, "a1", "a2", "a3")
    ins(p, "b1", "b2")
    assert names(p.victims()) == ["a3", "a2", "a1", "b2", "b1"]
    assert len(p) == 5 and k("a1") in p and k("zz") not in p and "x" not in p


def test_reused_blocks_age_slower_than_new_ones():
    p = WeightedLRUPolicy()
    ins(p, "a1", "a2")                                  # clock 2: a2 stamped 1, a1 2
    p.touch_chain([k("a1"), k("a2")])                   # class 1 (uses 2): a2 stamped 3, a1 4
    ins(p, "b1", "b2", "b3", "b4")                      # class 0: b4 5 ... b1 8; clock 8
    # b4: age 3 x 6 = 18 > a2: age 5 x 3 = 15; then a2 15 > b3 12; a1 12 ties b3 12: the older (a1) first
    assert names(p.victims()) == ["b4", "a2", "a1", "b3", "b2", "b1"]
    assert [p.class_of(k(x)) for x in ("a1", "b1")] == [1, 0] and p.class_of(k("nope")) == -1
    q = make_policy("lru")                              # the same calls under LRU: the touched chain goes first
    for call, arg in [("insert_chain", ["a1", "a2"]), ("touch_chain", ["a1", "a2"]),
                      ("insert_chain", ["b1", "b2", "b3", "b4"])]:
        getattr(q, call)([k(x) for x in arg])
    assert names(q.victims()) == ["a2", "a1", "b4", "b3", "b2", "b1"]


def test_orphans_go_first_whatever_their_class_tails_first_and_a_touch_rescues_them():
    p = WeightedLRUPolicy()
    ins(p, "o1", "o2")                                  # the oldest, class 0
    ins(p, "h1", "h2", "h3")
    for _ in range(3):
        p.touch_chain([k("h1"), k("h2"), k("h3")])      # class 2: ages slowest
    p.mark_orphans([k("h2"), k("h3"), k("nope")])       # h1 left the pool; an untracked slot is ignored
    assert names(p.victims()) == ["h3", "h2", "o2", "o1", "h1"]
    p.mark_orphans([k("o1")])                           # a later orphan is colder than the earlier ones
    assert names(p.victims())[:3] == ["o1", "h3", "h2"]
    p.touch_chain([k("h2")])                            # read by a client holding h1 itself: ordinary again
    assert names(p.victims()) == ["o1", "h3", "o2", "h1", "h2"]
    assert len(p) == 5


def test_touch_is_a_numpy_friendly_hit_and_ignores_unknown_slots():
    p = WeightedLRUPolicy()
    ins(p, "c1", "c2")
    p.touch_chain(np.array([k("c1"), k("c2"), 10**6], dtype=np.int64))
    assert [p.class_of(k("c1")), p.class_of(k("c2"))] == [1, 1] and len(p) == 2
    for _ in range(3):
        p.touch_chain([k("c1")])
    assert p.class_of(k("c1")) == 2                      # capped at the top class
    ins(p, "c2")                                         # re-inserting a tracked slot is a hit
    assert p.class_of(k("c2")) == 2


def test_ghost_restores_a_returning_keys_class():
    p = WeightedLRUPolicy()
    ins(p, "g")
    ins(p, "n1", "n2")
    assert evict(p, 1) == ["g"]                          # evicted as class 0: remembered as "one up"
    ins(p, "g")
    assert p.class_of(k("g")) == 1
    assert names(p.victims()) == ["n2", "n1", "g"]      # n2: age 2 x 6 = 12 > g: age 0
    assert p.remove(k("n1")) and not p.remove(k("n1"))  # no key: nothing remembered
    ins(p, "n1")
    assert p.class_of(k("n1")) == 0


def test_a_chain_never_ranks_a_child_above_its_parent():
    p = WeightedLRUPolicy()
    ins(p, "x")
    assert evict(p, 1) == ["x"]                          # x remembered as class 1
    ins(p, "y")
    p.touch_chain([k("y")])
    p.touch_chain([k("y")])
    assert evict(p, 1) == ["y"]                          # y remembered as class 2
    ins(p, "x", "y")                                     # x parent of y: y is capped at x's class
    assert [p.class_of(k("x")), p.class_of(k("y"))] == [1, 1]
    assert names(p.victims()) == ["y", "x"]
    p.touch_chain([k("x"), k("y")])                      # both one up, y still not above x
    assert [p.class_of(k("x")), p.class_of(k("y"))] == [2, 2] and names(p.victims()) == ["y", "x"]


def test_skipped_victims_are_not_offered_twice_and_iteration_ends():
    p = WeightedLRUPolicy()
    ins(p, *[f"n{i}" for i in range(20)])
    p.touch_chain([k("n0"), k("n1")])
    seen = []
    for victim in p.victims():
        seen.append(victim)
        if victim != k("n5"):                            # n5 is "leased": skipped, the rest evicted
            p.remove(victim, key(victim))
    assert len(seen) == len(set(seen)) == 20
    assert names(seen)[:3] == ["n19", "n18", "n17"] and names(seen)[-2:] == ["n1", "n0"]
    assert names(p.victims()) == ["n5"] and len(p) == 1
    p.clear()
    assert len(p) == 0 and list(p.victims()) == []


def test_memory_per_tracked_slot():
    p = WeightedLRUPolicy()
    n = 100_000
    for start in range(0, n, 1000):
        slots = list(range(start, start + 1000))
        p.insert_chain(slots, [s.to_bytes(16, "little") for s in slots])
    per_slot = p.nbytes() / len(p)
    # 17 B of per-slot arrays + a ghost of 4-8 u32 entries per slot (+1 cursor byte per 4): measured ~50 B
    assert p._prev.itemsize == p._next.itemsize == 4 and p._stamp.itemsize == 8
    assert 17 + 16 <= per_slot <= 17 + 33, per_slot


# ---------------------------------------------------------------------------------------------- workload

def conversations(seed: int, n_req: int = 3000) -> Trace:
    """Prefix-chain traffic as in the Mooncake traces, small: multi-turn conversations (Zipf-popular system
    prompts of 4 blocks, each turn appends 1-3 blocks and comes back 20-300 requests later) interleaved with
    one-off long documents (12 blocks nobody asks for again) that flush an LRU."""
    rng = random.Random(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    prompts = [fresh(4) for _ in range(12)]
    weights = [1 / (i + 1) for i in range(12)]
    due: dict[int, list[list[int]]] = {}
    chains: list[list[int]] = []
    for r in range(n_req):
        waiting = due.pop(r, [])
        if waiting:
            chain = waiting[0] + fresh(rng.randint(1, 3))
            for other in waiting[1:]:
                due.setdefault(r + 1, []).append(other)
        elif rng.random() < 0.45:
            chain = list(rng.choices(prompts, weights)[0]) + fresh(rng.randint(1, 3))
        else:
            chain = fresh(12)                                  # a one-off document
        if len(chain) < 40 and rng.random() < 0.8 and len(chain) != 12:
            due.setdefault(r + rng.randint(20, 300), []).append(chain)
        chains.append(chain)
    lengths = np.array([len(c) for c in chains])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = len(chains)
    return Trace(offsets=offsets, block_ids=np.concatenate(chains).astype(np.uint64), op=np.zeros(n, np.uint8),
                 time_s=np.arange(n, dtype=np.float64), tokens=lengths * MOONCAKE_BLOCK_TOKENS,
                 block_tokens=np.full(n, MOONCAKE_BLOCK_TOKENS, np.int32), source=f"conversations(seed={seed})")


def test_beats_lru_on_a_seeded_prefix_chain_workload_through_the_master():
    trace = conversations(seed=0)
    cap = int(trace.unique_blocks() * 0.08)
    lru = replay(trace, cap, "lru")[0].block_hit_rate
    wlru = replay(trace, cap, "wlru")[0].block_hit_rate
    assert wlru >= lru + 0.03, (wlru, lru)
