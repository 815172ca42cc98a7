"""store/promotion.py through the Master: slow-tier hits move up after the lookup, the copy runs without the master
lock, and every way the copy can go wrong leaves the pool consistent (exact tiers, exact counters, bytes intact)."""

import threading

import numpy as np
import pytest

from kvpool.store.node import NodeUnavailable
from kvpool.store.records import Tier
from tests.store.fakes import key
from tests.store.test_master import OBJ, clock, make, put, tiers  # noqa: F401 - fixtures


class GatedNode:
    """A real StorageNode whose promote() waits for the test: the promotion is caught mid-copy."""

    def __init__(self, node, *, fail: Exception | None = None, refuse: bool = False) -> None:
        self.node = node
        self.entered = threading.Event()
        self.go = threading.Event()
        self.fail = fail
        self.refuse = refuse

    def demote(self, moves, drops=()):
        return self.node.demote(moves, drops)

    def drop(self, drops):
        return self.node.drop(drops)

    def objects_removed(self, keys=None):
        self.node.objects_removed(keys)

    def promote(self, moves):
        self.entered.set()
        assert self.go.wait(10), "test never released the promotion"
        if self.fail is not None:
            raise self.fail
        if self.refuse:
            return [False] * len(moves)
        return self.node.promote(moves)


def gated(master, node, **kw) -> GatedNode:
    gate = GatedNode(node, **kw)
    master.register_node(node.info(), gate, expires=False)  # same incarnation: only the ops change
    return gate


def on_ssd(master, node):
    put(master, node, [key(1)])
    put(master, node, [key(2)])                       # DRAM holds one object: key 1 is demoted to SSD
    assert tiers(master, [key(1), key(2)]) == ["ssd", "dram"]


def test_the_copy_runs_without_the_master_lock(make):
    master, node = make(dram_objects=1, ssd_objects=2)
    on_ssd(master, node)
    gate = gated(master, node)
    res = master.lookup([key(1)])
    master.release([res.lease_id])
    worker = threading.Thread(target=master.promote_pending)
    worker.start()
    assert gate.entered.wait(10)
    # Mid-copy: every other master call answers (it would deadlock if the copy held the lock).
    assert master.lookup([key(2)], lease=False).hits == 1
    assert master.contains([key(1), key(2)]) == [True, True]
    # DRAM's one extent is reserved for key 1, so key 3 goes to SSD, evicting the coldest unpinned object there:
    # key 2 (key 1 is pinned by its promotion).
    assert put(master, node, [key(3)]) == ["stored"]
    assert tiers(master, [key(1), key(2), key(3)]) == ["ssd", None, "ssd"]
    gate.go.set()
    worker.join(10)
    assert tiers(master, [key(1), key(2), key(3)]) == ["dram", None, "ssd"]
    assert master.stats()["promotions_by_tier"] == {"ssd": 1}
    master.index.check_invariants()


def test_a_reader_keeps_the_old_extent_until_it_releases(make):
    master, node = make(dram_objects=1, ssd_objects=2, write_behind=False)  # inclusive: tests/store/test_inclusive.py
    on_ssd(master, node)
    res = master.lookup([key(1)])                     # a reader of the SSD copy, still reading
    assert res.locations[0].tier is Tier.SSD
    old = res.locations[0]
    assert master.promote_pending() == 1
    assert tiers(master, [key(1), key(2)]) == ["dram", "ssd"]
    # The SSD extent the reader was told about is still allocated and still holds key 1's bytes.
    out = np.zeros(OBJ, np.uint8)
    assert node.read_into(Tier.SSD, old.offset, key(1), OBJ, out) and (out == key(1)[0]).all()
    assert master.stats()["tiers"]["ssd"]["objects"] == 2   # key 2 (demoted) + the reader's old copy
    master.release([res.lease_id])
    assert master.stats()["tiers"]["ssd"]["objects"] == 1
    master.index.check_invariants()


def test_node_unreachable_during_the_copy_leaves_the_object_where_it_is(make):
    master, node = make(dram_objects=1, ssd_objects=2)
    on_ssd(master, node)
    gate = gated(master, node, fail=NodeUnavailable("node went away"))
    gate.go.set()
    master.release([master.lookup([key(1)]).lease_id])
    assert master.promote_pending() == 0
    s = master.stats()
    assert tiers(master, [key(1), key(2)]) == ["ssd", "ssd"]  # key 2 was demoted to make room, key 1 stayed
    assert (s["ssd_corrupt"], s["promotions"]) == (0, 0)     # unavailable is not corrupt
    assert s["tiers"]["dram"]["bytes"] == 0                  # the reserved target was freed
    master.index.check_invariants()


def test_a_refused_copy_is_a_corrupt_source_and_never_served(make):
    master, node = make(dram_objects=1, ssd_objects=2)
    on_ssd(master, node)
    gate = gated(master, node, refuse=True)
    gate.go.set()
    master.release([master.lookup([key(1)]).lease_id])
    assert master.promote_pending() == 0
    s = master.stats()
    assert tiers(master, [key(1), key(2)]) == [None, "ssd"]
    assert (s["ssd_corrupt"], s["promotions"], s["tiers"]["dram"]["bytes"]) == (1, 0, 0)
    master.index.check_invariants()


def test_removed_during_the_copy_is_not_brought_back(make):
    master, node = make(dram_objects=1, ssd_objects=2)
    on_ssd(master, node)
    gate = gated(master, node)
    master.release([master.lookup([key(1)]).lease_id])
    worker = threading.Thread(target=master.promote_pending)
    worker.start()
    assert gate.entered.wait(10)
    assert master.remove([key(1)]) == 1
    gate.go.set()
    worker.join(10)
    assert tiers(master, [key(1), key(2)]) == [None, "ssd"]
    s = master.stats()
    assert (s["promotions"], s["tiers"]["dram"]["bytes"], s["tiers"]["ssd"]["objects"]) == (0, 0, 1)
    master.index.check_invariants()


@pytest.mark.parametrize("promote_on_hit", [True, False])
def test_only_leased_slow_hits_are_queued(make, promote_on_hit):
    master, node = make(dram_objects=1, ssd_objects=2, promote_on_hit=promote_on_hit)
    on_ssd(master, node)
    assert master.lookup([key(1)], lease=False).hits == 1 and master.promotions.pending == 0
    res = master.lookup([key(2)])                                  # a DRAM hit: nothing to promote
    assert master.promotions.pending == 0
    master.release([res.lease_id])
    res = master.lookup([key(1)])
    assert master.promotions.pending == (1 if promote_on_hit else 0)
    assert master.promotion_wanted.is_set() == promote_on_hit
    master.release([res.lease_id])


def test_a_promotion_the_target_tier_refuses_leaves_no_pin_behind(tmp_path):
    """An object no tier can allocate for (size 0 here, which ReportObjects now refuses) used to stay pinned forever:
    the promotion pinned its source, then the allocation raised."""
    from kvpool.store.config import MasterConfig, NodeConfig
    from kvpool.store.master import Master
    from kvpool.store.node import StorageNode
    from kvpool.store.records import ObjectRecord
    from kvpool.tiers.types import Tier

    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=1 << 20, shm_dir=str(tmp_path),
                                  ssd_path=str(tmp_path / "ssd"), ssd_bytes=1 << 20))
    try:
        master = Master(MasterConfig())
        master.register_node(node.info(), node)
        key = b"k" * 16
        master.placement.adopt(master.placement.node("n1"), [ObjectRecord(key, bytes(16), "n1", Tier.SSD, 0, 0, 0)],
                               [])  # past the report's checks: what an older master adopted
        result = master.lookup([key])
        master.release([result.lease_id])
        assert master.promote_pending() == 0
        slot = master.index.slot_of(key)
        assert int(master.index.leases[slot]) == 0 and master.stats()["leases_open"] == 0
    finally:
        node.close()


def test_an_ssd_only_pool_queues_no_promotions(make):
    master, node = make(dram_objects=0, ssd_objects=4)
    put(master, node, [key(1), key(2)])
    assert tiers(master, [key(1), key(2)]) == ["ssd", "ssd"]
    res = master.lookup([key(1), key(2)])
    assert res.hits == 2 and master.promotions.pending == 0 and not master.promotion_wanted.is_set()
    master.release([res.lease_id])
