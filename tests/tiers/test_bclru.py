"""BalancedClassLRUPolicy: clru's mechanics with a new block weighted 15x, not 1000x: exact victim orders where the
two differ (a reused block 5x older than a new one goes first), the same calls under clru for contrast, exact keys
kept through the real Master, and memory per slot equal to clru's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from kvpool.store.config import MasterConfig
from kvpool.store.master import Master
from kvpool.store.records import NodeInfo
from kvpool.tiers.bclru import BalancedClassLRUPolicy
from kvpool.tiers.clru import ClassLRUPolicy
from kvpool.tiers.policy import POLICY_NAMES, EvictionPolicy, make_policy

from kvpool.planner import UNIT, NullNode, chain_keys, replay

_spec = importlib.util.spec_from_file_location("_clru_tests", Path(__file__).with_name("test_clru.py"))
_clru = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_clru)
ins, touch, k, names, evict, _request = _clru.ins, _clru.touch, _clru.k, _clru.names, _clru.evict, _clru._request


def test_registered():
    assert "bclru" in POLICY_NAMES
    p = make_policy("bclru")
    assert isinstance(p, BalancedClassLRUPolicy) and isinstance(p, EvictionPolicy) and p.name == "bclru"
    assert p._weights == (15, 3, 2) and len(p) == 0
    assert MasterConfig(policy="bclru").policy == "bclru"


@pytest.mark.parametrize("policy, order", [
    # b4..b1: ages 4..1 x 15 = 60, 45, 30, 15; a2: age 6 x 3 = 18, a1: 5 x 3 = 15 (ties: the older stamp first)
    ("bclru", ["b4", "b3", "b2", "a2", "a1", "b1", "c1"]),
    # x 1000: every new block with an age > 0 before every reused one
    ("clru", ["b4", "b3", "b2", "b1", "a2", "a1", "c1"]),
])
def test_a_reused_block_5x_older_than_a_new_one_goes_first(policy, order):
    p = make_policy(policy)
    ins(p, "a1", "a2")                      # a2 stamped 1, a1 2
    touch(p, "a1", "a2")                    # class 1 (uses 2): a2 3, a1 4
    ins(p, "b1", "b2", "b3", "b4")          # class 0: b4 5 ... b1 8
    ins(p, "c1")                            # class 0: c1 9 = clock
    assert names(p.victims()) == order


def test_orphans_and_ghost_as_clru():
    p = BalancedClassLRUPolicy()
    ins(p, "g")
    touch(p, "g")                           # class 1, stamped 2
    ins(p, "n1", "n2")                      # class 0: n2 3, n1 4 = clock
    p.mark_orphans([k("n1")])
    # the orphan first; then n2 (age 1 x 15 = 15) before g (age 2 x 3 = 6)
    assert evict(p, 3) == ["n1", "n2", "g"]
    ins(p, "g")                             # the ghost remembers g's uses: back as class 2
    assert p.class_of(k("g")) == 2


def test_memory_per_tracked_slot_is_clru_s():
    a, b = BalancedClassLRUPolicy(), ClassLRUPolicy()
    for p in (a, b):
        for start in range(0, 20_000, 1000):
            slots = list(range(start, start + 1000))
            p.insert_chain(slots, [s.to_bytes(16, "little") for s in slots])
    assert a.nbytes() == b.nbytes() and len(a) == len(b) == 20_000


@pytest.mark.parametrize("policy, kept", [("lru", [0, 1]), ("clru", [1, 0]), ("bclru", [0, 1])])
def test_master_keeps_a_fresh_turn_over_an_old_prefix(policy, kept):
    """Pool of 4 blocks. [1] is used twice early, then a conversation [5, 6] twice, a new turn [9], [5] again; [30]
    needs room: 9 (new, age 1: 1 x 15 = 15) against 1 (used twice, age 6: 6 x 3 = 18). bclru lets 1 go (as LRU
    does, by age); clru keeps every reused block ahead of any new one and drops the fresh turn."""
    master = Master(MasterConfig(policy=policy))
    master.register_node(NodeInfo(node_id="n", dram_bytes=4 * UNIT, alignment=UNIT), NullNode(), expires=False)
    hits = [_request(master, ids) for ids in ([1], [1], [5, 6], [5, 6], [9], [5], [30])]
    assert hits == [0, 1, 0, 2, 0, 1, 0]
    assert sum(master.stats()["evictions"].values()) == 1
    probe = [master.lookup(chain_keys([i]), lease=False).hits for i in (1, 9)]
    assert probe == kept


def test_beats_lru_on_the_seeded_conversations_where_clru_wins():
    trace = _clru.conversations(seed=0)
    cap = int(trace.unique_blocks() * 0.08)
    lru = replay(trace, cap, "lru")[0].block_hit_rate
    assert replay(trace, cap, "bclru")[0].block_hit_rate >= lru + 0.05
