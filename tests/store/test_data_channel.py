"""The raw TCP data channel and its HMAC tokens, on a real loopback socket with a bytearray arena."""

from __future__ import annotations

import socket
import threading
import time
import tracemalloc

import pytest
import xxhash

from kvpool import copyhash
from kvpool.store import tokens
from kvpool.store.data_channel import (
    BAD_REQUEST,
    DENIED,
    NOT_FOUND,
    OK,
    OP_READ,
    OP_WRITE,
    REP,
    DataClient,
    DataServer,
    Extent,
    FileSpan,
)
from tests.faults.harness import wait_until

SECRET = b"s" * 32


class Arena:
    def __init__(self, size=1 << 20):
        self.buf = bytearray(size)
        self.done = []

    def _view(self, kind, e):
        tokens.verify(SECRET, kind, e.ident, e.tier, e.offset, e.size, e.expires_ms, e.token)
        if e.ident == 404:
            raise KeyError("lease_id: unknown lease 404")
        return memoryview(self.buf)[e.offset:e.offset + e.size]

    def write_view(self, e):
        return self._view(tokens.WRITE, e)

    def write_done(self, e, view):
        self.done.append((e.ident, e.key))

    def read_view(self, e):
        return self._view(tokens.READ, e)


def ext(kind, ident, offset, size, *, expires=None, secret=SECRET, key=b"k" * 16):
    expires = tokens.now_ms() + 60_000 if expires is None else expires
    return Extent(ident, 1, offset, size, expires, tokens.sign(secret, kind, ident, 1, offset, size, expires), key)


@pytest.fixture
def node():
    arena = Arena()
    server = DataServer(arena).start()
    client = DataClient(server.address, timeout=5)
    yield arena, client
    client.close()
    server.close()


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "server closed the connection"
        buf += chunk
    return bytes(buf)


def test_pipelined_writes_then_reads_are_byte_exact(node):
    arena, client = node
    payloads = [bytes([i]) * (1000 + i) for i in range(70)]  # more than one window of 32
    offsets = [i * 4096 for i in range(70)]
    writes = [ext(tokens.WRITE, i, offsets[i], len(p)) for i, p in enumerate(payloads)]
    assert client.write_many(writes, [memoryview(p) for p in payloads]) == [None] * 70
    assert [d[0] for d in arena.done] == list(range(70))
    outs = [bytearray(len(p)) for p in payloads]
    reads = [ext(tokens.READ, 7, offsets[i], len(p)) for i, p in enumerate(payloads)]
    assert client.read_many_into(reads, [memoryview(o) for o in outs]) == [None] * 70
    assert [bytes(o) for o in outs] == payloads
    digests = [None] * 71      # hashed as the bytes arrive: a refused read gets none
    outs = [bytearray(len(p)) for p in payloads] + [bytearray(100)]
    results = client.read_many_into(reads + [ext(tokens.READ, 404, 0, 100)], [memoryview(o) for o in outs],
                                    digests=digests)
    assert results[:70] == [None] * 70 and results[70].status == NOT_FOUND
    assert digests == [xxhash.xxh3_64_intdigest(p) for p in payloads] + [None]


def test_bad_tokens_are_refused_and_the_stream_goes_on(node):
    arena, client = node
    good = ext(tokens.WRITE, 1, 0, 100)
    forged = ext(tokens.WRITE, 2, 4096, 100, secret=b"x" * 32)
    stretched = Extent(good.ident, 1, 0, 200, good.expires_ms, good.token)  # same token, larger extent
    expired = ext(tokens.WRITE, 3, 8192, 100, expires=tokens.now_ms() - 1)
    read_as_write = ext(tokens.READ, 4, 0, 100)
    results = client.write_many([forged, stretched, expired, read_as_write, good],
                                [memoryview(b"F" * 100), memoryview(b"S" * 200), memoryview(b"E" * 100),
                                 memoryview(b"R" * 100), memoryview(b"G" * 100)])
    assert [r.status if r else None for r in results] == [DENIED, DENIED, DENIED, DENIED, None]
    assert results[0].message.startswith("token:") and results[2].message == "expires_unix_ms: grant expired"
    assert bytes(arena.buf[:200]) == b"G" * 100 + bytes(100) and bytes(arena.buf[4096:4196]) == bytes(100)
    out = bytearray(100)
    res = client.read_many_into([ext(tokens.READ, 404, 0, 100)], [memoryview(out)])
    assert res[0].status == NOT_FOUND and "lease_id" in res[0].message
    assert client.read_many_into([ext(tokens.READ, 5, 0, 100)], [memoryview(out)]) == [None] and out == b"G" * 100


def test_a_forged_write_header_makes_the_node_allocate_nothing_of_its_size(node):
    """Issue 11 item 8: a refused WRITE's payload used to be read into a buffer of the size the header announced, so
    four forged 64 MiB headers cost the node 256 MiB before any valid token was seen. It is now drained through one
    bounded scratch buffer. The server runs in this process, so tracemalloc sees its allocations."""
    arena, client = node
    size = 32 << 20
    forged = ext(tokens.WRITE, 9, 0, size, secret=b"x" * 32)
    good = ext(tokens.WRITE, 10, 0, 4)
    chunk = memoryview(bytes(1 << 20))
    with socket.create_connection(client._addr, timeout=10) as sock:  # noqa: SLF001 - the node's data address
        tracemalloc.start()
        try:
            sock.sendall(forged.header(OP_WRITE))
            for _ in range(size // len(chunk)):
                sock.sendall(chunk)
            status, msg_len, _ = REP.unpack(recv_exact(sock, REP.size))
            message = recv_exact(sock, msg_len).decode()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert (status, message.split(":")[0]) == (DENIED, "token")
        assert peak < 2 << 20, f"refusing a forged {size}-byte write allocated {peak} bytes"
        sock.sendall(good.header(OP_WRITE) + b"good")  # the same stream goes on
        assert REP.unpack(recv_exact(sock, REP.size)) == (OK, 0, 4)
    assert bytes(arena.buf[:4]) == b"good" and arena.done == [(10, b"k" * 16)]


def test_idle_connections_are_closed_by_the_node_and_clients_reconnect():
    """The node closes a connection silent for idle_timeout_s (mid-frame too); a client whose pooled connection the
    node closed drops it and dials again instead of failing the transfer."""
    arena = Arena()
    server = DataServer(arena, idle_timeout_s=0.3).start()
    client = DataClient(server.address, timeout=5)
    try:
        assert client.write_many([ext(tokens.WRITE, 1, 0, 4)], [memoryview(b"abcd")]) == [None]
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as half_open:
            half_open.sendall(b"KVD1")  # 4 of 88 header bytes, then silence
            started = time.monotonic()
            assert half_open.recv(1) == b""  # EOF: the node gave up on it
            assert time.monotonic() - started < 5
        wait_until(lambda: server.connections() == 0, 10, "the node to close the pooled connection too (same timeout)")
        out = bytearray(4)
        assert client.read_many_into([ext(tokens.READ, 2, 0, 4)], [memoryview(out)]) == [None] and out == b"abcd"
    finally:
        client.close()
        server.close()


def test_connections_past_the_bound_are_refused_at_accept():
    arena = Arena()
    server = DataServer(arena, max_connections=2).start()
    host, port = server.address.rsplit(":", 1)
    socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(3)]
    try:
        assert socks[2].recv(1) == b""  # the third is closed right away
        client = DataClient(server.address, timeout=5)
        socks[0].close()  # one slot frees up: a client gets in again
        wait_until(lambda: server.connections() < 2, 10, "a connection slot to free up")
        assert client.write_many([ext(tokens.WRITE, 1, 0, 4)], [memoryview(b"abcd")]) == [None]
        client.close()
        assert server.refused_connections == 1
    finally:
        for s in socks:
            s.close()
        server.close()


def _real_node(tmp_path):
    from kvpool.store.config import NodeConfig
    from kvpool.store.node import StorageNode
    from kvpool.store.node_data import NodeDataHandler

    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=1 << 20, ssd_path=str(tmp_path / "ssd"),
                                  ssd_bytes=4 << 20))
    handler = NodeDataHandler(node)
    handler.secret = SECRET
    return node, handler


def tiered(kind, ident, tier, offset, size, key=b"k" * 16, secret=SECRET):
    expires = tokens.now_ms() + 60_000
    return Extent(ident, tier, offset, size, expires, tokens.sign(secret, kind, ident, tier, offset, size, expires),
                  key)


def _window(node) -> tuple[list[bytes], list[Extent]]:
    """8 DRAM extents and 8 SSD records side by side on a real node, record 5's payload damaged at rest (one byte
    flipped), and a window reading them all with a forged-token read inserted at position 3."""
    from kvpool.tiers.types import Tier

    data = [bytes([i + 1]) * 4096 for i in range(16)]
    for i in range(8):
        node.write(Tier.DRAM, i * 4096, b"", b"", data[i], None)
        node.write(Tier.SSD, i * 8192, bytes([i]) * 16, bytes(16), data[8 + i], None)
    with open(node.ssd.path, "r+b") as raw:
        raw.seek(5 * 8192 + 4096 + 10)
        raw.write(b"\xff")
    reads = [tiered(tokens.READ, 1, Tier.DRAM, i * 4096, 4096) for i in range(8)]
    reads += [tiered(tokens.READ, 1, Tier.SSD, i * 8192, 4096, key=bytes([i]) * 16) for i in range(8)]
    reads.insert(3, tiered(tokens.READ, 1, Tier.DRAM, 0, 4096, secret=b"x" * 32))
    return data, reads


def test_a_window_of_reads_is_answered_in_one_sendmsg_each_read_with_its_own_outcome(tmp_path, monkeypatch):
    """A real node's handler (read_views): 8 DRAM extents and 8 SSD records side by side, one record corrupted, one
    read with a forged token and one past the SSD file's end, all in one window of reads whose client does not check
    the payload (no digests: no FLAG_CHECKED, as `verify="none"` or a client from before). The node answers them with
    one sendmsg and reads the records with one preadv per run, verifying each; every reply is the one its read would
    get alone."""
    from kvpool.tiers.types import Tier

    node, handler = _real_node(tmp_path)
    server = DataServer(handler).start()
    client = DataClient(server.address, timeout=5)
    sendmsgs, preadvs = [], []
    real_sendmsg, real_preadv = socket.socket.sendmsg, __import__("os").preadv
    try:
        data, reads = _window(node)
        outs = [bytearray(4096) for _ in reads]

        def counting_sendmsg(sock, buffers, *args):
            sendmsgs.append(len(buffers))
            return real_sendmsg(sock, buffers, *args)

        def counting_preadv(fd, buffers, offset):
            preadvs.append((offset, len(buffers)))
            return real_preadv(fd, buffers, offset)

        def traced_records(*args, **kwargs):     # the C record reader's preadv calls (tiers/ssd.py reads with it)
            return real_records(*args, **kwargs, trace=preadvs)

        real_records = copyhash.read_records
        monkeypatch.setattr(socket.socket, "sendmsg", counting_sendmsg)
        monkeypatch.setattr(__import__("os"), "preadv", counting_preadv)
        monkeypatch.setattr(copyhash, "read_records", traced_records)
        results = client.read_many_into(reads, [memoryview(o) for o in outs])
        statuses = [r.status if r else None for r in results]
        assert statuses == [None] * 3 + [DENIED] + [None] * 10 + [NOT_FOUND] + [None] * 2
        assert results[14].message == "checksum: SSD record failed verification (served as a miss)"
        good = [i for i, s in enumerate(statuses) if s is None]
        assert [bytes(outs[i]) for i in good] == [data[j] for j in range(16) if j != 13]
        assert sendmsgs == [17 + 15]            # 17 replies, 15 with a payload: one sendmsg
        assert handler.file_reads == 0 and node.ssd.corrupt_reads == 1
        assert preadvs == [(0, 24)]             # 8 records side by side: one preadv (3 buffers each)
        # a record past the file's end (the master never signs one) fails the batch's checks: each record is then
        # read alone, for its own outcome
        sendmsgs.clear()
        preadvs.clear()
        reads = [reads[9], tiered(tokens.READ, 1, Tier.SSD, 4 << 20, 4096, key=b"z" * 16), reads[10]]
        outs = [bytearray(4096) for _ in reads]
        results = client.read_many_into(reads, [memoryview(o) for o in outs])
        assert [r.status if r else None for r in results] == [None, BAD_REQUEST, None]
        assert results[1].message.startswith("offset")
        assert [bytes(outs[0]), bytes(outs[2])] == [data[8], data[9]]
        assert sendmsgs == [3 + 2] and preadvs == [(0, 3), (8192, 3)]
    finally:
        client.close()
        server.close()
        node.close()


def test_checked_reads_get_ssd_payloads_from_the_file_and_the_client_hash_catches_damage(tmp_path, monkeypatch):
    """The same window with digests (FLAG_CHECKED: the client checks each payload against its committed checksum).
    The node checks each SSD record's header only and sends its payload with os.sendfile: no preadv, no hash of its
    own. A payload damaged at rest arrives as it is on disk and its digest is not the committed one (the client's
    miss); a header that does not name the key read is the node's NOT_FOUND, as before; everything else is exact."""
    from kvpool.tiers.types import Tier

    node, handler = _real_node(tmp_path)
    server = DataServer(handler).start()
    client = DataClient(server.address, timeout=5)
    sendfiles, preadvs = [], []
    os_mod = __import__("os")
    real_sendfile, real_preadv = os_mod.sendfile, os_mod.preadv
    try:
        data, reads = _window(node)
        damaged = bytearray(data[13])
        damaged[10] = 0xFF
        reads[1 + 8 + 6] = tiered(tokens.READ, 1, Tier.SSD, 6 * 8192, 4096, key=b"w" * 16)  # record 6, another key
        outs = [bytearray(4096) for _ in reads]
        digests = [None] * len(reads)

        def counting_sendfile(out_fd, in_fd, offset, count):
            sendfiles.append((offset, count))
            return real_sendfile(out_fd, in_fd, offset, count)

        def counting_preadv(fd, buffers, offset):
            preadvs.append((offset, len(buffers)))
            return real_preadv(fd, buffers, offset)

        monkeypatch.setattr(os_mod, "sendfile", counting_sendfile)
        monkeypatch.setattr(os_mod, "preadv", counting_preadv)
        real_records = copyhash.read_records
        monkeypatch.setattr(copyhash, "read_records", lambda *a, **k: pytest.fail("the node read a payload"))
        results = client.read_many_into(reads, [memoryview(o) for o in outs], digests=digests)
        statuses = [r.status if r else None for r in results]
        assert statuses == [None] * 3 + [DENIED] + [None] * 11 + [NOT_FOUND] + [None]
        assert results[15].message == "checksum: SSD record header failed verification (served as a miss)"
        good = [i for i, s in enumerate(statuses) if s is None and i != 14]
        want = [data[j] for j in range(16) if j not in (13, 14)]
        assert [bytes(outs[i]) for i in good] == want
        assert [digests[i] for i in good] == [xxhash.xxh3_64_intdigest(w) for w in want]
        assert bytes(outs[14]) == bytes(damaged)           # sent as it is on disk; the client's hash says so
        assert digests[14] == xxhash.xxh3_64_intdigest(bytes(damaged)) != xxhash.xxh3_64_intdigest(data[13])
        assert sendfiles == [(i * 8192 + 4096, 4096) for i in (0, 1, 2, 3, 4, 5, 7)]
        assert preadvs == []
        assert handler.file_reads == 7 and node.ssd.corrupt_reads == 1      # the header that named another key
        # a record past the file's end (the master never signs one) in a checked window: the batch is read staged,
        # as an unchecked one is, so each record gets its own outcome
        monkeypatch.setattr(copyhash, "read_records", real_records)
        sendfiles.clear()
        reads = [reads[9], tiered(tokens.READ, 1, Tier.SSD, 4 << 20, 4096, key=b"z" * 16), reads[10]]
        outs = [bytearray(4096) for _ in reads]
        results = client.read_many_into(reads, [memoryview(o) for o in outs], digests=[None] * 3)
        assert [r.status if r else None for r in results] == [None, BAD_REQUEST, None]
        assert results[1].message.startswith("offset")
        assert [bytes(outs[0]), bytes(outs[2])] == [data[8], data[9]]
        assert sendfiles == [] and handler.file_reads == 7
    finally:
        client.close()
        server.close()
        node.close()


def test_a_file_span_that_cannot_be_sent_whole_closes_its_connection_and_the_next_is_served(tmp_path):
    """A FileSpan's reply header promises its size before os.sendfile runs: a file that ends early (or fails) can
    only close the connection, which the client sees mid-frame (OSError), never as short or padded bytes. The
    server goes on serving; a read without FLAG_CHECKED is never answered from the file."""
    import os

    path = tmp_path / "short"
    path.write_bytes(b"s" * 1000)
    fd = os.open(path, os.O_RDONLY)

    class Spans:
        def write_view(self, e):
            raise ValueError("no writes here")

        def write_done(self, e, view):
            pass

        def read_view(self, e):
            return self.read_views([e])[0]

        def read_views(self, extents, checked=()):
            return [FileSpan(fd, 0, e.size) if k in checked else memoryview(b"v" * e.size)
                    for k, e in enumerate(extents)]

    server = DataServer(Spans()).start()
    client = DataClient(server.address, timeout=5)
    try:
        out, digests = bytearray(1000), [None]
        assert client.read_many_into([Extent(1, 1, 0, 1000, 0, bytes(16))], [memoryview(out)], digests=digests) \
            == [None]
        assert bytes(out) == b"s" * 1000 and digests == [xxhash.xxh3_64_intdigest(b"s" * 1000)]
        with pytest.raises(OSError):
            client.read_many_into([Extent(1, 1, 0, 4096, 0, bytes(16))], [memoryview(bytearray(4096))],
                                  digests=[None])
        out = bytearray(10)
        assert client.read_many_into([Extent(1, 1, 0, 10, 0, bytes(16))], [memoryview(out)]) == [None]
        assert bytes(out) == b"v" * 10
    finally:
        client.close()
        server.close()
        os.close(fd)


def test_frames_that_arrive_together_are_each_parsed_whole(node):
    """The node reads requests in bulk: a WRITE's payload may arrive in the same read as its header and the next
    frames (a refused one's too); every byte is the frame's it belongs to, replies in order."""
    arena, client = node
    good = ext(tokens.WRITE, 1, 0, 5000)
    forged = ext(tokens.WRITE, 2, 8192, 3000, secret=b"x" * 32)
    read = ext(tokens.READ, 3, 0, 5000)
    again = ext(tokens.WRITE, 4, 16384, 7)
    with socket.create_connection(client._addr, timeout=10) as sock:  # noqa: SLF001 - the node's data address
        sock.sendall(good.header(OP_WRITE) + b"A" * 5000 + forged.header(OP_WRITE) + b"F" * 3000
                     + read.header(2) + again.header(OP_WRITE) + b"again!!")
        assert REP.unpack(recv_exact(sock, REP.size)) == (OK, 0, 5000)
        status, msg_len, size = REP.unpack(recv_exact(sock, REP.size))
        assert (status, size, recv_exact(sock, msg_len).decode().split(":")[0]) == (DENIED, 0, "token")
        assert REP.unpack(recv_exact(sock, REP.size)) == (OK, 0, 5000)
        assert recv_exact(sock, 5000) == b"A" * 5000
        assert REP.unpack(recv_exact(sock, REP.size)) == (OK, 0, 7)
        sock.sendall(b"JUNK" + bytes(84))                       # not a frame: refused, then closed
        status, msg_len, _ = REP.unpack(recv_exact(sock, REP.size))
        assert (status, recv_exact(sock, msg_len)) == (2, b"magic/op: not a kvpool data frame")
        assert sock.recv(1) == b""
    assert bytes(arena.buf[8192:11192]) == bytes(3000) and bytes(arena.buf[16384:16391]) == b"again!!"
    assert arena.done == [(1, b"k" * 16), (4, b"k" * 16)]


def test_reads_answered_together_stop_at_a_mebibyte(tmp_path, monkeypatch):
    """Six 256 KiB reads in one window: answered four (1 MiB) then two, so a node reading SSD records sends the first
    replies while it reads the next instead of reading the whole window first."""
    from kvpool.tiers.types import Tier

    node, handler = _real_node(tmp_path)
    server = DataServer(handler).start()
    client = DataClient(server.address, timeout=5)
    sendmsgs, real_sendmsg = [], socket.socket.sendmsg
    try:
        size = 256 << 10
        for i in range(4):
            node.write(Tier.DRAM, i * size, b"", b"", bytes([i + 7]) * size, None)
        reads = [tiered(tokens.READ, 1, Tier.DRAM, (i % 4) * size, size) for i in range(6)]
        outs = [bytearray(size) for _ in reads]

        def counting_sendmsg(sock, buffers, *args):
            sendmsgs.append(len(buffers))
            return real_sendmsg(sock, buffers, *args)

        monkeypatch.setattr(socket.socket, "sendmsg", counting_sendmsg)
        assert client.read_many_into(reads, [memoryview(o) for o in outs]) == [None] * 6
        assert [bytes(o) for o in outs] == [bytes([i % 4 + 7]) * size for i in range(6)]
        assert sendmsgs[0] == 8     # the first 4 replies together (all 6 would be 12 parts); then the other 2
    finally:
        client.close()
        server.close()
        node.close()


def test_a_large_read_is_received_in_pieces_of_at_most_recv_piece(node, monkeypatch):
    from kvpool.store import sockets

    arena, client = node
    payload = bytes(range(256)) * (600 * 4)      # 600 KiB: more than four pieces
    assert client.write_many([ext(tokens.WRITE, 1, 0, len(payload))], [memoryview(payload)]) == [None]
    asked = []
    real = socket.socket.recv_into

    def recv_into(self, buffer, nbytes=0, flags=0):
        asked.append(nbytes or len(buffer))
        return real(self, buffer, nbytes, flags)

    monkeypatch.setattr(socket.socket, "recv_into", recv_into)
    out, digests = bytearray(len(payload)), [None]
    assert client.read_many_into([ext(tokens.READ, 1, 0, len(payload))], [memoryview(out)], digests=digests) == [None]
    assert bytes(out) == payload and digests == [xxhash.xxh3_64_intdigest(payload)]
    assert max(asked) == sockets.RECV_PIECE == 128 << 10
    assert sum(1 for n in asked if n == sockets.RECV_PIECE) >= len(payload) // sockets.RECV_PIECE


class StalledArena(Arena):
    """A node whose handler hangs until released (a stalled node process: alive, its socket open, answering nothing)."""

    def __init__(self, size=1 << 20):
        super().__init__(size)
        self.entered = threading.Event()
        self.release = threading.Event()

    def _stall(self):
        self.entered.set()
        assert self.release.wait(30)

    def read_view(self, e):
        if not self.release.is_set():
            self._stall()
        return super().read_view(e)

    def write_view(self, e):
        if not self.release.is_set():
            self._stall()
        return super().write_view(e)


def test_a_stalled_node_makes_a_read_raise_timeout_error_and_its_connection_is_never_reused():
    """The client's sockets block in the kernel (store/sockets.py kernel_timeouts), so a node that stops answering must
    still raise TimeoutError (not hang, not another OSError: the write path maps it to PoolTimeout), and the timed-out
    connection must be closed: reused, the next read would get the stalled read's late reply (other bytes)."""
    arena = StalledArena()
    arena.buf[0:4], arena.buf[8:12] = b"AAAA", b"BBBB"
    server = DataServer(arena).start()
    client = DataClient(server.address, timeout=0.3)
    try:
        with pytest.raises(TimeoutError, match=r"^data channel 127\.0\.0\.1:\d+: no progress in 0\.3s$"):
            client.read_many_into([ext(tokens.READ, 2, 0, 4)], [memoryview(bytearray(4))])
        assert arena.entered.is_set()
        arena.release.set()    # the stalled read is answered now, on a connection the client has closed
        out = bytearray(4)
        assert client.read_many_into([ext(tokens.READ, 3, 8, 4)], [memoryview(out)]) == [None]
        assert out == b"BBBB"
    finally:
        arena.release.set()
        client.close()
        server.close()


def test_a_node_that_stops_reading_makes_a_large_write_raise_timeout_error():
    """64 MiB is more than both loopback socket buffers hold, so the client's send blocks until its kernel timeout."""
    arena = StalledArena()
    server = DataServer(arena, max_object_bytes=128 << 20).start()
    client = DataClient(server.address, timeout=0.3)
    size = 64 << 20
    try:
        with pytest.raises(TimeoutError, match=r"no progress in 0\.3s$"):
            client.write_many([ext(tokens.WRITE, 1, 0, size)], [memoryview(bytearray(size))])
        assert arena.entered.is_set() and arena.done == []
    finally:
        arena.release.set()
        client.close()
        server.close()


def test_a_client_that_stops_receiving_a_large_read_loses_its_connection_and_the_node_serves_on():
    """The node's send blocks in the kernel too: a reader that asks for 32 MiB and never receives is cut off after
    idle_timeout_s (its connection thread ends), and a well-behaved client is served after it."""
    size = 32 << 20
    arena = Arena(size)
    arena.buf[:4] = b"late"
    server = DataServer(arena, idle_timeout_s=0.3).start()
    client = DataClient(server.address, timeout=5)
    host, port = server.address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as greedy:
            greedy.sendall(ext(tokens.READ, 1, 0, size).header(OP_READ))   # then never receives
            wait_until(lambda: server.connections() == 1, 10, "the greedy reader's connection")
            wait_until(lambda: server.connections() == 0, 10, "the node to give up on it (its send made no progress)")
        out = bytearray(4)
        assert client.read_many_into([ext(tokens.READ, 2, 0, 4)], [memoryview(out)]) == [None] and out == b"late"
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("stale", ["re-registered", "expired"])
def test_a_staged_write_whose_grant_goes_stale_while_its_bytes_arrive_writes_nothing(tmp_path, stale):
    """A real node's handler: an SSD record is written only once its last byte is in, and its token is checked again
    then. Its header passes; before the rest of its payload arrives the node registers afresh (a new key: the master
    now places that extent from scratch, store/tokens.py) or the grant expires (then the node's write fence refuses
    it at the deadline, store/write_fence.py, dropping the bytes that come after). The write is refused with
    PERMISSION_DENIED, nothing lands on the SSD file, and the same write with a good grant then goes through."""
    from kvpool.tiers.types import Tier

    node, handler = _real_node(tmp_path)
    verified = threading.Event()
    real_write_view = handler.write_view

    def write_view(e):
        view = real_write_view(e)
        verified.set()
        return view

    handler.write_view = write_view
    server = DataServer(handler).start()
    size, key = 8192, b"r" * 16
    payload = bytes(range(256)) * (size // 256)
    expires = tokens.now_ms() + (300 if stale == "expired" else 60_000)
    e = Extent(9, Tier.SSD, 0, size, expires, tokens.sign(SECRET, tokens.WRITE, 9, Tier.SSD, 0, size, expires), key)
    try:
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(e.header(OP_WRITE) + payload[:100])
            assert verified.wait(5)
            if stale == "re-registered":
                handler.secret = b"n" * 32
            else:
                wait_until(lambda: tokens.now_ms() > expires, 5, "the grant to expire")
            sock.sendall(payload[100:])
            status, msg_len, _ = REP.unpack(recv_exact(sock, REP.size))
            message = recv_exact(sock, msg_len).decode()
        assert status == DENIED
        assert message == ("token: does not match the grant (forged, or offset/size/tier/expiry altered)"
                           if stale == "re-registered" else
                           "expires_unix_ms: grant expired before its bytes all arrived (nothing of it counts)")
        assert node.scan_ssd() == []
        secret = handler.secret
        good = tokens.now_ms() + 60_000
        client = DataClient(server.address, timeout=5)
        try:
            assert client.write_many([Extent(10, Tier.SSD, 0, size, good, tokens.sign(
                secret, tokens.WRITE, 10, Tier.SSD, 0, size, good), key)], [memoryview(payload)]) == [None]
        finally:
            client.close()
        assert [r.key for r in node.scan_ssd()] == [key]
        out = bytearray(size)
        assert node.read_into(Tier.SSD, 0, key, size, out) and bytes(out) == payload
    finally:
        server.close()
        node.close()


def test_write_grants_are_checked_with_the_registration_s_write_key_where_the_master_gave_one(tmp_path):
    """A real node's handler: with a write key (RegisterNodeResponse.write_key) a write grant must be signed with it,
    never with the secret; reads stay the secret's. Without one (a master from before), both are the secret's."""
    from kvpool.tiers.types import Tier

    node, handler = _real_node(tmp_path)
    try:
        for write_key in (b"w" * 32, b""):
            handler.write_key = write_key
            signs_writes = write_key or SECRET
            for kind, good in ((tokens.WRITE, signs_writes), (tokens.READ, SECRET)):
                attempt = handler.write_view if kind == tokens.WRITE else handler.read_view
                assert len(attempt(tiered(kind, 1, Tier.DRAM, 0, 4096, secret=good))) == 4096
                for bad in {SECRET, b"w" * 32} - {good}:
                    with pytest.raises(tokens.TokenError, match="does not match"):
                        attempt(tiered(kind, 1, Tier.DRAM, 0, 4096, secret=bad))
    finally:
        node.close()
