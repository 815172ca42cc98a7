"""The inclusive SSD tier and its write-behind (store/placement.py, store/writebehind.py) through the Master, over a
real StorageNode (tiny arena and SSD file in tmp_path) and a fake clock: exact tiers, offsets, SSD records found by
`scan`, byte moves seen by a recording wrapper around the real node; orphans evicted first; placement over two nodes
evicting only when the pool is full."""

import numpy as np
import pytest

from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.index import NO_COPY
from kvpool.store.master import Master
from kvpool.store.metadata import MemoryMetadata
from kvpool.store.node import StorageNode
from kvpool.tiers.policy import POLICY_NAMES
from kvpool.tiers.types import Tier
from tests.store.fakes import key
from tests.store.test_master import OBJ, clock, make, put, tiers  # noqa: F401 - fixtures

SSD_EXTENT = 2 * OBJ   # header page + payload


class Recorder:
    """The real node, with the byte moves the master asks for written down (in call order)."""

    def __init__(self, node: StorageNode) -> None:
        self.node = node
        self.demoted: list[list] = []
        self.dropped: list[list] = []

    def demote(self, moves, drops=()):
        self.demoted.append(list(moves))
        if drops:
            self.dropped.append(list(drops))
        return self.node.demote(moves, drops)

    def promote(self, moves):
        return self.node.promote(moves)

    def drop(self, drops):
        self.dropped.append(list(drops))
        return self.node.drop(drops)

    def objects_removed(self, keys=None):
        self.node.objects_removed(keys)


def recorded(master, node) -> Recorder:
    rec = Recorder(node)
    master.register_node(node.info(), rec, expires=False)  # same incarnation: only the ops change
    return rec


def records(node) -> dict[bytes, int]:
    """SSD records a restarted node would find: key -> offset."""
    return {r.key: r.offset for r in node.ssd.scan(verify=True)}


def copy_of(master, k):
    return master.placement.copies.offset(master.index.slot_of(k))


def wb(master) -> dict:
    return master.stats()["write_behind"]


def test_a_put_reserves_its_copy_and_the_write_behind_writes_it(make):
    master, node = make(dram_objects=2, ssd_objects=4)
    put(master, node, [key(1), key(2)])
    assert tiers(master, [key(1), key(2)]) == ["dram", "dram"]
    assert (copy_of(master, key(1)), copy_of(master, key(2))) == (0, SSD_EXTENT)   # reserved at put time
    assert wb(master) == {"pending": 2, "copied": 0, "copied_bytes": 0, "failed": 0}
    assert records(node) == {}
    assert master.copy_pending() == 2
    assert records(node) == {key(1): 0, key(2): SSD_EXTENT}       # whole records with the committed checksum
    assert wb(master) == {"pending": 0, "copied": 2, "copied_bytes": 2 * OBJ, "failed": 0}
    assert master.copy_pending() == 0
    ssd = master.stats()["nodes"]["n1"]["ssd"]
    assert (ssd["objects"], ssd["bytes"]) == (2, 2 * SSD_EXTENT)  # SSD usage counts the copies
    master.index.check_invariants()


def test_demoting_an_object_with_a_clean_copy_moves_no_bytes(make):
    master, node = make(dram_objects=1, ssd_objects=3, promote_on_hit=False)
    rec = recorded(master, node)
    put(master, node, [key(1)])
    assert master.copy_pending() == 1 and len(rec.demoted) == 1     # the write-behind's one copy
    put(master, node, [key(2)])                                     # DRAM full: key 1 goes down
    assert tiers(master, [key(1), key(2)]) == ["ssd", "dram"]
    assert master.inspect([key(1)])[0].offset == 0 and copy_of(master, key(1)) is None  # the copy IS the object
    assert len(rec.demoted) == 1 and master.stats()["demotions"] == 1
    out = np.zeros(OBJ, np.uint8)
    assert node.read_into(Tier.SSD, 0, key(1), OBJ, out) and (out == 1).all()


def test_demoting_an_object_whose_copy_is_not_written_yet_writes_it_into_its_reserved_extent(make):
    master, node = make(dram_objects=1, ssd_objects=3, promote_on_hit=False)
    rec = recorded(master, node)
    put(master, node, [key(1)])
    put(master, node, [key(2)])                                     # no write-behind round yet: key 1 is dirty
    [[move]] = rec.demoted
    assert (move.key, move.src_tier, move.dst_tier, move.dst_offset) == (key(1), Tier.DRAM, Tier.SSD, 0)
    assert tiers(master, [key(1), key(2)]) == ["ssd", "dram"] and records(node) == {key(1): 0}
    assert wb(master)["pending"] == 1                               # key 2 only; key 1 left the queue
    assert master.copy_pending() == 1 and records(node) == {key(1): 0, key(2): SSD_EXTENT}


def test_an_object_leaving_erases_its_copy_so_a_restart_cannot_resurrect_it(make):
    master, node = make(dram_objects=2, ssd_objects=2)
    put(master, node, [key(1), key(2)])
    master.copy_pending()
    assert set(records(node)) == {key(1), key(2)}
    assert master.remove([key(1)]) == 1
    assert records(node) == {key(2): SSD_EXTENT}
    assert master.evict(older_than_s=0) == 1
    assert records(node) == {} and master.stats()["nodes"]["n1"]["ssd"]["bytes"] == 0


def test_a_promoted_ssd_record_becomes_the_copy_and_nothing_is_written(make):
    master, node = make(dram_objects=1, ssd_objects=3)
    rec = recorded(master, node)
    put(master, node, [key(1)])
    master.copy_pending()
    put(master, node, [key(2)])                                     # key 1 -> SSD at 0 (clean)
    master.copy_pending()                                           # key 2's copy at SSD_EXTENT
    writes = sum(len(b) for b in rec.demoted)
    master.release([master.lookup([key(1)]).lease_id])
    assert master.promote_pending() == 1
    assert tiers(master, [key(1), key(2)]) == ["dram", "ssd"]
    assert copy_of(master, key(1)) == 0 and master.inspect([key(2)])[0].offset == SSD_EXTENT
    assert sum(len(b) for b in rec.demoted) == writes and wb(master)["pending"] == 0   # both were clean
    assert records(node) == {key(1): 0, key(2): SSD_EXTENT}
    master.index.check_invariants()


def test_a_reader_of_the_promoted_record_keeps_it_until_it_releases(make):
    master, node = make(dram_objects=1, ssd_objects=3)
    put(master, node, [key(1)])
    master.copy_pending()
    put(master, node, [key(2)])
    res = master.lookup([key(1)])                                   # still reading SSD offset 0
    assert master.promote_pending() == 1 and copy_of(master, key(1)) == 0
    assert master.remove([key(1)]) == 1                             # the new object and its copy go...
    out = np.zeros(OBJ, np.uint8)
    assert node.read_into(Tier.SSD, 0, key(1), OBJ, out) and (out == 1).all()  # ...the reader's extent stays
    assert key(1) in records(node)
    master.release([res.lease_id])
    assert key(1) not in records(node)
    assert master.stats()["nodes"]["n1"]["ssd"]["objects"] == 1     # key 2 only: the shared extent is free now
    master.index.check_invariants()


def test_ssd_capacity_is_the_pools_and_copies_push_out_the_coldest_ssd_object(make):
    master, node = make(dram_objects=2, ssd_objects=3, promote_on_hit=False)
    for i in (1, 2, 3):
        put(master, node, [key(i)])
        master.copy_pending()
    assert tiers(master, [key(1), key(2), key(3)]) == ["ssd", "dram", "dram"]  # SSD: 1 + copies of 2 and 3
    put(master, node, [key(4)])                                     # 2 goes down onto its copy; 4's copy needs
    assert tiers(master, [key(i) for i in (1, 2, 3, 4)]) == [None, "ssd", "dram", "dram"]  # room: 1 is evicted
    s = master.stats()
    assert (s["demotions"], s["evictions"]) == (2, {"dram": 0, "ssd": 1})
    assert records(node) == {key(2): SSD_EXTENT, key(3): 2 * SSD_EXTENT}   # 1's record erased; 4 not written yet


def test_flush_node_writes_every_pending_copy_and_stops_placement_until_it_registers_again(make):
    master, node = make(dram_objects=4, ssd_objects=4)
    put(master, node, [key(i) for i in (1, 2, 3)])
    assert master.flush_node("n1") == (3, 0)
    assert set(records(node)) == {key(1), key(2), key(3)} and wb(master)["pending"] == 0
    assert master.stats()["stopping"] == ["n1"]
    assert [r.status.value for r in master.put_start([key(4)], [OBJ])] == ["no_space"]  # nothing new goes there
    master.register_node(node.info(), node, expires=False)
    assert put(master, node, [key(4)])[0].value == "stored" and master.stats()["stopping"] == []
    with pytest.raises(KeyError, match="node_id 'zz'"):
        master.flush_node("zz")


def test_a_master_that_reloads_its_index_adopts_reported_copies(tmp_path, clock):
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=2 * OBJ, shm_dir=str(tmp_path),
                                  ssd_path=str(tmp_path / "ssd"), ssd_bytes=4 * SSD_EXTENT))
    try:
        meta = MemoryMetadata(persistent=True)
        first = Master(MasterConfig(), meta, clock=clock)
        first.register_node(node.info(), node, expires=False)
        put(first, node, [key(1), key(2)])
        first.copy_pending()
        second = Master(MasterConfig(), meta, clock=clock)          # the journal has the DRAM objects, not copies
        second.register_node(node.info(), node, expires=False)      # same incarnation: DRAM kept
        assert copy_of(second, key(1)) is None
        result = second.report_objects("n1", node.scan_ssd())
        assert (result.adopted, result.known, result.dropped_keys) == (0, 2, [])
        assert (copy_of(second, key(1)), copy_of(second, key(2))) == (0, SSD_EXTENT)
        assert tiers(second, [key(1), key(2)]) == ["dram", "dram"] and second.stats()["write_behind"]["pending"] == 0
    finally:
        node.close()


# ---------------------------------------------------------------- orphans


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_block_whose_parent_is_removed_is_evicted_before_colder_reachable_blocks(make, policy):
    master, node = make(dram_objects=4, policy=policy)
    put(master, node, [key(9)])                                     # the coldest object
    put(master, node, [key(1), key(2), key(3)])                     # one chain
    assert master.remove([key(1)]) == 1                             # 2 and 3 are unreachable now
    assert master.stats()["orphaned"] == 2
    order = []
    for i in (4, 5, 6, 7):
        before = {i for i in (2, 3, 9) if tiers(master, [key(i)])[0]}
        put(master, node, [key(i)])
        after = {i for i in (2, 3, 9) if tiers(master, [key(i)])[0]}
        order += sorted(before - after)
    assert order == [3, 2, 9]                                       # orphans first, tails first, then LRU


def test_a_lookup_links_chains_put_in_separate_batches(make):
    master, node = make(dram_objects=6)
    put(master, node, [key(1), key(2)])
    put(master, node, [key(3), key(4)])                             # its parent is not known from this put
    master.remove([key(2)])
    assert master.stats()["orphaned"] == 0                          # 3 looked like a root
    put(master, node, [key(2)])
    master.release([master.lookup([key(1), key(2), key(3), key(4)]).lease_id])
    master.remove([key(2)])
    assert master.stats()["orphaned"] == 2                          # 3 and 4, linked by the lookup
    # A client that holds block 2 itself reads 3 and 4: they are roots again, ordinary victims.
    master.release([master.lookup([key(3), key(4)]).lease_id])
    assert not master.placement.chains.is_orphan(master.index.slot_of(key(3)))


def test_objects_of_a_dropped_node_orphan_their_descendants_on_other_nodes(tmp_path, clock):
    nodes = [StorageNode(NodeConfig(node_id=f"n{i}", dram_bytes=2 * OBJ, shm_dir=str(tmp_path))) for i in (1, 2)]
    try:
        master = Master(MasterConfig(), clock=clock)
        for n in nodes:
            master.register_node(n.info(), n, expires=False)
        results = master.put_start([key(1), key(2), key(3)], [OBJ] * 3)     # spread: most free DRAM first
        placed = [r.grant.location.node_id for r in results]
        assert placed == ["n1", "n2", "n1"]
        master.put_commit([r.grant.grant_id for r in results], [0, 0, 0])
        master.remove_node("n2")                                    # key 2 is lost with n2: key 3 is stranded
        assert tiers(master, [key(1), key(2), key(3)]) == ["dram", None, "dram"]
        assert master.stats()["orphaned"] == 1
        assert master.placement.chains.is_orphan(master.index.slot_of(key(3)))
    finally:
        for n in nodes:
            n.close()


# ---------------------------------------------------------------- placement over the pool


@pytest.mark.parametrize("write_behind", [False, True])
def test_two_equal_nodes_evict_nothing_until_the_pool_is_full(tmp_path, clock, write_behind):
    nodes = [StorageNode(NodeConfig(node_id=f"n{i}", dram_bytes=2 * OBJ, shm_dir=str(tmp_path),
                                    ssd_path=str(tmp_path / f"ssd{i}"), ssd_bytes=4 * SSD_EXTENT)) for i in (1, 2)]
    try:
        master = Master(MasterConfig(write_behind=write_behind, promote_on_hit=False), clock=clock)
        for n in nodes:
            master.register_node(n.info(), n, expires=False)
        capacity = 2 * 4 if write_behind else 2 * (2 + 4)           # inclusive: the SSDs; exclusive: DRAM + SSD
        for i in range(1, capacity + 1):
            r = master.put_start([key(i)], [OBJ])[0]
            nodes[int(r.grant.location.node_id[1]) - 1].write(r.grant.location.tier, r.grant.location.offset,
                                                              key(i), b"\0" * 16, np.full(OBJ, i, np.uint8), None)
            assert master.put_commit([r.grant.grant_id], [0]) == [True]
            master.copy_pending()
            s = master.stats()
            assert sum(s["evictions"].values()) == 0, f"evicted after put {i} of {capacity}"
        assert {n: s["nodes"][n]["ssd"]["objects"] for n in ("n1", "n2")} == {"n1": 4, "n2": 4}
        assert {n: s["nodes"][n]["dram"]["objects"] for n in ("n1", "n2")} == {"n1": 2, "n2": 2}
        assert len(master.index) == capacity
        master.put_commit([master.put_start([key(99)], [OBJ])[0].grant.grant_id], [0])
        assert sum(master.stats()["evictions"].values()) == 1       # the pool is full now: one in, one out
    finally:
        for n in nodes:
            n.close()


def test_index_copy_column_is_cleared_for_ssd_objects(make):
    master, node = make(dram_objects=1, ssd_objects=3, write_behind=False)
    put(master, node, [key(1)])
    assert int(master.index.copy[master.index.slot_of(key(1))]) == NO_COPY   # exclusive tiers: no copies
    assert master.stats()["write_behind"]["pending"] == 0


def test_an_hbm_object_keeps_its_copy_through_dram_and_lands_on_it(tmp_path, clock):
    from tests.store.test_hbm_tier import HostHbm

    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=OBJ, shm_dir=str(tmp_path), ssd_path=str(tmp_path / "s"),
                                  ssd_bytes=4 * SSD_EXTENT), hbm=HostHbm(OBJ))
    try:
        master = Master(MasterConfig(promote_on_hit=False), clock=clock)
        master.register_node(node.info(), node, expires=False)
        rec = recorded(master, node)
        put(master, node, [key(1)])
        assert tiers(master, [key(1)]) == ["hbm"] and copy_of(master, key(1)) == 0
        assert master.copy_pending() == 1 and records(node) == {key(1): 0}     # HBM -> its SSD extent
        put(master, node, [key(2)])                                     # 1: HBM -> DRAM, keeping its clean copy
        assert tiers(master, [key(1), key(2)]) == ["dram", "hbm"] and copy_of(master, key(1)) == 0
        master.copy_pending()
        put(master, node, [key(3)])                                     # 1: DRAM -> onto its copy; 2: HBM -> DRAM
        assert tiers(master, [key(1), key(2), key(3)]) == ["ssd", "dram", "hbm"]
        assert master.inspect([key(1)])[0].offset == 0
        moves = [(m.key, m.src_tier, m.dst_tier) for batch in rec.demoted for m in batch]
        assert moves == [(key(1), Tier.HBM, Tier.SSD), (key(1), Tier.HBM, Tier.DRAM), (key(2), Tier.HBM, Tier.SSD),
                         (key(2), Tier.HBM, Tier.DRAM)]                 # no DRAM -> SSD copy of key 1
        out = bytearray(OBJ)
        assert node.read_into(Tier.SSD, 0, key(1), OBJ, out) and bytes(out) == bytes([1]) * OBJ
    finally:
        node.close()


def test_an_ssd_smaller_than_twice_dram_keeps_the_exclusive_tiers(make):
    master, node = make(dram_objects=3, ssd_objects=2)             # 16 KiB of SSD for 12 KiB of DRAM
    for i in (1, 2, 3, 4):
        put(master, node, [key(i)])
    assert [copy_of(master, key(i)) for i in (2, 3, 4)] == [None] * 3
    assert tiers(master, [key(i) for i in (1, 2, 3, 4)]) == ["ssd", "dram", "dram", "dram"]   # 3 + 2 objects fit
    assert sum(master.stats()["evictions"].values()) == 0


def test_a_damaged_copy_is_a_miss_once_it_is_the_object(make):
    master, node = make(dram_objects=1, ssd_objects=3, promote_on_hit=False)
    put(master, node, [key(1)])
    master.copy_pending()
    with open(node.ssd.path, "r+b") as f:                          # one payload byte of key 1's copy, at rest
        f.seek(4096 + 100)
        b = f.read(1)
        f.seek(4096 + 100)
        f.write(bytes([b[0] ^ 0xFF]))
    put(master, node, [key(2)])                                     # key 1 goes down onto its copy, unread
    res = master.lookup([key(1)])
    assert res.tiers == [int(Tier.SSD)]
    out = np.zeros(OBJ, np.uint8)
    assert node.read_into(Tier.SSD, res.offsets[0], key(1), OBJ, out) is False   # a miss, never the bytes
    assert master.report_corrupt(res.lease_id, [key(1)]) == 1
    assert master.stats()["ssd_corrupt"] == 1 and master.contains([key(1)]) == [False]
    assert [r.key for r in node.ssd.scan()] == [key(1)]             # still leased: its extent waits for the reader
    master.release([res.lease_id])
    assert [r.key for r in node.ssd.scan()] == []                   # then the damaged record is erased, not skipped
    master.copy_pending()
    assert records(node) == {key(2): SSD_EXTENT}
