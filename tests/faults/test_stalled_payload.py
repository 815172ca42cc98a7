"""A writer that stalls in the middle of its payload, over TCP, never lands the rest on the object the pool placed
on its extent since (store/write_fence.py).

Real processes: a master and a DRAM node n1. The test is the stalled writer: it takes a grant with a PutStart of
its own, sends the header and half the payload (over the node's data channel, or as the first chunk of a gRPC
Write), then stops sending. Its grant then ends one of two ways:
  expired   the master (grants of 1 s) reclaims it at its expiry;
  restart   the master is SIGKILLed and started again on the same Redis (grants of 30 s: not expired), and n1
            registers with it again, with a new write key.
The pool places the next put (b) on the very extent the stalled writer holds; b is acknowledged. Then the writer
sends the rest. Before 2026-12-07 n1 was still receiving it into its arena, so the rest landed over b and every
read of b missed: an acknowledged object lost. Now n1 stopped receiving at the grant's deadline (the late bytes are
read and dropped, the write refused: DENIED / PERMISSION_DENIED) or cut the write before registering (its
connection shut / UNAVAILABLE), and b reads back exact over TCP and same host."""

from __future__ import annotations

import socket
import threading

import grpc
import pytest

from kvpool import PoolClient
from kvpool.launcher import free_port
from kvpool.proto import kvpool_pb2 as pb
from kvpool.store.data_channel import DENIED, OP_WRITE, REP, Extent
from tests.faults.harness import (Cluster, Figures, connected_nodes, inspect, master_stub, node_stub, payload_of,
                                  read_back_exact, start_redis, stats, wait_until)

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SIZE, HALF = 64 << 10, 32 << 10
EXPIRED = "expires_unix_ms: grant expired before its bytes all arrived (nothing of it counts)"
CUT = "node: the write was cut, the node is registering with its master again"


def _key(i: int) -> bytes:
    return (0x57A1D << 64 | i).to_bytes(16, "big")


class ChannelWriter:
    """The stalled writer on n1's data channel: a raw socket."""

    def __init__(self, grant: pb.PutStartResponse, key: bytes) -> None:
        node = grant.nodes[grant.node_index[0]]
        host, port = node.data_address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.extent = Extent(grant.grant_ids[0], grant.tiers[0], grant.offsets[0], SIZE, grant.expires_unix_ms,
                             grant.tokens[0], key, bytes(16))
        self.payload = payload_of(key, SIZE)

    def first_half(self) -> None:
        self.sock.sendall(self.extent.header(OP_WRITE) + self.payload[:HALF])

    def rest(self) -> tuple:
        """(status, message) of the node's reply, or ("closed",) when it shut the connection."""
        try:
            self.sock.sendall(self.payload[HALF:])
            head = self.sock.recv(REP.size, socket.MSG_WAITALL)
        except (BrokenPipeError, ConnectionResetError):
            return ("closed",)
        if not head:
            return ("closed",)
        status, msg_len, _ = REP.unpack(head)
        return status, self.sock.recv(msg_len, socket.MSG_WAITALL).decode()

    def close(self) -> None:
        self.sock.close()


class GrpcWriter:
    """The stalled writer as a gRPC Write stream: its second chunk waits for `rest`."""

    def __init__(self, grant: pb.PutStartResponse, key: bytes) -> None:
        self.grant, self.key, self.payload = grant, key, payload_of(key, SIZE)
        self.go = threading.Event()
        self.call = None

    def first_half(self) -> None:
        g = self.grant

        def chunks():
            yield pb.WriteChunk(grant_id=g.grant_ids[0], tier=g.tiers[0], offset=g.offsets[0], size=SIZE,
                                expires_unix_ms=g.expires_unix_ms, token=g.tokens[0], key=self.key,
                                namespace=bytes(16), data=self.payload[:HALF])
            self.go.wait(60)
            yield pb.WriteChunk(data=self.payload[HALF:])

        self.call = node_stub(g.nodes[g.node_index[0]].control_address).Write.future(chunks(), timeout=60)

    def rest(self) -> tuple:
        self.go.set()
        try:
            self.call.result(timeout=30)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
        return ("written",)

    def close(self) -> None:
        self.go.set()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(workdir=tmp_path)
    yield c
    c.close()
    print(c.logs())


@pytest.mark.parametrize("path", ["channel", "grpc"])
@pytest.mark.parametrize("ends", ["expired", "restart"])
def test_a_writer_stalled_mid_payload_never_lands_the_rest_on_the_object_placed_there_since(tmp_path, cluster, ends,
                                                                                           path, capsys):
    redis = start_redis(tmp_path / "redis") if ends == "restart" else None
    a, b = _key(1), _key(2)
    figures = Figures(f"writer stalled mid-payload ({path}), grant {ends}")
    master_port = free_port()
    extra = ["--heartbeat-s", "0.3"] + (["--grant-ttl-s", "1.0"] if ends == "expired" else [])
    writer = None
    try:
        master = cluster.start_master(port=master_port, node_ttl_s=30.0, redis_url=redis and redis.url, extra=extra)
        cluster.start_node("n1", dram="1MiB")
        grant = master_stub(master.address).PutStart(pb.PutStartRequest(keys=[a], sizes=[SIZE]), timeout=5)
        assert list(grant.statuses) == [pb.STORED] and list(grant.tiers) == [pb.DRAM]
        writer = (ChannelWriter if path == "channel" else GrpcWriter)(grant, a)
        writer.first_half()
        if ends == "expired":
            wait_until(lambda: stats(master.address)["grants_open"] == 0, 10, "the stalled writer's grant to expire")
            # an expired DRAM grant's extent is given out again once heartbeats show no same-host writer claims it
            # (store/held_extents.py): the second heartbeat after the expiry, as this TCP writer claims nothing
            wait_until(lambda: stats(master.address)["grants_held"] == 0, 10, "the expired grant's extent to be freed")
        else:
            master.kill()
            master = cluster.start_master(port=master_port, node_ttl_s=30.0, redis_url=redis.url, extra=extra)
            wait_until(lambda: connected_nodes(master.address) == {"n1"}, 20, "n1 to register again")
        with PoolClient(master.address, timeout=5) as parent:
            assert parent.put_many([b], [payload_of(b, SIZE)]) == ["stored"]
            figures.acked += 1
            where = inspect(master.address, [b])[0]
            assert (where.node_id, where.offset) == ("n1", grant.offsets[0])  # the stalled writer's extent
            answer = writer.rest()
            if ends == "expired":
                assert answer == ((DENIED, EXPIRED) if path == "channel" else
                                  (grpc.StatusCode.PERMISSION_DENIED, EXPIRED))
            else:
                assert answer == (("closed",) if path == "channel" else (grpc.StatusCode.UNAVAILABLE, CUT))
            read_back_exact(master.address, b, SIZE, figures)
            assert stats(master.address).get("dram_corrupt", 0) == 0
            assert parent.contains_many([a]) == [False]
    finally:
        if writer is not None:
            writer.close()
        if redis is not None:
            redis.kill()
    figures.report(capsys)
    figures.check()
