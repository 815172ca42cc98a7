"""Master side of draining a node (store/migration.py) with two real in-process StorageNodes and a fake clock:
moves switch the index only on a matching checksum, a reader's lease keeps the source extent alive, nothing is ever
placed on a draining node, expired moves are reaped, bad input changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.master import Master
from kvpool.store.metadata import MemoryMetadata
from kvpool.store.migration import MigrateStatus
from kvpool.store.node import StorageNode
from kvpool.store.records import PutStatus
from kvpool.tiers.types import Tier
from tests.store.fakes import Clock, key  # noqa: F401 - Clock is used by fixtures

OBJ = 4096


def data(i: int) -> np.ndarray:
    return np.full(OBJ, i, np.uint8)


@pytest.fixture
def pool(tmp_path):
    made = []

    def _make(n1_objects=4, n2_objects=4, n2_ssd_objects=0, metadata=None, share=False):
        clock = Clock()
        master = Master(MasterConfig(grant_ttl_s=10, lease_ttl_s=10, node_ttl_s=100), metadata, clock=clock)
        nodes = {}
        for node_id, dram, ssd in (("n1", n1_objects, 0), ("n2", n2_objects, n2_ssd_objects)):
            node = StorageNode(NodeConfig(node_id=node_id, dram_bytes=dram * OBJ, shm_dir=str(tmp_path),
                                          ssd_path=str(tmp_path / f"ssd-{node_id}") if ssd else None,
                                          ssd_bytes=ssd * 2 * OBJ, share_dram=share))
            made.append(node)
            nodes[node_id] = node
        master.register_node(nodes["n1"].info(), nodes["n1"], expires=False)
        return master, nodes, clock

    yield _make
    for node in made:
        node.close()


def put(master, nodes, indices, prefer):
    results = master.put_start([key(i) for i in indices], [OBJ] * len(indices), prefer_node=prefer)
    ids, sums = [], []
    for i, r in zip(indices, results):
        assert r.status == PutStatus.STORED
        loc = r.grant.location
        nodes[loc.node_id].write(loc.tier, loc.offset, key(i), b"\0" * 16, data(i), xxhash.xxh3_64_intdigest(data(i)))
        ids.append(r.grant.grant_id)
        sums.append(xxhash.xxh3_64_intdigest(data(i)))
    assert master.put_commit(ids, sums) == [True] * len(ids)


def copy(nodes, mv) -> int:
    """What a client does for one move: read the source, write the destination; returns the checksum of the bytes."""
    buf = np.zeros(mv.source.size, np.uint8)
    assert nodes[mv.source.node_id].read_into(mv.source.tier, mv.source.offset, b"", mv.source.size, buf) \
        or mv.source.tier == Tier.DRAM
    nodes[mv.dest.node_id].write(mv.dest.tier, mv.dest.offset, b"", mv.ns_digest, buf, xxhash.xxh3_64_intdigest(buf))
    return xxhash.xxh3_64_intdigest(buf)


def read(master, nodes, i) -> bytes | None:
    r = master.lookup([key(i)])
    if not r.hits:
        return None
    loc = r.locations[0]
    buf = np.zeros(loc.size, np.uint8)
    nodes[loc.node_id].read_into(loc.tier, loc.offset, key(i), loc.size, buf)
    master.release([r.lease_id])
    return buf.tobytes()


def test_moves_switch_objects_to_the_other_node_byte_exact(pool):
    master, nodes, _ = pool(metadata=MemoryMetadata(persistent=True))
    put(master, nodes, [1, 2, 3], "n1")
    master.register_node(nodes["n2"].info(), nodes["n2"], expires=False)
    assert master.begin_drain("n1") == (3, 0)
    assert master.stats()["draining"] == ["n1"]
    res = master.migrate_start([key(1), key(2), key(3), key(9)])
    assert [m.status for m in res.moves] == [MigrateStatus.MOVING] * 3 + [MigrateStatus.GONE]
    assert {m.dest.node_id for m in res.moves[:3]} == {"n2"}
    assert master.migrate_start([key(1)]).moves[0].status == MigrateStatus.BUSY
    sums = [copy(nodes, m) for m in res.moves[:3]]
    assert master.migrate_commit([m.move_id for m in res.moves[:3]], sums) == [True] * 3
    assert [r.node_id for r in master.inspect([key(1), key(2), key(3)])] == ["n2"] * 3
    assert [read(master, nodes, i) for i in (1, 2, 3)] == [data(i).tobytes() for i in (1, 2, 3)]
    assert master.stats()["nodes"]["n1"]["dram"]["objects"] == 0  # source extents freed
    assert {r.key: r.node_id for r in master.metadata.load_objects()} == {key(i): "n2" for i in (1, 2, 3)}
    assert master.begin_drain("n1") == (0, 0)
    assert master.remove_node("n1") == 0
    assert master.stats()["draining"] == []
    master.index.check_invariants()


def test_wrong_checksum_or_vanished_object_is_refused_and_cleaned_up(pool):
    master, nodes, _ = pool()
    put(master, nodes, [1, 2], "n1")
    master.register_node(nodes["n2"].info(), nodes["n2"], expires=False)
    master.begin_drain("n1")
    res = master.migrate_start([key(1), key(2)])
    copy(nodes, res.moves[0])
    assert master.remove([key(2)]) == 1  # removed while pinned by the move
    assert master.migrate_commit([res.moves[0].move_id, res.moves[1].move_id], [12345, res.moves[1].checksum]) \
        == [False, False]
    assert [r.node_id for r in master.inspect([key(1)])] == ["n1"]
    assert read(master, nodes, 1) == data(1).tobytes()
    stats = master.stats()
    assert (stats["nodes"]["n2"]["dram"]["objects"], stats["nodes"]["n1"]["dram"]["objects"], stats["moves_open"]) \
        == (0, 1, 0)
    assert master.migrate_commit([res.moves[0].move_id], [res.moves[0].checksum]) == [False]  # already gone
    assert master.index.leases[master.index.slot_of(key(1))] == 0


def test_reader_holding_the_source_keeps_its_bytes_until_release(pool):
    master, nodes, _ = pool()
    put(master, nodes, [1], "n1")
    master.register_node(nodes["n2"].info(), nodes["n2"], expires=False)
    master.begin_drain("n1")
    reader = master.lookup([key(1)])
    src = reader.locations[0]
    res = master.migrate_start([key(1)])
    mv = res.moves[0]
    assert master.migrate_commit([mv.move_id], [copy(nodes, mv)]) == [True]
    assert master.stats()["nodes"]["n1"]["dram"]["objects"] == 1  # still allocated: the reader holds it
    assert master.lookup([key(1)], lease=False).hits == 1 and master.inspect([key(1)])[0].node_id == "n2"
    assert master.release([reader.lease_id]) == 1
    assert master.stats()["nodes"]["n1"]["dram"]["objects"] == 0
    assert src.node_id == "n1"
    master.index.check_invariants()


def test_nothing_placed_on_a_draining_node_and_no_space_is_per_key(pool):
    master, nodes, clock = pool(n1_objects=4, n2_objects=2)
    put(master, nodes, [1, 2, 3], "n1")
    clock.now += 1  # the objects already on n2 are used later than n1's: a drain must not push them out
    master.register_node(nodes["n2"].info(), nodes["n2"], expires=False)
    put(master, nodes, [4], "n2")
    master.begin_drain("n1")
    results = master.put_start([key(5)], [OBJ], prefer_node="n1")  # n1 has room, but it is draining
    assert results[0].grant.location.node_id == "n2"
    assert master.begin_drain("n1") == (3, 0)
    master.put_abort([results[0].grant.grant_id])
    res = master.migrate_start([key(1), key(2), key(3)])
    assert [m.status for m in res.moves] == [MigrateStatus.MOVING, MigrateStatus.NO_SPACE, MigrateStatus.NO_SPACE]
    assert master.migrate_abort([res.moves[0].move_id, 999]) == 1
    assert master.stats()["nodes"]["n2"]["dram"]["objects"] == 1 and master.contains([key(4)]) == [True]
    assert master.remove_node("n1") == 3
    assert master.contains([key(1), key(2), key(3), key(4)]) == [False, False, False, True]


def test_expired_moves_are_reaped_and_a_pending_grant_dies_with_its_node(pool):
    master, nodes, clock = pool()
    put(master, nodes, [1], "n1")
    grant = master.put_start([key(7)], [OBJ], prefer_node="n1")[0].grant
    master.register_node(nodes["n2"].info(), nodes["n2"], expires=False)
    assert master.begin_drain("n1") == (1, 1)
    res = master.migrate_start([key(1)])
    clock.now += 11
    master.reap()
    assert master.stats()["moves_open"] == 0
    assert master.migrate_commit([res.moves[0].move_id], [res.moves[0].checksum]) == [False]
    assert master.stats()["nodes"]["n2"]["dram"]["objects"] == 0
    grant = master.put_start([key(7)], [OBJ], prefer_node="n1")[0].grant  # the old one expired too
    assert grant.location.node_id == "n2"
    master.register_node(nodes["n1"].info(), nodes["n1"], expires=False)
    late = master.put_start([key(8)], [OBJ])[0].grant
    assert late.location.node_id == "n2"  # still draining after re-registering
    assert master.remove_node("n1") == 1
    assert master.put_commit([grant.grant_id], [0]) == [True]
    master.index.check_invariants()


def test_bad_input_names_the_argument_and_changes_nothing(pool):
    master, nodes, _ = pool()
    put(master, nodes, [1], "n1")
    with pytest.raises(KeyError, match="node_id 'nope' is not registered"):
        master.begin_drain("nope")
    with pytest.raises(KeyError, match="node_id 'nope' is not registered"):
        master.list_objects(node_id="nope")
    with pytest.raises(ValueError, match=r"keys\[0\] must be a 16-byte key, got 3"):
        master.migrate_start([b"abc"])
    with pytest.raises(ValueError, match="checksums has 0 entries, move_ids has 1"):
        master.migrate_commit([1], [])
    with pytest.raises(ValueError, match=r"move_ids\[1\] must be an id \(int >= 0\), got -1"):
        master.migrate_abort([1, -1])
    assert master.stats()["draining"] == [] and master.contains([key(1)]) == [True]
    assert master.migrate_start([key(1)]).moves[0].status == MigrateStatus.GONE  # n1 is not draining


def test_a_node_restarting_mid_move_cancels_its_moves_and_grants(pool):
    import dataclasses

    master, nodes, _ = pool()
    put(master, nodes, [1, 2], "n1")
    master.register_node(nodes["n2"].info(), nodes["n2"], expires=False)
    master.begin_drain("n1")
    res = master.migrate_start([key(1)])
    grant = master.put_start([key(5)], [OBJ])[0].grant
    assert grant.location.node_id == "n2"
    master.register_node(dataclasses.replace(nodes["n2"].info(), incarnation="restarted"), nodes["n2"],
                         expires=False)  # n2 restarted: its extents (and the move's destination) are gone
    assert master.migrate_commit([res.moves[0].move_id], [res.moves[0].checksum]) == [False]
    assert master.put_commit([grant.grant_id], [0]) == [False]
    assert master.inspect([key(1)])[0].node_id == "n1" and read(master, nodes, 1) == data(1).tobytes()
    assert master.index.leases[master.index.slot_of(key(1))] == 0
    master.register_node(dataclasses.replace(nodes["n1"].info(), incarnation="again"), nodes["n1"], expires=False)
    assert master.stats()["draining"] == ["n1"]  # a restarted node that was draining stays draining
    master.index.check_invariants()


def test_migrate_next_pages_a_draining_node_by_cursor_and_bytes(pool):
    master, nodes, _ = pool(n1_objects=8, n2_objects=8)
    put(master, nodes, [1, 2, 3, 4, 5], "n1")
    master.register_node(nodes["n2"].info(), nodes["n2"], expires=False)
    with pytest.raises(ValueError, match="node_id 'n1' is not draining: call begin_drain"):
        master.migrate_next("n1")
    with pytest.raises(KeyError, match="node_id 'nope' is not registered"):
        master.migrate_next("nope")
    with pytest.raises(ValueError, match=r"limit must be in \[1, max_batch_keys=65536\], got 0"):
        master.migrate_next("n1", limit=0)
    with pytest.raises(ValueError, match="cursor must be an int >= 0, got -1"):
        master.migrate_next("n1", cursor=-1)
    master.begin_drain("n1")
    first = master.migrate_next("n1", limit=3, max_bytes=2 * OBJ + 1)  # the byte bound stops it at two
    assert first.keys == [key(1), key(2)] and first.next_cursor == 2
    assert [m.status for m in first.moves] == [MigrateStatus.MOVING] * 2
    rest = master.migrate_next("n1", cursor=first.next_cursor, limit=3)
    assert rest.keys == [key(3), key(4), key(5)] and rest.next_cursor == 0
    moves = first.moves + rest.moves
    assert master.migrate_commit([m.move_id for m in moves], [copy(nodes, m) for m in moves]) == [True] * 5
    assert master.migrate_next("n1").keys == [] and master.begin_drain("n1") == (0, 0)
    assert [read(master, nodes, i) for i in range(1, 6)] == [data(i).tobytes() for i in range(1, 6)]


def test_a_drained_object_leaves_the_source_nodes_host_index_and_enters_the_destinations(pool):
    """Both nodes share their arenas, so each keeps a host index a same-host client reads with no Lookup: after the
    move, the source's must not name the freed extent (a reader would pay a failed read first), the destination's
    names the new one."""
    master, nodes, _ = pool(share=True)
    put(master, nodes, [1, 2], "n1")
    master.register_node(nodes["n2"].info(), nodes["n2"], expires=False)
    assert master.host_feed.flush(10)
    offsets = [loc.offset for loc in master.inspect([key(1), key(2)])]
    assert nodes["n1"].host_index.find([key(1), key(2)])[0] == offsets
    assert master.begin_drain("n1") == (2, 0)
    res = master.migrate_start([key(1)])
    assert master.migrate_commit([res.moves[0].move_id], [copy(nodes, res.moves[0])]) == [True]
    assert master.host_feed.flush(10)
    assert nodes["n1"].host_index.find([key(1)]) == ([], [], [], [])
    assert nodes["n1"].host_index.find([key(2)])[0] == offsets[1:]             # not moved yet: still there
    assert nodes["n2"].host_index.find([key(1)])[0] == [res.moves[0].dest.offset]
