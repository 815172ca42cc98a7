"""ClassLRUPolicy: exact victim order (new blocks before every reused one, reused ones by weighted age, tails
first, orphans first), the 16-bit ghost (remembered uses, across table growth), memory per slot, and the real
Master: exact keys kept under pressure, and a seeded prefix-chain workload on which it beats LRU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from kvpool.store.config import MasterConfig
from kvpool.store.master import Master
from kvpool.store.records import NodeInfo
from kvpool.tiers.clru import ClassLRUPolicy
from kvpool.tiers.policy import POLICY_NAMES, EvictionPolicy, make_policy

from kvpool.planner import UNIT, NullNode, chain_keys, replay

_spec = importlib.util.spec_from_file_location("_wlru_tests", Path(__file__).with_name("test_wlru.py"))
_wlru_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_wlru_tests)
conversations = _wlru_tests.conversations       # the seeded workload wlru is measured on (--import-mode=importlib)

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


def touch(p, *labels: str) -> None:
    p.touch_chain([k(x) for x in labels])


def evict(p, n: int) -> list[str]:
    out = []
    for victim in p.victims():
        p.remove(victim, key(victim))
        out.append(victim)
        if len(out) == n:
            break
    return names(out)


def test_registered_protocol_and_bad_weights():
    assert "clru" in POLICY_NAMES
    p = make_policy("clru")
    assert isinstance(p, ClassLRUPolicy) and isinstance(p, EvictionPolicy) and len(p) == 0 and p.name == "clru"
    with pytest.raises(ValueError, match="weights must be 3 ints > 0, non-increasing"):
        ClassLRUPolicy((2, 3, 1000))
    assert MasterConfig(policy="clru").policy == "clru"


def test_new_blocks_go_before_older_reused_ones():
    p = ClassLRUPolicy()
    ins(p, "a1", "a2")                      # a2 stamped 1, a1 2
    touch(p, "a1", "a2")                    # class 1 (uses 2): a2 3, a1 4
    ins(p, "b1", "b2", "b3", "b4")          # class 0: b4 5 ... b1 8
    ins(p, "c1")                            # class 0: c1 9 = clock
    # b4..b1: ages 4..1 x 1000 beat a2: age 6 x 3 = 18; a1: 5 x 3 = 15 beats c1: age 0
    assert names(p.victims()) == ["b4", "b3", "b2", "b1", "a2", "a1", "c1"]
    q = make_policy("lru")                  # the same calls under LRU: the reused chain goes first
    for labels, call in [(("a1", "a2"), q.insert_chain), (("a1", "a2"), q.touch_chain),
                         (("b1", "b2", "b3", "b4"), q.insert_chain), (("c1",), q.insert_chain)]:
        call([k(x) for x in labels])
    assert names(q.victims()) == ["a2", "a1", "b4", "b3", "b2", "b1", "c1"]


def test_twice_used_ages_faster_than_more_used():
    p = ClassLRUPolicy()
    ins(p, "x")
    touch(p, "x")
    touch(p, "x")                           # x: class 2 (uses 3), stamped 3
    ins(p, "y")
    touch(p, "y")                           # y: class 1 (uses 2), stamped 5
    ins(p, "p1", "p2", "p3", "p4", "p5")    # class 0: p5 6 ... p1 10 = clock
    # p5..p2 (x 1000) first; then y: age 5 x 3 = 15 before the older x: age 7 x 2 = 14; p1 (age 0) last
    assert names(p.victims()) == ["p5", "p4", "p3", "p2", "y", "x", "p1"]
    assert [p.class_of(k(n)) for n in ("x", "y", "p1")] == [2, 1, 0]


def test_orphans_first_tails_first_and_a_touch_rescues_them():
    p = ClassLRUPolicy()
    ins(p, "o1", "o2")
    ins(p, "h1", "h2", "h3")
    for _ in range(3):
        touch(p, "h1", "h2", "h3")
    p.mark_orphans([k("h2"), k("h3"), k("nope")])
    assert names(p.victims()) == ["h3", "h2", "o2", "o1", "h1"]
    touch(p, "h2")
    assert names(p.victims()) == ["h3", "o2", "o1", "h1", "h2"]


def test_ghost_remembers_uses_of_evicted_keys_and_survives_growth():
    p = ClassLRUPolicy()
    ins(p, "g")
    touch(p, "g")                           # class 1: remembered as class 2 when evicted
    ins(p, "n1")
    ins(p, "n2")                            # n2 (age 0) ranks 0: the only block ranked below g
    assert evict(p, 2) == ["n1", "g"]       # n1 (new) first although younger; remembered as class 1
    size = len(p._ghost)
    slots = list(range(10_001, 10_001 + 2 * size))   # the table doubles at least once meanwhile
    p.insert_chain(slots, [s.to_bytes(16, "little") for s in slots])
    assert len(p._ghost) >= 4 * size
    ins(p, "g", "n1")                       # chain g -> n1: n1 capped at its parent's class
    assert [p.class_of(k("g")), p.class_of(k("n1"))] == [2, 1]
    assert p.remove(k("n1")) and not p.remove(k("n1"))  # no key: nothing remembered
    ins(p, "n1")
    assert p.class_of(k("n1")) == 0


def test_skipped_victims_are_not_offered_twice():
    p = ClassLRUPolicy()
    ins(p, *[f"s{i}" for i in range(10)])
    touch(p, "s0", "s1")
    seen = []
    for victim in p.victims():
        seen.append(victim)
        if victim != k("s4"):
            p.remove(victim, key(victim))
    assert names(seen) == [f"s{i}" for i in range(9, 1, -1)] + ["s1", "s0"]
    assert names(p.victims()) == ["s4"] and len(p) == 1


def test_memory_per_tracked_slot():
    p = ClassLRUPolicy()
    n = 100_000
    for start in range(0, n, 1000):
        slots = list(range(start, start + 1000))
        p.insert_chain(slots, [s.to_bytes(16, "little") for s in slots])
    per_slot = p.nbytes() / len(p)
    # 17 B of wlru's arrays + 16-32 u16 ghost entries (+1 cursor byte per 4): 53-89 B; 100,000 slots: 131,072
    # ghost sets' worth of 2,097,152 entries -> 17 + 41.9 + 5.2 = 64.2 B (plus the arrays' doubling slack)
    assert p._ghost.itemsize == 2 and p._prev.itemsize == 4 and p._stamp.itemsize == 8
    assert len(p._ghost) == 2_097_152
    assert 17 + 32 + 4 <= per_slot <= 17 + 64 + 8 + 17, per_slot


# ---------------------------------------------------------------------------------------------- the Master

def _request(master: Master, ids: list[int]) -> int:
    """One connector request: lookup under a lease, release, put and commit the missed tail. Returns hits."""
    keys = chain_keys(np.array(ids, dtype=np.uint64))
    r = master.lookup(keys)
    if r.lease_id:
        master.release([r.lease_id])
    tail = keys[r.hits:]
    grants = [x.grant.grant_id for x in master.put_start(tail, [UNIT] * len(tail)) if x.grant is not None]
    master.put_commit(grants, [0] * len(grants))
    return r.hits


@pytest.mark.parametrize("policy, kept", [("lru", [1, 3, 2]), ("clru", [2, 2, 2])])
def test_master_keeps_the_reused_prefix_under_clru(policy, kept):
    master = Master(MasterConfig(policy=policy))
    master.register_node(NodeInfo(node_id="n", dram_bytes=6 * UNIT, alignment=UNIT), NullNode(), expires=False)
    assert _request(master, [1, 2]) == 0
    assert _request(master, [1, 2]) == 2        # the prefix is reused: class 1 under clru
    assert _request(master, [10, 11, 12]) == 0  # a new chain: 5 of 6 blocks used
    assert _request(master, [20, 21]) == 0      # one block must go: LRU takes 2 (the oldest), clru 12 (new)
    probe = [master.lookup(chain_keys(np.array(c, dtype=np.uint64)), lease=False).hits
             for c in ([1, 2], [10, 11, 12], [20, 21])]
    assert probe == kept
    assert sum(master.stats()["evictions"].values()) == 1


def test_beats_lru_on_a_seeded_prefix_chain_workload_through_the_master():
    trace = conversations(seed=0)
    cap = int(trace.unique_blocks() * 0.08)
    lru = replay(trace, cap, "lru")[0].block_hit_rate
    clru = replay(trace, cap, "clru")[0].block_hit_rate
    assert clru >= lru + 0.05, (clru, lru)
