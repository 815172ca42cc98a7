"""A `remove` tells a node which keys went (DropRequest.removed_keys, NodeEndpoint.removes_keys), over a real gRPC
NodeService on 127.0.0.1 with the master's host-index feed publishing to it: the node's host index forgets those rows
only and the master publishes nothing again, where before it cleared the index and the master published every object
the node still held (O(objects in the pool) per removal). A node that does not say `removes_keys` still clears and
gets everything published again; a tenant's removal forgets no row; bad removal fields are refused by name and change
nothing."""

from __future__ import annotations

import dataclasses

import grpc
import numpy as np
import pytest
import xxhash

from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import queries
from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.master import Master
from kvpool.store.node import StorageNode
from kvpool.store.records import PutStatus
from kvpool.store.remote_node import RemoteNodeOps

from tests.store.fakes import Clock
from tests.store.node_service import serve_node

OBJ = 4096
N = 40


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


@pytest.fixture
def served(tmp_path):
    """A node with a shared DRAM arena (and so a host index) behind its real NodeService, and its RemoteNodeOps."""
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=2 * N * OBJ, shm_dir=str(tmp_path), share_dram=True))
    server, address = serve_node(node)
    ops = RemoteNodeOps(address, 10.0)
    try:
        yield node, ops, address
    finally:
        ops.close()
        server.stop(None)
        node.close()


def pool(node: StorageNode, ops: RemoteNodeOps, *, removes_keys: bool = True, tenant: str = "") -> Master:
    """A master with the node registered (as a node from before `removes_keys` when False) and N objects put and
    published to its host index (`tenant`'s, which are never published, for the last N // 2)."""
    master = Master(MasterConfig(grant_ttl_s=10, lease_ttl_s=10, node_ttl_s=100), clock=Clock(),
                    token_secret=b"s" * 32)
    master.register_node(dataclasses.replace(node.info(), removes_keys=removes_keys), ops, expires=False)
    batches = [("", [key(i) for i in range(N)])]
    if tenant:
        batches.append((tenant, [key(i) for i in range(N, N + N // 2)]))
    for owner, keys in batches:
        results = master.put_start(keys, [OBJ] * len(keys), tenant=owner)
        sums = []
        for i, r in enumerate(results):
            assert r.status == PutStatus.STORED
            data = np.full(OBJ, i % 251, np.uint8)
            loc = r.grant.location
            node.write(loc.tier, loc.offset, r.grant.key, b"\0" * 16, data, None)
            sums.append(xxhash.xxh3_64_intdigest(data))
        assert master.put_commit([r.grant.grant_id for r in results], sums, tenant=owner) == [True] * len(keys)
    assert master.host_feed.flush(10)
    assert len(node.host_index) == N
    return master


def rows(node: StorageNode) -> list[int]:
    """The unscoped keys' indices whose rows the node's host index holds."""
    return [i for i in range(N) if node.host_index.find([key(i)])[0]]


def test_a_remove_makes_the_node_forget_those_rows_only_and_publishes_nothing_again(served):
    node, ops, _ = served
    master = pool(node, ops)
    published, generation = master.host_feed.published, node.shared_arena.generation
    assert master.remove([key(3), key(7)]) == 2
    assert master.host_feed.flush(10)
    assert rows(node) == [i for i in range(N) if i not in (3, 7)]
    assert node.shared_arena.generation == generation + 1       # location caches still learn of the removal
    assert master.host_feed.published == published              # before: N - 2 rows published again


def test_a_node_that_does_not_say_removes_keys_clears_its_index_and_gets_the_rest_published_again(served):
    node, ops, _ = served
    master = pool(node, ops, removes_keys=False)
    published, generation = master.host_feed.published, node.shared_arena.generation
    assert master.remove([key(3), key(7)]) == 2
    assert master.host_feed.flush(10)
    assert rows(node) == [i for i in range(N) if i not in (3, 7)]
    assert node.shared_arena.generation == generation + 1
    assert master.host_feed.published == published + N - 2


def test_a_tenants_removal_forgets_no_row_and_still_moves_the_generation(served):
    node, ops, _ = served
    master = pool(node, ops, tenant="acme")
    published, generation = master.host_feed.published, node.shared_arena.generation
    assert master.remove([key(N), key(N + 1)], tenant="acme") == 2
    assert master.host_feed.flush(10)
    assert rows(node) == list(range(N))
    assert node.shared_arena.generation == generation + 1
    assert master.host_feed.published == published


@pytest.mark.parametrize("chunk", [1024, 8])
def test_an_admin_evict_makes_the_node_forget_the_evicted_rows_only(served, monkeypatch, chunk):
    """`kvpool evict` tells the nodes after each chunk of its objects (queries.REMOVAL_CHUNK), with that chunk's keys:
    the rows of the objects leased meanwhile (never evicted) stay, and nothing is published again (before the evict
    was chunked, the node cleared its index and the master published the 5 again)."""
    monkeypatch.setattr(queries, "REMOVAL_CHUNK", chunk)
    node, ops, _ = served
    master = pool(node, ops)
    lease = master.lookup([key(i) for i in range(5)]).lease_id
    published, generation = master.host_feed.published, node.shared_arena.generation
    assert master.evict(older_than_s=0) == N - 5
    assert master.host_feed.flush(10)
    assert rows(node) == list(range(5))
    assert master.host_feed.published == published
    assert node.shared_arena.generation == generation + -(-(N - 5) // chunk)    # one bump a chunk: 1, or 5
    master.release([lease])


@pytest.mark.parametrize("chunk", [1024, 8])
def test_an_admin_evict_on_a_node_that_does_not_say_removes_keys_clears_and_publishes_again_what_stays(
        served, monkeypatch, chunk):
    """Such a node clears its whole index when told, so it is told once, after the last chunk: what stays is
    published again once (told after each of 5 chunks, it would be published 5 times)."""
    monkeypatch.setattr(queries, "REMOVAL_CHUNK", chunk)
    node, ops, _ = served
    master = pool(node, ops, removes_keys=False)
    lease = master.lookup([key(i) for i in range(5)]).lease_id
    published, generation = master.host_feed.published, node.shared_arena.generation
    assert master.evict(older_than_s=0) == N - 5
    assert master.host_feed.flush(10)
    assert rows(node) == list(range(5))
    assert master.host_feed.published == published + 5
    assert node.shared_arena.generation == generation + 1
    master.release([lease])


@pytest.mark.parametrize("request_, code, message", [
    (pb.DropRequest(objects_removed=True, removed_keys=[key(1)]), grpc.StatusCode.INVALID_ARGUMENT,
     "removed_keys: only with removed_keys_only"),
    (pb.DropRequest(removed_keys_only=True, removed_keys=[key(1)]), grpc.StatusCode.INVALID_ARGUMENT,
     "removed_keys_only: only with objects_removed"),
    (pb.DropRequest(objects_removed=True, removed_keys_only=True, removed_keys=[key(1), b"short"]),
     grpc.StatusCode.INVALID_ARGUMENT, "removed_keys[1] must be 16 bytes, got 5"),
])
def test_bad_removal_fields_are_refused_by_name_and_change_nothing(served, request_, code, message):
    node, ops, address = served
    pool(node, ops)
    generation = node.shared_arena.generation
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            pbg.NodeServiceStub(channel).Drop(request_, timeout=10)
    assert (err.value.code(), err.value.details()) == (code, message)
    assert rows(node) == list(range(N))
    assert node.shared_arena.generation == generation


def test_a_removal_tells_every_node_at_once(tmp_path):
    """Three nodes, each of which answers only once all three are being told (a barrier): the removal waits one
    round trip, not one per node. Told one after another, the first would wait out the barrier (BrokenBarrierError,
    logged) and none would get through."""
    import threading

    from tests.store.test_node_calls import Pool, chain_key

    a = Pool(tmp_path, "a", [("n1", 8, 0), ("n2", 8, 0), ("n3", 8, 0)], batched=True)
    try:
        assert a.put([chain_key(1, i) for i in range(3)]) == [PutStatus.STORED] * 3
        barrier = threading.Barrier(3, timeout=10)
        passed: list[str] = []

        def told(name):
            def hook(keys):
                barrier.wait()
                passed.append(name)
            return hook

        for name, ops in a.ops.items():
            ops.on_removed = told(name)
        assert a.master.remove([chain_key(1, 0)]) == 1
        assert sorted(passed) == ["n1", "n2", "n3"]      # all three were told, and before remove returned
        assert a.master.inspect([chain_key(1, i) for i in range(3)])[0] is None
    finally:
        a.close()
