"""A node's write fence (store/write_fence.py) on a real node's handler behind a real loopback data channel and a
real gRPC NodeService: a write stalled in the middle of its payload never lands a byte after its grant ends, by
expiry or by the node registering again, over the object the pool placed on its extent since."""

from __future__ import annotations

import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import tokens
from kvpool.store.config import NodeConfig
from kvpool.store.data_channel import DENIED, OK, OP_WRITE, REP, DataClient, DataServer, Extent
from kvpool.store.node import StorageNode
from kvpool.store.node_data import NodeDataHandler
from kvpool.store.node_server import NodeServicer
from kvpool.store.write_fence import LAND_MARGIN_S, WriteFence
from kvpool.tiers.types import Tier
from tests.faults.harness import wait_until
from tests.store.pki import make_pki
from tests.store.test_tls import client_tls, server_tls

SIZE, HALF = 64 << 10, 32 << 10
STALE, FRESH = bytes([0xA5]) * SIZE, bytes(range(256)) * (SIZE // 256)
EXPIRED = "expires_unix_ms: grant expired before its bytes all arrived (nothing of it counts)"
REGISTERING = "node: registering with its master again, writes are refused until it has"


@pytest.fixture(params=["plain", "tls"])
def node(tmp_path, request):
    """A real node's handler behind a data channel, plaintext or TLS (its receive timeouts are Python's there)."""
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=1 << 20, ssd_path=str(tmp_path / "ssd"),
                                  ssd_bytes=4 << 20))
    handler = NodeDataHandler(node)
    handler.secret, handler.write_key = b"s" * 32, b"w" * 32
    tls = None
    if request.param == "tls":
        pki = make_pki(tmp_path / "pki")
        tls = (server_tls(pki).server_ssl_context(), client_tls(pki).client_ssl_context())
    server = DataServer(handler, ssl_context=tls and tls[0]).start()
    server.client_ssl = tls and tls[1]
    yield node, handler, server
    server.close()
    node.close()


def grant(ident: int, key: bytes, ttl_ms: int, tier: int = Tier.DRAM) -> Extent:
    expires = tokens.now_ms() + ttl_ms
    return Extent(ident, tier, 0, SIZE, expires, tokens.sign(key, tokens.WRITE, ident, tier, 0, SIZE, expires),
                  b"k" * 16)


def dram(node: StorageNode) -> bytes:
    return bytes(node.dram.view(0, SIZE))


def connect(server: DataServer) -> socket.socket:
    host, port = server.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return server.client_ssl.wrap_socket(sock, server_hostname=host) if server.client_ssl else sock


def reply(sock: socket.socket) -> tuple[int, str]:
    head = b""
    while len(head) < REP.size:
        chunk = sock.recv(REP.size - len(head))
        assert chunk, "the node closed the connection"
        head += chunk
    status, msg_len, _ = REP.unpack(head)
    msg = b""
    while len(msg) < msg_len:
        msg += sock.recv(msg_len - len(msg))
    return status, msg.decode()


def half_written(server: DataServer, node: StorageNode, e: Extent) -> socket.socket:
    """A connection that sent `e`'s WRITE header and the first half of STALE, once that half has landed."""
    sock = connect(server)
    sock.sendall(e.header(OP_WRITE) + STALE[:HALF])
    wait_until(lambda: dram(node)[:HALF] == STALE[:HALF], 5, "the first half to land")
    return sock


def assert_cut(sock: socket.socket) -> None:
    """The rest of STALE finds the connection shut: the node cut the write."""
    try:
        sock.sendall(STALE[HALF:])
        closed = sock.recv(REP.size) == b""
    except OSError:     # BrokenPipeError, ConnectionResetError; ssl.SSLError over TLS
        closed = True
    assert closed


def write(server: DataServer, e: Extent, payload: bytes) -> list:
    client = DataClient(server.address, timeout=5, ssl_context=server.client_ssl)
    try:
        return [err and err.message for err in client.write_many([e], [memoryview(payload)])]
    finally:
        client.close()


def test_a_dram_write_stalled_past_its_grant_lands_nothing_after_the_deadline_and_the_stream_goes_on(node):
    """Half the payload, then nothing until the grant has expired and the extent holds the next object (FRESH, a
    later grant's write). The node's receive stopped waiting at the deadline (LAND_MARGIN_S before the expiry): the
    late half is read and dropped, the write refused with DENIED, and the arena holds FRESH exactly; the same
    connection then serves a good write. Before the fence, the late half landed over FRESH."""
    node, handler, server = node
    stale = grant(1, handler.write_key, ttl_ms=400)
    with connect(server) as sock:
        sock.sendall(stale.header(OP_WRITE) + STALE[:HALF])
        wait_until(lambda: dram(node)[:HALF] == STALE[:HALF], 5, "the first half to land")
        wait_until(lambda: tokens.now_ms() > stale.expires_ms, 5, "the grant to expire")
        assert write(server, grant(2, handler.write_key, ttl_ms=60_000), FRESH) == [None]
        sock.sendall(STALE[HALF:])
        assert reply(sock) == (DENIED, EXPIRED)
        assert dram(node) == FRESH
        assert handler.write_fence.counts() == {"cut_writes": 0, "drained_writes": 0, "late_writes": 1}
        again = grant(3, handler.write_key, ttl_ms=60_000)
        sock.sendall(again.header(OP_WRITE) + STALE)
        assert reply(sock) == (OK, "")
        assert dram(node) == STALE


def test_registering_again_cuts_the_writes_in_flight_and_refuses_new_ones_until_the_new_key_is_in(node):
    """What NodeServer.register does around RegisterNode: `close` shuts the in-flight write's connection and
    returns once it can land nothing; a write arriving meanwhile is refused; the registration's new key goes in,
    `reopen`, and the next object lands. The stalled writer's late half finds its connection gone, and the arena
    holds the next object exactly."""
    node, handler, server = node
    fence = handler.write_fence
    with half_written(server, node, grant(1, handler.write_key, ttl_ms=60_000)) as sock:
        assert fence.close() == 1
        assert write(server, grant(2, handler.write_key, ttl_ms=60_000), FRESH) == [REGISTERING]
        handler.write_key = b"n" * 32
        fence.reopen()
        assert write(server, grant(3, b"n" * 32, ttl_ms=60_000), FRESH) == [None]
        assert_cut(sock)
    assert dram(node) == FRESH
    assert fence.counts() == {"cut_writes": 1, "drained_writes": 0, "late_writes": 0} and fence.close() == 0
    fence.reopen()


def test_registering_again_lets_a_write_in_flight_finish_within_the_drain_and_refuses_new_ones_meanwhile(node):
    """`close(drain_s)`: the write in flight may finish (no master places anything on this node before the
    registration that follows, so its own extent is still its own); a write arriving during the drain is refused;
    `close` returns as soon as the last one in flight ends, long before the drain is out, having cut nothing."""
    node, handler, server = node
    fence = handler.write_fence
    stale = grant(1, handler.write_key, ttl_ms=60_000)
    closed = []
    with connect(server) as sock:
        sock.sendall(stale.header(OP_WRITE) + STALE[:HALF])
        wait_until(lambda: dram(node)[:HALF] == STALE[:HALF], 5, "the first half to land")
        closer = threading.Thread(target=lambda: closed.append((fence.close(drain_s=60.0), time.monotonic())))
        closer.start()
        wait_until(lambda: fence.closed, 5, "the fence to close")
        assert write(server, grant(2, handler.write_key, ttl_ms=60_000), FRESH) == [REGISTERING]
        assert closer.is_alive()            # still draining: the first write has not ended
        sock.sendall(STALE[HALF:])
        assert reply(sock) == (OK, "")
        closer.join(10)
    assert not closer.is_alive() and closed[0][0] == 0
    assert dram(node) == STALE
    assert fence.counts() == {"cut_writes": 0, "drained_writes": 1, "late_writes": 0}
    fence.reopen()
    assert not fence.closed and write(server, grant(3, handler.write_key, ttl_ms=60_000), FRESH) == [None]


def test_a_write_still_in_flight_when_the_drain_runs_out_is_cut(node):
    """A writer stalled halfway through the whole drain is cut as without one: `close` returns 1 no sooner than
    `drain_s`, the stalled writer finds its connection gone, and nothing of its second half lands."""
    node, handler, server = node
    fence = handler.write_fence
    with half_written(server, node, grant(1, handler.write_key, ttl_ms=60_000)) as sock:
        started = time.monotonic()
        assert fence.close(drain_s=0.3) == 1
        assert time.monotonic() - started >= 0.3
        assert_cut(sock)
    assert dram(node) == STALE[:HALF] + bytes(SIZE - HALF)
    assert fence.counts() == {"cut_writes": 1, "drained_writes": 0, "late_writes": 0}
    fence.reopen()


def test_a_staged_ssd_write_cut_by_a_registration_writes_no_record(node):
    """An SSD write is staged and written whole at its end: cut while its bytes arrive, it writes nothing."""
    node, handler, server = node
    stale = grant(1, handler.write_key, ttl_ms=60_000, tier=Tier.SSD)
    landed = threading.Event()
    real = handler.write_view
    handler.write_view = lambda e: (real(e), landed.set())[0]
    with connect(server) as sock:
        sock.sendall(stale.header(OP_WRITE) + STALE[:HALF])
        assert landed.wait(5)
        assert handler.write_fence.close() == 1
        handler.write_fence.reopen()
        try:
            sock.sendall(STALE[HALF:])
            assert sock.recv(REP.size) == b""
        except OSError:     # BrokenPipeError, ConnectionResetError; ssl.SSLError over TLS
            pass
    assert node.scan_ssd() == []


@pytest.mark.parametrize("ends", ["expired", "cut"])
def test_a_grpc_write_stream_stalled_past_its_grant_lands_no_chunk_after_it(node, ends):
    """NodeService.Write (the gRPC data path): the first chunk lands, the stream stalls, its grant ends (expiry, or
    the node registering again) and the next object takes the extent. The stalled stream's next chunk is refused
    (PERMISSION_DENIED / UNAVAILABLE) and never lands."""
    node, handler, data = node
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pbg.add_NodeServiceServicer_to_server(NodeServicer(node, handler), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stale = grant(1, handler.write_key, ttl_ms=400 if ends == "expired" else 60_000)
        go = threading.Event()

        def chunks():
            yield pb.WriteChunk(grant_id=stale.ident, tier=stale.tier, offset=0, size=SIZE,
                                expires_unix_ms=stale.expires_ms, token=stale.token, key=stale.key,
                                data=STALE[:HALF])
            go.wait(30)
            yield pb.WriteChunk(data=STALE[HALF:])

        call = pbg.NodeServiceStub(channel).Write.future(chunks(), timeout=30)
        wait_until(lambda: dram(node)[:HALF] == STALE[:HALF], 5, "the first chunk to land")
        if ends == "expired":
            wait_until(lambda: tokens.now_ms() > stale.expires_ms, 5, "the grant to expire")
            fresh = grant(2, handler.write_key, ttl_ms=60_000)
        else:
            assert handler.write_fence.close() == 1
            handler.write_key = b"n" * 32
            handler.write_fence.reopen()
            fresh = grant(2, b"n" * 32, ttl_ms=60_000)
        assert write(data, fresh, FRESH) == [None]
        go.set()
        with pytest.raises(grpc.RpcError) as info:
            call.result(timeout=10)
        assert (info.value.code(), info.value.details()) == (
            (grpc.StatusCode.PERMISSION_DENIED, EXPIRED) if ends == "expired" else
            (grpc.StatusCode.UNAVAILABLE, "node: the write was cut, the node is registering with its master again"))
        assert dram(node) == FRESH
    finally:
        channel.close()
        server.stop(0)


def test_a_write_begun_with_less_than_the_margin_left_lands_nothing(node):
    """The deadline is LAND_MARGIN_S before the expiry: a grant with less left than that is already past it."""
    node, handler, server = node
    late = grant(1, handler.write_key, ttl_ms=int(LAND_MARGIN_S * 1000) // 2)
    assert write(server, late, STALE) == [EXPIRED]
    assert dram(node) == bytes(SIZE)


def test_a_fence_refuses_while_closed_and_counts_what_it_cut():
    fence = WriteFence()
    landing = fence.begin(tokens.now_ms() + 60_000)
    assert fence.close() == 1 and landing.cut
    with pytest.raises(tokens.TokenError, match="registering with its master again"):
        fence.begin(tokens.now_ms() + 60_000)
    fence.end(landing)
    fence.reopen()
    fence.end(fence.begin(tokens.now_ms() + 60_000))
    assert fence.close() == 0 and fence.counts()["cut_writes"] == 1


def test_a_receive_timeout_lowered_near_a_deadline_does_not_shorten_the_connection_s_idle_timeout(node):
    """A write with less time left than the idle timeout lowers the connection's receive timeout (to half the time
    left). The wait for the next frame then times out under it and goes on under the idle timeout: a peer silent for
    longer than the lowered timeout keeps its connection, one silent past the idle timeout loses it."""
    node, handler, fixture_server = node
    server = DataServer(handler, idle_timeout_s=3.0, ssl_context=fixture_server.ssl_context).start()
    server.client_ssl = fixture_server.client_ssl
    try:
        with connect(server) as sock:
            sock.sendall(grant(1, handler.write_key, ttl_ms=1000).header(OP_WRITE) + STALE)  # lowers it to <= 0.45 s
            assert reply(sock) == (OK, "")
            time.sleep(1.0)                     # the peer stays silent past the lowered timeout
            sock.sendall(grant(2, handler.write_key, ttl_ms=60_000).header(OP_WRITE) + FRESH)
            assert reply(sock) == (OK, "") and dram(node) == FRESH
            started = time.monotonic()
            assert sock.recv(1) == b""          # then silent past the idle timeout: the node closes it
            assert time.monotonic() - started >= 2.9
    finally:
        server.close()


def test_a_write_cut_between_its_token_check_and_its_first_byte_lands_nothing(node):
    """The cut comes while the write's header is being checked (here: from inside `write_view`), with the first 8 KiB
    of its payload already read along with the header (sent as one segment, one TLS record: the node's bulk read
    of the header takes them). `close` returns at once (the landing's lock is free); those bytes must not land after
    it, and the write must not count."""
    node, handler, server = node
    real = handler.write_view
    cut = []

    def write_view(e):
        view = real(e)
        cut.append(handler.write_fence.close())
        return view

    handler.write_view = write_view
    with connect(server) as sock:
        sock.sendall(grant(1, handler.write_key, ttl_ms=60_000).header(OP_WRITE) + STALE[:8 << 10])
        try:
            answer = sock.recv(REP.size)
        except OSError:     # ConnectionResetError; ssl.SSLError over TLS
            answer = b""
        assert answer == b""
        wait_until(lambda: server.connections() == 0, 5, "the node to end the cut write's connection")
    assert cut == [1]
    assert dram(node) == bytes(SIZE)
    handler.write_fence.reopen()


def test_a_node_process_lets_a_write_finish_within_its_register_drain_and_its_metrics_count_what_it_cut(tmp_path):
    """`kvpool node --metrics-listen --register-drain-s 3`: a real node registered with a real master registers
    again (what it does after its master restarts, or after a heartbeat failed) twice. The first time a write is
    halfway on its data channel and its writer sends the rest while the node drains: it lands whole and answers OK.
    The second time the writer stays silent through the drain: it is cut. The node's /metrics, read over HTTP, count
    one of each, and no late write."""
    import urllib.request

    from kvpool.launcher import free_port
    from kvpool.services import NodeProcess
    from kvpool.store.config import NodeServerConfig
    from kvpool.store.master_server import MasterServer, MasterServerConfig

    master = MasterServer(MasterServerConfig(listen="127.0.0.1:0")).start()
    port = free_port()
    process = NodeProcess(NodeServerConfig(node_id="n1", master=master.address, listen="127.0.0.1:0",
                                           dram_bytes=1 << 20, metrics_listen=f"127.0.0.1:{port}",
                                           register_drain_s=3.0)).start()

    def scrape() -> list[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return [line for line in r.read().decode().splitlines() if line.startswith("kvpool_node_writes_")]

    try:
        server = process.server
        assert server.registered.wait(10)
        assert scrape() == ["kvpool_node_writes_cut_total 0.0", "kvpool_node_writes_drained_total 0.0",
                            "kvpool_node_writes_late_total 0.0"]
        host, data_port = server.data_address.rsplit(":", 1)
        fence = server.handler.write_fence
        with socket.create_connection((host, int(data_port)), timeout=10) as sock:
            sock.sendall(grant(1, server.handler.write_key, ttl_ms=60_000).header(OP_WRITE) + STALE[:HALF])
            wait_until(lambda: bytes(server.node.dram.view(0, HALF)) == STALE[:HALF], 5, "the first half to land")
            registering = threading.Thread(target=server.register)
            registering.start()
            wait_until(lambda: fence.closed, 5, "the node to start draining")
            sock.sendall(STALE[HALF:])
            assert reply(sock) == (OK, "")
            registering.join(30)
        assert not registering.is_alive() and bytes(server.node.dram.view(0, SIZE)) == STALE
        with socket.create_connection((host, int(data_port)), timeout=10) as sock:
            sock.sendall(grant(2, server.handler.write_key, ttl_ms=60_000).header(OP_WRITE) + FRESH[:HALF])
            wait_until(lambda: bytes(server.node.dram.view(0, HALF)) == FRESH[:HALF], 5, "the first half to land")
            server.register()
        assert bytes(server.node.dram.view(0, SIZE)) == FRESH[:HALF] + STALE[HALF:]
        assert scrape() == ["kvpool_node_writes_cut_total 1.0", "kvpool_node_writes_drained_total 1.0",
                            "kvpool_node_writes_late_total 0.0"]
    finally:
        process.stop()
        master.stop()


@pytest.mark.parametrize("drain_s", [0.0, 5.0])
def test_a_tcp_put_in_flight_when_its_node_registers_again_with_the_same_master(tmp_path, drain_s):
    """A real master, a real node and a PoolClient over TCP, all in this process. The node's handler holds the put's
    write after the fence took it (the write is in flight) while the node registers again with the same master (as
    after a transient heartbeat failure: same incarnation, so the master keeps the node's objects, grants and key).
    With `register_drain_s` the write lands once let go, the registration follows, the commit finds its grant, and
    the put is stored and read back byte for byte. Without a drain (0, the behaviour before) the write is cut and
    the put fails (PoolUnavailable: its only node failed it): the object is a miss."""
    from kvpool import PoolClient
    from kvpool.errors import PoolUnavailable
    from kvpool.services import NodeProcess
    from kvpool.store.config import NodeServerConfig
    from kvpool.store.master_server import MasterServer, MasterServerConfig

    master = MasterServer(MasterServerConfig(listen="127.0.0.1:0")).start()
    process = NodeProcess(NodeServerConfig(node_id="n1", master=master.address, listen="127.0.0.1:0",
                                           dram_bytes=1 << 20, register_drain_s=drain_s)).start()
    key, payload = b"d" * 16, bytes(range(256)) * (SIZE // 256)
    try:
        server = process.server
        assert server.registered.wait(10)
        handler, fence = server.handler, server.handler.write_fence
        in_flight, let_go = threading.Event(), threading.Event()
        real = handler.write_view

        def held_write_view(e):
            in_flight.set()
            assert let_go.wait(10)
            return real(e)

        handler.write_view = held_write_view
        with PoolClient(master.address, transport="tcp", timeout=10, retries=0) as client:
            answers = []

            def put():
                try:
                    answers.append(client.put_many([key], [payload]))
                except PoolUnavailable as exc:
                    answers.append(exc)

            putter = threading.Thread(target=put)
            putter.start()
            assert in_flight.wait(10)
            registering = threading.Thread(target=server.register)
            registering.start()
            if drain_s:     # the registration waits for the write in flight
                wait_until(lambda: fence.closed, 5, "the node to close its fence")
            else:           # the registration cuts it and goes on (its fence may be open again before a poll)
                registering.join(30)
            let_go.set()
            registering.join(30)
            putter.join(30)
            handler.write_view = real
            assert not registering.is_alive() and not putter.is_alive()
            buf = bytearray(SIZE)
            got = client.get_many_into([key], [buf])
        counts = fence.counts()
        if drain_s:
            assert answers == [["stored"]] and got == 1 and bytes(buf) == payload
            assert (counts["drained_writes"], counts["cut_writes"]) == (1, 0)
        else:
            # the only node failed the write: nothing could be written (kvpool.errors.PoolUnavailable)
            assert isinstance(answers[0], PoolUnavailable) and "peer closed the connection" in str(answers[0])
            assert got == 0
            assert (counts["drained_writes"], counts["cut_writes"]) == (0, 1)
    finally:
        process.stop()
        master.stop()
