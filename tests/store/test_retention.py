"""store/retention.py through the master: a real StorageNode (tiny arena in tmp_path), the LRU policy and a fake clock.
Retention hints (put_start's pin_s) keep objects past unpinned ones, yield rather than refuse a put, expire, and are
capped per tenant; bad hints change nothing."""

import math

import numpy as np
import pytest
import xxhash

from kvpool.store.checks import MAX_PIN_S
from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.master import Master
from kvpool.store.metadata import MemoryMetadata
from kvpool.store.node import StorageNode
from kvpool.store.records import PutStatus
from tests.store.fakes import Clock, key

OBJ = 4096


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def make(tmp_path, clock):
    made = []

    def _make(dram_objects=6, **cfg):
        node = StorageNode(NodeConfig(node_id="n1", dram_bytes=dram_objects * OBJ, shm_dir=str(tmp_path)))
        master = Master(MasterConfig(**cfg), clock=clock)
        master.register_node(node.info(), node, expires=False)
        made.append(node)
        return master, node

    yield _make
    for node in made:
        node.close()


def put(master, node, keys, pin_s=0.0, tenant=""):
    results = master.put_start(keys, [OBJ] * len(keys), pin_s=pin_s, tenant=tenant)
    ids, sums = [], []
    for k, r in zip(keys, results):
        if r.grant is not None:
            data = np.full(OBJ, k[0], np.uint8)
            node.write(r.grant.location.tier, r.grant.location.offset, r.grant.key, b"\0" * 16, data,
                       xxhash.xxh3_64_intdigest(data))
            ids.append(r.grant.grant_id)
            sums.append(xxhash.xxh3_64_intdigest(data))
    assert master.put_commit(ids, sums, tenant=tenant) == [True] * len(ids)
    return [r.status for r in results]


def present(master, keys):
    return [k[0] for k, there in zip(keys, master.contains(keys)) if there]


A = [key(i) for i in (1, 2, 3)]         # the older chain
B = [key(i) for i in (11, 12, 13)]      # the newer chain
C = [key(i) for i in (21, 22, 23)]      # the pressure


@pytest.mark.parametrize("pinned", [False, True])
def test_a_pinned_chain_survives_pressure_that_evicts_an_unpinned_one_in_exact_order(make, clock, pinned):
    master, node = make(dram_objects=6)
    put(master, node, A, pin_s=60 if pinned else 0)
    clock.now += 1
    put(master, node, B)
    clock.now += 1
    gone = []
    for k in C:                        # one key at a time: each put evicts exactly one object, coldest allowed first
        before = set(present(master, A + B))
        assert put(master, node, [k]) == [PutStatus.STORED]
        gone += sorted(before - set(present(master, A + B)))
    # LRU alone takes the older chain, tail first; with A pinned, B goes (tail first) and A stays whole.
    assert gone == ([13, 12, 11] if pinned else [3, 2, 1])
    s = master.stats()
    assert (s["pinned_objects"], s["pinned_bytes"]) == ((3, 3 * OBJ) if pinned else (0, 0))
    assert (s["pins_clipped"], s["pinned_evictions"]) == (0, 0)
    master.index.check_invariants()


def test_pins_never_fail_a_put_while_unpinned_space_exists(make, clock):
    master, node = make(dram_objects=4, pin_max_fraction=1.0)
    put(master, node, A, pin_s=600)
    put(master, node, [key(40)])          # the one unpinned object, the newest
    clock.now += 1
    assert put(master, node, [key(41)]) == [PutStatus.STORED]
    assert present(master, A + [key(40), key(41)]) == [1, 2, 3, 41]
    assert master.stats()["pinned_evictions"] == 0


def test_a_pool_entirely_pinned_still_accepts_a_put_and_counts_the_pin_that_yielded(make, clock):
    master, node = make(dram_objects=3, pin_max_fraction=1.0)
    put(master, node, A, pin_s=600)
    clock.now += 1
    assert put(master, node, [key(50)], pin_s=600) == [PutStatus.STORED]
    # every object was pinned: the coldest pin (the chain's tail) yielded rather than refuse the put
    assert present(master, A + [key(50)]) == [1, 2, 50]
    s = master.stats()
    assert (s["pinned_evictions"], s["pinned_objects"], s["pinned_bytes"]) == (1, 3, 3 * OBJ)
    master.index.check_invariants()


def test_an_expired_pin_no_longer_protects(make, clock):
    master, node = make(dram_objects=6)
    put(master, node, A, pin_s=10)
    clock.now += 1
    put(master, node, B)
    clock.now += 10                     # A's pin ended (t=11 >= 0 + 10)
    put(master, node, [C[0]])
    assert present(master, A + B) == [1, 2, 11, 12, 13]   # plain LRU again: A's tail went, not B's
    master.reap()                         # the sweep drops the ended pins of the objects still here
    assert (master.stats()["pinned_objects"], master.stats()["pinned_bytes"]) == (0, 0)
    assert master.stats()["pinned_evictions"] == 0
    master.index.check_invariants()


def test_a_pin_ends_at_whole_seconds_rounded_up(make, clock):
    master, node = make(dram_objects=2)
    clock.now += 0.6
    put(master, node, [key(1)], pin_s=0.5)   # second 0 since the master started: pinned until second 1
    clock.now += 0.3                        # t=0.9: second 0, still pinned
    put(master, node, [key(2)])
    put(master, node, [key(3)])
    assert present(master, [key(1), key(2), key(3)]) == [1, 3]


def test_the_tenant_cap_clips_pins_and_the_put_still_succeeds(make, clock):
    master, node = make(dram_objects=8, pin_max_fraction=0.25)     # cap: 2 objects' bytes per tenant
    assert put(master, node, A, pin_s=60, tenant="a") == [PutStatus.STORED] * 3
    s = master.stats()
    assert (s["pinned_objects"], s["pinned_bytes"], s["pins_clipped"]) == (2, 2 * OBJ, 1)
    # another tenant has its own cap
    assert put(master, node, B, pin_s=60, tenant="b") == [PutStatus.STORED] * 3
    s = master.stats()
    assert (s["pinned_objects"], s["pins_clipped"]) == (4, 2)
    assert (s["tenants"]["a"]["pinned_objects"], s["tenants"]["b"]["pinned_bytes"]) == (2, 2 * OBJ)
    # the clipped key (A's tail) is an ordinary object: pressure takes it first
    clock.now += 1
    put(master, node, C[:2], tenant="c")
    put(master, node, [key(30)], tenant="c")
    assert master.contains(A, tenant="a") == [True, True, False]
    master.index.check_invariants()


def test_pin_max_fraction_zero_honours_no_pins(make):
    master, node = make(dram_objects=4, pin_max_fraction=0)
    assert put(master, node, A, pin_s=60) == [PutStatus.STORED] * 3
    assert (master.stats()["pinned_objects"], master.stats()["pins_clipped"]) == (0, 3)


def test_a_put_of_existing_keys_extends_their_pin(make, clock):
    master, node = make(dram_objects=8, pin_max_fraction=1.0)
    put(master, node, A)                       # stored unpinned (a first turn)
    assert put(master, node, A + [key(4)], pin_s=60) == [PutStatus.EXISTS] * 3 + [PutStatus.STORED]
    assert master.stats()["pinned_objects"] == 4
    clock.now += 1
    put(master, node, B)
    clock.now += 1
    put(master, node, C[:2])                   # one over: B's tail goes, not the older (pinned) A
    assert present(master, A + [key(4)] + B) == [1, 2, 3, 4, 11, 12]
    # a shorter hint never shortens a pin
    put(master, node, A, pin_s=1)
    clock.now += 30
    put(master, node, [key(60), key(61)])
    assert present(master, A + B) == [1, 2, 3]
    master.index.check_invariants()


def test_a_pinned_orphan_is_not_protected(make, clock):
    master, node = make(dram_objects=6, pin_max_fraction=1.0)
    put(master, node, A, pin_s=600)
    clock.now += 1
    put(master, node, B)
    assert master.remove([A[0]]) == 1          # A[1], A[2] lost their way in: orphans, still pinned
    clock.now += 1
    put(master, node, C[:3])                   # 5 held + 3 = 8 > 6: two go, the orphans first, pins or not
    assert present(master, A + B) == [11, 12, 13]
    assert master.stats()["pinned_evictions"] == 0
    master.index.check_invariants()


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan, math.inf, True, MAX_PIN_S + 1, 1e30, "5", None])
def test_bad_pin_s_is_a_value_error_naming_it_and_stores_nothing(make, bad):
    master, node = make(dram_objects=4)
    with pytest.raises(ValueError, match="pin_s"):
        master.put_start(A, [OBJ] * 3, pin_s=bad)
    assert len(master.index) == 0 and master.stats()["objects"] == 0 and master.leases.open_grants == 0


def test_a_demoted_and_promoted_object_keeps_its_pin(tmp_path, clock):
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=2 * OBJ, shm_dir=str(tmp_path),
                                  ssd_path=str(tmp_path / "ssd"), ssd_bytes=8 * 2 * OBJ))
    try:
        master = Master(MasterConfig(write_behind=False, pin_max_fraction=1.0), clock=clock)
        master.register_node(node.info(), node, expires=False)
        put(master, node, [key(1)], pin_s=600)
        put(master, node, [key(2)], pin_s=600)
        clock.now += 1
        put(master, node, [key(3)])            # DRAM all pinned: the coldest pin yields one tier down
        assert [r.tier.label for r in master.inspect([key(1), key(2), key(3)])] == ["ssd", "dram", "dram"]
        res = master.lookup([key(1)])          # an SSD hit: promoted back to DRAM (a new slot)
        master.release([res.lease_id])
        master.promote_pending()
        # the unpinned key(3) made the room; key(1) kept its pin in its new slot
        assert [r.tier.label for r in master.inspect([key(1), key(2), key(3)])] == ["dram", "dram", "ssd"]
        assert master.index.find(key(1)) in master.index.retained
        s = master.stats()
        assert (s["pinned_objects"], s["pinned_evictions"]) == (2, 1)
        master.index.check_invariants()
    finally:
        node.close()


def test_pins_are_journalled_and_a_restarted_master_keeps_them_until_their_end(tmp_path, clock):
    meta = MemoryMetadata(persistent=True)
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=6 * OBJ, shm_dir=str(tmp_path)))
    try:
        m1 = Master(MasterConfig(), meta, clock=clock)
        m1.register_node(node.info(), node, expires=False)
        start = clock.now
        put(m1, node, A, pin_s=60)
        clock.now += 1
        put(m1, node, B)
        assert {r.key: r.pinned_until for r in meta.load_objects()} == {**{k: start + 60 for k in A},
                                                                       **{k: 0.0 for k in B}}
        clock.now += 1
        put(m1, node, A[:1], pin_s=100)      # an existing key's longer pin reaches the journal too
        assert {r.key: r.pinned_until for r in meta.load_objects()}[A[0]] == start + 2 + 100
        clock.now += 10
        m2 = Master(MasterConfig(), meta, clock=clock)     # restart: same backend, same node incarnation
        m2.register_node(node.info(), node, expires=False)
        assert m2.stats()["pinned_objects"] == 3
        gone = []
        for k in C:      # reloaded objects all count as used at the restart: LRU order is the reload order, but
            before = set(present(m2, A + B))                 # the pinned chain A outlives B whatever that order
            assert put(m2, node, [k]) == [PutStatus.STORED]
            gone += sorted(before - set(present(m2, A + B)))
        assert sorted(gone) == [11, 12, 13] and present(m2, A) == [1, 2, 3]
        clock.now = start + 60                               # A's pins end at start + 60, A[0]'s at start + 102
        assert m2.reap()["grants"] == 0 and m2.stats()["pinned_objects"] == 1
    finally:
        node.close()


def test_a_victim_pick_walks_the_pinned_objects_once_not_at_every_put(make, clock, monkeypatch):
    # The pinned chain is the coldest: the first pick passes over it (held) and moves it to the hot end, so the next
    # picks find their unpinned victim at once. Walking the pins at every put made a full pool's put O(pinned)
    # under the master's lock (138.7 ms per 32-object put with 8,192 pinned objects, 0.8 ms without).
    from kvpool.tiers.lru import LRUPolicy

    walked: list[int] = []
    real = LRUPolicy.victims

    def counted(policy):
        walked.append(0)
        for slot in real(policy):
            walked[-1] += 1
            yield slot

    master, node = make(dram_objects=8)
    put(master, node, A, pin_s=600)
    clock.now += 1
    chain = [key(i) for i in (11, 12, 13, 14, 15)]
    put(master, node, chain)
    clock.now += 1
    monkeypatch.setattr(LRUPolicy, "victims", counted)
    gone = []
    for k in [key(i) for i in (21, 22, 23, 24, 25, 26)]:   # one key at a time: each put evicts exactly one object
        before = set(present(master, chain + [key(21)]))
        assert put(master, node, [k]) == [PutStatus.STORED]
        gone += sorted(before - set(present(master, chain + [key(21)])))
    assert gone == [15, 14, 13, 12, 11, 21]         # the unpinned in LRU order (the chain tail first); A stays
    assert present(master, A) == [1, 2, 3]
    assert walked == [4, 1, 1, 1, 1, 4]             # the pins walked at the first pick, then only once B is gone
    assert master.stats()["pinned_evictions"] == 0
    master.index.check_invariants()


@pytest.mark.parametrize("passes", [1, 2, 3])
def test_pins_passed_over_keep_their_order_and_the_coldest_pin_still_yields_first(make, clock, passes):
    # A (chain 1, 2, 3: its tail the coldest) is passed over by `passes` picks, each evicting an unpinned object;
    # then the pool is all pins and the next put makes the coldest pin yield: A's tail, whatever the passes
    master, node = make(dram_objects=4, pin_max_fraction=1.0)
    put(master, node, A, pin_s=600)
    clock.now += 1
    unpinned = [key(40 + i) for i in range(passes)]
    put(master, node, unpinned[:1])
    for k in unpinned[1:]:
        clock.now += 1
        assert put(master, node, [k]) == [PutStatus.STORED]           # evicts the one unpinned object before it
    clock.now += 1
    assert put(master, node, [key(50)], pin_s=600) == [PutStatus.STORED]     # evicts the last unpinned one
    assert present(master, A + [key(50)]) == [1, 2, 3, 50]
    clock.now += 1
    assert put(master, node, [key(51)], pin_s=600) == [PutStatus.STORED]     # all pinned: the coldest pin yields
    assert present(master, A + [key(50), key(51)]) == [1, 2, 50, 51]
    assert master.stats()["pinned_evictions"] == 1
    master.index.check_invariants()
