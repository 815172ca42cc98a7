"""S3FIFOPolicy: exact victim order (probation, promotion, second chances, ghost readmission), safe iteration,
and a seeded trace on which it must beat LRU (the bar for any policy other than LRU)."""

from __future__ import annotations

import random

import pytest

from kvpool.tiers.lru import LRUPolicy
from kvpool.tiers.policy import EvictionPolicy, make_policy
from kvpool.tiers.s3fifo import S3FIFOPolicy


_SLOTS: dict[str, int] = {}


def k(name: str) -> int:
    """The slot standing for `name` (policies track index slots, plain ints)."""
    return _SLOTS.setdefault(name, 2 * len(_SLOTS) + 1)


def key(slot: int) -> bytes:
    return names([slot])[0].encode().ljust(16, b".")


def names(slots) -> list[str]:
    by_slot = {s: n for n, s in _SLOTS.items()}
    return [by_slot[s] for s in slots]


def ins(p, slots: list[int]) -> None:
    p.insert_chain(slots, [key(s) for s in slots])


def evict(p: S3FIFOPolicy, n: int) -> list[str]:
    out = []
    for victim in p.victims():
        p.remove(victim, key(victim))
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
    ins(p, [k("a1"), k("a2"), k("a3")])
    ins(p, [k("b1"), k("b2")])
    assert names(p.victims()) == ["a3", "a2", "a1", "b2", "b1"]
    assert len(p) == 5 and k("a1") in p


def test_used_keys_are_promoted_and_outlive_one_hit_wonders():
    p = S3FIFOPolicy()
    ins(p, [k("a1"), k("a2"), k("a3")])
    ins(p, [k("b1"), k("b2")])
    p.touch_chain([k("a1"), k("a2")])            # a prefix hit on chain a
    assert evict(p, 3) == ["a3", "b2", "b1"]     # a1, a2 were promoted to main on the way
    assert names(p.victims()) == ["a2", "a1"]    # main keeps chain order: tail before parent


def test_main_gives_second_chances_by_use_count():
    p = S3FIFOPolicy()
    ins(p, [k("x"), k("y")])
    p.touch_chain([k("x"), k("y")])
    assert names(p.victims()) == ["y", "x"]      # both promoted on the way (freq reset to 0), none evicted
    p.touch_chain([k("y")])
    p.touch_chain([k("y")])
    assert evict(p, 1) == ["x"]                   # y spends its uses on extra rounds
    assert names(p.victims()) == ["y"]


def test_ghost_readmits_straight_to_main():
    p = S3FIFOPolicy()
    ins(p, [k("g")])
    ins(p, [k("n1"), k("n2"), k("n3")])
    assert evict(p, 1) == ["g"]                   # evicted while on probation: remembered
    ins(p, [k("g")])                      # asked for again -> main, not small
    assert evict(p, 3) == ["n3", "n2", "n1"]      # small is drained before main
    assert names(p.victims()) == ["g"]


def test_skipped_victims_are_not_offered_twice_and_iteration_ends():
    p = S3FIFOPolicy()
    ins(p, [k(f"n{i}") for i in range(20)])
    p.touch_chain([k("n0"), k("n1")])
    seen = []
    for victim in p.victims():
        seen.append(victim)
        if victim != k("n5"):                     # n5 is "leased": skipped, everything else evicted
            p.remove(victim, key(victim))
    assert len(seen) == len(set(seen)) == 20
    assert names(seen)[:3] == ["n19", "n18", "n17"]
    assert names(seen)[-2:] == ["n1", "n0"]        # the used ones go last, from main
    assert names(p.victims()) == ["n5"] and len(p) == 1


def trace(seed: int, n_req: int = 2000, n_hot: int = 40, chain: int = 8, p_hot: float = 0.5):
    """Requests are block chains: Zipf-popular shared prompts mixed with one-off prompts nobody repeats."""
    rng = random.Random(seed)
    k = lambda name: name.encode().ljust(16, b".")  # noqa: E731  (keys here, not slots)
    hot = [[k(f"h{i}-{j}") for j in range(chain)] for i in range(n_hot)]
    weights = [1 / (i + 1) for i in range(n_hot)]
    return [rng.choices(hot, weights)[0] if rng.random() < p_hot else [k(f"c{r}-{j}") for j in range(chain)]
            for r in range(n_req)]


def hit_ratio(policy: EvictionPolicy, requests, capacity: int) -> float:
    """Like the master: keys live in slots that are reused (LIFO free list) as soon as their object is evicted."""
    hits = total = 0
    slot_of: dict[bytes, int] = {}
    key_at: dict[int, bytes] = {}
    free = list(range(capacity - 1, -1, -1))
    for keys in requests:
        h = 0
        while h < len(keys) and keys[h] in slot_of:   # prefix lookup
            h += 1
        hits, total = hits + h, total + len(keys)
        victims = policy.victims()
        while len(policy) + sum(x not in slot_of for x in keys[h:]) > capacity:
            slot = next(victims)
            policy.remove(slot, key_at[slot])
            del slot_of[key_at.pop(slot)]
            free.append(slot)
        new = []
        for key_ in keys[h:]:                          # a key past the first miss may still be cached
            slot = slot_of.get(key_)
            if slot is None:
                slot = slot_of[key_] = free.pop()
                key_at[slot] = key_
            new.append(slot)
        policy.insert_chain(new, keys[h:])
        policy.touch_chain([slot_of[x] for x in keys[:h] if x in slot_of])  # evicted just now: ignored
    return hits / total


def test_orphans_leave_before_small_and_main_tails_first_and_a_touch_rescues_them():
    p = S3FIFOPolicy()
    ins(p, [k("m1"), k("m2")])
    p.touch_chain([k("m1"), k("m2")])
    ins(p, [k("s1"), k("s2"), k("s3")])
    p.mark_orphans([k("s2"), k("s3"), k("m2"), k("zz")])   # untracked slot ignored
    assert len(p) == 5
    # orphans first (the order given, reversed: deepest first), then the algorithm as usual
    assert evict(p, 3) == ["m2", "s3", "s2"]
    ins(p, [k("t1"), k("t2")])
    p.mark_orphans([k("t1"), k("t2")])
    p.touch_chain([k("t1")])                                 # read after all: back to probation, used once
    assert evict(p, 1) == ["t2"]
    assert k("t1") in p and len(p) == 3


def test_orphans_made_while_iterating_are_offered_next():
    p = S3FIFOPolicy()
    ins(p, [k("a1"), k("a2")])
    ins(p, [k("b1"), k("b2")])
    out = []
    for victim in p.victims():
        out.append(victim)
        p.remove(victim, key(victim))
        if victim == k("a2"):
            p.mark_orphans([k("b2")])              # evicting a2 stranded b2 (say): it goes next
        if len(out) == 3:
            break
    assert names(out) == ["a2", "b2", "a1"]


def test_beats_lru_on_a_trace_with_one_off_prompts():
    requests = trace(seed=0)
    lru = hit_ratio(LRUPolicy(), requests, capacity=120)
    s3 = hit_ratio(S3FIFOPolicy(), requests, capacity=120)
    assert s3 > lru * 1.3, (s3, lru)
