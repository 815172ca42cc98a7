"""Malformed input to every RPC and to the data channel (issue 11 items 6, 7, 8), sent with the generated stubs (and
raw sockets for the data channel) to a real master + node: each answers its exact status code with a message naming
the field, and changes nothing (Stats, List and every object's bytes compared before and after).
"""

from __future__ import annotations

import json
import socket
import time

import grpc
import pytest

from kvpool import PoolClient
from kvpool.proto import kvpool_pb2 as pb
from kvpool.store.control_channel import CHANNEL_METHODS, ControlClient
from kvpool.store.data_channel import MAGIC, OP_WRITE, REP, REQ
from tests.faults.harness import Cluster, Figures, master_stub, node_stub, payload_of, stats, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SIZE = 64 << 10
BIG = 2 << 20           # larger than the node's DRAM: placed on its SSD
MAX_BATCH = 64
IDLE_S = 2.0            # the node's data-channel idle timeout in this test
DRAM = 1 << 20
SSD = 8 << 20
K = (0xBAD << 100).to_bytes(16, "big")
KEYS = [(0xBAD << 100 | i + 1).to_bytes(16, "big") for i in range(20)]  # 16 in DRAM + 4 demoted to SSD
INVALID, NOT_FOUND, EXHAUSTED, DENIED = ("INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED",
                                         "PERMISSION_DENIED")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("malformed")
    cluster = Cluster(workdir=workdir)
    try:
        # exclusive tiers (no write-behind copies): exactly 4 objects on SSD, the rest in DRAM
        master = cluster.start_master(node_ttl_s=30.0, extra=["--max-batch-keys", str(MAX_BATCH),
                                                              "--heartbeat-s", "0.5", "--promote-on-hit", "false",
                                                              "--write-behind", "false"])
        node = cluster.start_node("n1", dram="1MiB", ssd="8MiB", extra=["--data-idle-timeout-s", str(IDLE_S)])
        with PoolClient(master.address, timeout=5) as client:
            assert client.put_many(KEYS, [payload_of(k, SIZE) for k in KEYS]) == ["stored"] * len(KEYS)
        assert stats(master.address)["tiers"]["ssd"]["objects"] == 4
        yield cluster, master.address, node.address
    finally:
        cluster.close()
        print(cluster.logs())


def _endpoint(address: str) -> pb.NodeEndpoint:
    """n1's endpoint as the master knows it, with another incarnation: what a restarted n1 would send."""
    ep = stats(address)["endpoints"]["n1"]
    return pb.NodeEndpoint(node_id="n1", host_id=ep["host_id"], data_address=ep["data_address"],
                           control_address=ep["control_address"], alignment=4096, incarnation="forged",
                           tiers=[pb.TierCapacity(tier=pb.DRAM, capacity_bytes=DRAM),
                                  pb.TierCapacity(tier=pb.SSD, capacity_bytes=SSD)])


def _register(address, **changes):
    ep = _endpoint(address)
    tiers = changes.pop("tiers", None)
    for name, value in changes.items():
        setattr(ep, name, value)
    if tiers is not None:
        del ep.tiers[:]
        ep.tiers.extend(tiers)
    return pb.RegisterNodeRequest(node=ep)


def _report(**changes):
    fields = dict(node_id="n1", keys=[K], namespaces=[bytes(16)], tiers=[pb.SSD], offsets=[6 << 20], sizes=[SIZE],
                  checksums=[1])
    fields.update(changes)
    return pb.ReportObjectsRequest(**fields)


# (method, request factory taking the master address, code, fragment of the message)
MASTER_CASES = [
    # item 6: a rejected RegisterNode of the existing n1 must leave n1 and its objects alone
    ("RegisterNode", lambda a: _register(a, alignment=3), INVALID, "alignment must be a power of two"),
    ("RegisterNode", lambda a: _register(a, tiers=[pb.TierCapacity(tier=7, capacity_bytes=DRAM)]), INVALID,
     "node.tiers[0].tier: unknown tier 7"),
    ("RegisterNode", lambda a: _register(a, tiers=[pb.TierCapacity(tier=pb.DRAM, capacity_bytes=DRAM),
                                                  pb.TierCapacity(tier=pb.DRAM, capacity_bytes=DRAM)]), INVALID,
     "node.tiers[1].tier: dram listed twice"),
    ("RegisterNode", lambda a: _register(a, tiers=[pb.TierCapacity(tier=pb.DRAM, capacity_bytes=2**64 - 1)]),
     INVALID, "dram_bytes: 18446744073709551615"),
    ("RegisterNode", lambda a: _register(a, ssd_record_overhead=2**40), INVALID, "ssd_record_overhead"),
    ("RegisterNode", lambda a: _register(a, node_id="x" * 300), INVALID, "node_id must be at most 128 characters"),
    ("RegisterNode", lambda a: _register(a, control_address=""), INVALID, "node.control_address/data_address"),
    ("RegisterNode", lambda a: pb.RegisterNodeRequest(node=_register(a).node, claimed_starts=[0]), INVALID,
     "claimed_ends: 0 entries for 1 claimed_starts"),
    ("Heartbeat", lambda a: pb.HeartbeatRequest(node_id="n1", epoch=1, claimed_starts=[0, 4096], claimed_ends=[4096]),
     INVALID, "claimed_ends: 1 entries for 2 claimed_starts"),
    ("ReportObjects", lambda a: _report(sizes=[0]), INVALID, "sizes[0] must be an int >= 1, got 0"),
    ("ReportObjects", lambda a: _report(offsets=[6 << 20 | 100]), INVALID,
     "offsets[0] must be a multiple of the node's alignment 4096"),
    ("ReportObjects", lambda a: _report(offsets=[SSD]), INVALID, "offsets[0] + record size"),
    ("ReportObjects", lambda a: _report(tiers=[pb.HBM]), INVALID, "tiers[0]: node n1 has no hbm tier"),
    ("ReportObjects", lambda a: _report(keys=[b"abc"]), INVALID, "keys[0] must be a 16-byte key, got 3"),
    ("ReportObjects", lambda a: _report(namespaces=[b"abc"]), INVALID, "namespaces[0] must be a 16-byte"),
    ("ReportObjects", lambda a: _report(tiers=[9]), INVALID, "tiers[0]: unknown tier 9"),
    ("ReportObjects", lambda a: _report(node_id="ghost"), NOT_FOUND, "node_id 'ghost' is not registered"),
    ("DrainNode", lambda a: pb.DrainNodeRequest(node_id="ghost"), NOT_FOUND, "node_id 'ghost' is not registered"),
    ("FlushNode", lambda a: pb.FlushNodeRequest(node_id="ghost"), NOT_FOUND, "node_id 'ghost' is not registered"),
    ("FlushNode", lambda a: pb.FlushNodeRequest(), INVALID, "node_id: must be a non-empty string"),
    ("PutStart", lambda a: pb.PutStartRequest(keys=[K], sizes=[2**62]), INVALID, "sizes[0] must be an int in [1,"),
    ("PutStart", lambda a: pb.PutStartRequest(keys=[K], sizes=[SIZE], namespace=bytes(16),
                                              namespace_label="x" * 1000), INVALID,
     "namespace_label: at most 128 characters"),
    ("PutStart", lambda a: pb.PutStartRequest(keys=[b"abc"], sizes=[SIZE]), INVALID, "keys[0] must be a 16-byte"),
    ("PutCommit", lambda a: pb.PutCommitRequest(grant_ids=[1], checksums=[]), INVALID,
     "checksums: has 0 entries, grant_ids has 1"),
    ("PutAbort", lambda a: pb.PutAbortRequest(grant_ids=list(range(MAX_BATCH + 1))), EXHAUSTED,
     "grant_ids: batch of 65"),
    ("Lookup", lambda a: pb.LookupRequest(keys=[KEYS[0]], lease=True, expect_sizes=[1, 2]), INVALID,
     "expect_sizes has 2 entries, keys has 1"),
    ("Lookup", lambda a: pb.LookupRequest(keys=[KEYS[0]], namespace=b"abc"), INVALID, "namespace: must be a 16-byte"),
    ("Release", lambda a: pb.ReleaseRequest(lease_ids=[1, 2], corrupt_keys=[KEYS[0]]), INVALID,
     "lease_ids: corrupt_keys name the keys of exactly one lease, got 2"),
    ("Release", lambda a: pb.ReleaseRequest(lease_ids=[1], corrupt_keys=[b"abc"]), INVALID,
     "corrupt_keys[0] must be a 16-byte key, got 3"),
    ("Contains", lambda a: pb.ContainsRequest(keys=[b""]), INVALID, "keys[0] must be a 16-byte key, got 0"),
    ("Remove", lambda a: pb.RemoveRequest(keys=[KEYS[0], b"x"]), INVALID, "keys[1] must be a 16-byte key, got 1"),
    ("List", lambda a: pb.ListRequest(namespace=b"abc"), INVALID, "namespace: must be a 16-byte"),
    ("List", lambda a: pb.ListRequest(node_id="ghost"), NOT_FOUND, "node_id 'ghost' is not registered"),
    ("Inspect", lambda a: pb.InspectRequest(keys=[b"x" * 17]), INVALID, "keys[0] must be a 16-byte key, got 17"),
    # item 8: an empty EvictRequest is not "everything"; item 7: an idle age past the atime column's range
    ("Evict", lambda a: pb.EvictRequest(), INVALID, "namespace, idle_seconds or all: give at least one"),
    ("Evict", lambda a: pb.EvictRequest(idle_seconds=1e308), INVALID, "idle_seconds: at most"),
    ("Evict", lambda a: pb.EvictRequest(idle_seconds=float("nan")), INVALID, "idle_seconds: must be >= 0"),
    ("Evict", lambda a: pb.EvictRequest(all=True, namespace=bytes(16)), INVALID, "all: evicts everything"),
    ("BeginDrain", lambda a: pb.BeginDrainRequest(node_id="ghost"), NOT_FOUND, "node_id 'ghost' is not registered"),
    ("BeginDrain", lambda a: pb.BeginDrainRequest(), INVALID, "node_id: must be a non-empty string"),
    ("MigrateStart", lambda a: pb.MigrateStartRequest(keys=[b"abc"]), INVALID, "keys[0] must be a 16-byte"),
    ("MigrateStart", lambda a: pb.MigrateStartRequest(node_id="n1"), INVALID, "is not draining"),
    ("MigrateCommit", lambda a: pb.MigrateCommitRequest(move_ids=[1, 2], checksums=[1]), INVALID,
     "checksums: has 1 entries, move_ids has 2"),
    ("MigrateAbort", lambda a: pb.MigrateAbortRequest(move_ids=list(range(MAX_BATCH + 1))), EXHAUSTED,
     "move_ids: batch of 65"),
    ("StartRecording", lambda a: pb.StartRecordingRequest(directory="/proc/kvpool-rec", duration_s=-1), INVALID,
     "duration_s must be a number of seconds >= 0"),
    ("StartRecording", lambda a: pb.StartRecordingRequest(directory="/proc/kvpool-rec", max_file_bytes=0), INVALID,
     "max_file_bytes must be an int >= 1"),
    ("StartRecording", lambda a: pb.StartRecordingRequest(), INVALID, "directory must be a non-empty path"),
    ("StartRecording", lambda a: pb.StartRecordingRequest(directory="/proc/kvpool-rec"), INVALID,
     "directory '/proc/kvpool-rec' is not writable by the master"),
]
# RPCs whose every input is well-formed to protobuf and that answer OK without changing anything: an unknown node's
# heartbeat is told to register; Stats and StopRecording take no argument. All get the garbage-bytes case below.
HARMLESS = {"Heartbeat": lambda a: pb.HeartbeatRequest(node_id="ghost", epoch=7), "Stats": lambda a: pb.StatsRequest(),
            "StopRecording": lambda a: pb.StopRecordingRequest(),     # nothing is recording: the empty status
            "Hello": lambda a: pb.HelloRequest()}


def _move(**changes):
    fields = dict(keys=[K], namespaces=[bytes(16)], sizes=[SIZE], checksums=[0], src_tiers=[pb.DRAM],
                  src_offsets=[0], dst_tiers=[pb.SSD], dst_offsets=[6 << 20])
    fields.update(changes)
    return pb.MoveRequest(**fields)


def _drop(**changes):
    fields = dict(keys=[K], tiers=[pb.SSD], offsets=[6 << 20], sizes=[SIZE])
    fields.update(changes)
    return pb.DropRequest(**fields)


def _publish(**changes):
    fields = dict(keys=[K], offsets=[0], sizes=[SIZE], checksums=[1])
    fields.update(changes)
    return pb.PublishRequest(**fields)


# item 7: every one of these answered UNKNOWN (an unhandled exception in the node) before
NODE_CASES = [
    ("Demote", lambda: _move(src_offsets=[DRAM]), "src_offsets[0] + sizes[0] (1048576 + 65536) exceeds"),
    ("Demote", lambda: _move(dst_offsets=[6 << 20 | 100]), "dst_offsets[0] must be a multiple of 4096"),
    ("Demote", lambda: _move(dst_offsets=[SSD]), "dst_offsets[0] + record size"),
    ("Demote", lambda: _move(keys=[b"abc"]), "keys[0] must be 16 bytes, got 3"),
    ("Demote", lambda: _move(namespaces=[b"abc"]), "namespaces[0] must be 16 bytes, got 3"),
    ("Demote", lambda: _move(sizes=[2**62]), "sizes[0] must be in [1,"),
    ("Demote", lambda: _move(sizes=[0]), "sizes[0] must be in [1,"),
    ("Demote", lambda: _move(src_tiers=[pb.HBM]), "src_tiers[0]: node n1 has no hbm tier"),
    ("Demote", lambda: _move(src_tiers=[pb.SSD], dst_tiers=[pb.SSD]), "dst_tiers[0]: a move needs two tiers"),
    ("Promote", lambda: _move(src_tiers=[pb.SSD], src_offsets=[100], dst_tiers=[pb.DRAM], dst_offsets=[0]),
     "src_offsets[0] must be a multiple of 4096"),
    ("Promote", lambda: _move(src_tiers=[pb.SSD], src_offsets=[0], dst_tiers=[pb.DRAM], dst_offsets=[2**62]),
     "dst_offsets[0] + sizes[0]"),
    ("Promote", lambda: _move(src_tiers=[pb.SSD], src_offsets=[0], dst_tiers=[pb.DRAM], dst_offsets=[0],
                              sizes=[2**62]), "sizes[0] must be in [1,"),
    ("Drop", lambda: _drop(offsets=[100]), "offsets[0] must be a multiple of 4096"),
    ("Drop", lambda: _drop(offsets=[SSD + 4096]), "offsets[0] + record size"),
    ("Drop", lambda: _drop(keys=[b"abc"]), "keys[0] must be 16 bytes, got 3"),
    ("Drop", lambda: _drop(tiers=[pb.HBM]), "tiers[0]: node n1 has no hbm tier"),
    ("Publish", lambda: _publish(offsets=[DRAM]), "offsets[0] + sizes[0] (1048576 + 65536) exceeds"),
    ("Publish", lambda: _publish(keys=[b"abc"]), "keys[0] must be 16 bytes, got 3"),
    ("Publish", lambda: _publish(sizes=[0]), "sizes[0] must be >= 1, got 0"),
    ("Publish", lambda: _publish(offsets=[]), "offsets: has 0 entries, keys has 1"),
    ("Publish", lambda: _publish(gone=[b"abc"]), "gone[0] must be 16 bytes, got 3"),
]


def _snapshot(address: str) -> tuple:
    s = stats(address)
    keep = {k: s[k] for k in ("objects", "tiers", "grants_open", "leases_open", "nodes", "evictions", "ssd_corrupt",
                              "dram_corrupt", "namespaces")}
    keep["endpoints"] = {n: {k: v for k, v in e.items()} for n, e in s["endpoints"].items()}
    listing = master_stub(address).List(pb.ListRequest(), timeout=5)
    return keep, [(o.key, o.node_id, o.tier, o.offset, o.size, o.checksum) for o in listing.objects]


def _wait_quiet(address: str) -> None:
    wait_until(lambda: stats(address)["leases_open"] == 0, 10, "read leases to be released")


def _all_readable(address: str) -> int:
    """Objects of KEYS read back byte-exact, same host and TCP (each key alone: a miss hides nothing)."""
    good = 0
    for transport in ("auto", "tcp"):
        with PoolClient(address, timeout=5, transport=transport) as client:
            for k in KEYS:
                buf = bytearray(SIZE)
                good += client.get_many_into([k], [buf]) == 1 and bytes(buf) == payload_of(k, SIZE)
    _wait_quiet(address)
    return good


def _expect(call, code: str, fragment: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == getattr(grpc.StatusCode, code), info.value.details()
    assert fragment in (info.value.details() or ""), info.value.details()


def test_the_cases_cover_every_rpc():
    services = pb.DESCRIPTOR.services_by_name
    master = {m.name for m in services["MasterService"].methods}
    node = {m.name for m in services["NodeService"].methods}
    assert {c[0] for c in MASTER_CASES} | set(HARMLESS) == master
    assert {c[0] for c in NODE_CASES} | {"Write", "Read"} == node  # Write/Read: test_write_and_read_with_bad_fields


@pytest.mark.parametrize("method,make,code,fragment", MASTER_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(MASTER_CASES)])
def test_malformed_master_rpc_answers_its_code_and_changes_nothing(pool, method, make, code, fragment):
    _, address, _ = pool
    before = _snapshot(address)
    _expect(lambda: getattr(master_stub(address), method)(make(address), timeout=5), code, fragment)
    assert _snapshot(address) == before


CHANNEL_CASES = [c for c in MASTER_CASES if c[0] in CHANNEL_METHODS]


def _control(address: str) -> ControlClient:
    hello = master_stub(address).Hello(pb.HelloRequest(), timeout=5)
    return ControlClient("127.0.0.1", hello.control_port, hello.instance)


@pytest.mark.parametrize("method,make,code,fragment", CHANNEL_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CHANNEL_CASES)])
def test_malformed_control_channel_call_answers_the_same_code_and_changes_nothing(pool, method, make, code, fragment):
    """The hot calls over the master's control channel (store/control_channel.py) run the same handlers: the same
    status code and message for every malformed request, and nothing changes."""
    _, address, _ = pool
    before = _snapshot(address)
    ctl = _control(address)
    try:
        got, body = ctl.call(method, make(address).SerializeToString(), "", 5.0)
    finally:
        ctl.close()
    assert got == getattr(grpc.StatusCode, code).value[0], body
    assert fragment in body.decode(), body
    assert _snapshot(address) == before


def test_garbage_bytes_to_every_control_channel_method_are_refused_and_change_nothing(pool):
    _, address, _ = pool
    before = _snapshot(address)
    ctl = _control(address)
    try:
        for method in CHANNEL_METHODS:
            got, body = ctl.call(method, b"\xff\xff\xff\xff\x0f", "", 5.0)  # no message parses from it
            assert (got, body.decode()) == (grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                            f"request: not a {method}Request message")
    finally:
        ctl.close()
    assert _snapshot(address) == before


@pytest.mark.parametrize("method,make,fragment", NODE_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(NODE_CASES)])
def test_malformed_node_rpc_answers_invalid_argument_and_changes_nothing(pool, method, make, fragment):
    _, address, node_address = pool
    before = _snapshot(address)
    _expect(lambda: getattr(node_stub(node_address), method)(make(), timeout=5), INVALID, fragment)
    assert _snapshot(address) == before


def test_garbage_bytes_to_every_rpc_are_refused_and_change_nothing(pool):
    _, address, node_address = pool
    before = _snapshot(address)
    for service, target in (("MasterService", address), ("NodeService", node_address)):
        with grpc.insecure_channel(target) as channel:
            for m in pb.DESCRIPTOR.services_by_name[service].methods:
                path = f"/kvpool.v1.{service}/{m.name}"
                call = (channel.stream_unary(path) if m.client_streaming else
                        channel.unary_stream(path) if m.server_streaming else channel.unary_unary(path))
                junk = b"\xff\xff\xff\xff\x0f"  # an unterminated varint: no message parses from it
                with pytest.raises(grpc.RpcError) as info:
                    result = call(iter([junk]), timeout=5) if m.client_streaming else call(junk, timeout=5)
                    if m.server_streaming:
                        list(result)
                assert info.value.code() == grpc.StatusCode.INTERNAL, (path, info.value.code())
    for method, make in HARMLESS.items():
        getattr(master_stub(address), method)(make(address), timeout=5)
    assert _snapshot(address) == before


def test_write_and_read_with_bad_fields_are_refused_and_change_nothing(pool):
    """A genuine SSD write grant / read lease with a 3-byte key, and a stretched extent: refused, nothing written."""
    _, address, node_address = pool
    stub, node = master_stub(address), node_stub(node_address)
    grant = stub.PutStart(pb.PutStartRequest(keys=[K], sizes=[BIG]), timeout=5)
    assert list(grant.statuses) == [pb.STORED] and list(grant.tiers) == [pb.SSD]
    try:
        chunk = pb.WriteChunk(grant_id=grant.grant_ids[0], tier=grant.tiers[0], offset=grant.offsets[0],
                              size=grant.sizes[0], expires_unix_ms=grant.expires_unix_ms, token=grant.tokens[0],
                              key=b"abc", data=b"z" * BIG)
        _expect(lambda: node.Write(iter([chunk]), timeout=5), INVALID, "key must be 16 bytes")
        chunk.key, chunk.size = K, 2**62
        _expect(lambda: node.Write(iter([chunk]), timeout=5), DENIED, "token: does not match the grant")
    finally:
        stub.PutAbort(pb.PutAbortRequest(grant_ids=[grant.grant_ids[0]]), timeout=5)
    before = _snapshot(address)
    lookup = stub.Lookup(pb.LookupRequest(keys=[KEYS[-1]], lease=True), timeout=5)  # demoted: on the SSD
    try:
        assert list(lookup.tiers) == [pb.SSD]
        read = pb.ReadRequest(lease_id=lookup.lease_id, tier=lookup.tiers[0], offset=lookup.offsets[0],
                              size=lookup.sizes[0], expires_unix_ms=lookup.expires_unix_ms, token=lookup.tokens[0],
                              key=b"abc")
        _expect(lambda: list(node.Read(read, timeout=5)), INVALID, "key must be 16 bytes")
    finally:
        stub.Release(pb.ReleaseRequest(lease_ids=[lookup.lease_id]), timeout=5)
    _wait_quiet(address)
    assert _snapshot(address) == before
    assert _all_readable(address) == 2 * len(KEYS)


def test_junk_namespace_labels_are_bounded(pool):
    """Every distinct label used to make a stats entry and a metric series forever; past the bound they share one."""
    _, address, _ = pool
    stub = master_stub(address)
    for i in range(300):
        stub.Lookup(pb.LookupRequest(keys=[K], namespace=bytes(16), block_tokens=16, namespace_label=f"junk-{i}"),
                    timeout=5)
    labels = stats(address)["namespaces"]
    assert len(labels) == 256 and labels["(other)"]["requested_tokens"] == 16 * (300 - 255)


def test_data_channel_forged_headers_allocate_nothing_and_idle_connections_are_closed(pool, capsys):
    cluster, address, _ = pool
    figures = Figures("malformed data channel")
    data_address = stats(address)["endpoints"]["n1"]["data_address"]
    host, port = data_address.rsplit(":", 1)
    node_pid = cluster.nodes["n1"].popen.pid
    rss_before = _rss(node_pid)
    # Forged WRITE headers announcing 64 MiB each (an SSD extent: the handler would have staged them in memory):
    # refused on the token before any byte is allocated; the payload is drained through one bounded buffer.
    for _ in range(4):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(REQ.pack(MAGIC, OP_WRITE, pb.SSD, 0, 1, 0, 64 << 20, int(time.time() * 1000) + 60_000,
                               bytes(16), K, bytes(16)))
            zeros = bytes(1 << 20)
            for _ in range(64):  # the announced payload: the node drains it through one small buffer
                s.sendall(zeros)
            status, msg_len, _ = REP.unpack(_recv(s, REP.size))
            assert status == 1 and _recv(s, msg_len).decode().startswith("token:")
    figures.extra["node RSS growth MiB"] = (_rss(node_pid) - rss_before) / (1 << 20)
    assert figures.extra["node RSS growth MiB"] < 32
    # Bad magic: one BAD_REQUEST reply, then the node closes the connection.
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"JUNK" + bytes(REQ.size - 4))
        status, msg_len, _ = REP.unpack(_recv(s, REP.size))
        assert status == 2 and b"magic/op" in _recv(s, msg_len)
        assert s.recv(1) == b""
    # Half-open connections (a header never finished) are closed by the node's idle timeout, not held forever.
    opened = time.monotonic()
    socks = [socket.create_connection((host, int(port)), timeout=30) for _ in range(8)]
    try:
        for s in socks:
            s.sendall(b"KVD1")  # 4 of 88 header bytes
        for s in socks:
            assert s.recv(1) == b""  # EOF: the node gave up on it
        figures.extra["half-open connection closed after s"] = time.monotonic() - opened
    finally:
        for s in socks:
            s.close()
    assert _all_readable(address) == 2 * len(KEYS)
    figures.acked = len(KEYS)
    figures.report(capsys)
    figures.check()


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_every_object_survived_the_malformed_input(pool, capsys):
    _, address, _ = pool
    figures = Figures("malformed input to every RPC")
    figures.acked = len(KEYS)
    good = _all_readable(address)
    figures.acked_lost = len(KEYS) - good // 2
    figures.extra["cases"] = len(MASTER_CASES) + len(NODE_CASES) + 2
    s = stats(address)
    assert s["objects"] == len(KEYS) and s["ssd_corrupt"] == 0 and json.dumps(s["nodes"])
    figures.report(capsys)
    figures.check()


def test_evict_everything_only_when_said(pool):
    """Last in the module: it empties the pool. `kvpool evict --all` and `kvpool rm --all` send EvictRequest.all."""
    import subprocess
    import sys

    _, address, _ = pool
    cli = [sys.executable, "-m", "kvpool.cli"]
    out = subprocess.run([*cli, "evict", "--all", "--master", address, "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"evicted": len(KEYS), "namespace": None, "older_than_s": None}
    assert stats(address)["objects"] == 0
    out = subprocess.run([*cli, "rm", "--all", "--master", address, "--json"], capture_output=True, text=True,
                         timeout=60)
    assert (out.returncode, json.loads(out.stdout)) == (0, {"removed": 0})
