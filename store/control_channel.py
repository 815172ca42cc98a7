"""The master's control channel: the hot client calls over one framed TCP connection instead of gRPC.

Why: a 32-key get is one Lookup and one (background) Release, a put one PutStart and one PutCommit. Through
Python gRPC each such call costs ~0.3-0.6 ms of CPU and latency on each side (completion-queue thread, thread-pool
hand-off, HTTP/2 framing), measured on the 2-core box as the whole of a 64 KiB x 32 get's time. The same messages
over a plain socket cost ~30 us of transport. So the channel carries exactly the gRPC request and response
messages (proto/kvpool.proto; the one wire mapping, store/wire.py, is unchanged) and runs exactly the gRPC
handlers (MasterServicer): status codes, messages, authorisation and the master's validation are the same on both
paths, and everything else (admin, nodes, health) stays on gRPC.

    CHANNEL_METHODS  PutStart PutCommit PutAbort Lookup Release Contains Remove

Frames (little endian). On accept the server sends a greeting, `4s magic b"KVC1", H version, 2x, 16s instance`
(the master process's random id, also in HelloResponse: a client that reached another process on a reused port
sees it and never sends). Then each request:

    offset 0  I  payload_len    the request message's bytes
           4  I  call_id        echoed in the reply (a desynchronised stream is detected, never misread)
           8  B  method         index into CHANNEL_METHODS, 1-based
           9  x
          10  H  token_len      the bearer token's bytes ("" without one), then payload_len bytes of request
    = 12 bytes

and its reply: `I payload_len, I call_id, B code, 3x` (12 bytes), then the response message (code 0 = OK), or the
UTF-8 error message (code = the gRPC status code's number). Requests on one connection are answered in order.

Authentication: the token travels with every request (as gRPC metadata does), so a rotated or revoked token stops
working at the next call, not at the next connection; with `cert_roles` and mutual TLS a request without a token is
the certificate's identity. The method rules are store/auth's METHOD_RULES. A malformed frame (bad method, oversize
length, undecodable message) is answered INVALID_ARGUMENT when the stream can continue and closes the connection
when it cannot; nothing reaches the master then.

Bounds: at most `max_connections` connections at once (one thread each; more are closed at accept), a connection
silent for `idle_timeout_s` (between requests or mid-frame) is closed, and no frame is larger than
`max_frame_bytes` (gRPC's own message limit on the master). TLS: with the master's server SSL context each
connection is wrapped (the handshake on the connection's thread, with a deadline).

The client half (`ControlClient`) keeps a small pool of connections (one per concurrent caller) and drops pooled ones
the master closed (readable while idle) or that idled past `max_idle_s` before reusing one. It raises
`ControlUnreachable` when nothing was sent (the caller may use gRPC instead), OSError / TimeoutError after a
request went out (the caller decides, as for a gRPC call whose connection broke, whether to retry).
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import threading
import time
from typing import Callable

from kvpool.proto import kvpool_pb2 as pb
from kvpool.store.auth.config import Identity, Role
from kvpool.store.auth.methods import METHOD_RULES
from kvpool.store.auth.server import identity_from_cert, role_refusal, serving_as
from kvpool.store.auth.table import TokenStore
from kvpool.store.sockets import ConnectionPool, ThreadedServer, kernel_timeouts, recv_exact, tune_socket

log = logging.getLogger(__name__)

MAGIC = b"KVC1"
VERSION = 1
GREETING = struct.Struct("<4sH2x16s")
REQ = struct.Struct("<IIBxH")
REP = struct.Struct("<IIB3x")
CHANNEL_METHODS = ("PutStart", "PutCommit", "PutAbort", "Lookup", "Release", "Contains", "Remove")
_REQUESTS = {name: getattr(pb, f"{name}Request") for name in CHANNEL_METHODS}
RESPONSES = {name: getattr(pb, f"{name}Response") for name in CHANNEL_METHODS}
METHOD_ID = {name: i + 1 for i, name in enumerate(CHANNEL_METHODS)}
OK = 0
INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, INTERNAL, UNAUTHENTICATED = 3, 5, 7, 13, 16


class ControlUnreachable(ConnectionError):
    """No request was sent: no connection, or the greeting was not this master's. Safe to send another way."""


class _Aborted(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class _Context:
    """What MasterServicer's handlers use of a gRPC context, for calls that came over the channel."""

    __slots__ = ()

    def abort(self, code, message: str):
        raise _Aborted(code.value[0], message)

    def time_remaining(self) -> float | None:
        return None


_CONTEXT = _Context()


class ControlServer(ThreadedServer):
    """Threaded server over a MasterServicer: one thread per connection (connections are few and long-lived)."""

    def __init__(self, servicer, host: str = "127.0.0.1", port: int = 0, *, instance: bytes,
                 tokens: TokenStore | None = None, auth: bool = False, cert_roles: bool = False,
                 ssl_context: ssl.SSLContext | None = None, handshake_timeout_s: float = 10.0,
                 idle_timeout_s: float = 300.0, max_connections: int = 256, max_frame_bytes: int = 256 << 20,
                 on_reject: Callable[[str, str], None] | None = None) -> None:
        if len(instance) != 16:
            raise ValueError(f"instance must be 16 bytes, got {len(instance)}")
        super().__init__(host, port, what="control", max_connections=max_connections, ssl_context=ssl_context,
                         handshake_timeout_s=handshake_timeout_s)
        self.servicer = servicer
        self.instance = instance
        self.tokens, self.auth, self.cert_roles = tokens, auth, cert_roles
        self.idle_timeout_s = idle_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.on_reject = on_reject
        self.calls = {name: 0 for name in CHANNEL_METHODS}   # answered requests per method (tests, stats)

    def serve(self, conn: socket.socket) -> None:
        cert_ident: list[Identity | None] = []
        kernel_timeouts(conn, self.idle_timeout_s)    # no poll before each call (store/sockets.py)
        conn.sendall(GREETING.pack(MAGIC, VERSION, self.instance))
        head = bytearray(REQ.size)
        hview = memoryview(head)
        while True:
            recv_exact(conn, hview)
            size, call_id, method, token_len = REQ.unpack(head)
            if size > self.max_frame_bytes:
                self._reply(conn, call_id, INVALID_ARGUMENT,
                            f"frame: {size} bytes exceeds the control channel's {self.max_frame_bytes}")
                return  # the stream cannot be resynchronised without reading the oversize body
            body = bytearray(token_len + size)
            recv_exact(conn, memoryview(body))
            code, reply = self._handle(conn, method, bytes(body[:token_len]), memoryview(body)[token_len:],
                                       cert_ident)
            self._reply(conn, call_id, code, reply)

    def _handle(self, conn, method: int, token: bytes, payload: memoryview, cert_ident: list) -> tuple[int, bytes]:
        if not 1 <= method <= len(CHANNEL_METHODS):
            return INVALID_ARGUMENT, f"method: {method} is not a control channel method (1..{len(CHANNEL_METHODS)})"
        name = CHANNEL_METHODS[method - 1]
        ident = None
        if self.auth:
            ident, code, why = self._identify(conn, name, token, cert_ident)
            if ident is None:
                self._rejected(name, code)
                return code, why
        try:
            request = _REQUESTS[name].FromString(payload)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError: the message, not the stream, is bad
            return INVALID_ARGUMENT, f"request: not a {name}Request message"
        try:
            with serving_as(ident):
                reply = getattr(self.servicer, name)(request, _CONTEXT)
        except _Aborted as exc:
            return exc.code, exc.message
        except Exception as exc:  # noqa: BLE001 - a handler bug answers INTERNAL; the connection stays usable
            log.exception("control channel %s failed", name)
            return INTERNAL, f"{name}: {exc}"
        self.calls[name] += 1
        return OK, reply.SerializeToString()

    def _identify(self, conn, name: str, token: bytes, cert_ident: list) -> tuple[Identity | None, int, str]:
        rule = METHOD_RULES.get(f"/kvpool.v1.MasterService/{name}")
        if token:
            text = token.decode(errors="replace")
            ident = self.tokens.identify(text) if self.tokens is not None else None
            if ident is None:
                return None, UNAUTHENTICATED, "authorization: unknown or revoked token"
        elif self.cert_roles:
            if not cert_ident:
                der = conn.getpeercert(binary_form=True) if isinstance(conn, ssl.SSLSocket) else None
                cert_ident.append(identity_from_cert(ssl.DER_cert_to_PEM_cert(der).encode()) if der else None)
            ident = cert_ident[0]
            if ident is None:
                return None, UNAUTHENTICATED, ("authorization: no token, and no client certificate naming a kvpool "
                                               "role (OU)")
        else:
            return None, UNAUTHENTICATED, "authorization: missing credential (send 'authorization: Bearer <token>')"
        refusal = role_refusal(name, rule, ident)
        if refusal:
            return None, PERMISSION_DENIED, refusal
        return ident, OK, ""

    def _rejected(self, name: str, code: int) -> None:
        log.debug("control channel: %s refused: %d", name, code)
        if self.on_reject is not None:
            self.on_reject(name, "UNAUTHENTICATED" if code == UNAUTHENTICATED else "PERMISSION_DENIED")

    @staticmethod
    def _reply(conn: socket.socket, call_id: int, code: int, body: bytes | str) -> None:
        data = body.encode() if isinstance(body, str) else body
        conn.sendall(REP.pack(len(data), call_id, code) + data)


class ControlClient:
    """Calls to one master's control channel over a small pool of connections (one per concurrent caller)."""

    def __init__(self, host: str, port: int, instance: bytes, *, ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str = "", max_idle_s: float = 120.0, connect_timeout: float = 2.0) -> None:
        self._addr = (host, port)
        self.instance = instance
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname or host
        self.connect_timeout = connect_timeout
        self.answered = False   # some call got its reply: the channel works from here
        self._next_id = 0
        self._id_lock = threading.Lock()
        # max_idle_s below the server's idle timeout (300 s by default): reuse never races its close
        self._pool = ConnectionPool(self._dial, max_idle_s=max_idle_s)

    def call(self, method: str, request: bytes, token: str, timeout: float) -> tuple[int, bytes]:
        """(code, response bytes or UTF-8 error message). ControlUnreachable: nothing sent. OSError (TimeoutError
        included) after the request went out: whether the master ran it is unknown."""
        sock = self._pool.take()
        deadline = time.monotonic() + timeout
        tok = token.encode() if token else b""
        with self._id_lock:
            self._next_id = call_id = (self._next_id + 1) & 0xFFFFFFFF
        try:
            sock.settimeout(timeout)
            sock.sendall(REQ.pack(len(request), call_id, METHOD_ID[method], len(tok)) + tok + request)
            head = bytearray(REP.size)
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            recv_exact(sock, memoryview(head))
            size, got_id, code = REP.unpack(head)
            if got_id != call_id:
                raise ConnectionError(f"control channel: reply to call {got_id}, expected {call_id}")
            body = bytearray(size)
            recv_exact(sock, memoryview(body))
        except BaseException:
            sock.close()
            raise
        self.answered = True
        self._pool.give(sock)
        return code, bytes(body)

    def connect(self) -> None:
        """Open one connection now (connect, TLS, greeting) and keep it idle for the next call: the first call of a
        client warmed up at start (kvpool/rpc.py `warm_control`) then dials nothing. ControlUnreachable as a call's."""
        self._pool.give(self._dial())

    def _dial(self) -> socket.socket:
        try:
            sock = socket.create_connection(self._addr, timeout=self.connect_timeout)
        except OSError as exc:
            raise ControlUnreachable(f"control channel {self._addr[0]}:{self._addr[1]}: {exc}") from None
        try:
            tune_socket(sock)
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.server_hostname)
            greeting = bytearray(GREETING.size)
            recv_exact(sock, memoryview(greeting))
            magic, version, instance = GREETING.unpack(greeting)
        except (OSError, ValueError) as exc:
            sock.close()
            raise ControlUnreachable(f"control channel {self._addr[0]}:{self._addr[1]}: {exc}") from None
        if magic != MAGIC or version != VERSION or instance != self.instance:
            sock.close()
            raise ControlUnreachable(f"control channel {self._addr[0]}:{self._addr[1]}: not the master that "
                                     "announced it (restarted?)")
        return sock

    def close(self) -> None:
        self._pool.close()


__all__ = ["CHANNEL_METHODS", "ControlClient", "ControlServer", "ControlUnreachable", "RESPONSES", "Role"]
