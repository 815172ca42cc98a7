"""A storage node's writes in flight, and the two fences that keep a late writer's bytes off the next object.

A DRAM write over the data channel (or gRPC Write) lands straight in the node's arena as its payload arrives; the
extent belongs to its grant only until the grant ends. Before 2026-12-07 a writer that stalled in the middle of its
payload and woke after its grant had ended (expired, or made by a master that has restarted since) still landed the
rest of its bytes, over the object the master had placed on that extent meanwhile: that object was then a miss for
every reader (its checksum), an acknowledged object lost. Now every write is a `Landing` of the node's `WriteFence`,
and its payload lands holding the landing's lock, each piece after two checks:

  deadline   no piece lands later than LAND_MARGIN_S before the grant expires (the node's clock): a receive never
             waits past that point (`receive` lowers the connection's receive timeout as it nears), and a write whose
             payload has not all arrived by then is refused (its remaining bytes are read and dropped, the stream
             goes on). The master reclaims a grant at its expiry, so a clock skew between hosts below the margin
             keeps the two apart, as it already must for the token's own expiry check (store/tokens.py).
  cut        `close(drain_s)`, called by the node before it registers again (a new registration may come with a
             new write key: the master then places this node's extents from scratch), refuses new writes, lets
             those in flight finish for up to `drain_s` (the node's `register_drain_s`), and cuts the rest: their
             sockets are shut down, and `close` returns only once none can land another byte. Letting them finish
             is safe: no master places anything on this node before the registration that follows, so a write that
             ends before it lands on its own extent, and the master it reaches with its commit decides whether it
             counts (one that restarted since refuses it). A registration after a transient heartbeat failure, which
             keeps its key (the same master re-attached), cost every write in flight before 2026-12-07 (evening); now
             it costs only those still in flight after the drain (a writer stalled mid-payload, say).

A staged write (SSD, HBM) lands in the handler's `write_done`, called holding the same lock after the same checks.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

from kvpool.store.sockets import RECV_PIECE, RecvTimeout
from kvpool.store.tokens import TokenError

LAND_MARGIN_S = 0.1     # a write's last byte lands at least this long before its grant expires (node clock)
_SHORTEST_WAIT_S = 0.001
_CUT = "node: the write was cut, the node is registering with its master again"
EXPIRED_MID_WRITE = "expires_unix_ms: grant expired before its bytes all arrived (nothing of it counts)"


class WriteCut(ConnectionError):
    """The node cut this write (it is registering with its master again): its connection is shut down."""


@dataclass(eq=False, slots=True)
class Landing:
    """One write in flight: its bytes may land while `deadline` (unix seconds, the node's clock) has not passed and
    it is not cut, holding `lock` (`WriteFence.close` shuts `conn`, which ends a receive, then takes the lock once
    to know nothing is landing: a data-channel write holds it for its whole payload, a gRPC Write per chunk)."""

    deadline: float
    conn: socket.socket | None = None
    cut: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def left(self) -> float:
        return self.deadline - time.time()

    def check(self) -> None:
        """Raise unless a piece may land now (call with `lock` held)."""
        if self.cut:
            raise WriteCut(_CUT)
        if self.left() <= 0:
            raise TokenError(EXPIRED_MID_WRITE)


class WriteFence:
    """A node's writes in flight (`begin` / `end`): `close` lets them finish for a while, cuts the rest and refuses
    new ones until `reopen`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)    # notified when the last write in flight ends
        self._open = True
        self._landings: set[Landing] = set()
        self._cut_writes = 0        # cut by `close`
        self._drained_writes = 0    # in flight at a `close` and ended during its drain (not cut)
        self._late_writes = 0       # refused at their deadline with bytes still to come (`count_late`)

    def begin(self, expires_ms: int, conn: socket.socket | None = None) -> Landing:
        """A write to land by its grant's `expires_ms` (unix ms); `conn` is shut down if the write is cut. Raises
        TokenError while the node is registering. Pair with `end`."""
        landing = Landing(expires_ms / 1000 - LAND_MARGIN_S, conn)
        with self._lock:
            if not self._open:
                raise TokenError("node: registering with its master again, writes are refused until it has")
            self._landings.add(landing)
        return landing

    def end(self, landing: Landing) -> None:
        with self._lock:
            self._landings.discard(landing)
            if not self._landings:
                self._idle.notify_all()

    def close(self, drain_s: float = 0.0) -> int:
        """Refuse writes until `reopen`, wait up to `drain_s` seconds for those in flight to end, and cut the ones
        still in flight then; returns how many were cut, once none can land."""
        with self._lock:
            self._open = False
            if drain_s > 0 and self._landings:
                drained = len(self._landings)
                self._idle.wait_for(lambda: not self._landings, timeout=drain_s)
                self._drained_writes += drained - len(self._landings)
            landings = list(self._landings)
        for landing in landings:
            landing.cut = True
            if landing.conn is not None:
                try:    # the base class's: an SSLSocket's own shutdown would drop its SSL object under its reader
                    socket.socket.shutdown(landing.conn, socket.SHUT_RDWR)
                except OSError:
                    pass
        for landing in landings:
            with landing.lock:  # what is landing now finishes (its receive ended by the shutdown); the cut flag
                pass            # stops anything after
        with self._lock:
            self._cut_writes += len(landings)
        return len(landings)

    def count_late(self) -> None:
        """A write refused at its deadline with bytes still to come (the data channel's `_land`)."""
        with self._lock:
            self._late_writes += 1

    def counts(self) -> dict[str, int]:
        """{"cut_writes": .., "drained_writes": .., "late_writes": ..} since the node started: its /metrics
        (kvpool/metrics.py NodeCountsCollector) reads them at scrape time."""
        with self._lock:
            return {"cut_writes": self._cut_writes, "drained_writes": self._drained_writes,
                    "late_writes": self._late_writes}

    @property
    def closed(self) -> bool:
        """True from `close` (its drain included) until `reopen`: new writes are refused."""
        with self._lock:
            return not self._open

    def reopen(self) -> None:
        with self._lock:
            self._open = True


def receive(sock: socket.socket, view: memoryview, landing: Landing, timeout: RecvTimeout) -> int:
    """Fill `view` from `sock` in pieces (as store/sockets.py `recv_exact`), the caller holding `landing.lock`,
    looking at the clock and the cut flag before each; returns how many bytes landed: all of them, or fewer when
    the deadline came first (the rest is still on the socket). No receive may wait past the deadline: while one
    could, the connection's receive `timeout` is lowered to half the time left (a syscall on the first write of a
    connection and in a grant's last moments, not per write: the next write's grant has more time left). A receive
    that times out looks at the clock again. Raises WriteCut when cut (its socket was shut down: the receive ends
    at once), ConnectionError when the peer closes, TimeoutError after the connection's idle timeout without a
    byte (where that is shorter than the grant)."""
    got, n, deadline = 0, len(view), landing.deadline
    while got < n:
        if landing.cut:
            raise WriteCut(_CUT)
        left = deadline - time.time()
        if left <= 0:
            return got
        if left < timeout.seconds:
            timeout.at_most(left / 2 if left > _SHORTEST_WAIT_S else left)
        try:
            k = sock.recv_into(view[got:], min(n - got, RECV_PIECE))
        except (BlockingIOError, TimeoutError) as exc:
            if not timeout.lowered():
                raise TimeoutError(f"data channel: no payload byte in {timeout.seconds}s") from exc
            continue
        if k == 0:
            raise WriteCut(_CUT) if landing.cut else ConnectionError("peer closed the connection mid-frame")
        got += k
    return got
