"""Bad input to every RPC of a real master + node answers the exact gRPC status with a message naming the field, and
leaves the index as it was (Stats and List compared before/after). Plus: a reader racing a writer never sees
partial bytes."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor

import grpc
import pytest

from kvpool import PoolClient
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store.data_channel import DENIED, DataClient, Extent
from tests.store.cluster import Cluster, check_pattern, key_of, pattern

SIZE = 16 << 10
MAX_BATCH = 64
GRANT_TTL = 1.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(workdir=tmp_path_factory.mktemp("cluster"))
    yield c
    c.close()
    print(c.logs())


@pytest.fixture(scope="module")
def pool(cluster):
    """One master + node for the whole module: each test leaves the index as it found it (or uses its own keys)."""
    master = cluster.start_master(node_ttl_s=5.0, extra=["--max-batch-keys", str(MAX_BATCH), "--grant-ttl-s",
                                                         str(GRANT_TTL), "--heartbeat-s", "0.5"])
    node = cluster.start_node("n1")
    channel = grpc.insecure_channel(master.address)
    stub = pbg.MasterServiceStub(channel)
    stub._address = master.address
    node_channel = grpc.insecure_channel(node.address)
    with PoolClient(master.address, timeout=5) as client:
        assert client.put_many([key_of(i) for i in range(5)], [pattern(i, SIZE) for i in range(5)]) == ["stored"] * 5
        yield stub, pbg.NodeServiceStub(node_channel), client
    channel.close()
    node_channel.close()


def _snapshot(stub) -> tuple:
    stats = json.loads(stub.Stats(pb.StatsRequest(), timeout=5).json)
    listing = stub.List(pb.ListRequest(), timeout=5)
    keep = {k: stats[k] for k in ("objects", "tiers", "grants_open", "leases_open", "nodes")}
    return keep, [(o.key, o.node_id, o.tier, o.offset, o.size, o.checksum) for o in listing.objects]


def _wait_no_leases(stub) -> None:
    for _ in range(100):
        if json.loads(stub.Stats(pb.StatsRequest(), timeout=5).json)["leases_open"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError("a read lease was never released")


def _expect(call, code: grpc.StatusCode, fragment: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    assert fragment in info.value.details(), info.value.details()


K = key_of(100)
BAD = [
    ("PutStart", lambda: pb.PutStartRequest(keys=[K, b"short"], sizes=[SIZE, SIZE]), "INVALID_ARGUMENT",
     "keys[1] must be a 16-byte key, got 5"),
    ("PutStart", lambda: pb.PutStartRequest(keys=[K], sizes=[SIZE, SIZE]), "INVALID_ARGUMENT",
     "sizes has 2 entries, keys has 1"),
    ("PutStart", lambda: pb.PutStartRequest(keys=[K], sizes=[0]), "INVALID_ARGUMENT", "sizes[0] must be an int"),
    ("PutStart", lambda: pb.PutStartRequest(keys=[K], sizes=[SIZE], namespace=b"x" * 5), "INVALID_ARGUMENT",
     "namespace: must be a 16-byte namespace digest, got 5 bytes"),
    ("PutStart", lambda: pb.PutStartRequest(keys=[key_of(i) for i in range(MAX_BATCH + 1)],
                                            sizes=[SIZE] * (MAX_BATCH + 1)), "RESOURCE_EXHAUSTED",
     f"keys: batch of {MAX_BATCH + 1} exceeds max_batch_keys={MAX_BATCH}"),
    ("PutCommit", lambda: pb.PutCommitRequest(grant_ids=[1, 2], checksums=[1]), "INVALID_ARGUMENT",
     "checksums: has 1 entries, grant_ids has 2"),
    ("PutCommit", lambda: pb.PutCommitRequest(grant_ids=list(range(MAX_BATCH + 1)), checksums=[0] * (MAX_BATCH + 1)),
     "RESOURCE_EXHAUSTED", "grant_ids: batch of 65"),
    ("Lookup", lambda: pb.LookupRequest(keys=[key_of(0), b"k" * 17], lease=True), "INVALID_ARGUMENT",
     "keys[1] must be a 16-byte key, got 17"),
    ("Lookup", lambda: pb.LookupRequest(keys=[key_of(0)], lease=True, expect_sizes=[SIZE + 1]), "INVALID_ARGUMENT",
     f"expect_sizes[0] is {SIZE + 1} bytes, object has {SIZE}"),
    ("Lookup", lambda: pb.LookupRequest(keys=[key_of(i) for i in range(MAX_BATCH + 1)]), "RESOURCE_EXHAUSTED",
     "keys: batch of 65"),
    ("Contains", lambda: pb.ContainsRequest(keys=[b""]), "INVALID_ARGUMENT", "keys[0] must be a 16-byte key, got 0"),
    ("Remove", lambda: pb.RemoveRequest(keys=[key_of(0), key_of(1), b"x"]), "INVALID_ARGUMENT",
     "keys[2] must be a 16-byte key, got 1"),
    ("Remove", lambda: pb.RemoveRequest(keys=[key_of(i) for i in range(MAX_BATCH + 1)]), "RESOURCE_EXHAUSTED",
     "keys: batch of 65"),
    ("Inspect", lambda: pb.InspectRequest(keys=[b"x" * 3]), "INVALID_ARGUMENT", "keys[0] must be a 16-byte key"),
    ("List", lambda: pb.ListRequest(start_after=b"abc"), "INVALID_ARGUMENT", "start_after: must be a 16-byte key"),
    ("Evict", lambda: pb.EvictRequest(namespace=b"abc"), "INVALID_ARGUMENT", "namespace: must be a 16-byte"),
    ("ReportObjects", lambda: pb.ReportObjectsRequest(node_id="ghost", keys=[K], namespaces=[K], tiers=[1],
                                                      offsets=[0], sizes=[SIZE], checksums=[0]),
     "NOT_FOUND", "node_id 'ghost' is not registered"),
    ("ReportObjects", lambda: pb.ReportObjectsRequest(node_id="n1", keys=[K], namespaces=[K], tiers=[1],
                                                      offsets=[0, 1], sizes=[SIZE], checksums=[0]),
     "INVALID_ARGUMENT", "offsets: has 2 entries, keys has 1"),
    ("DrainNode", lambda: pb.DrainNodeRequest(node_id="ghost"), "NOT_FOUND", "node_id 'ghost' is not registered"),
    ("RegisterNode", lambda: pb.RegisterNodeRequest(node=pb.NodeEndpoint(node_id="")), "INVALID_ARGUMENT",
     "node.node_id: must be a non-empty string"),
]


@pytest.mark.parametrize("method,make,code,fragment", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_master_rpc_answers_exact_code_and_changes_nothing(pool, method, make, code, fragment):
    stub, _, _ = pool
    before = _snapshot(stub)
    _expect(lambda: getattr(stub, method)(make(), timeout=5), getattr(grpc.StatusCode, code), fragment)
    assert _snapshot(stub) == before


def _grant(stub, key):
    reply = stub.PutStart(pb.PutStartRequest(keys=[key], sizes=[SIZE]), timeout=5)
    assert list(reply.statuses) == [pb.STORED]
    return reply


def _write_chunks(reply, *, token=None, offset=None, size=None, expires=None, data=None):
    yield pb.WriteChunk(grant_id=reply.grant_ids[0], tier=reply.tiers[0],
                        offset=reply.offsets[0] if offset is None else offset,
                        size=reply.sizes[0] if size is None else size,
                        expires_unix_ms=reply.expires_unix_ms if expires is None else expires,
                        token=reply.tokens[0] if token is None else token,
                        data=b"Z" * SIZE if data is None else data)


def test_forged_stretched_and_expired_grants_are_permission_denied(pool):
    stub, node, client = pool
    reply = _grant(stub, K)
    victim = bytearray(SIZE)
    assert client.get_many_into([key_of(0)], [victim]) == 1
    _wait_no_leases(stub)  # the client releases its read lease asynchronously
    before = _snapshot(stub)
    forged = bytes(16)
    cases = [
        (dict(token=forged), "token: does not match the grant"),
        (dict(offset=0, data=b"Z" * SIZE), "token: does not match the grant"),  # aim at object 0's extent
        (dict(size=SIZE * 2, data=b"Z" * SIZE * 2), "token: does not match the grant"),
        (dict(expires=reply.expires_unix_ms + 60_000), "token: does not match the grant"),
        (dict(token=b"short"), "token: expected 16 bytes, got 5"),
    ]
    for kwargs, fragment in cases:
        _expect(lambda: node.Write(_write_chunks(reply, **kwargs), timeout=5), grpc.StatusCode.PERMISSION_DENIED,
                fragment)
    # The same refusals on the raw data channel, and a read with a write token.
    ep = reply.nodes[0]
    data = DataClient(ep.data_address, timeout=5)
    try:
        e = Extent(reply.grant_ids[0], reply.tiers[0], 0, SIZE, reply.expires_unix_ms, reply.tokens[0], K)
        assert data.write_many([e], [memoryview(b"Z" * SIZE)])[0].status == DENIED
        e = Extent(reply.grant_ids[0], reply.tiers[0], reply.offsets[0], SIZE, reply.expires_unix_ms,
                   reply.tokens[0], K)
        assert data.read_many_into([e], [memoryview(bytearray(SIZE))])[0].status == DENIED
        assert _snapshot(stub) == before
        after = bytearray(SIZE)
        assert client.get_many_into([key_of(0)], [after]) == 1 and after == victim == pattern(0, SIZE)
        # An expired grant: wait out the grant TTL (bounded), then the genuine token is refused.
        time.sleep(GRANT_TTL + 0.2)
        _expect(lambda: node.Write(_write_chunks(reply), timeout=5), grpc.StatusCode.PERMISSION_DENIED,
                "expires_unix_ms: grant expired")
        res = data.write_many([Extent(reply.grant_ids[0], reply.tiers[0], reply.offsets[0], SIZE,
                                      reply.expires_unix_ms, reply.tokens[0], K)], [memoryview(b"Z" * SIZE)])
        assert res[0].status == DENIED and res[0].message == "expires_unix_ms: grant expired"
        commit = stub.PutCommit(pb.PutCommitRequest(grant_ids=[reply.grant_ids[0]], checksums=[0]), timeout=5)
        assert list(commit.statuses) == [pb.EXPIRED]
        assert client.contains_many([K]) == [False]
    finally:
        data.close()


def test_a_writer_can_only_write_inside_its_grant(pool):
    stub, node, client = pool
    reply = _grant(stub, K)
    # The genuine grant with a short payload / an overlong payload is refused; the exact payload is accepted.
    _expect(lambda: node.Write(_write_chunks(reply, data=b"Z" * (SIZE - 1)), timeout=5),
            grpc.StatusCode.INVALID_ARGUMENT, f"data: {SIZE - 1} bytes sent for a grant of size {SIZE}")
    _expect(lambda: node.Write(_write_chunks(reply, data=b"Z" * (SIZE + 1)), timeout=5),
            grpc.StatusCode.INVALID_ARGUMENT, f"data: {SIZE + 1} bytes sent for a grant of size {SIZE}")
    assert node.Write(_write_chunks(reply, data=pattern(100, SIZE)), timeout=5).written == SIZE
    import xxhash

    commit = stub.PutCommit(pb.PutCommitRequest(grant_ids=[reply.grant_ids[0]],
                                                checksums=[xxhash.xxh3_64_intdigest(pattern(100, SIZE))]), timeout=5)
    assert list(commit.statuses) == [pb.COMMITTED]
    out = bytearray(SIZE)
    assert client.get_many_into([K], [out]) == 1 and out == pattern(100, SIZE)


def _writer(address: str, rounds: int, size: int) -> int:
    """Remove and re-put 8 keys with a new version each round (new extents, reused space)."""
    import struct

    from kvpool import PoolClient

    def obj(i, v):
        return struct.pack("<II", i, v) + bytes([(i * 7 + v * 13 + 1) % 256]) * (size - 8)

    with PoolClient(address, transport="tcp", timeout=5) as c:
        for v in range(1, rounds + 1):
            keys = [key_of(1000 + i) for i in range(8)]
            c.remove_many(keys)
            c.put_many(keys, [obj(1000 + i, v) for i in range(8)])
    return rounds


def test_reader_racing_a_writer_never_sees_partial_bytes(pool, cluster):
    stub, _, _ = pool
    size = 256 << 10
    address = cluster.master.address
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        writer = ex.submit(_writer, address, 60, size)
        seen = {"hit": 0, "miss": 0}
        deadline = time.monotonic() + 60
        with PoolClient(address, timeout=5) as reader, PoolClient(address, transport="tcp", timeout=5) as tcp:
            for round_ in range(2000):
                if writer.done() or time.monotonic() > deadline:
                    break
                for c in (reader, tcp):
                    keys = [key_of(1000 + i) for i in range(8)]
                    bufs = [bytearray(size) for _ in keys]
                    n = c.get_many_into(keys, bufs)
                    for i in range(n):
                        check_pattern(bufs[i], 1000 + i)  # whole and of this key, whatever the version
                    seen["hit"] += n
                    seen["miss"] += n < 8
        assert writer.result(120) == 60
    assert seen["hit"] > 0


def test_evict_by_namespace_removes_only_that_namespace(pool):
    from kvpool import Namespace

    stub, _, client = pool
    ns = Namespace(model="m", fingerprint="f", kv_dtype="float16", block_tokens=16, num_layers=2, num_kv_heads=1,
                   head_dim=8)
    keys = [key_of(i, salt=9) for i in range(3)]
    assert client.put_many(keys, [pattern(i, SIZE) for i in range(3)], namespace=ns) == ["stored"] * 3
    listed = stub.List(pb.ListRequest(namespace=ns.digest), timeout=5)
    assert [o.key for o in listed.objects] == keys and {o.namespace for o in listed.objects} == {ns.digest}
    assert stub.Evict(pb.EvictRequest(namespace=ns.digest), timeout=5).evicted == 3
    assert client.contains_many(keys + [key_of(0)]) == [False, False, False, True]


def test_bytes_changed_under_a_committed_object_are_a_miss_not_returned(pool):
    """What a writer past its grant (or a bad DIMM) does to a committed object: every checked read is a miss, counted
    by the reader and reported, and the master forgets the object (dram_corrupt) so the next put restores it."""
    from kvpool.store import wire
    from kvpool.tiers.dram import DramArena

    stub, _, _ = pool
    good, k = key_of(6, salt=5), key_of(7, salt=5)

    def corrupt_k():
        reply = stub.Lookup(pb.LookupRequest(keys=[k], lease=True), timeout=5)
        arena = DramArena.attach(wire.dram_path(reply.nodes[0]))
        try:
            arena.view(reply.offsets[0], 1)[0] ^= 0xFF
        finally:
            stub.Release(pb.ReleaseRequest(lease_ids=[reply.lease_id]), timeout=5)
            arena.close()

    def dram_corrupt():
        return json.loads(stub.Stats(pb.StatsRequest(), timeout=5).json)["dram_corrupt"]

    address = stub_address(stub)
    with PoolClient(address, timeout=5) as c, PoolClient(address, transport="tcp", timeout=5) as t, \
            PoolClient(address, timeout=5, verify="none") as unchecked:
        assert c.put_many([good, k], [pattern(6, SIZE), pattern(7, SIZE)]) == ["stored"] * 2
        corrupt_k()
        bufs = [bytearray(SIZE), bytearray(SIZE)]  # verify="none" gives the guarantee up: the bad bytes come back
        assert unchecked.get_many_into([good, k], bufs) == 2 and bufs[1] != pattern(7, SIZE)
        before = dram_corrupt()
        for n, client in enumerate((c, t), start=1):  # same-host copy, then the TCP data channel
            if n > 1:
                assert c.put_many([k], [pattern(7, SIZE)]) == ["stored"]
                corrupt_k()
            bufs = [bytearray(SIZE), bytearray(SIZE)]
            assert client.get_many_into([good, k], bufs) == 1
            assert bytes(bufs[0]) == pattern(6, SIZE)
            assert client.stats()["client_checksum_failures"] == 1
            for _ in range(100):  # the report rides on the release, which is not awaited
                if not c.contains_many([k])[0]:
                    break
                time.sleep(0.05)
            assert c.contains_many([k]) == [False] and dram_corrupt() == before + n
        with pytest.raises(ValueError, match="^verify must be 'remote', 'all' or 'none', got True$"):
            PoolClient(address, verify=True)
        c.remove_many([good, k])


def stub_address(stub) -> str:
    return stub._address  # set by the pool fixture


def test_bad_node_rpcs_answer_exact_codes_and_change_nothing(pool):
    stub, node, client = pool
    before = _snapshot(stub)
    lookup = stub.Lookup(pb.LookupRequest(keys=[key_of(0)], lease=True), timeout=5)
    try:
        read = pb.ReadRequest(lease_id=lookup.lease_id, tier=lookup.tiers[0], offset=lookup.offsets[0],
                              size=lookup.sizes[0], expires_unix_ms=lookup.expires_unix_ms, token=lookup.tokens[0])
        assert b"".join(c.data for c in node.Read(read, timeout=5)) == pattern(0, SIZE)  # the genuine lease reads
        for field, value, fragment in [("token", bytes(16), "token: does not match the grant"),
                                       ("offset", 0 if lookup.offsets[0] else 4096, "token: does not match"),
                                       ("size", SIZE * 2, "token: does not match")]:
            bad = pb.ReadRequest()
            bad.CopyFrom(read)
            setattr(bad, field, value)
            _expect(lambda: b"".join(c.data for c in node.Read(bad, timeout=5)),
                    grpc.StatusCode.PERMISSION_DENIED, fragment)
    finally:
        stub.Release(pb.ReleaseRequest(lease_ids=[lookup.lease_id]), timeout=5)
    _expect(lambda: node.Drop(pb.DropRequest(keys=[K], tiers=[2], offsets=[0, 1], sizes=[1]), timeout=5),
            grpc.StatusCode.INVALID_ARGUMENT, "offsets: has 2 entries, keys has 1")
    move = pb.MoveRequest(keys=[K], namespaces=[K], sizes=[1], checksums=[0], src_tiers=[7], src_offsets=[0],
                          dst_tiers=[2], dst_offsets=[0])
    for rpc in (node.Demote, node.Promote):
        _expect(lambda: rpc(move, timeout=5), grpc.StatusCode.INVALID_ARGUMENT, "src_tiers[0]: unknown tier 7")
    _wait_no_leases(stub)
    assert _snapshot(stub) == before
    out = bytearray(SIZE)
    assert client.get_many_into([key_of(0)], [out]) == 1 and out == pattern(0, SIZE)


@pytest.mark.parametrize("verify_threads, one_pass", [(1, False), (0, False), (1, True)])
def test_a_corrupt_object_in_a_big_same_host_read_is_a_miss_on_either_verify_path(pool, verify_threads, one_pass,
                                                                                    monkeypatch, request):
    """3 MiB in one get_many_into (PIPELINE_MIN lowered to 2 MiB: the node has 8): the helper-thread path
    (fence.copy_verified_many) with verify_threads=1, the calling thread alone with 0, both with the two-pass copy;
    and the one-pass copy (kvpool._copyhash, no helper). The object changed under its commit is a miss; its
    neighbours are exact."""
    from kvpool import copyhash, fence
    from kvpool.store import wire
    from kvpool.tiers.dram import DramArena

    if one_pass and copyhash.REASON:
        pytest.skip(f"the one-pass copy is not built: {copyhash.REASON}")
    previous = copyhash.use(one_pass)
    request.addfinalizer(lambda: copyhash.use(previous))
    monkeypatch.setattr(fence, "PIPELINE_MIN", 2 << 20)
    handed = []
    submit = fence._helper.submit
    monkeypatch.setattr(fence._helper, "submit", lambda pieces, done: (handed.append(len(pieces)),
                                                                       submit(pieces, done)))

    stub, _, _ = pool
    big = 1 << 20
    keys = [key_of(i, salt=9 + verify_threads + 2 * one_pass) for i in range(3)]
    # host_index_reads=False: the get asks the master, whether or not the node's index has the chain yet (a copy
    # from the index would be three more hand-offs, test_host_index_reads covers that path)
    with PoolClient(stub_address(stub), timeout=5, verify_threads=verify_threads, host_index_reads=False) as c:
        assert c.put_many(keys, [pattern(i, big) for i in range(3)]) == ["stored"] * 3
        reply = stub.Lookup(pb.LookupRequest(keys=[keys[1]], lease=True), timeout=5)
        arena = DramArena.attach(wire.dram_path(reply.nodes[0]))
        try:
            arena.view(reply.offsets[0] + big - 1, 1)[0] ^= 0xFF   # its last byte: the last chunk hashed
        finally:
            stub.Release(pb.ReleaseRequest(lease_ids=[reply.lease_id]), timeout=5)
            arena.close()
        bufs = [bytearray(big) for _ in keys]
        assert c.get_many_into(keys, bufs) == 1    # a prefix get: the hit stops at the corrupt object
        assert bytes(bufs[0]) == pattern(0, big)
        assert c.stats()["client_checksum_failures"] == 1
        for _ in range(100):  # the report rides on the release, which is not awaited
            if not c.contains_many([keys[1]])[0]:
                break
            time.sleep(0.05)
        assert c.contains_many(keys) == [True, False, True]
        c.remove_many(keys)
    # one hand-off per 1 MiB chunk copied: the optimistic copy of all three, then, from the object that failed its
    # check, the leased read of the last two (which tells a corrupt object from a reused extent and reports it)
    assert handed == ([1] * 5 if verify_threads and not one_pass else [])


def test_verify_threads_must_be_0_or_1(pool):
    stub, _, _ = pool
    for bad in (2, -1, True, 1.0, "1"):
        with pytest.raises(ValueError, match=r"^verify_threads must be 0 \(hash same-host reads on the calling "):
            PoolClient(stub_address(stub), verify_threads=bad)
