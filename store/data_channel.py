"""The raw TCP data channel between clients and a storage node: bulk bytes without gRPC framing.

bench/data_channel.py measured this against gRPC streaming (README "Distributed pool"): gRPC copies each
payload into and out of protobuf messages and chunks; here a write is `recv_into` straight into the node's
arena view and a read is one `sendall` of the arena view into the client's own buffer (`recv_into`).

Frame (little endian), one request header then, for writes, `size` payload bytes:

    offset 0   4s  magic b"KVD1"
           4   B   op        1 = WRITE, 2 = READ
           5   B   tier
           6   H   flags     FLAG_CHECKED (reads); 0 otherwise (a node from before 2026-12-07 ignores it)
           8   Q   id        grant_id (WRITE) / lease_id (READ)
          16   Q   offset    within the tier
          24   Q   size
          32   Q   expires_unix_ms
          40  16s  token     store/tokens.py
          56  16s  key       block key (SSD records carry it in their header; a read checks it)
          72  16s  ns        namespace digest (written into an SSD record header)
    = 88 bytes

Reply: `B status, 3x, I msg_len, Q size` (16 bytes), then msg_len bytes of UTF-8 error text, then for an OK READ
`size` payload bytes. Requests on one connection are answered in order, so a client pipelines a window of them.
The node reads request bytes in bulk and answers the READs it finds one after another together (its handler's
`read_views`: SSD records side by side in one preadv), all their replies in one sendmsg; the bytes on the wire are
the same as one reply at a time. Measured 2026-11-28 on the 2-core box (DataClient against a node process, 32-read
windows of 64 KiB DRAM extents, verified as they land): 24.9 us per read against 53.0 us reading and answering one
frame at a time (a recv per 88-byte header, a sendmsg per reply): 2.64 against 1.24 GB/s.
A rejected WRITE's payload is still consumed (up to `max_object_bytes`, else the connection is closed), so one
bad grant does not break the stream for the others. It is read into one bounded scratch buffer and dropped: a forged
header makes the node allocate nothing of its announced size (the token is checked before any payload byte lands).

Dated reads (a TCP client's location cache, kvpool/locations.py): `op` 4 = STAMP asks for the node's *removal
stamp*, answered OK with 16 payload bytes: 8 random bytes drawn when the node process started, then a u64 counting
the removals the master told it of (and its registrations, store/node.py). `op` 3 = READ_DATED is a READ whose `ns`
field carries the stamp its location was dated with: the node answers it as a READ while that is still its stamp,
else NOT_FOUND with a message starting "stamp:" and no payload (it removed objects since, or it is another process).
A node whose handler has no stamp answers both with INVALID_ARGUMENT and goes on with the stream.

Checked reads (2026-12-07): a client that hashes a READ's payload as it lands and checks it against the object's
committed xxh3_64 (kvpool/transfer.py, `verify` other than "none") sets FLAG_CHECKED. The node may then answer an SSD
record from the file itself: it checks the record's header (key, size, header sum) and sends the payload with
`os.sendfile` (a `FileSpan` from the handler's `read_views`), with no staging copy and no hash of its own; a
payload damaged at rest is the client's checksum miss, reported to the master as the node's would be. Measured
2026-12-07 on the 2-core box (`bench/ab.py --rounds 3` of `bench/ssd_read.py --rounds 3`, its TCP column against
the disk's sequential read, page cache dropped), before / after: 512 KiB 0.62x, 0.73x, 0.65x / 1.08x, 0.82x, 0.90x;
2 MiB 0.75x, 0.78x, 0.64x / 1.31x, 0.83x, 0.92x; 64 KiB 0.50-0.52x / 0.40-0.55x (no change: per-record costs on
both ends bound it, not the copy). From the page cache, 2 MiB reads went 2.1-2.8 -> 5.0-6.2 GB/s (a scratch run).
Without the flag (an old client, `verify="none"`), or over TLS (an SSLSocket has no sendfile), the node reads and
verifies the record as before.

Bounds: at most `max_connections` connections are served at once (one thread each; more are closed at accept), and a
connection that sends nothing for `idle_timeout_s` (between requests or mid-frame: a half-open or stalled peer) is
closed, so no peer holds a thread forever. Clients drop pooled connections the node closed (readable while idle) or
that sat idle longer than `max_idle_s`, before they reuse one. Both ends leave plaintext sockets blocking and let the
kernel keep these timeouts (store/sockets.py `kernel_timeouts`: Python's own timeouts poll before every call and
cost 9-26% of a read); a client's stalled read or write raises TimeoutError.

TLS (optional, store/tls.py builds the contexts): `DataServer(ssl_context=...)` wraps each accepted connection
(the handshake runs on the connection's thread with a deadline, so a silent peer cannot stall the accept loop);
`DataClient(ssl_context=...)` wraps each connection it opens and checks the node's certificate against the address
it dials (or `server_hostname`). The frames are the same; only the reply of a READ is sent as two writes (an
SSLSocket has no sendmsg). Without a context the code path is the plaintext one, unchanged.

One module of ~540 lines because it is one concept, the wire protocol: the frame layout, the server that answers it
and the client that speaks it change together.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import xxhash

from kvpool.store.sockets import (ConnectionPool, RecvTimeout, ThreadedServer, kernel_timeouts, recv_exact,
                                  tune_socket)
from kvpool.store.tokens import TokenError
from kvpool.store.write_fence import EXPIRED_MID_WRITE, Landing, WriteFence, receive

log = logging.getLogger(__name__)

MAGIC = b"KVD1"
OP_WRITE = 1
OP_READ = 2
OP_READ_DATED = 3   # a READ naming the removal stamp its location was dated with (in the `ns` field)
OP_STAMP = 4        # the node's removal stamp: OK with STAMP_BYTES payload bytes
_READ_OPS = (OP_READ, OP_READ_DATED, OP_STAMP)
STAMP_BYTES = 16
STAMP_REFUSED = "stamp:"    # how a refused dated read's message starts
FLAG_CHECKED = 1    # on a READ whose reader hashes the payload against the committed checksum itself
REQ = struct.Struct("<4sBBHQQQQ16s16s16s")
REP = struct.Struct("<B3xIQ")
OK, DENIED, BAD_REQUEST, NOT_FOUND, ERROR = 0, 1, 2, 3, 4
STATUS_NAMES = {OK: "OK", DENIED: "PERMISSION_DENIED", BAD_REQUEST: "INVALID_ARGUMENT", NOT_FOUND: "NOT_FOUND",
                ERROR: "INTERNAL"}
_WINDOW = 32  # requests in flight per connection: 32 headers always fit a socket buffer, so no send/recv deadlock
_DISCARD_CHUNK = 256 << 10  # scratch for the payload of a refused WRITE (the only buffer a refusal costs)
_INBOX_BYTES = 64 << 10     # a connection's buffer of request bytes not parsed yet (headers, a WRITE's first bytes)
_SERVE_BATCH = 64           # READ frames answered together at most (a client's window is 32)
_BATCH_BYTES = 1 << 20      # ... and the bytes they ask for: an SSD record is read while the previous replies are
                            # on their way (answering a window of 2 MiB records together, read all then send all, cost
                            # a third of an SSD get over TCP: 1.76 -> 1.22 GB/s at 512 KiB, bench/ssd_read.py)
_IOV_MAX = 1024             # Linux: buffers one sendmsg may take


class DataHandler(Protocol):
    """What the channel asks of a node. Raise TokenError (denied), ValueError (bad request), KeyError (gone).

    Optionally `read_views(extents, checked=()) -> list[memoryview | FileSpan | Exception]`: `read_view` of each
    (the exception it would raise in place of a view), all valid together until the next call on the same thread;
    the server then answers the READs it finds one after another with one sendmsg (store/node_data.py's handler has
    it). For the positions in `checked` (reads whose client checks the payload: FLAG_CHECKED, on a plaintext
    connection) it may answer a `FileSpan` instead of a view: the server sends it with os.sendfile. Optionally
    `removal_stamp() -> bytes` (STAMP_BYTES): with it the node answers STAMP and READ_DATED frames. Optionally
    `write_fence` (store/write_fence.py WriteFence): with it each write is a landing of the fence, its payload
    received piece by piece under the landing's checks (none after the grant's deadline, none once cut)."""

    def write_view(self, e: "Extent") -> memoryview: ...

    def write_done(self, e: "Extent", view: memoryview) -> None: ...

    def read_view(self, e: "Extent") -> memoryview:
        """The extent's bytes, valid until the next read_view on the same thread (the channel sends them first)."""
        ...


@dataclass(slots=True, frozen=True)
class FileSpan:
    """A READ's payload as `size` bytes of an open file at `offset` (an SSD record's payload, its header checked):
    the server sends it with os.sendfile, straight from the page cache, and the client's hash is its check."""

    fd: int
    offset: int
    size: int


class DataChannelError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{STATUS_NAMES.get(status, status)}: {message}")
        self.status = status
        self.message = message


def _discard(sock: socket.socket, size: int, scratch: memoryview, timeout: RecvTimeout | None = None) -> None:
    while size:
        try:
            k = sock.recv_into(scratch, min(size, len(scratch)))
        except (BlockingIOError, TimeoutError):
            if timeout is not None and timeout.timed_out():     # a write had lowered it (store/write_fence.py)
                continue
            raise
        if k == 0:
            raise ConnectionError("peer closed the connection mid-frame")
        size -= k


def _send_replies(sock: socket.socket, parts: list) -> None:
    """`_send_parts` of the parts between FileSpans, each FileSpan sent with os.sendfile after the parts before it.
    A span that cannot be sent whole (an I/O error, the file shorter than the span) raises ConnectionError: its
    reply's header is out, so the only honest end is to close the connection (the client sees it mid-frame)."""
    start = 0
    for at, part in enumerate(parts):
        if type(part) is not FileSpan:
            continue
        if at > start:
            _send_parts(sock, parts[start:at])
        start = at + 1
        offset, left = part.offset, part.size
        while left:
            try:
                sent = os.sendfile(sock.fileno(), part.fd, offset, left)
            except OSError as exc:      # the disk, or the peer (a stalled one: the kernel's send timeout)
                raise ConnectionError(f"sendfile of {part.size} bytes at {part.offset} failed: {exc}") from exc
            if sent == 0:
                raise ConnectionError(f"sendfile of {part.size} bytes at {part.offset}: the file ended early")
            offset += sent
            left -= sent
    if start < len(parts):
        _send_parts(sock, parts[start:])


def _send_parts(sock: socket.socket, parts: list) -> None:
    """Replies' headers and payloads in as few sendmsg calls as the socket takes (one syscall, one segment train,
    in the common case), finishing any partial send."""
    at = 0
    while at < len(parts):
        sent = sock.sendmsg(parts[at:at + _IOV_MAX])
        while at < len(parts) and sent >= len(parts[at]):
            sent -= len(parts[at])
            at += 1
        if sent:                        # a part sent in part: the rest of it alone, then on
            sock.sendall(memoryview(parts[at])[sent:])
            at += 1


class _Inbox:
    """What a connection sent that the server has not parsed yet: request headers are read in bulk (recv_into of
    up to 64 KiB), so a pipelined window of them costs one syscall, not one per frame."""

    def __init__(self, conn: socket.socket, timeout: RecvTimeout) -> None:
        self.conn = conn
        self.timeout = timeout
        self.buf = bytearray(_INBOX_BYTES)
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0

    def has(self, n: int) -> bool:
        return self.end - self.start >= n

    def need(self, n: int) -> None:
        """Block until `n` unparsed bytes are here (ConnectionError at EOF)."""
        if self.end - self.start >= n:
            return
        if self.start:                  # keep the unparsed tail at the front
            left = self.end - self.start
            self.view[:left] = self.view[self.start:self.end]
            self.start, self.end = 0, left
        while self.end < n:
            try:
                k = self.conn.recv_into(self.view[self.end:])
            except (BlockingIOError, TimeoutError):
                if self.timeout.timed_out():    # a write had lowered it (store/write_fence.py): wait on
                    continue
                raise
            if k == 0:
                raise ConnectionError("peer closed the connection" + (" mid-frame" if self.end else ""))
            self.end += k

    def take_into(self, view: memoryview | None, n: int) -> int:
        """Up to `n` unparsed bytes (a WRITE's payload that arrived with its header) into `view` (None: dropped);
        returns how many."""
        k = min(n, self.end - self.start)
        if k and view is not None:
            view[:k] = self.view[self.start:self.start + k]
        self.start += k
        return k


class DataServer(ThreadedServer):
    """Threaded server: one thread per connection (connections are few and long-lived: one pool per client)."""

    def __init__(self, handler: DataHandler, host: str = "127.0.0.1", port: int = 0, *,
                 max_object_bytes: int = 64 << 20, ssl_context: ssl.SSLContext | None = None,
                 handshake_timeout_s: float = 10.0, idle_timeout_s: float = 60.0, max_connections: int = 256):
        super().__init__(host, port, what="data", max_connections=max_connections, ssl_context=ssl_context,
                         handshake_timeout_s=handshake_timeout_s)
        self.handler = handler
        self.fence: WriteFence | None = getattr(handler, "write_fence", None)
        self.max_object_bytes = max_object_bytes
        self.idle_timeout_s = idle_timeout_s

    def serve(self, conn: socket.socket) -> None:
        """Answer one connection's frames in order. Request headers are read in bulk (a client pipelines a window of
        them): the READs found one after another in what arrived are answered together, their replies in one
        sendmsg (with a handler that has `read_views`; one at a time otherwise)."""
        tls = isinstance(conn, ssl.SSLSocket)
        kernel_timeouts(conn, self.idle_timeout_s)  # a silent peer (between requests or mid-frame) loses its connection
        read_views = getattr(self.handler, "read_views", None)
        inbox = _Inbox(conn, RecvTimeout(conn, self.idle_timeout_s))
        scratch: memoryview | None = None
        try:
            while True:
                try:
                    inbox.need(REQ.size)
                except (ConnectionError, OSError):
                    return
                frames, nbytes = [], 0
                while len(frames) < _SERVE_BATCH and nbytes < _BATCH_BYTES and inbox.has(REQ.size):
                    fields = REQ.unpack_from(inbox.buf, inbox.start)
                    if fields[1] not in _READ_OPS or fields[0] != MAGIC or (frames and read_views is None):
                        break
                    frames.append((fields[1], fields[3], Extent(fields[4], fields[2], *fields[5:])))
                    nbytes += fields[6]
                    inbox.start += REQ.size
                if frames:
                    self._answer_reads(conn, frames, read_views, tls)
                    continue
                magic, op, tier, _flags, ident, offset, size, expires, token, key, ns = REQ.unpack_from(inbox.buf,
                                                                                                     inbox.start)
                inbox.start += REQ.size
                e = Extent(ident, tier, offset, size, expires, token, key, ns)
                if magic != MAGIC or op != OP_WRITE:
                    self._reply(conn, BAD_REQUEST, "magic/op: not a kvpool data frame")
                    return
                landing = None
                try:
                    if self.fence is not None:
                        landing = self.fence.begin(expires, conn)
                    view = self.handler.write_view(e)
                except Exception as exc:  # noqa: BLE001 - every refusal is reported, the stream continues
                    if landing is not None:
                        self.fence.end(landing)
                    if size > self.max_object_bytes:
                        self._reply(conn, _status_of(exc), str(exc))
                        return
                    if scratch is None:
                        scratch = memoryview(bytearray(_DISCARD_CHUNK))
                    _discard(conn, size - inbox.take_into(None, size), scratch, inbox.timeout)
                    self._reply(conn, _status_of(exc), str(exc))
                    continue
                try:
                    refused = self._land(conn, inbox, e, view, landing)
                finally:
                    if landing is not None:
                        self.fence.end(landing)
                if refused is not None:
                    self._reply(conn, _status_of(refused), str(refused))
                    continue
                self._reply(conn, OK, "", size)
        except (ConnectionError, OSError) as exc:
            log.debug("data connection ended: %s", exc)

    def _land(self, conn: socket.socket, inbox: "_Inbox", e: Extent, view: memoryview,
              landing: Landing | None) -> Exception | None:
        """A granted write's payload into `view`, then the handler's `write_done`; returns the refusal to answer
        (its payload consumed all the same), or None. With the handler's `write_fence`, the payload lands holding
        the landing's lock and only while its grant holds (store/write_fence.py): past the deadline the rest is read
        and dropped."""
        size = e.size
        if landing is None:
            got = inbox.take_into(view, size)
            if got < size:
                recv_exact(conn, view[got:])
            try:
                self.handler.write_done(e, view)
            except Exception as exc:  # noqa: BLE001 - reported, the stream continues
                return exc
            return None
        refused = None
        with landing.lock:  # each piece after a look at the clock (and `receive`'s at the cut flag: a cut waits
            # for this lock): a payload that is all in landed in time, and `write_done` (a staged write's landing)
            # needs no check of its own
            got = inbox.take_into(view, size) if landing.deadline > time.time() and not landing.cut else 0
            if got < size:
                got += receive(conn, view[got:], landing, inbox.timeout)
            if got == size:
                try:
                    self.handler.write_done(e, view)
                except Exception as exc:  # noqa: BLE001 - reported, the stream continues
                    refused = exc
        if got < size:                  # the deadline came first: the rest is dropped
            self.fence.count_late()
            log.warning("write of grant %d refused: %d of its %d bytes had arrived by its deadline", e.ident, got,
                        size)
            rest = size - got
            _discard(conn, rest - inbox.take_into(None, rest), memoryview(bytearray(_DISCARD_CHUNK)), inbox.timeout)
            refused = TokenError(EXPIRED_MID_WRITE)
        return refused

    def _answer_reads(self, conn: socket.socket, frames: list[tuple[int, int, Extent]], read_views,
                      tls: bool) -> None:
        """The replies of consecutive READ / READ_DATED / STAMP frames (op, flags, extent), in order: each its header
        and payload (or its error). The stamp is read once, before any of the batch's reads. Reads flagged
        FLAG_CHECKED may be answered from a file (FileSpan) on a plaintext connection."""
        views: list = [None] * len(frames)
        reads: list[int] = []
        stamp = None
        if any(op != OP_READ for op, _, _ in frames):
            stamp_of = getattr(self.handler, "removal_stamp", None)
            stamp = stamp_of() if stamp_of is not None else None
        for j, (op, _, e) in enumerate(frames):
            if op == OP_READ:
                reads.append(j)
            elif stamp is None:
                views[j] = ValueError("op: this node does not date reads (STAMP / READ_DATED)")
            elif op == OP_STAMP:
                views[j] = stamp
            elif e.ns != stamp:
                views[j] = KeyError(f"{STAMP_REFUSED} this node removed objects since the location was dated, or is "
                                    f"another process: ask the master")
            else:
                reads.append(j)
        if reads:
            extents = [frames[j][2] for j in reads]
            checked = () if tls else [k for k, j in enumerate(reads) if frames[j][1] & FLAG_CHECKED]
            if read_views is not None:
                got = read_views(extents, checked=checked)
            else:
                got = []
                for e in extents:
                    try:
                        got.append(self.handler.read_view(e))
                    except Exception as exc:  # noqa: BLE001
                        got.append(exc)
            for j, view in zip(reads, got):
                views[j] = view
        parts: list = []
        spans = False
        for view in views:
            if isinstance(view, Exception):
                msg = (view.args[0] if isinstance(view, KeyError) and view.args else str(view)).encode()
                parts.append(REP.pack(_status_of(view), len(msg), 0) + msg)
            elif type(view) is FileSpan:
                spans = True
                parts.append(REP.pack(OK, 0, view.size))
                parts.append(view)
            else:
                parts.append(REP.pack(OK, 0, len(view)))
                parts.append(view)
        if tls:         # an SSLSocket has no sendmsg (and no FileSpan was asked for)
            for part in parts:
                conn.sendall(part)
        elif spans:
            _send_replies(conn, parts)
        else:
            _send_parts(conn, parts)

    @staticmethod
    def _reply(conn: socket.socket, status: int, message: str, size: int = 0) -> None:
        msg = message.encode()
        conn.sendall(REP.pack(status, len(msg), size) + msg)


def _status_of(exc: Exception) -> int:
    if isinstance(exc, TokenError):
        return DENIED
    if isinstance(exc, KeyError):
        return NOT_FOUND
    if isinstance(exc, ValueError):
        return BAD_REQUEST
    log.exception("data channel handler failed", exc_info=exc)
    return ERROR


@dataclass(slots=True, frozen=True)
class Extent:
    """One signed request: a write grant or a read location."""

    ident: int
    tier: int
    offset: int
    size: int
    expires_ms: int
    token: bytes
    key: bytes = bytes(16)
    ns: bytes = bytes(16)

    def header(self, op: int, flags: int = 0) -> bytes:
        return REQ.pack(MAGIC, op, self.tier, flags, self.ident, self.offset, self.size, self.expires_ms, self.token,
                        self.key, self.ns)


class DataClient:
    """Pipelined requests to one node over a small pool of connections (one per concurrent caller)."""

    def __init__(self, address: str, *, timeout: float = 10.0, ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str = "", max_idle_s: float = 20.0):
        host, port = address.rsplit(":", 1)
        self._addr = (host, int(port))
        self.timeout = timeout
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname or host
        # max_idle_s below the node's idle timeout (60 s by default): reuse never races its close
        self._pool = ConnectionPool(self._dial, max_idle_s=max_idle_s)

    def _dial(self) -> socket.socket:
        sock = socket.create_connection(self._addr, timeout=self.timeout)
        tune_socket(sock)
        if self.ssl_context is not None:
            try:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.server_hostname)
            except BaseException:
                sock.close()
                raise
        kernel_timeouts(sock, self.timeout)
        return sock

    def close(self) -> None:
        self._pool.close()

    def write_many(self, extents: Sequence[Extent], payloads: Sequence[memoryview]) -> list[DataChannelError | None]:
        """Write payloads[i] into extents[i]; one error (or None) per extent. Transport faults raise OSError."""
        return self._run(OP_WRITE, extents, payloads)

    def read_many_into(self, extents: Sequence[Extent], dests: Sequence[memoryview], *,
                       digests: list | None = None) -> list[DataChannelError | None]:
        """Fill dests[i] (exactly extents[i].size bytes) from the node; one error (or None) per extent. `digests`
        (a list as long as `extents`): digests[i] is set to the xxh3_64 of the bytes that landed in dests[i], hashed
        piece by piece as they arrive (fused with the receive; none for an extent whose read failed). With
        `digests` the frames carry FLAG_CHECKED: the caller promises to compare each digest with the object's
        committed checksum, and the node may send an SSD record's payload unchecked, straight from its file."""
        return self._run(OP_READ, extents, dests, digests)

    def read_dated_into(self, extents: Sequence[Extent], dests: Sequence[memoryview], *,
                        digests: list | None = None) -> list[DataChannelError | None]:
        """`read_many_into` as READ_DATED frames: each extent's `ns` is the removal stamp its location was dated
        with; the node refuses (NOT_FOUND, message starting STAMP_REFUSED) any whose stamp is not its own now."""
        return self._run(OP_READ_DATED, extents, dests, digests)

    def removal_stamp(self) -> bytes:
        """The node's removal stamp now (STAMP_BYTES). Raises DataChannelError (INVALID_ARGUMENT: a node that
        does not date reads) or OSError."""
        buf = bytearray(STAMP_BYTES)
        [err] = self._run(OP_STAMP, [Extent(0, 0, 0, STAMP_BYTES, 0, bytes(16))], [memoryview(buf)])
        if err is not None:
            raise err
        return bytes(buf)

    def _run(self, op: int, extents: Sequence[Extent], bufs: Sequence[memoryview],
             digests: list | None = None) -> list[DataChannelError | None]:
        results: list[DataChannelError | None] = [None] * len(extents)
        flags = FLAG_CHECKED if digests is not None and op in (OP_READ, OP_READ_DATED) else 0
        sock = self._pool.take()
        try:
            rep = bytearray(REP.size)
            rview = memoryview(rep)
            for start in range(0, len(extents), _WINDOW):
                stop = min(start + _WINDOW, len(extents))
                if op != OP_WRITE:
                    sock.sendall(b"".join(e.header(op, flags) for e in extents[start:stop]))
                else:
                    for i in range(start, stop):
                        sock.sendall(extents[i].header(op))
                        sock.sendall(bufs[i])
                for i in range(start, stop):
                    recv_exact(sock, rview)
                    status, msg_len, size = REP.unpack(rep)
                    if msg_len:
                        msg = bytearray(msg_len)
                        recv_exact(sock, memoryview(msg))
                        results[i] = DataChannelError(status, msg.decode(errors="replace"))
                    elif status != OK:
                        results[i] = DataChannelError(status, "")
                    elif op != OP_WRITE:
                        if size != len(bufs[i]):
                            raise ConnectionError(f"node sent {size} bytes for a {len(bufs[i])}-byte extent")
                        if digests is None:
                            recv_exact(sock, bufs[i])
                        else:
                            hasher = xxhash.xxh3_64()
                            recv_exact(sock, bufs[i], hasher)
                            digests[i] = hasher.intdigest()
        except BlockingIOError as exc:  # the kernel's timeout (store/sockets.py kernel_timeouts): a stalled node
            sock.close()
            raise TimeoutError(f"data channel {self._addr[0]}:{self._addr[1]}: no progress in {self.timeout}s") from exc
        except BaseException:
            sock.close()
            raise
        self._pool.give(sock)
        return results
