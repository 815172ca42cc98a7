"""LRUPolicy / make_policy: exact victim order, chain tails before parents, touch reorders, safe iteration."""

from __future__ import annotations

import pytest

from kvpool.tiers.lru import LRUPolicy
from kvpool.tiers.policy import EvictionPolicy, make_policy

_SLOTS: dict[str, int] = {}


def k(name: str) -> int:
    """The slot standing for `name` (policies track index slots, plain ints; sparse on purpose)."""
    return _SLOTS.setdefault(name, 3 * len(_SLOTS) + 1)


def names(slots) -> list[str]:
    by_slot = {s: n for n, s in _SLOTS.items()}
    return [by_slot[s] for s in slots]


def test_make_policy():
    p = make_policy("lru")
    assert isinstance(p, LRUPolicy) and isinstance(p, EvictionPolicy)
    assert len(p) == 0


def test_no_per_object_python_objects():
    p = LRUPolicy()
    p.insert_chain(list(range(1000)))
    assert p._next.itemsize == p._prev.itemsize == 4 and len(p._next) == 1000    # grown to the top slot
    p.remove(500)
    assert 500 not in p and 499 in p and -1 not in p and "x" not in p and len(p) == 999
    p.insert_chain([5000])                          # a far slot doubles past it
    assert len(p._next) == 5001 and list(p.victims())[:2] == [999, 998] and list(p.victims())[-1] == 5000
    with pytest.raises(ValueError,
                       match=r"policy must be one of \['lru', 's3fifo', 'wlru', 'clru', 'bclru', 'lclru'\], got 'mru'"):
        make_policy("mru")


def test_chain_tails_are_evicted_before_parents():
    p = LRUPolicy()
    p.insert_chain([k("a1"), k("a2"), k("a3")])
    assert names(p.victims()) == ["a3", "a2", "a1"]
    p.insert_chain([k("b1"), k("b2")])             # a newer chain is hotter than the whole older one
    assert names(p.victims()) == ["a3", "a2", "a1", "b2", "b1"]
    assert len(p) == 5 and k("a1") in p and k("zz") not in p


def test_touch_reorders_and_ignores_unknown_keys():
    p = LRUPolicy()
    p.insert_chain([k("a1"), k("a2"), k("a3")])
    p.insert_chain([k("b1"), k("b2")])
    p.touch_chain([k("a1"), k("a2"), k("nope")])   # a prefix hit on chain a
    assert names(p.victims()) == ["a3", "b2", "b1", "a2", "a1"]
    assert k("nope") not in p
    p.insert_chain([k("b1")])                      # re-inserting a tracked key is a touch
    assert names(p.victims()) == ["a3", "b2", "a2", "a1", "b1"]
    assert len(p) == 5


def test_shared_prefix_chains():
    p = LRUPolicy()
    p.insert_chain([k("p"), k("x1"), k("x2")])
    p.insert_chain([k("p"), k("y1")])              # second request shares the prefix block p
    assert names(p.victims()) == ["x2", "x1", "y1", "p"]


def test_remove():
    p = LRUPolicy()
    p.insert_chain([k("a"), k("b"), k("c")])
    assert p.remove(k("b")) is True
    assert p.remove(k("b")) is False
    assert names(p.victims()) == ["c", "a"]


def test_caller_may_evict_and_skip_while_iterating():
    p = LRUPolicy()
    chain = [k(f"n{i:03d}") for i in range(300)]   # more than one internal snapshot batch
    p.insert_chain(chain)
    seen = []
    for victim in p.victims():
        seen.append(victim)
        if victim == k("n250"):
            p.remove(k("n249"))                    # removed before it is reached: never yielded
        if int(names([victim])[0][1:4]) % 2 == 0:
            p.remove(victim)                       # evicted; odd ones are "leased" and skipped
    expected = [x for x in reversed(chain) if x != k("n249")]
    assert seen == expected                        # each exactly once, coldest first
    assert names(p.victims()) == [f"n{i:03d}" for i in range(299, -1, -1) if i % 2 and i != 249]


def test_keys_inserted_during_iteration_come_last():
    p = LRUPolicy()
    p.insert_chain([k("a"), k("b")])
    out = []
    for victim in p.victims():
        out.append(victim)
        p.remove(victim)
        if victim == k("b"):
            p.insert_chain([k("new")])
    assert names(out) == ["b", "a", "new"]
    assert len(p) == 0


@pytest.mark.parametrize("shortest, longest", [(17, 40), (129, 200)])
def test_long_chains_match_a_reference_lru_under_random_touches(shortest, longest):
    """Chains > 16 slots take the block-splice path when already adjacent (checked in Python up to 128 slots, in
    numpy beyond), the per-slot path otherwise; all must give exactly the order of a plain reference LRU (a list,
    hot end last)."""
    import random

    import numpy as np

    rng = random.Random(7)
    p, ref = LRUPolicy(), []
    chains = [list(range(c * longest, c * longest + rng.randint(shortest, longest))) for c in range(12)]

    def ref_touch(chain, insert):
        for s in reversed(chain):
            if s in ref:
                ref.remove(s)
            elif not insert:
                continue
            ref.append(s)

    for step in range(400):
        chain = rng.choice(chains)
        if rng.random() < 0.3:
            chain = chain[: rng.randint(shortest, len(chain))]    # a prefix hit
        op = rng.random()
        if op < 0.3:
            p.insert_chain(chain)
            ref_touch(chain, True)
        elif op < 0.85:
            p.touch_chain(np.array(chain) if step % 2 else chain)
            ref_touch(chain, False)
        elif ref:
            victim = rng.choice(ref)
            assert p.remove(victim)
            ref.remove(victim)
        assert list(p.victims()) == ref, step


def test_orphans_are_the_next_victims_tails_first_and_a_touch_rescues_them():
    p = LRUPolicy()
    p.insert_chain([k("o1"), k("o2"), k("o3")])    # coldest chain
    p.insert_chain([k("h1"), k("h2"), k("h3")])    # hottest chain: its parent h1 left the pool
    p.mark_orphans([k("h2"), k("h3"), k("nope")])  # prefix order; an untracked slot is ignored
    assert names(p.victims()) == ["h3", "h2", "o3", "o2", "o1", "h1"]
    p.mark_orphans([k("h3")])                       # already the coldest: stays there
    assert names(p.victims())[:2] == ["h3", "h2"]
    p.touch_chain([k("h2")])                        # a client that holds the parent itself read it
    assert names(p.victims()) == ["h3", "o3", "o2", "o1", "h1", "h2"]
    assert len(p) == 6
