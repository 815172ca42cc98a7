"""Dated reads on the raw TCP data channel (store/data_channel.py STAMP / READ_DATED): what a TCP client's location
cache sends (kvpool/locations.py). A real node's handler over a real loopback socket: the stamp it answers is the
node's, a read dated with it is served, one dated with any other stamp is refused with NOT_FOUND and no payload,
each frame of a window with its own outcome; a removal or another node process changes the stamp."""

from __future__ import annotations

import socket

import pytest
import xxhash

from kvpool.store import tokens
from kvpool.store.config import NodeConfig
from kvpool.store.data_channel import (
    BAD_REQUEST,
    NOT_FOUND,
    OK,
    OP_READ,
    OP_READ_DATED,
    OP_STAMP,
    REP,
    STAMP_BYTES,
    STAMP_REFUSED,
    DataChannelError,
    DataClient,
    DataServer,
    Extent,
)
from kvpool.store.node import StorageNode
from kvpool.store.node_data import NodeDataHandler
from kvpool.tiers.types import Tier

SECRET = b"s" * 32


def dated(offset: int, size: int, stamp: bytes, *, tier: int = Tier.DRAM, key: bytes = b"k" * 16) -> Extent:
    expires = tokens.now_ms() + 60_000
    token = tokens.sign(SECRET, tokens.READ, 7, tier, offset, size, expires)
    return Extent(7, tier, offset, size, expires, token, key, stamp)


@pytest.fixture
def served(tmp_path):
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=1 << 20, ssd_path=str(tmp_path / "ssd"),
                                  ssd_bytes=4 << 20))
    handler = NodeDataHandler(node)
    handler.secret = SECRET
    server = DataServer(handler).start()
    client = DataClient(server.address, timeout=5)
    yield node, client
    client.close()
    server.close()
    node.close()


def test_the_stamp_is_the_nodes_and_moves_with_each_removal_it_is_told_of(served):
    node, client = served
    first = client.removal_stamp()
    assert len(first) == STAMP_BYTES and first == node.removal_stamp()
    assert first == bytes.fromhex(node.incarnation) + (0).to_bytes(8, "little")
    node.objects_removed()
    second = client.removal_stamp()
    assert second == bytes.fromhex(node.incarnation) + (1).to_bytes(8, "little") and second != first


def test_another_node_process_has_another_stamp(tmp_path):
    a = StorageNode(NodeConfig(node_id="n1", dram_bytes=1 << 16))
    b = StorageNode(NodeConfig(node_id="n1", dram_bytes=1 << 16))
    try:
        assert a.removal_stamp()[:8] != b.removal_stamp()[:8]    # 8 random bytes each: a restart never reuses one
        assert a.removal_stamp()[8:] == b.removal_stamp()[8:] == bytes(8)
    finally:
        a.close()
        b.close()


def test_a_window_of_dated_reads_serves_the_current_stamp_and_refuses_any_other(served):
    """DRAM extents and SSD records in one window, dated with the stamp now, an old one and another process's: the
    first are served byte-exact (hashed as they land), the others refused with NOT_FOUND and no payload, each with
    its own outcome; a plain READ in the same window is served as always."""
    node, client = served
    data = [bytes([i + 1]) * 4096 for i in range(6)]
    for i in range(3):
        node.write(Tier.DRAM, i * 4096, b"", b"", data[i], None)
        node.write(Tier.SSD, i * 8192, bytes([i]) * 16, bytes(16), data[3 + i], None)
    old = client.removal_stamp()
    node.objects_removed()
    now = client.removal_stamp()
    other = bytes(8) + now[8:]
    reads = [dated(0, 4096, now), dated(4096, 4096, old), dated(8192, 4096, now),
             dated(0, 4096, now, tier=Tier.SSD, key=bytes([0]) * 16), dated(8192, 4096, other, tier=Tier.SSD,
                                                                            key=bytes([1]) * 16),
             dated(16384, 4096, now, tier=Tier.SSD, key=bytes([2]) * 16)]
    outs = [bytearray(4096) for _ in reads]
    digests: list = [None] * len(reads)
    results = client.read_dated_into(reads, [memoryview(o) for o in outs], digests=digests)
    assert [r.status if r else None for r in results] == [None, NOT_FOUND, None, None, NOT_FOUND, None]
    assert all(results[i].message.startswith(STAMP_REFUSED) for i in (1, 4))
    want = {0: data[0], 2: data[2], 3: data[3], 5: data[5]}
    assert {i: bytes(outs[i]) for i in want} == want
    assert {i: digests[i] for i in want} == {i: xxhash.xxh3_64_intdigest(b) for i, b in want.items()}
    assert bytes(outs[1]) == bytes(outs[4]) == bytes(4096) and digests[1] is digests[4] is None   # nothing landed
    plain = bytearray(4096)
    assert client.read_many_into([dated(4096, 4096, old)], [memoryview(plain)]) == [None]   # READ: no date
    assert bytes(plain) == data[1]


def test_a_dated_read_still_needs_its_token(served):
    node, client = served
    node.write(Tier.DRAM, 0, b"", b"", b"x" * 4096, None)
    e = dated(0, 4096, client.removal_stamp())
    forged = Extent(e.ident, e.tier, e.offset, e.size, e.expires_ms, bytes(16), e.key, e.ns)
    [err] = client.read_dated_into([forged], [memoryview(bytearray(4096))])
    assert err is not None and err.message.startswith("token:")


class _Undated:
    """A handler from before dated reads: no removal_stamp."""

    def read_view(self, e):
        return memoryview(b"r" * e.size)

    def write_view(self, e):
        raise AssertionError("no writes here")

    def write_done(self, e, view):
        raise AssertionError("no writes here")


def test_a_node_without_stamps_refuses_both_frames_by_name_and_serves_on():
    server = DataServer(_Undated()).start()
    client = DataClient(server.address, timeout=5)
    try:
        with pytest.raises(DataChannelError) as info:
            client.removal_stamp()
        assert info.value.status == BAD_REQUEST and info.value.message.startswith("op:")
        [err] = client.read_dated_into([dated(0, 16, bytes(16))], [memoryview(bytearray(16))])
        assert err.status == BAD_REQUEST
        out = bytearray(16)
        assert client.read_many_into([dated(0, 16, bytes(16))], [memoryview(out)]) == [None] and out == b"r" * 16
        with socket.create_connection(client._addr, timeout=5) as sock:  # noqa: SLF001 - the node's data address
            sock.sendall(dated(0, 16, bytes(16)).header(OP_STAMP) + dated(0, 16, bytes(16)).header(OP_READ))
            status, msg_len, size = REP.unpack(sock.recv(REP.size, socket.MSG_WAITALL))
            assert (status, size) == (BAD_REQUEST, 0)
            sock.recv(msg_len, socket.MSG_WAITALL)
            assert REP.unpack(sock.recv(REP.size, socket.MSG_WAITALL)) == (OK, 0, 16)
            assert sock.recv(16, socket.MSG_WAITALL) == b"r" * 16
    finally:
        client.close()
        server.close()


def test_the_frame_ops_are_the_documented_numbers():
    assert (OP_READ, OP_READ_DATED, OP_STAMP) == (2, 3, 4)
