"""What the pool's two framed TCP channels share: the node's data channel (store/data_channel.py) and the master's
control channel (store/control_channel.py).

    ThreadedServer   accept loop, one thread per connection, at most `max_connections` at once (more are closed at
                     accept and counted in `refused_connections`), TLS wrap on the connection's own thread with a
                     deadline, `close()` that shuts every live connection; a subclass serves one connection
    ConnectionPool   a client's idle connections to one server (one per concurrent caller): a pooled connection the
                     server closed (readable while idle: EOF) or that idled past `max_idle_s` is dropped, not reused
    tune_socket / kernel_timeouts / recv_exact / readable   socket helpers both channels use
    RecvTimeout      a served connection's receive timeout, lowered near a write's deadline and put back
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import struct
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

SOCK_BUF = 4 << 20


def tune_socket(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)
        except OSError:
            pass


_TIMEVAL = struct.Struct("@ll")  # struct timeval: seconds, microseconds


def _timeval(seconds: float) -> bytes:
    """SO_RCVTIMEO / SO_SNDTIMEO's value: at least 1 us (0 / 0 would mean "never time out")."""
    return _TIMEVAL.pack(*divmod(max(round(seconds * 1e6), 1), 1_000_000))


def kernel_timeouts(sock: socket.socket, seconds: float | None) -> None:
    """Put a plaintext socket in blocking mode and let the kernel keep its timeout (SO_RCVTIMEO / SO_SNDTIMEO): a
    send or receive that makes no progress for `seconds` fails with BlockingIOError (EAGAIN), an OSError, as a
    stalled peer should. A TLS socket keeps Python's timeout (an SSLSocket's blocking reads would report a kernel
    timeout as SSLWantReadError). None: blocking with no timeout, as `settimeout(None)`.

    Why not `settimeout`: Python then runs the socket non-blocking and polls before every send and receive, and a
    large send returns each time the socket buffer fills, to poll again. Measured 2026-11-29 on the 2-core box
    (scratch, bare DataServer and DataClient, 32-read windows, verified reads, medians of 400 interleaved rounds):
    blocking on both ends read 4.61 against 4.23 GB/s at 2 MiB (+9%), 4.40 against 3.93 at 512 KiB (+12%), 3.66
    against 2.91 at 64 KiB (+26%); a raw loopback socket with no timeout read 4.58 / 5.02 / 2.90."""
    if seconds is None or isinstance(sock, ssl.SSLSocket):
        sock.settimeout(seconds)
        return
    timeval = _timeval(seconds)
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


class RecvTimeout:
    """A served connection's receive timeout as last set: `idle_s` (kernel_timeouts) until `at_most` lowers it (a
    write near its grant's deadline, store/write_fence.py), back by `timed_out` (a wait that timed out under a
    lowered timeout goes on under the idle one). Each sets the socket only when the value changes: SO_RCVTIMEO
    alone on a plaintext socket, the Python timeout (send and receive) on a TLS one."""

    def __init__(self, sock: socket.socket, idle_s: float) -> None:
        self.sock = sock
        self.idle_s = idle_s
        self.seconds = idle_s

    def lowered(self) -> bool:
        return self.seconds < self.idle_s

    def at_most(self, seconds: float) -> None:
        if seconds < self.seconds:
            self._set(seconds)

    def timed_out(self) -> bool:
        """After a receive timed out: True when the timeout had been lowered (it is put back to `idle_s`: receive
        again), False when the connection really was idle that long (the caller gives up)."""
        if not self.lowered():
            return False
        self._set(self.idle_s)
        return True

    def _set(self, seconds: float) -> None:
        self.seconds = seconds
        if isinstance(self.sock, ssl.SSLSocket):
            self.sock.settimeout(seconds)
        else:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(seconds))


# No recv_into asks for more than this. Smaller receives kept loopback streams faster here; our reading of why: a
# receive asked for a whole 2 MiB object holds the socket's lock while it copies, and the sender's ACKs queue behind
# it. 128 KiB pieces are also hashed (recv_exact's hasher) while they are still in the core's cache. Raw loopback
# sockets, 2 MiB objects, medians of 20-40 interleaved rounds on the 2-core box (2026-11-28): +9-30% in six A/Bs
# (3.1-5.3 -> 3.9-5.8 GB/s), for a sender of distinct buffers as much as for one of the zero page. The data channel's
# verified reads gained less (+1-7% in five A/Bs: 2.81 -> 3.01, 3.08 -> 3.24 GB/s): they stay at ~0.75-0.9x the bare
# socket's 128 KiB receives, for a reason not found (neither process is busy all the time: client ~74%, node ~86% of a
# core).
RECV_PIECE = 128 << 10


def recv_exact(sock: socket.socket, view: memoryview, hasher=None) -> None:
    """Fill `view` from `sock`. `hasher` (an xxhash object): updated with each piece as it lands, while the piece
    is still in cache, so a caller verifying the bytes needs no second pass over memory."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, RECV_PIECE))
        if k == 0:
            raise ConnectionError("peer closed the connection mid-frame")
        if hasher is not None:
            hasher.update(view[got:got + k])
        got += k


def readable(sock: socket.socket) -> bool:
    """Whether an idle connection has something to read now: EOF (the peer closed it) or data nobody asked for."""
    poller = select.poll()  # not select.select: descriptors above 1023 are common in an engine process
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class ThreadedServer:
    """Subclasses implement `serve(conn)`: the connection is tuned, wrapped in TLS when `ssl_context` is set, and
    untracked and closed after `serve` returns or raises a socket error."""

    def __init__(self, host: str, port: int, *, what: str, max_connections: int,
                 ssl_context: ssl.SSLContext | None = None, handshake_timeout_s: float = 10.0) -> None:
        self.what = what
        self.max_connections = max_connections
        self.ssl_context = ssl_context
        self.handshake_timeout_s = handshake_timeout_s
        self.refused_connections = 0
        self._sock = socket.create_server((host, port))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self.address = f"{host}:{self.port}"
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name=f"kvpool-{what}-accept", daemon=True)

    def start(self):
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
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

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
                    log.warning("%s channel: %d connections open (max_connections); refused %d so far", self.what,
                                self.max_connections, self.refused_connections)
                conn.close()
                continue
            tune_socket(conn)
            threading.Thread(target=self._run, args=(conn,), name=f"kvpool-{self.what}-conn", daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            if self.ssl_context is not None:
                raw = conn
                raw.settimeout(self.handshake_timeout_s)
                try:
                    conn = self.ssl_context.wrap_socket(raw, server_side=True)
                except (OSError, ValueError) as exc:  # a bad or untrusted peer, or a silent one past the deadline
                    log.debug("%s channel TLS handshake failed: %s", self.what, exc)
                    conn = raw
                    return
                with self._lock:
                    self._conns.discard(raw)   # wrap_socket detached it; the SSLSocket owns the descriptor now
                    self._conns.add(conn)
            self.serve(conn)
        except (ConnectionError, OSError) as exc:
            log.debug("%s connection ended: %s", self.what, exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()


class ConnectionPool:
    """Idle connections to one server. `dial()` opens a new one (the caller's connect, TLS and greeting)."""

    def __init__(self, dial: Callable[[], socket.socket], *, max_idle_s: float) -> None:
        self._dial = dial
        self.max_idle_s = max_idle_s
        self._idle: list[tuple[socket.socket, float]] = []
        self._lock = threading.Lock()
        self._closed = False

    def take(self) -> socket.socket:
        while True:
            with self._lock:
                if not self._idle:
                    break
                sock, since = self._idle.pop()
            # idle too long, or readable while idle (the server closed it: idle timeout, restart): not reusable
            if time.monotonic() - since < self.max_idle_s and not readable(sock):
                return sock
            sock.close()
        return self._dial()

    def give(self, sock: socket.socket) -> None:
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


__all__ = ["ConnectionPool", "ThreadedServer", "kernel_timeouts", "readable", "recv_exact", "tune_socket"]
