"""What the master publishes to a node's host index depends on what the node said it takes: SSD records only to a
node that takes SSD rows (`NodeInfo.ssd_index_rows`); a node from before them gets its DRAM extents alone (it would
take an SSD record's offset for a DRAM extent). Real in-process StorageNodes sharing their arenas."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import xxhash

from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.master import Master
from kvpool.store.node import StorageNode
from kvpool.store.records import PutStatus
from kvpool.tiers.host_index import DRAM_ROW, SSD_ROW
from tests.store.fakes import Clock, key

OBJ = 4096


@pytest.fixture
def nodes(tmp_path):
    made = {}
    for node_id, dram, ssd in (("ssd-new", 0, 8), ("ssd-old", 0, 8), ("dram-old", 8, 0)):
        made[node_id] = StorageNode(NodeConfig(node_id=node_id, dram_bytes=dram * OBJ, shm_dir=str(tmp_path),
                                               ssd_path=str(tmp_path / node_id) if ssd else None,
                                               ssd_bytes=ssd * 2 * OBJ, share_dram=True))
    yield made
    for node in made.values():
        node.close()


def put(master, nodes, indices, prefer):
    results = master.put_start([key(i) for i in indices], [OBJ] * len(indices), prefer_node=prefer)
    ids, sums = [], []
    for i, r in zip(indices, results):
        assert r.status == PutStatus.STORED and r.grant.location.node_id == prefer
        data = np.full(OBJ, i, np.uint8)
        loc = r.grant.location
        nodes[prefer].write(loc.tier, loc.offset, key(i), b"\0" * 16, data, xxhash.xxh3_64_intdigest(data))
        ids.append(r.grant.grant_id)
        sums.append(xxhash.xxh3_64_intdigest(data))
    assert master.put_commit(ids, sums) == [True] * len(ids)
    return [r.grant.location.offset for r in results]


def test_ssd_records_are_published_only_to_nodes_that_take_ssd_rows(nodes):
    master = Master(MasterConfig(grant_ttl_s=10, lease_ttl_s=10, node_ttl_s=100), clock=Clock())
    assert nodes["ssd-new"].info().ssd_index_rows is True          # this version's nodes say so
    master.register_node(nodes["ssd-new"].info(), nodes["ssd-new"], expires=False)
    new = put(master, nodes, [1, 2], "ssd-new")
    for old, keys in (("ssd-old", [3, 4]), ("dram-old", [5, 6])):  # as nodes from before SSD rows: without the flag
        master.register_node(dataclasses.replace(nodes[old].info(), ssd_index_rows=False), nodes[old], expires=False)
        dram = put(master, nodes, keys, old)    # (placed on the node just registered: DRAM first, then the emptiest)
    assert master.host_feed.flush(10)
    offsets, _, _, places = nodes["ssd-new"].host_index.find([key(1), key(2)])
    assert (offsets, places) == (new, [SSD_ROW, SSD_ROW])
    assert nodes["ssd-old"].host_index.find([key(3)]) == ([], [], [], [])
    offsets, _, _, places = nodes["dram-old"].host_index.find([key(5), key(6)])
    assert (offsets, places) == (dram, [DRAM_ROW, DRAM_ROW])
    assert master.host_feed.as_dict() == {"published": 4, "gone": 0, "failed": 0, "dropped": 0}
    # the node upgraded in place registers again, saying it takes SSD rows: they are published from then on
    master.register_node(nodes["ssd-old"].info(), nodes["ssd-old"], expires=False)
    assert master.host_feed.flush(10)
    assert nodes["ssd-old"].host_index.find([key(3), key(4)])[3] == [SSD_ROW, SSD_ROW]


def _index_is_the_master_s(master, node, indices) -> None:
    """`node`'s host index holds exactly the objects the master has there, at their offsets."""
    for i in indices:
        where = master.inspect([key(i)])[0]
        assert node.host_index.find([key(i)])[0] == ([] if where is None else [where.offset]), i


def test_a_registration_republishes_in_chunks_and_the_index_ends_as_the_master_s(nodes, monkeypatch):
    """A node that kept its memory registers again (its master restarted): its objects go back into its host index
    `REPUBLISH_SLOTS` slots per hold of the master's lock, other calls between. One removed between two chunks, one
    put, one removed and put again: the index ends with exactly the objects the master has there, where it has
    them."""
    from kvpool.store import master as master_mod
    monkeypatch.setattr(master_mod, "REPUBLISH_SLOTS", 2)
    node = nodes["dram-old"]                                   # 8 DRAM objects, shares its arena
    master = Master(MasterConfig(grant_ttl_s=10, lease_ttl_s=10, node_ttl_s=100), clock=Clock())
    master.register_node(node.info(), node, expires=False)
    put(master, nodes, [1, 2, 3, 4, 5, 6], "dram-old")         # slots 0-5
    assert master.host_feed.flush(10)
    calls = []

    def others() -> None:
        calls.append(len(calls))
        if len(calls) == 1:                                   # slots 0-1 done: one of them goes, one not yet seen
            assert master.remove([key(1), key(5)]) == 2
        if len(calls) == 2:                                   # a new object, into a slot already passed
            put(master, nodes, [7], "dram-old")

    master.between_republish_chunks = others
    node.objects_removed()                                     # as a node registering again clears its index
    master.register_node(node.info(), node, expires=False)     # the same process: its objects stay
    assert master.host_feed.flush(10)
    assert len(calls) >= 3
    held = [i for i in range(1, 8) if master.inspect([key(i)])[0] is not None]
    assert held == [2, 3, 4, 6, 7]
    _index_is_the_master_s(master, node, range(1, 8))


def test_a_registration_is_answered_before_its_republication_ends(nodes, monkeypatch):
    """The republication is a backfill on the feed's thread: `register_node` (the RegisterNode RPC) returns while it
    runs, however many objects the node holds (a node of a few million ran past its RPC deadline). Registering again
    meanwhile starts it over from the first slot (the node cleared its index again); the index ends complete."""
    import threading

    from kvpool.store import master as master_mod
    monkeypatch.setattr(master_mod, "REPUBLISH_SLOTS", 2)
    node = nodes["dram-old"]
    master = Master(MasterConfig(grant_ttl_s=10, lease_ttl_s=10, node_ttl_s=100), clock=Clock())
    master.register_node(node.info(), node, expires=False)
    put(master, nodes, list(range(1, 9)), "dram-old")           # slots 0-7: four chunks
    assert master.host_feed.flush(10)
    paused, go = threading.Event(), threading.Event()

    def hold() -> None:
        paused.set()
        assert go.wait(10)

    master.between_republish_chunks = hold
    node.objects_removed()
    master.register_node(node.info(), node, expires=False)     # returns with three chunks still to go
    assert paused.wait(10)
    assert master.host_feed.backfilling() == ["dram-old"]
    assert master.host_feed.flush(0.05) is False
    node.objects_removed()                                     # registers again meanwhile: from slot 0 again
    master.register_node(node.info(), node, expires=False)
    master.between_republish_chunks = lambda: None
    go.set()
    assert master.host_feed.flush(10)
    assert master.host_feed.backfilling() == []
    assert [len(node.host_index.find([key(i)])[0]) for i in range(1, 9)] == [1] * 8
    _index_is_the_master_s(master, node, range(1, 9))


def test_a_republication_larger_than_the_feed_s_queue_loses_nothing(nodes, monkeypatch):
    """A chunk waits until its node's queue has room for all it may add: a node holding more objects than
    `MAX_QUEUED` gets every one back (before, the oldest were pushed out of the queue, counted `dropped`)."""
    from kvpool.store import host_feed
    from kvpool.store import master as master_mod
    monkeypatch.setattr(master_mod, "REPUBLISH_SLOTS", 2)
    monkeypatch.setattr(host_feed, "MAX_QUEUED", 3)
    node = nodes["dram-old"]
    master = Master(MasterConfig(grant_ttl_s=10, lease_ttl_s=10, node_ttl_s=100), clock=Clock())
    master.host_feed.interval_s = 0.02                          # a sender slower than the chunks
    master.register_node(node.info(), node, expires=False)
    for i in range(1, 9):                                      # one at a time: a put's commit fits the queue
        put(master, nodes, [i], "dram-old")
        assert master.host_feed.flush(10)
    published = master.host_feed.as_dict()["published"]
    node.objects_removed()
    master.register_node(node.info(), node, expires=False)
    assert master.host_feed.flush(10)
    assert master.host_feed.as_dict() == {"published": published + 8, "gone": 0, "failed": 0, "dropped": 0}
    _index_is_the_master_s(master, node, range(1, 9))


def test_a_node_that_restarted_or_left_ends_its_republication(nodes, monkeypatch):
    """A new process of the node (new incarnation) holds nothing the master had: its backfill in progress is
    dropped; a node removed from the pool ends its backfill at its next chunk."""
    import threading

    from kvpool.store import master as master_mod
    monkeypatch.setattr(master_mod, "REPUBLISH_SLOTS", 2)
    node = nodes["dram-old"]
    master = Master(MasterConfig(grant_ttl_s=10, lease_ttl_s=10, node_ttl_s=100), clock=Clock())
    master.register_node(node.info(), node, expires=False)
    put(master, nodes, list(range(1, 9)), "dram-old")
    assert master.host_feed.flush(10)
    for leave in ("restart", "remove"):
        paused, go = threading.Event(), threading.Event()
        chunks = []

        def hold(chunks=chunks, paused=paused, go=go) -> None:
            chunks.append(1)
            paused.set()
            assert go.wait(10)

        master.between_republish_chunks = hold
        node.objects_removed()
        master.register_node(node.info(), node, expires=False)
        assert paused.wait(10)
        if leave == "restart":
            master.register_node(dataclasses.replace(node.info(), incarnation="new-process"), node, expires=False)
        else:
            master.remove_node("dram-old")
        go.set()
        assert master.host_feed.flush(10)
        assert chunks == [1]                                    # none after the one in progress
        assert master.inspect([key(i) for i in range(1, 9)]) == [None] * 8
        if leave == "restart":                                  # back for the next round, its objects again
            master.register_node(node.info(), node, expires=False)
            put(master, nodes, list(range(1, 9)), "dram-old")
            assert master.host_feed.flush(10)
