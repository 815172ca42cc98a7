"""The master's control channel (store/control_channel.py) on a real `kvpool up` pool in this process (LocalCluster:
gRPC master + node on 127.0.0.1) and real sockets: which calls go over it, bytes exact; what a malformed, stalled or
surplus connection gets; that a master without one, or a restarted one, is still served. Authentication and roles
over the channel are in test_secure_cluster.py (its pool is authenticated)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import struct
import time

import pytest

from kvpool import PoolClient
from kvpool.launcher import free_port
from kvpool.proto import kvpool_pb2 as pb
from kvpool.store.config import UpConfig
from kvpool.store.control_channel import GREETING, MAGIC, METHOD_ID, REP, REQ, ControlClient
from kvpool.store.local_cluster import LocalCluster

OBJ = 8 << 10
KEYS = [(0xC0 << 120 | i).to_bytes(16, "big") for i in range(8)]
DATAS = [bytes([i + 1]) * OBJ for i in range(8)]


@pytest.fixture(scope="module", autouse=True)
def _remove_shm_dirs():
    """The /dev/shm directories `up` made (each cluster's own), once the module's clusters are stopped."""
    yield
    for path in glob.glob(os.path.join("/dev/shm", f"kvpool-ctl-{os.getpid()}-*")):
        shutil.rmtree(path, ignore_errors=True)


def up(**kw) -> LocalCluster:
    shm = os.path.join("/dev/shm", f"kvpool-ctl-{os.getpid()}-{free_port()}")
    os.makedirs(shm, exist_ok=True)
    cfg = UpConfig(**{"listen": f"127.0.0.1:{free_port()}", "http_listen": "", "shm_dir": shm,
                      "dram_bytes": 1 << 20, "ssd_path": None, **kw})
    return LocalCluster(cfg).start()


def wait_until(pred, what: str, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def cluster():
    c = up(control_idle_timeout_s=1.0, control_max_connections=4)
    try:
        yield c
    finally:
        c.stop()


def raw_conn(cluster: LocalCluster) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", cluster.master.control.port), timeout=5)
    greeting = recv_n(sock, GREETING.size)
    magic, version, instance = GREETING.unpack(greeting)
    assert (magic, version, instance) == (MAGIC, 1, cluster.master.control.instance)
    return sock


def recv_n(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            return out
        out += chunk
    return out


def raw_call(sock: socket.socket, method: int, payload: bytes, call_id: int = 7) -> tuple[int, int, bytes]:
    sock.sendall(REQ.pack(len(payload), call_id, method, 0) + payload)
    size, got_id, code = REP.unpack(recv_n(sock, REP.size))
    return got_id, code, recv_n(sock, size)


def test_hot_calls_go_over_the_channel_bytes_exact_and_the_rest_by_grpc(cluster):
    calls = cluster.master.control.calls
    with PoolClient(cluster.address, optimistic_reads=False) as c:   # a leased get: its Release is a hot call too
        assert c.put_many(KEYS, DATAS) == ["stored"] * 8
        assert calls["PutStart"] == 1 and calls["PutCommit"] == 1
        bufs = [bytearray(OBJ) for _ in KEYS]
        assert c.get_many_into(KEYS, bufs) == 8 and bufs == [bytearray(d) for d in DATAS]
        assert calls["Lookup"] == 1
        wait_until(lambda: calls["Release"] == 1, "the get's lease release")
        assert c.contains_many(KEYS[:3] + [b"\x00" * 16]) == [True, True, True, False]
        assert c.lookup_prefix(KEYS) == 8
        assert c.remove_many(KEYS[6:]) == 2
        assert calls == {"PutStart": 1, "PutCommit": 1, "PutAbort": 0, "Lookup": 2, "Release": 1, "Contains": 1,
                         "Remove": 1}
        assert c.stats()["objects"] == 6    # Stats is not a channel method: gRPC, and nothing counted
    before = dict(calls)
    with PoolClient(cluster.address, control_channel=False) as g:     # the same calls, every one by gRPC
        assert not g.rpc.uses_control_channel()
        bufs = [bytearray(OBJ) for _ in KEYS[:6]]
        assert g.get_many_into(KEYS[:6], bufs) == 6 and bufs == [bytearray(d) for d in DATAS[:6]]
        assert g.put_many(KEYS[6:], DATAS[6:]) == ["stored"] * 2
    assert calls == before


def test_warm_opens_the_control_connection_the_first_call_then_uses():
    """`warm()` asks for the channel and opens one connection to it; the first lookup and get after it dial none."""
    c = up()
    try:
        ctl = c.master.control
        with PoolClient(c.address) as client:
            assert client.put_many(KEYS[:2], DATAS[:2]) == ["stored", "stored"]
        wait_until(lambda: ctl.connections() == 0, "the putting client's connection to close")
        with PoolClient(c.address, host_index_reads=False) as client:     # the lookup asks the master at once
            assert ctl.connections() == 0
            client.warm(prefault=False)
            assert ctl.connections() == 1 and ctl.calls["Lookup"] == 0
            assert client.lookup_prefix(KEYS[:2]) == 2 and ctl.calls["Lookup"] == 1     # over the warm connection
            bufs = [bytearray(OBJ) for _ in range(2)]
            assert client.get_many_into(KEYS[:2], bufs) == 2 and bufs == [bytearray(d) for d in DATAS[:2]]
            assert ctl.connections() == 1
    finally:
        c.stop()


def test_a_master_with_control_listen_off_serves_every_call_by_grpc():
    c = up(control_listen="off")
    try:
        assert c.master.control is None
        with PoolClient(c.address) as client:
            assert not client.rpc.uses_control_channel()
            assert client.put_many(KEYS[:2], DATAS[:2]) == ["stored", "stored"]
            bufs = [bytearray(OBJ) for _ in range(2)]
            assert client.get_many_into(KEYS[:2], bufs) == 2 and bufs == [bytearray(d) for d in DATAS[:2]]
    finally:
        c.stop()


def test_control_listen_is_validated_naming_the_field():
    with pytest.raises(ValueError, match="control_listen must be host:port, empty .* or 'off', got 'nowhere'"):
        UpConfig(control_listen="nowhere")
    with pytest.raises(ValueError, match="control_max_connections"):
        UpConfig(control_max_connections=0)


def test_malformed_frames_are_refused_reach_nothing_and_the_stream_goes_on(cluster):
    with PoolClient(cluster.address) as c:
        assert c.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4
        before = dict(cluster.master.control.calls)
        sock = raw_conn(cluster)
        try:
            assert raw_call(sock, 0, b"") == (7, 3, b"method: 0 is not a control channel method (1..7)")
            assert raw_call(sock, 99, b"", call_id=8) == (8, 3, b"method: 99 is not a control channel method (1..7)")
            # bytes that are no RemoveRequest: refused before the master sees them (nothing is removed)
            assert raw_call(sock, METHOD_ID["Remove"], b"\xff\xff\xff", call_id=9) == (
                9, 3, b"request: not a RemoveRequest message")
            # a caller mistake the master names (a key of 3 bytes), the same message gRPC would carry
            got_id, code, msg = raw_call(sock, METHOD_ID["Remove"], pb.RemoveRequest(keys=[b"abc"]).SerializeToString())
            assert (got_id, code) == (7, 3) and b"keys" in msg
            # the same connection still serves a good call
            got_id, code, body = raw_call(sock, METHOD_ID["Contains"],
                                          pb.ContainsRequest(keys=KEYS[:4]).SerializeToString(), call_id=10)
            assert (got_id, code, list(pb.ContainsResponse.FromString(body).present)) == (10, 0, [True] * 4)
            # a frame past the size limit cannot be skipped: refused, then the connection is closed
            sock.sendall(REQ.pack((256 << 20) + 1, 11, METHOD_ID["Contains"], 0))
            size, got_id, code = REP.unpack(recv_n(sock, REP.size))
            assert (got_id, code) == (11, 3)
            assert recv_n(sock, size).startswith(b"frame: 268435457 bytes exceeds")
            assert recv_n(sock, 1) == b""
        finally:
            sock.close()
        assert cluster.master.control.calls == {**before, "Contains": before["Contains"] + 1}
        bufs = [bytearray(OBJ) for _ in range(4)]
        assert c.get_many_into(KEYS[:4], bufs) == 4 and bufs == [bytearray(d) for d in DATAS[:4]]


def test_a_stalled_connection_blocks_nobody_and_is_closed_after_the_idle_timeout(cluster):
    control = cluster.master.control
    stalled = raw_conn(cluster)
    try:
        stalled.sendall(REQ.pack(100, 1, METHOD_ID["Lookup"], 0)[:5])   # half a header, then silence
        with PoolClient(cluster.address, location_cache_s=0, host_index_reads=False) as c:  # every get a Lookup
            assert c.put_many(KEYS[:2], DATAS[:2]) == ["stored", "stored"]
            bufs = [bytearray(OBJ) for _ in range(2)]
            assert c.get_many_into(KEYS[:2], bufs) == 2 and bufs == [bytearray(d) for d in DATAS[:2]]
            # idle_timeout 1 s: the stalled peer and the client's idle pooled connection are both closed ...
            stalled.settimeout(10)
            assert recv_n(stalled, 1) == b""
            wait_until(lambda: control.connections() == 0, "the idle connections to close")
            # ... and the client notices (its pooled connection reads EOF) and dials again: no call fails
            assert c.get_many_into(KEYS[:2], bufs) == 2 and bufs == [bytearray(d) for d in DATAS[:2]]
            assert control.calls["Lookup"] == 2
    finally:
        stalled.close()


def test_connections_past_the_cap_are_closed_at_accept(cluster):
    control = cluster.master.control
    held = [raw_conn(cluster) for _ in range(4)]   # control_max_connections=4
    try:
        extra = socket.create_connection(("127.0.0.1", control.port), timeout=5)
        assert recv_n(extra, GREETING.size) == b""       # closed without a greeting
        extra.close()
        assert control.refused_connections == 1
        # a client still works: its calls that cannot be sent there go by gRPC
        with PoolClient(cluster.address) as c:
            assert c.put_many(KEYS[:1], DATAS[:1]) == ["stored"]
            assert c.contains_many(KEYS[:1]) == [True]
    finally:
        for s in held:
            s.close()


def test_a_client_never_sends_to_another_process_on_the_announced_port(cluster):
    # What a client checks before it sends: the greeting must name the instance Hello announced.
    other = ControlClient("127.0.0.1", cluster.master.control.port, b"\x00" * 16)
    from kvpool.store.control_channel import ControlUnreachable

    with pytest.raises(ControlUnreachable, match="not the master that announced it"):
        other.call("Contains", pb.ContainsRequest(keys=KEYS[:1]).SerializeToString(), "", 5.0)
    assert cluster.master.control.calls["Contains"] == 0
    # and a port nobody listens on is ControlUnreachable too (nothing was sent: the caller may use gRPC)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    with pytest.raises(ControlUnreachable):
        ControlClient("127.0.0.1", dead_port, b"\x00" * 16).call("Contains", b"", "", 5.0)


def test_a_restarted_master_is_reached_on_its_new_control_port():
    port = free_port()
    first = up(listen=f"127.0.0.1:{port}")
    with PoolClient(f"127.0.0.1:{port}", timeout=5, retries=3) as c:
        try:
            assert c.put_many(KEYS[:2], DATAS[:2]) == ["stored", "stored"]
            old_instance = first.master.control.instance
        finally:
            first.stop()
        second = up(listen=f"127.0.0.1:{port}")
        try:
            assert second.master.control.instance != old_instance    # a new process: the old greeting is refused
            # the pooled connection to the old master reads EOF and is dropped; the old port refuses; that call goes
            # by gRPC, and the next one asks Hello again and uses the new channel
            assert c.put_many(KEYS[2:4], DATAS[2:4]) == ["stored", "stored"]
            assert c.contains_many(KEYS[2:4]) == [True, True]
            bufs = [bytearray(OBJ) for _ in range(2)]
            assert c.get_many_into(KEYS[2:4], bufs) == 2 and bufs == [bytearray(d) for d in DATAS[2:4]]
            assert second.master.control.calls["Lookup"] == 1
        finally:
            second.stop()


def test_frame_layouts_are_the_documented_sizes():
    assert (REQ.size, REP.size, GREETING.size) == (12, 12, 24)
    assert struct.calcsize("<IIBxH") == 12
