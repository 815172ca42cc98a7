"""S3FIFOPolicy: exact victim order (probation, promotion, second chances, ghost readmission), safe iteration,
and a seeded trace on which it must beat LRU (the bar for any policy other than LRU)."""

from __future__ import annotations

import random

import pytest

from kvpool.tiers.lru import LRUPolicy
from kvpool.tiers.policy import EvictionPolicy, make_policy
from kvpool.tiers.s3fifo import S3FIFOPolicy


def k(name: str) -> bytes:
    return name.encode().ljust(16, b".")


def names(keys) -> list[str]:
    return [x.rstrip(b".").decode() for x in keys]


def evict(p: S3FIFOPolicy, n: int) -> list[str]:
    out = []
    for victim in p.victims():
        p.remove(victim)
        out.append(victim)
        if len(out) == n:
            break
    return names(out)


def test_make_policy_and_protocol():
    p = make_policy("s3fifo")
    assert isinstance(p, S3FIFOPolicy) and isinstance(p, EvictionPolicy)
    with pytest.raises(ValueError, match="small_ratio"):
        S3FIFOPolicy(small_ratio=1.5)


def test_unused_keys_leave_in_fifo_order_tails_first():
    p = S3FIFOPolicy()
    p.insert_chain([k("a1"), k("a2"), k("a3")])
    p.insert_chain([k("b1"), k("b2")])
    assert names(p.victims()) == ["a3", "a2", "a1", "b2", "b1"]
    assert len(p) == 5 and k("a1") in p


def test_used_keys_are_promoted_and_outlive_one_hit_wonders():
    p = S3FIFOPolicy()
    p.insert_chain([k("a1"), k("a2"), k("a3")])
    p.insert_chain([k("b1"), k("b2")])
    p.touch_chain([k("a1"), k("a2")])            # a prefix hit on chain a
    assert evict(p, 3) == ["a3", "b2", "b1"]     # a1, a2 were promoted to main on the way
    assert names(p.victims()) == ["a2", "a1"]    # main keeps chain order: tail before parent


def test_main_gives_second_chances_by_use_count():
    p = S3FIFOPolicy()
    p.insert_chain([k("x"), k("y")])
    p.touch_chain([k("x"), k("y")])
    assert names(p.victims()) == ["y", "x"]      # both promoted on the way (freq reset to 0), none evicted
    p.touch_chain([k("y")])
    p.touch_chain([k("y")])
    assert evict(p, 1) == ["x"]                   # y spends its uses on extra rounds
    assert names(p.victims()) == ["y"]


def test_ghost_readmits_straight_to_main():
    p = S3FIFOPolicy()
    p.insert_chain([k("g")])
    p.insert_chain([k("n1"), k("n2"), k("n3")])
    assert evict(p, 1) == ["g"]                   # evicted while on probation: remembered
    p.insert_chain([k("g")])                      # asked for again -> main, not small
    assert evict(p, 3) == ["n3", "n2", "n1"]      # small is drained before main
    assert names(p.victims()) == ["g"]


def test_skipped_victims_are_not_offered_twice_and_iteration_ends():
    p = S3FIFOPolicy()
    p.insert_chain([k(f"n{i}") for i in range(20)])
    p.touch_chain([k("n0"), k("n1")])
    seen = []
    for victim in p.victims():
        seen.append(victim)
        if victim != k("n5"):                     # n5 is "leased": skipped, everything else evicted
            p.remove(victim)
    assert len(seen) == len(set(seen)) == 20
    assert names(seen)[:3] == ["n19", "n18", "n17"]
    assert names(seen)[-2:] == ["n1", "n0"]        # the used ones go last, from main
    assert names(p.victims()) == ["n5"] and len(p) == 1


def trace(seed: int, n_req: int = 2000, n_hot: int = 40, chain: int = 8, p_hot: float = 0.5):
    """Requests are block chains: Zipf-popular shared prompts mixed with one-off prompts nobody repeats."""
    rng = random.Random(seed)
    hot = [[k(f"h{i}-{j}") for j in range(chain)] for i in range(n_hot)]
    weights = [1 / (i + 1) for i in range(n_hot)]
    return [rng.choices(hot, weights)[0] if rng.random() < p_hot else [k(f"c{r}-{j}") for j in range(chain)]
            for r in range(n_req)]


def hit_ratio(policy: EvictionPolicy, requests, capacity: int) -> float:
    hits = total = 0
    for keys in requests:
        h = 0
        while h < len(keys) and keys[h] in policy:   # prefix lookup
            h += 1
        hits, total = hits + h, total + len(keys)
        need = len(keys) - h
        victims = policy.victims()
        while len(policy) + need > capacity:
            policy.remove(next(victims))
        policy.insert_chain(keys[h:])
        policy.touch_chain(keys[:h])
    return hits / total


def test_beats_lru_on_a_trace_with_one_off_prompts():
    requests = trace(seed=0)
    lru = hit_ratio(LRUPolicy(), requests, capacity=120)
    s3 = hit_ratio(S3FIFOPolicy(), requests, capacity=120)
    assert s3 > lru * 1.3, (s3, lru)
