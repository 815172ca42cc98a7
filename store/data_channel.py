"""The raw TCP data channel between clients and a storage node: bulk bytes without gRPC framing.

bench/data_channel.py measured this against gRPC streaming (README "Distributed pool"): gRPC copies each
payload into and out of protobuf messages and chunks; here a write is `recv_into` straight into the node's
arena view and a read is one `sendall` of the arena view into the client's own buffer (`recv_into`).

Frame (little endian), one request header then, for writes, `size` payload bytes:

    offset 0   4s  magic b"KVD1"
           4   B   op        1 = WRITE, 2 = READ
           5   B   tier
           6   2x  pad
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
A rejected WRITE's payload is still consumed (up to `max_object_bytes`, else the connection is closed), so one
bad grant does not break the stream for the others. It is read into one bounded scratch buffer and dropped: a forged
header makes the node allocate nothing of its announced size (the token is checked before any payload byte lands).

Bounds: at most `max_connections` connections are served at once (one thread each; more are closed at accept), and a
connection that sends nothing for `idle_timeout_s` (between requests or mid-frame: a half-open or stalled peer) is
closed, so no peer holds a thread forever. Clients drop pooled connections the node closed (readable while idle) or
that sat idle longer than `max_idle_s`, before they reuse one.

TLS (optional, store/tls.py builds the contexts): `DataServer(ssl_context=...)` wraps each accepted connection
(the handshake runs on the connection's thread with a deadline, so a silent peer cannot stall the accept loop);
`DataClient(ssl_context=...)` wraps each connection it opens and checks the node's certificate against the address
it dials (or `server_hostname`). The frames are the same; only the reply of a READ is sent as two writes (an
SSLSocket has no sendmsg). Without a context the code path is the plaintext one, unchanged.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from typing import Protocol, Sequence

from kvpool.store.tokens import TokenError

log = logging.getLogger(__name__)

MAGIC = b"KVD1"
OP_WRITE = 1
OP_READ = 2
REQ = struct.Struct("<4sBB2xQQQQ16s16s16s")
REP = struct.Struct("<B3xIQ")
OK, DENIED, BAD_REQUEST, NOT_FOUND, ERROR = 0, 1, 2, 3, 4
STATUS_NAMES = {OK: "OK", DENIED: "PERMISSION_DENIED", BAD_REQUEST: "INVALID_ARGUMENT", NOT_FOUND: "NOT_FOUND",
                ERROR: "INTERNAL"}
_WINDOW = 32  # requests in flight per connection: 32 headers always fit a socket buffer, so no send/recv deadlock
_SOCK_BUF = 4 << 20
_DISCARD_CHUNK = 256 << 10  # scratch for the payload of a refused WRITE (the only buffer a refusal costs)


class DataHandler(Protocol):
    """What the channel asks of a node. Raise TokenError (denied), ValueError (bad request), KeyError (gone)."""

    def write_view(self, e: "Extent") -> memoryview: ...

    def write_done(self, e: "Extent", view: memoryview) -> None: ...

    def read_view(self, e: "Extent") -> memoryview: ...


class DataChannelError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{STATUS_NAMES.get(status, status)}: {message}")
        self.status = status
        self.message = message


def tune_socket(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCK_BUF)
        except OSError:
            pass


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection mid-frame")
        got += k


def _discard(sock: socket.socket, size: int, scratch: memoryview) -> None:
    while size:
        k = sock.recv_into(scratch, min(size, len(scratch)))
        if k == 0:
            raise ConnectionError("peer closed the connection mid-frame")
        size -= k


def readable(sock: socket.socket) -> bool:
    """Whether an idle connection has something to read now: EOF (the peer closed it) or data nobody asked for."""
    poller = select.poll()  # not select.select: descriptors above 1023 are common in an engine process
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _send_two(sock: socket.socket, head: bytes, body: memoryview) -> None:
    """Reply header and payload in one sendmsg (one syscall, one segment train), finishing any partial send."""
    sent = sock.sendmsg([head, body])
    if sent < len(head):
        sock.sendall(head[sent:])
        sock.sendall(body)
    elif sent - len(head) < len(body):
        sock.sendall(body[sent - len(head):])


def _send_two_tls(sock: ssl.SSLSocket, head: bytes, body: memoryview) -> None:
    sock.sendall(head)
    sock.sendall(body)


class DataServer:
    """Threaded server: one thread per connection (connections are few and long-lived: one pool per client)."""

    def __init__(self, handler: DataHandler, host: str = "127.0.0.1", port: int = 0, *,
                 max_object_bytes: int = 64 << 20, ssl_context: ssl.SSLContext | None = None,
                 handshake_timeout_s: float = 10.0, idle_timeout_s: float = 60.0, max_connections: int = 256):
        self.handler = handler
        self.max_object_bytes = max_object_bytes
        self.ssl_context = ssl_context
        self.handshake_timeout_s = handshake_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.refused_connections = 0
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.listen(128)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="kvpool-data-accept", daemon=True)

    def start(self) -> "DataServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            for conn in list(self._conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                full = len(self._conns) >= self.max_connections
                if not full:
                    self._conns.add(conn)
            if full:
                self.refused_connections += 1
                if self.refused_connections == 1 or self.refused_connections % 1000 == 0:
                    log.warning("data channel: %d connections open (max_connections); refused %d so far",
                                self.max_connections, self.refused_connections)
                conn.close()
                continue
            tune_socket(conn)
            threading.Thread(target=self._serve, args=(conn,), name="kvpool-data-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        send_two = _send_two
        if self.ssl_context is not None:
            raw = conn
            try:
                raw.settimeout(self.handshake_timeout_s)
                conn = self.ssl_context.wrap_socket(raw, server_side=True)
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError: bad or untrusted peer, timeout
                log.debug("data channel TLS handshake failed: %s", exc)
                with self._lock:
                    self._conns.discard(raw)
                raw.close()
                return
            with self._lock:
                self._conns.discard(raw)  # wrap_socket detached it; the SSLSocket owns the descriptor now
                self._conns.add(conn)
            send_two = _send_two_tls
        conn.settimeout(self.idle_timeout_s)  # a silent peer (between requests or mid-frame) loses its connection
        head = bytearray(REQ.size)
        hview = memoryview(head)
        scratch: memoryview | None = None
        try:
            while True:
                try:
                    recv_exact(conn, hview)
                except (ConnectionError, OSError):
                    return
                magic, op, tier, ident, offset, size, expires, token, key, ns = REQ.unpack(head)
                e = Extent(ident, tier, offset, size, expires, token, key, ns)
                if magic != MAGIC or op not in (OP_WRITE, OP_READ):
                    self._reply(conn, BAD_REQUEST, "magic/op: not a kvpool data frame")
                    return
                if op == OP_WRITE:
                    try:
                        view = self.handler.write_view(e)
                    except Exception as exc:  # noqa: BLE001 - every refusal is reported, the stream continues
                        if size > self.max_object_bytes:
                            self._reply(conn, _status_of(exc), str(exc))
                            return
                        if scratch is None:
                            scratch = memoryview(bytearray(_DISCARD_CHUNK))
                        _discard(conn, size, scratch)
                        self._reply(conn, _status_of(exc), str(exc))
                        continue
                    recv_exact(conn, view)
                    try:
                        self.handler.write_done(e, view)
                    except Exception as exc:  # noqa: BLE001
                        self._reply(conn, _status_of(exc), str(exc))
                        continue
                    self._reply(conn, OK, "", size)
                else:
                    try:
                        view = self.handler.read_view(e)
                    except Exception as exc:  # noqa: BLE001
                        self._reply(conn, _status_of(exc), str(exc))
                        continue
                    send_two(conn, REP.pack(OK, 0, len(view)), view)
        except (ConnectionError, OSError) as exc:
            log.debug("data connection ended: %s", exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

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

    def header(self, op: int) -> bytes:
        return REQ.pack(MAGIC, op, self.tier, self.ident, self.offset, self.size, self.expires_ms, self.token,
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
        self.max_idle_s = max_idle_s  # below the node's idle timeout (60 s by default): reuse never races its close
        self._idle: list[tuple[socket.socket, float]] = []
        self._lock = threading.Lock()
        self._closed = False

    def _take(self) -> socket.socket:
        while True:
            with self._lock:
                if not self._idle:
                    break
                sock, since = self._idle.pop()
            # Idle too long, or readable while idle (the node closed it: idle timeout, restart): not reusable.
            if time.monotonic() - since < self.max_idle_s and not readable(sock):
                return sock
            sock.close()
        sock = socket.create_connection(self._addr, timeout=self.timeout)
        tune_socket(sock)
        if self.ssl_context is not None:
            try:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.server_hostname)
            except BaseException:
                sock.close()
                raise
        return sock

    def _give(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append((sock, time.monotonic()))
                return
        sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock, _ in idle:
            sock.close()

    def write_many(self, extents: Sequence[Extent], payloads: Sequence[memoryview]) -> list[DataChannelError | None]:
        """Write payloads[i] into extents[i]; one error (or None) per extent. Transport faults raise OSError."""
        return self._run(OP_WRITE, extents, payloads)

    def read_many_into(self, extents: Sequence[Extent], dests: Sequence[memoryview]) -> list[DataChannelError | None]:
        """Fill dests[i] (exactly extents[i].size bytes) from the node; one error (or None) per extent."""
        return self._run(OP_READ, extents, dests)

    def _run(self, op: int, extents: Sequence[Extent], bufs: Sequence[memoryview]) -> list[DataChannelError | None]:
        results: list[DataChannelError | None] = [None] * len(extents)
        sock = self._take()
        try:
            rep = bytearray(REP.size)
            rview = memoryview(rep)
            for start in range(0, len(extents), _WINDOW):
                stop = min(start + _WINDOW, len(extents))
                if op == OP_READ:
                    sock.sendall(b"".join(e.header(op) for e in extents[start:stop]))
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
                    elif op == OP_READ:
                        if size != len(bufs[i]):
                            raise ConnectionError(f"node sent {size} bytes for a {len(bufs[i])}-byte extent")
                        recv_exact(sock, bufs[i])
        except BaseException:
            sock.close()
            raise
        self._give(sock)
        return results
