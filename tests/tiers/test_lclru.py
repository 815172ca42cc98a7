"""LengthClassLRUPolicy: exact victim orders (blocks seen once weighted by the length of the put that stored them,
reused ones as clru, tails first, orphans first), the same calls under clru for contrast, the ghost as clru's,
memory per slot equal to clru's, and the real Master keeping a long put over a mid-length one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from kvpool.planner import UNIT, NullNode, chain_keys
from kvpool.store.config import MasterConfig
from kvpool.store.master import Master
from kvpool.store.records import NodeInfo
from kvpool.tiers.clru import ClassLRUPolicy
from kvpool.tiers.lclru import LengthClassLRUPolicy
from kvpool.tiers.policy import POLICY_NAMES, EvictionPolicy, make_policy

_spec = importlib.util.spec_from_file_location("_clru_tests", Path(__file__).with_name("test_clru.py"))
_clru = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_clru)
ins, touch, k, names, evict, _request = _clru.ins, _clru.touch, _clru.k, _clru.names, _clru.evict, _clru._request


def labels(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(1, n + 1)]


def test_registered_and_bad_weights():
    assert "lclru" in POLICY_NAMES
    p = make_policy("lclru")
    assert isinstance(p, LengthClassLRUPolicy) and isinstance(p, EvictionPolicy) and p.name == "lclru"
    assert p._weights == (6, 1000, 10, 3, 2) and len(p) == 0
    assert MasterConfig(policy="lclru").policy == "lclru"
    for new, reused in [((6, 1000), (3, 2)), ((6, 1000, 10), (2, 3)), ((2, 1000, 10), (3, 2)),
                        ((6, 1000, 0), (3, 2)), ((6, 1000, True), (3, 2)), ((6, 1000, 10), (3,))]:
        with pytest.raises(ValueError, match="new_weights must be 3 ints"):
            LengthClassLRUPolicy(new, reused)


@pytest.mark.parametrize("policy", ["lclru", "clru"])
def test_new_blocks_ranked_by_the_length_of_their_put(policy):
    p = make_policy(policy)
    ins(p, *labels("s", 2))                 # short put (< 16): s2 stamped 1, s1 2
    ins(p, *labels("m", 16))                # mid put (16-63): m16 3 ... m1 18
    ins(p, *labels("l", 64))                # long put (>= 64): l64 19 ... l1 82 = clock
    order = names(p.victims())
    if policy == "clru":                    # one weight for every new block: oldest first
        assert order == ["s2", "s1", *labels("m", 16)[::-1], *labels("l", 64)[::-1]]
        return
    assert [p.list_of(k(x)) for x in ("s1", "m1", "l1")] == [0, 1, 2]
    assert [p.class_of(k(x)) for x in ("s1", "m1", "l1")] == [0, 0, 0]
    # m: ages 79..64 x 1000; l_i: age i - 1 x 10 (630 ... 0); s2: 81 x 6 = 486, s1: 80 x 6 = 480, tied with l49
    # (48 x 10): the older stamp (s1's 2) first
    assert order == [*labels("m", 16)[::-1], *labels("l", 64)[50 - 1:][::-1], "s2", "s1",
                     *labels("l", 49)[::-1]]


def test_reused_blocks_as_clru_and_a_touch_leaves_the_new_lists():
    p = LengthClassLRUPolicy()
    ins(p, "a1", "a2")                      # short: a2 1, a1 2
    touch(p, "a1", "a2")                    # uses 2 (list 3): a2 3, a1 4
    touch(p, "a1")                          # uses 3+ (list 4): a1 5
    ins(p, "b1", "b2")                      # short: b2 6, b1 7 = clock
    assert [p.list_of(k(x)) for x in ("a1", "a2", "b1")] == [4, 3, 0]
    assert [p.class_of(k(x)) for x in ("a1", "a2", "b1")] == [2, 1, 0]
    # a2: age 4 x 3 = 12; b2: 1 x 6 = 6; a1: 2 x 2 = 4; b1: 0
    assert names(p.victims()) == ["a2", "b2", "a1", "b1"]


def test_orphans_first_and_the_ghost_remembers_uses():
    p = LengthClassLRUPolicy()
    ins(p, "g")
    touch(p, "g")                           # uses 2
    ins(p, *labels("n", 64))                # long: weight 10
    p.mark_orphans([k("n1"), k("n2")])
    assert evict(p, 2) == ["n2", "n1"]      # orphans first, the deepest first
    # g (stamped 2): age 64 x 3 = 192; n_i (stamped 67 - i): age i - 1 x 10, so n64 ... n21 (200) go before it
    assert names(p.victims()) == [*labels("n", 64)[21 - 1:][::-1], "g", *labels("n", 20)[3 - 1:][::-1]]
    p.remove(k("g"), _clru.key(k("g")))
    ins(p, "g", "h")                        # the ghost remembers g's uses: back as 3+; h below it is new, short
    assert [p.list_of(k("g")), p.list_of(k("h"))] == [4, 0]
    assert k("n1") not in p and len(p) == 64


def test_memory_per_tracked_slot_is_clru_s():
    a, b = LengthClassLRUPolicy(), ClassLRUPolicy()
    for p in (a, b):
        for start in range(0, 20_000, 1000):
            slots = list(range(start, start + 1000))
            p.insert_chain(slots, [s.to_bytes(16, "little") for s in slots])
    assert a.nbytes() == b.nbytes() and len(a) == len(b) == 20_000


@pytest.mark.parametrize("policy, kept", [("lru", [63, 16]), ("clru", [63, 16]), ("lclru", [64, 15])])
def test_master_keeps_a_long_put_over_a_mid_length_one(policy, kept):
    """Pool of 80 blocks: a 64-block document, then a 16-block one-off fill it; one more block needs room. LRU and
    clru let the document's oldest block (its tail) go; lclru weighs the mid-length put 100x and drops its tail."""
    master = Master(MasterConfig(policy=policy))
    master.register_node(NodeInfo(node_id="n", dram_bytes=80 * UNIT, alignment=UNIT), NullNode(), expires=False)
    doc, one_off = list(range(100, 164)), list(range(200, 216))
    assert [_request(master, ids) for ids in (doc, one_off, [300])] == [0, 0, 0]
    assert sum(master.stats()["evictions"].values()) == 1
    probe = [master.lookup(chain_keys(np.array(c, dtype=np.uint64)), lease=False).hits for c in (doc, one_off)]
    assert probe == kept
