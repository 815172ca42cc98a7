"""Expired DRAM grants' extents held until no same-host writer claims them (store/held_extents.py,
tiers/writer_claims.py): the bookkeeping alone, then a master with a fake clock over a real node that shares its
arena, a real client-side mapping of that arena claiming ranges, and heartbeats carrying the node's own scan."""

from __future__ import annotations

import pytest

from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.held_extents import HeldExtents
from kvpool.store.master import Master
from kvpool.store.node import StorageNode
from kvpool.store.records import PutStatus
from kvpool.tiers.dram import DramArena
from tests.store.fakes import Clock, key

OBJ = 4096


def test_an_extent_is_freed_on_the_second_beat_after_its_hold_that_names_no_claim_over_it():
    held = HeldExtents()
    held.hold(1, 0, OBJ)
    assert held.beat(1, []) == []                       # may have scanned before the hold
    assert held.beat(1, [(OBJ - 1, OBJ + 1)]) == []     # a claim over its last byte
    assert held.beat(1, [(OBJ, 2 * OBJ)]) == [0]        # one that ends where the extent ends: free
    assert held.count() == 0 and held.beat(1, []) == []
    held.hold(1, OBJ, OBJ)
    held.hold(2, 0, OBJ)
    assert held.beat(1, []) == [] and held.beat(1, []) == [OBJ]
    held.forget_node(2)
    assert held.count() == 0 and held.beat(2, []) == [] and held.beat(2, []) == []


@pytest.fixture
def pool(tmp_path):
    clock = Clock()
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=OBJ, shm_dir=str(tmp_path), share_dram=True))
    master = Master(MasterConfig(grant_ttl_s=5.0), clock=clock)
    epoch = master.register(node.info(), node, expires=False).epoch
    client = DramArena.attach(node.dram.path)
    yield master, node, client, clock, epoch
    client.close()
    node.close()


def test_an_expired_grant_s_extent_waits_for_the_node_s_heartbeats_and_for_the_writer_claiming_it(pool):
    """One DRAM extent. A grant for key 1 expires while a same-host writer claims its extent (stopped inside its
    copy): the master forgets key 1 at once, so no reader finds it and a new put of it may come, but the extent is
    not given out (a put of key 2 gets no space) until the second heartbeat after the expiry whose scan shows no
    claim over it; then key 2 lands there."""
    master, node, client, clock, epoch = pool
    assert node.info().writer_claims
    grant = master.put_start([key(1)], [OBJ])[0].grant
    claims = client.writer_claims()
    cell = claims.take()
    claims.hold(cell, grant.location.offset, grant.location.offset + OBJ)      # a copy that has begun
    clock.now += 5.1
    assert master.reap()["grants"] == 1
    stats = master.stats()
    assert stats["grants_open"] == 0 and stats["grants_held"] == 1 and master.contains([key(1)]) == [False]
    assert master.put_commit([grant.grant_id], [0]) == [False]      # the late writer's commit: refused
    assert [r.status for r in master.put_start([key(2)], [OBJ])] == [PutStatus.NO_SPACE]
    for _ in range(3):      # the writer is still inside its copy: its claim keeps the extent held
        assert node.claimed_ranges() == [(0, OBJ)]
        assert master.heartbeat_stamped("n1", epoch, claimed=node.claimed_ranges())[0] is False
        assert master.stats()["grants_held"] == 1
    claims.drop(cell)       # the copy is over
    assert master.heartbeat_stamped("n1", epoch, claimed=node.claimed_ranges())[0] is False
    assert master.stats()["grants_held"] == 0
    started = master.put_start([key(2)], [OBJ])
    assert [r.status for r in started] == [PutStatus.STORED] and started[0].grant.location.offset == 0


def test_with_no_writer_the_extent_is_freed_on_the_second_heartbeat(pool):
    master, node, _client, clock, epoch = pool
    master.put_start([key(1)], [OBJ])
    clock.now += 5.1
    master.reap()
    assert master.heartbeat_stamped("n1", epoch, claimed=[])[0] is False
    assert master.stats()["grants_held"] == 1       # this heartbeat's scan may have run before the expiry
    master.heartbeat_stamped("n1", epoch, claimed=[])
    assert master.stats()["grants_held"] == 0
    assert [r.status for r in master.put_start([key(1)], [OBJ])] == [PutStatus.STORED]


def test_a_node_that_leaves_takes_its_held_extents_with_it(pool):
    master, node, _client, clock, epoch = pool
    master.put_start([key(1)], [OBJ])
    clock.now += 5.1
    master.reap()
    assert master.stats()["grants_held"] == 1
    master.remove_node("n1")
    assert master.stats()["grants_held"] == 0
    master.index.check_invariants()


def test_a_restarted_master_holds_the_free_parts_of_the_ranges_a_registering_node_finds_claimed(tmp_path):
    """The master restarts (a new Master over the same persistent metadata) while a same-host writer is inside its
    copy into the extent of a grant the old master gave (never committed, so the new master does not know it). The
    node registers again with its scan of the claims: the new master reserves the free part of the claimed range
    (the extent at OBJ) and holds it like an expired grant's, so a new put goes elsewhere; once a heartbeat shows the
    claim gone (the second after the registration), the extent is given out again."""
    from kvpool.store.metadata import MemoryMetadata
    import numpy as np
    import xxhash

    clock = Clock()
    meta = MemoryMetadata(persistent=True)
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=4 * OBJ, shm_dir=str(tmp_path), share_dram=True))
    client = DramArena.attach(node.dram.path)
    try:
        m1 = Master(MasterConfig(), meta, clock=clock)
        m1.register(node.info(), node, expires=False)
        (done,) = m1.put_start([key(1)], [OBJ])
        data = np.full(OBJ, 1, np.uint8)
        node.write(done.grant.location.tier, done.grant.location.offset, key(1), b"\0" * 16, data,
                   xxhash.xxh3_64_intdigest(data))
        assert m1.put_commit([done.grant.grant_id], [xxhash.xxh3_64_intdigest(data)]) == [True]
        (pending,) = m1.put_start([key(2)], [OBJ])
        assert (done.grant.location.offset, pending.grant.location.offset) == (0, OBJ)
        claims = client.writer_claims()
        cell = claims.take()
        claims.hold(cell, OBJ, 2 * OBJ)         # the writer of key 2, inside its copy
        m2 = Master(MasterConfig(), meta, clock=clock)      # m1 died
        node.objects_removed()                  # what the node does first as it registers again, then it scans
        epoch = m2.register(node.info(), node, expires=False, claimed=node.claimed_ranges()).epoch
        assert m2.stats()["grants_held"] == 1 and m2.contains([key(1), key(2)]) == [True, False]
        assert [r.grant.location.offset for r in m2.put_start([key(3)], [OBJ])] == [2 * OBJ]
        assert m2.heartbeat_stamped("n1", epoch, claimed=node.claimed_ranges())[0] is False
        assert m2.heartbeat_stamped("n1", epoch, claimed=node.claimed_ranges())[0] is False
        assert m2.stats()["grants_held"] == 1   # claimed still, two heartbeats on
        claims.drop(cell)
        m2.heartbeat_stamped("n1", epoch, claimed=node.claimed_ranges())
        assert m2.stats()["grants_held"] == 0
        assert sorted(r.grant.location.offset for r in m2.put_start([key(4), key(5)], [OBJ, OBJ])) == [OBJ, 3 * OBJ]
        m2.index.check_invariants()
    finally:
        client.close()
        node.close()


def test_a_node_that_does_not_share_its_arena_frees_an_expired_grant_at_once(tmp_path):
    clock = Clock()
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=OBJ, shm_dir=str(tmp_path)))
    try:
        master = Master(MasterConfig(grant_ttl_s=5.0), clock=clock)
        master.register(node.info(), node, expires=False)
        assert not node.info().writer_claims
        master.put_start([key(1)], [OBJ])
        clock.now += 5.1
        master.reap()
        assert master.stats()["grants_held"] == 0
        assert [r.status for r in master.put_start([key(2)], [OBJ])] == [PutStatus.STORED]
    finally:
        node.close()


def test_a_same_host_writer_that_finds_every_block_of_claims_held_writes_over_the_data_channel(tmp_path):
    """A real master and node (in this process) and same-host PoolClients. The first writer takes block 0 and gives
    it back as it closes. With all BLOCKS blocks of the node's arena then held by other mappings, a client's put goes
    over the node's data channel (where the node's own write fence applies) instead of copying into the arena
    unclaimed; it is stored and read back byte for byte."""
    from kvpool import PoolClient
    from kvpool.services import NodeProcess
    from kvpool.store.config import NodeServerConfig
    from kvpool.store.master_server import MasterServer, MasterServerConfig
    from kvpool.tiers.writer_claims import BLOCKS

    master = MasterServer(MasterServerConfig(listen="127.0.0.1:0")).start()
    process = NodeProcess(NodeServerConfig(node_id="n1", master=master.address, listen="127.0.0.1:0",
                                           dram_bytes=1 << 20, shm_dir=str(tmp_path))).start()
    others, held = [], []
    payload = bytes(range(256)) * 256
    try:
        server = process.server
        assert server.registered.wait(10)

        def holder():
            others.append(DramArena.attach(server.node.dram.path))
            return others[-1].writer_claims()

        with PoolClient(master.address, timeout=10) as writer:
            assert writer.put_many([key(6)], [payload]) == ["stored"]     # copied in: block 0 is its
            held = [holder() for _ in range(BLOCKS - 1)]
            assert [c.block for c in held] == list(range(1, BLOCKS)) and holder() is None
        held.append(holder())       # the writer closed: its block is free again
        assert held[-1].block == 0
        with PoolClient(master.address, timeout=10) as client:
            assert server.data_server.connections() == 0
            assert client.put_many([key(7)], [payload]) == ["stored"]
            assert server.data_server.connections() == 1        # the write went over the channel
            buf = bytearray(len(payload))
            assert client.get_many_into([key(7)], [buf]) == 1 and bytes(buf) == payload
    finally:
        for c in held:
            if c is not None:
                c.close()
        for o in others:
            o.close()
        process.stop()
        master.stop()
