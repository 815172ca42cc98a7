"""A Demote call that carries its drops (MoveRequest.drops, NodeEndpoint.move_drops) over a real gRPC NodeService on
127.0.0.1: the node erases the dropped records before it makes the moves, so a move into the extent a dropped record
held leaves the moved record, not an erased one; drops that fail validation are refused by field name and nothing
is erased or moved."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import xxhash

from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import wire
from kvpool.store.config import NodeConfig
from kvpool.store.node import Drop, Move, StorageNode
from kvpool.store.remote_node import RemoteNodeOps
from kvpool.tiers.types import Tier

from tests.store.node_service import serve_node

SIZE = 4096
NS = b"n" * 16
OLD, NEW = b"o" * 16, b"w" * 16     # a record on the SSD tier, and an object in DRAM to demote into its extent


@pytest.fixture
def served(tmp_path):
    """A node with DRAM and SSD tiers behind its real NodeService; OLD's record at SSD offset 0, NEW at DRAM 0."""
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=64 * SIZE, shm_dir=str(tmp_path),
                                  ssd_path=str(tmp_path / "ssd"), ssd_bytes=64 * SIZE))
    server, address = serve_node(node)
    old, new = payload(1), payload(2)
    node.write(Tier.SSD, 0, OLD, NS, old, None)
    node.write(Tier.DRAM, 0, NEW, NS, new, None)
    ops = RemoteNodeOps(address, 10.0)
    try:
        yield node, ops, address, old, new
    finally:
        ops.close()
        server.stop(None)
        node.close()


def payload(seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(SIZE)


def read(node: StorageNode, tier: Tier, offset: int, key: bytes) -> bytes | None:
    out = bytearray(SIZE)
    return bytes(out) if node.read_into(tier, offset, key, SIZE, out) else None


def move_new_to_ssd0(new: bytes) -> Move:
    return Move(NEW, NS, SIZE, xxhash.xxh3_64_intdigest(new), Tier.DRAM, 0, Tier.SSD, 0)


def test_a_node_says_it_takes_drops_in_a_demote():
    assert StorageNode(NodeConfig(node_id="n1", dram_bytes=SIZE)).info().move_drops is True


def test_the_drops_are_erased_before_the_moves(served):
    node, ops, _, old, new = served
    assert read(node, Tier.SSD, 0, OLD) == old
    assert ops.demote([move_new_to_ssd0(new)], [Drop(OLD, Tier.SSD, 0, SIZE)]) == [True]
    # erased first, then written: the extent holds the moved record (erasing after the move would have lost it)
    assert read(node, Tier.SSD, 0, NEW) == new
    assert read(node, Tier.SSD, 0, OLD) is None


def test_a_drop_elsewhere_is_erased_and_the_move_made(served):
    node, ops, _, old, new = served
    node.write(Tier.SSD, 8 * SIZE, b"x" * 16, NS, old, None)
    move = Move(NEW, NS, SIZE, xxhash.xxh3_64_intdigest(new), Tier.DRAM, 0, Tier.SSD, 16 * SIZE)
    assert ops.demote([move], [Drop(b"x" * 16, Tier.SSD, 8 * SIZE, SIZE)]) == [True]
    assert read(node, Tier.SSD, 8 * SIZE, b"x" * 16) is None
    assert (read(node, Tier.SSD, 16 * SIZE, NEW), read(node, Tier.SSD, 0, OLD)) == (new, old)


@pytest.mark.parametrize("drops, message", [
    (pb.DropRequest(keys=[b"short"], tiers=[pb.SSD], offsets=[0], sizes=[SIZE]),
     "drops.keys[0] must be 16 bytes, got 5"),
    (pb.DropRequest(keys=[OLD], tiers=[pb.SSD], offsets=[1 << 40], sizes=[SIZE]),
     f"drops.offsets[0] + record size ({1 << 40} + 8192) exceeds the ssd capacity {64 * SIZE}"),
    (pb.DropRequest(keys=[OLD], tiers=[pb.SSD], offsets=[0], sizes=[SIZE, SIZE]),
     "drops.sizes: has 2 entries, keys has 1"),
    (pb.DropRequest(objects_removed=True), "drops.objects_removed: only a Drop call says objects were removed"),
])
def test_bad_drops_are_refused_by_field_and_nothing_changes(served, drops, message):
    node, _, address, old, new = served
    request = wire.moves_to_msg([move_new_to_ssd0(new)])
    request.drops.CopyFrom(drops)
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as err:
        pbg.NodeServiceStub(channel).Demote(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == message
    assert (read(node, Tier.SSD, 0, OLD), read(node, Tier.DRAM, 0, NEW)) == (old, new)   # nothing erased or moved
    assert read(node, Tier.SSD, 0, NEW) is None
