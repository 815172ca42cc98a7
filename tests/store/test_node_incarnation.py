"""A master's node call names the node process it was made for (RemoteNodeOps.bound, the `incarnation` field of
MoveRequest / DropRequest / PublishRequest): a node process restarted at the same address refuses every call made for
the process before it, FAILED_PRECONDITION, and changes nothing; the calls made for it (or naming no process, a
master from before) go through. Real gRPC NodeServices on 127.0.0.1, the second process on the first one's SSD file
and address."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import xxhash

from kvpool.launcher import free_port
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import wire
from kvpool.store.config import NodeConfig
from kvpool.store.node import Drop, Move, NodeUnavailable, Publication, StorageNode
from kvpool.store.remote_node import RemoteNodeOps
from kvpool.tiers.types import Tier

from tests.store.node_service import serve_node

SIZE = 4096
NS = b"n" * 16
KEEP, HOT = b"k" * 16, b"h" * 16    # a record on the SSD tier; an object in DRAM


def payload(seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(SIZE)


def read(node: StorageNode, tier: Tier, offset: int, key: bytes) -> bytes | None:
    out = bytearray(SIZE)
    return bytes(out) if node.read_into(tier, offset, key, SIZE, out) else None


@pytest.fixture
def restarted(tmp_path):
    """Process A writes KEEP's record at SSD offset 0 and stops; process B starts on the same SSD file and address
    (its scan finds the record) and holds HOT at DRAM offset 0."""
    config = NodeConfig(node_id="n1", dram_bytes=64 * SIZE, shm_dir=str(tmp_path), ssd_path=str(tmp_path / "ssd"),
                        ssd_bytes=64 * SIZE, share_dram=True)
    address = f"127.0.0.1:{free_port()}"
    a = StorageNode(config)
    server, _ = serve_node(a, address)
    kept = payload(1)
    a.write(Tier.SSD, 0, KEEP, NS, kept, None)
    old = a.incarnation
    server.stop(None)
    a.close()
    b = StorageNode(config)
    assert b.incarnation != old and [r.key for r in b.scan_ssd()] == [KEEP]
    hot = payload(2)
    b.write(Tier.DRAM, 0, HOT, NS, hot, None)
    server, _ = serve_node(b, address)
    ops = RemoteNodeOps(address, 10.0)
    try:
        yield b, ops, old, kept, hot
    finally:
        ops.close()
        server.stop(None)
        b.close()


def test_every_call_made_for_the_process_before_is_refused_and_changes_nothing(restarted):
    node, ops, old, kept, hot = restarted
    stale = ops.bound(old)
    stamp = node.removal_stamp()
    to_ssd = Move(HOT, NS, SIZE, xxhash.xxh3_64_intdigest(hot), Tier.DRAM, 0, Tier.SSD, 0)
    to_dram = Move(KEEP, NS, SIZE, xxhash.xxh3_64_intdigest(kept), Tier.SSD, 0, Tier.DRAM, 0)
    assert stale.drop([Drop(KEEP, Tier.SSD, 0, SIZE)]) == 0
    assert stale.demote([to_ssd], [Drop(KEEP, Tier.SSD, 0, SIZE)]) == [False]
    with pytest.raises(NodeUnavailable, match="FAILED_PRECONDITION"):
        stale.promote([to_dram])
    with pytest.raises(NodeUnavailable, match="FAILED_PRECONDITION"):
        stale.objects_removed()
    with pytest.raises(NodeUnavailable, match="FAILED_PRECONDITION"):
        stale.publish(Publication((HOT,), (0,), (SIZE,), (xxhash.xxh3_64_intdigest(hot),), (), (Tier.DRAM,)))
    # nothing erased, moved, published or bumped
    assert (read(node, Tier.SSD, 0, KEEP), read(node, Tier.DRAM, 0, HOT)) == (kept, hot)
    assert [r.key for r in node.scan_ssd()] == [KEEP]
    assert node.host_index.find([HOT]) == ([], [], [], []) and node.removal_stamp() == stamp


def test_the_refusal_names_both_processes(restarted):
    node, ops, old, _, _ = restarted
    request = wire.drops_to_msg([Drop(KEEP, Tier.SSD, 0, SIZE)])
    request.incarnation = old
    with grpc.insecure_channel(ops.address) as channel, pytest.raises(grpc.RpcError) as err:
        pbg.NodeServiceStub(channel).Drop(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.details() == (f"incarnation: the call was made for node process {old}, this is "
                                   f"{node.incarnation} (the node restarted): nothing done")


def test_the_calls_for_this_process_or_for_none_go_through(restarted):
    node, ops, old, kept, hot = restarted
    mine = ops.bound(node.incarnation)
    assert ops.bound(node.incarnation) is mine and ops.bound(old) is not mine     # a view per process, kept
    assert (mine.incarnation, ops.incarnation) == (node.incarnation, "")
    assert mine.publish(Publication((HOT,), (0,), (SIZE,), (xxhash.xxh3_64_intdigest(hot),), (), (Tier.DRAM,))) == 1
    assert node.host_index.find([HOT])[0] == [0]
    to_ssd = Move(HOT, NS, SIZE, xxhash.xxh3_64_intdigest(hot), Tier.DRAM, 0, Tier.SSD, 8 * SIZE)
    assert mine.demote([to_ssd]) == [True] and read(node, Tier.SSD, 8 * SIZE, HOT) == hot
    assert ops.drop([Drop(KEEP, Tier.SSD, 0, SIZE)]) == 1           # no process named: a master from before
    assert read(node, Tier.SSD, 0, KEEP) is None


def test_a_view_needs_a_str():
    ops = RemoteNodeOps(f"127.0.0.1:{free_port()}", 1.0)
    try:
        with pytest.raises(ValueError, match="incarnation must be a str, got 7"):
            ops.bound(7)
    finally:
        ops.close()


def test_a_master_s_calls_for_a_node_process_name_it(tmp_path):
    """A real MasterServer and two processes of node n1 in turn at one address and SSD file (NodeServers in this
    process): the ops the master holds for the first name it, so once the second has registered a call the master
    made for the first (a drop of its extent, in flight when it restarted) is refused there; the master's ops for
    the second go through."""
    from kvpool.store.config import NodeServerConfig
    from kvpool.store.master_server import MasterServer, MasterServerConfig
    from kvpool.store.node_server import NodeServer

    server = MasterServer(MasterServerConfig(listen="127.0.0.1:0")).start()
    listen = f"127.0.0.1:{free_port()}"
    config = NodeServerConfig(node_id="n1", master=server.address, listen=listen, dram_bytes=64 * SIZE,
                              ssd_path=str(tmp_path / "ssd"), ssd_bytes=64 * SIZE, shm_dir=str(tmp_path))
    first = NodeServer(config)
    try:
        first.start()
        assert first.registered.wait(30)
        kept = payload(3)
        first.node.write(Tier.SSD, 0, KEEP, NS, kept, None)
        for_first = server.master.placement.nodes["n1"].ops
        assert for_first.incarnation == first.incarnation
    finally:
        first.stop(0)
    second = NodeServer(config)
    try:
        second.start()
        assert second.registered.wait(30)
        assert second.incarnation != first.incarnation
        for_second = server.master.placement.nodes["n1"].ops
        assert for_second.incarnation == second.incarnation
        assert for_first.drop([Drop(KEEP, Tier.SSD, 0, SIZE)]) == 0
        assert read(second.node, Tier.SSD, 0, KEEP) == kept
        assert for_second.drop([Drop(KEEP, Tier.SSD, 0, SIZE)]) == 1
        assert read(second.node, Tier.SSD, 0, KEEP) is None
    finally:
        second.stop(0)
        server.stop(0)
