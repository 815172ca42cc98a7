"""LengthClassLRUPolicy: clru's exact victim order until a block comes back, the learned weights (exact, from the
per-bucket counts), victim orders under them, the ghost crediting the bucket a block was evicted from, halving,
orphans first, memory per slot equal to clru's, and the real Master keeping a fresh short put that clru drops."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvpool.planner import UNIT, NullNode
from kvpool.store.config import MasterConfig
from kvpool.store.master import Master
from kvpool.store.records import NodeInfo
from kvpool.tiers.clru import ClassLRUPolicy
from kvpool.tiers.lclru import LengthClassLRUPolicy, bucket
from kvpool.tiers.policy import POLICY_NAMES, EvictionPolicy, make_policy

_spec = importlib.util.spec_from_file_location("_clru_tests", Path(__file__).with_name("test_clru.py"))
_clru = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_clru)
ins, touch, k, names, evict, key, _request = _clru.ins, _clru.touch, _clru.k, _clru.names, _clru.evict, _clru.key, \
    _clru._request

PRIOR_ONLY = 158            # a bucket with no blocks of its own: ratio 1.0, t = 0.4: round(1000**0.6 * 10**0.4)


def labels(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(1, n + 1)]


def test_registered_buckets_and_initial_weights():
    assert "lclru" in POLICY_NAMES
    p = make_policy("lclru")
    assert isinstance(p, LengthClassLRUPolicy) and isinstance(p, EvictionPolicy) and p.name == "lclru"
    assert p.weights == (1000,) * 8 + (3, 2) and len(p) == 0
    assert MasterConfig(policy="lclru").policy == "lclru"
    assert [bucket(n) for n in (1, 2, 3, 4, 7, 8, 15, 16, 63, 64, 127, 128, 5000)] == \
        [0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 6, 7, 7]


def test_ranks_as_clru_until_a_block_comes_back():
    a, b = LengthClassLRUPolicy(), ClassLRUPolicy()
    for p in (a, b):
        ins(p, "a1", "a2")
        ins(p, *labels("m", 16))
        ins(p, "c1")
        p.mark_orphans([k("m15"), k("m16")])
    assert a.weights[:8] == (1000,) * 8 and a.back == [0.0] * 8 and a.stored == [1, 2, 0, 0, 16, 0, 0, 0]
    assert names(a.victims()) == names(b.victims()) == ["m16", "m15", "a2", "a1", *labels("m", 14)[::-1], "c1"]


def test_learned_weights_and_the_order_they_give():
    p = LengthClassLRUPolicy()
    for i in range(3):
        ins(p, f"s{i}a", f"s{i}b")          # short puts (bucket 1) ...
        touch(p, f"s{i}a", f"s{i}b")        # ... that come back
        ins(p, *labels(f"L{i}-", 16))       # long one-offs (bucket 4) that do not
    # stored: bucket 1 6, bucket 4 48; back: bucket 1 6; average 6 / 54 = 1/9. Bucket 1: (6 + 20/9) / 26 * 9 = 2.85
    # (>= 1.15: weight 10); bucket 4: (20/9) / 68 * 9 = 0.29 (<= 0.9: 1000); the rest: the prior alone (1.0)
    assert p.stored == [0, 6, 0, 0, 48, 0, 0, 0] and p.back == [0, 6, 0, 0, 0, 0, 0, 0]
    assert p.weights == (PRIOR_ONLY, 10, PRIOR_ONLY, PRIOR_ONLY, 1000, PRIOR_ONLY, PRIOR_ONLY, PRIOR_ONLY, 3, 2)
    # 20 ticks a round: s2b was touched at 43, s2a 44. A short put: t2 61, t1 62; a long one: n16 63 ... n1 78 =
    # clock. The weights stay (bucket 1: (6 + 20/12) / 28 * 12 = 3.3; bucket 4: (20/12) / 84 * 12 = 0.24)
    ins(p, "t1", "t2")
    ins(p, *labels("n", 16))
    assert p.weights[:8] == (PRIOR_ONLY, 10, PRIOR_ONLY, PRIOR_ONLY, 1000, PRIOR_ONLY, PRIOR_ONLY, PRIOR_ONLY)
    assert [p.list_of(k(x)) for x in ("s2a", "t1", "n1")] == [8, 1, 4]
    assert [p.class_of(k(x)) for x in ("s2a", "t1", "n1")] == [1, 0, 0]
    # (the one-offs L*, older, go before all of these) n16..n2: ages 15..1 x 1000; t2: 17 x 10 = 170, t1: 160;
    # s2b: 35 x 3 = 105, s2a: 102; n1: age 0
    mine = {*labels("n", 16), "t1", "t2", "s2a", "s2b"}
    assert [x for x in names(p.victims()) if x in mine] == [*labels("n", 16)[1:][::-1], "t2", "t1", "s2b", "s2a",
                                                             "n1"]


def test_the_ghost_credits_the_bucket_a_block_was_evicted_from():
    p = LengthClassLRUPolicy()
    ins(p, *labels("d", 16))                # bucket 4
    ins(p, "x")                             # bucket 0
    assert evict(p, 17) == [*labels("d", 16)[::-1], "x"]
    ins(p, *labels("d", 16))                # back through the ghost: uses 2 (list 8), bucket 4 credited
    assert p.back == [0, 0, 0, 0, 16, 0, 0, 0] and p.stored == [1, 0, 0, 0, 16, 0, 0, 0]
    assert {p.list_of(k(x)) for x in labels("d", 16)} == {8}
    # average 16 / 17; bucket 4: (16 + 20 * 16/17) / 36 / (16/17) = 1.03; bucket 0: (20 * 16/17) / 21 / (16/17)
    # = 0.95; t = (ratio - 0.9) / 0.25: round(1000 ** (1 - t) * 10 ** t)
    r4 = (16 + 20 * 16 / 17) / 36 / (16 / 17)
    r0 = (20 * 16 / 17) / 21 / (16 / 17)
    want = [round(1000 ** (1 - (r - 0.9) / 0.25) * 10 ** ((r - 0.9) / 0.25)) for r in (r0, r4)]
    assert (p.weights[0], p.weights[4]) == (want[0], want[1]) == (381, 95)
    ins(p, "x")                             # x comes back too: uses 2, bucket 0 credited
    assert p.list_of(k("x")) == 8 and p.back[0] == 1
    assert p.remove(k("x")) and not p.remove(k("x"))   # no key: nothing remembered
    ins(p, "x")
    assert p.list_of(k("x")) == 0 and p.back[0] == 1


def test_counters_halve_after_16_new_blocks_per_slot():
    p = LengthClassLRUPolicy()
    chunk = list(range(1000, 1064))         # 64 blocks (bucket 6), removed again: the policy stays at 64 slots
    for _ in range(256):                    # 16,384 new blocks = 16 x 1,024 (the floor on slots): not yet
        p.insert_chain(chunk)
        for s in chunk:
            p.remove(s)
    assert p.stored[6] == 16_384
    p.insert_chain(chunk)                   # 16,448 > 16,384: halved
    assert p.stored[6] == 8_224 and p._fresh_since == 0


def test_orphans_first():
    p = LengthClassLRUPolicy()
    ins(p, "g")
    touch(p, "g")                           # uses 2: stamped 2
    ins(p, *labels("n", 4))                 # bucket 2: n4 3 ... n1 6 = clock
    p.mark_orphans([k("n1"), k("n2")])
    # the orphans, deepest first; then n4 (age 3 x 1000), n3 (2 x 1000), g (4 x 3 = 12)
    assert names(p.victims()) == ["n2", "n1", "n4", "n3", "g"]
    touch(p, "n1")                          # a touch makes an orphan ordinary again (uses 2, stamped 7)
    assert names(p.victims()) == ["n2", "n4", "n3", "g", "n1"]


def test_memory_per_tracked_slot_is_clru_s():
    a, b = LengthClassLRUPolicy(), ClassLRUPolicy()
    for p in (a, b):
        for start in range(0, 20_000, 1000):
            slots = list(range(start, start + 1000))
            p.insert_chain(slots, [s.to_bytes(16, "little") for s in slots])
    assert a.nbytes() == b.nbytes() and len(a) == len(b) == 20_000


@pytest.mark.parametrize("policy, turns, last", [("lru", [2] * 6, 0), ("clru", [2] * 4 + [1] * 2, 0),
                                                ("bclru", [2] * 6, 0), ("lclru", [2] * 6, 2)])
def test_master_keeps_a_fresh_short_put_once_short_puts_come_back(policy, turns, last):
    """Pool of 24 blocks. Six rounds of: a 2-block conversation turn, a 16-block one-off, the turn again (a hit).
    Then a new turn T, two one-offs (32 blocks: T's room is needed) and T again. lclru has learned that 2-block puts
    come back (weight 10) and 16-block ones do not (1000): the one-offs go first and T hits. LRU, clru and bclru rank
    by age (T is older than the first one-off) and drop it."""
    master = Master(MasterConfig(policy=policy))
    master.register_node(NodeInfo(node_id="n", dram_bytes=24 * UNIT, alignment=UNIT), NullNode(), expires=False)
    one_offs = iter(range(1000, 1000 + 16 * 8, 16))
    hits = []
    for i in range(6):
        turn = [100 + 2 * i, 101 + 2 * i]
        hits += [_request(master, turn), _request(master, list(range(next(one_offs), 16 + 1000 + 16 * i))),
                 _request(master, turn)]
    assert hits == [h for n in turns for h in (0, 0, n)]   # clru: the last two turns lose a block
    t = [900, 901]
    assert [_request(master, t), _request(master, list(range(1096, 1112))), _request(master, list(range(1112, 1128))),
            _request(master, t)] == [0, 0, 0, last]
    if policy == "lclru":
        space = next(n for n in master.placement.by_number if n is not None).spaces
        # bucket 1: stored 14, back 12; bucket 4: stored 128, back 0 (module docstring's rule)
        assert next(iter(space.values())).policy.weights == (PRIOR_ONLY, 10, PRIOR_ONLY, PRIOR_ONLY, 1000,
                                                              PRIOR_ONLY, PRIOR_ONLY, PRIOR_ONLY, 3, 2)
