"""One RPC layer for every client of the master (PoolClient, the admin CLI, drain): a channel, deadlines,
retries of idempotent calls, and ONE map from gRPC status codes to the errors callers see.

    UNAVAILABLE           PoolUnavailable   "no kvpool master answering at ADDR<unavailable_hint>"
    DEADLINE_EXCEEDED     PoolTimeout       "no kvpool master answering at ADDR: WHAT got no answer in Ts<timeout_hint>"
    INVALID_ARGUMENT,
    RESOURCE_EXHAUSTED    ValueError        the server's message, which names the field (caller mistake)
    NOT_FOUND             PoolNotFound      the server's message
    UNAUTHENTICATED,
    PERMISSION_DENIED     PoolAuthError     "WHAT at ADDR refused: CODE: details" (no / wrong credential or role)
    anything else         PoolError         "WHAT at ADDR failed: CODE: details"

Credentials (kvpool/credentials.py): the channel is TLS when they carry TLS settings, and every call presents
their token as `authorization` metadata passed with the call (not a client interceptor: gRPC's Python interceptor
path costs ~45 us per call, 1-2% of a 32 x 2 MiB get on its own).

Retries: only calls marked `retry=True` (idempotent reads and removals, and the grant- or move-ending PutAbort /
PutCommit / MigrateAbort / MigrateCommit, whose repeat ends nothing: a grant or a move ends once, and its id is
never another master process's), on UNAVAILABLE /
DEADLINE_EXCEEDED, with a short exponential back-off. Thread-safe (gRPC stubs are).

Control channel (store/control_channel.py): the hot client calls (PutStart, PutCommit, PutAbort, Lookup, Release,
Contains, Remove) go over the master's framed TCP control channel when it has one, the same messages without gRPC's
~0.3-0.6 ms per call. The first such call asks the master where it listens (Hello, over gRPC); a master without
one (`control_listen: off`, or an older master: UNIMPLEMENTED) is asked again after a minute, and every call goes
by gRPC meanwhile. A call that could not be sent (no connection, or the port now belongs to another process: the
greeting names the master instance Hello announced) goes by gRPC and Hello is asked again; a call whose
connection broke after it was sent is UNAVAILABLE, and a call past its deadline DEADLINE_EXCEEDED, exactly as over
gRPC, with the same retries. Status codes and messages are the gRPC handlers' own, so the fault map is one.
"""

from __future__ import annotations

import logging
import threading
import time

import grpc

from kvpool.credentials import Credentials
from kvpool.errors import PoolAuthError, PoolError, PoolNotFound, PoolTimeout, PoolUnavailable
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store.control_channel import CHANNEL_METHODS, RESPONSES, ControlClient, ControlUnreachable
from kvpool.store.remote_node import RECONNECT_OPTIONS

# A restarted master is found again within ~1 s (RECONNECT_OPTIONS), not after gRPC's default back-off (up to 120 s).
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20),
                   *RECONNECT_OPTIONS]
_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
log = logging.getLogger(__name__)
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_CHANNEL = frozenset(CHANNEL_METHODS)
_HELLO_AGAIN_S = 60.0     # a master that announced no control channel is asked again this much later
_HELLO_RETRY_S = 2.0      # ... and after a failed Hello (master down) or a channel that could not be reached


class _CallFailed(Exception):
    """A control-channel call answered with a status code, or that broke after it was sent (code UNAVAILABLE /
    DEADLINE_EXCEEDED): raised as the same errors as the gRPC path's."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class MasterRpc:
    def __init__(self, address: str, *, timeout: float, retries: int = 0, unavailable_hint: str = "",
                 timeout_hint: str = "", credentials: Credentials | None = None, control: bool = True) -> None:
        """`control`: use the master's control channel for the hot calls when it has one (False: gRPC only)."""
        self.address = address
        self.timeout = float(timeout)
        self.retries = retries
        self._unavailable_hint = unavailable_hint
        self._timeout_hint = timeout_hint
        self.credentials = credentials or Credentials()
        self.channel = self.credentials.channel(address, CHANNEL_OPTIONS, with_token=False)
        self.stub = pbg.MasterServiceStub(self.channel)
        self.control_wanted = control
        self._control: ControlClient | None = None
        self._hello_after = 0.0 if control else float("inf")
        self._control_lock = threading.Lock()
        self._warned = False

    def wait_ready(self, timeout: float) -> None:
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise PoolUnavailable(f"no kvpool master answering at {self.address} within {timeout}s"
                                  f"{self._unavailable_hint}") from None

    def call(self, method: str, request, *, retry: bool = False, what: str | None = None):
        """`stub.<method>(request)` with the deadline (over the control channel where it serves `method`); faults
        raised as the module docstring says."""
        rpc = getattr(self.stub, method)
        attempts = 1 + (self.retries if retry else 0)
        for attempt in range(attempts):
            try:
                control = self._channel_for(method)
                if control is not None:
                    try:
                        return self._control_call(control, method, request)
                    except ControlUnreachable as exc:
                        self._control_lost(control, exc)   # nothing was sent: this call goes by gRPC
                return rpc(request, timeout=self.timeout, metadata=self.credentials.metadata())
            except (grpc.RpcError, _CallFailed) as exc:
                if exc.code() in _RETRY_CODES and attempt + 1 < attempts:
                    time.sleep(min(0.05 * 2 ** attempt, 1.0))
                    continue
                raise self.error(exc, what or method) from None
        raise AssertionError("unreachable")

    # ---------------------------------------------------------------- control channel
    def uses_control_channel(self) -> bool:
        """Whether the hot calls go over the control channel now (asks the master if not asked yet)."""
        return self._channel_for("Lookup") is not None

    def warm_control(self) -> bool:
        """Ask the master for its control channel now and open one connection to it, off the first call's path (a
        fresh engine's first lookup paid ~3 ms for the Hello, the dial and the greeting). True when the hot calls
        will go over it; a channel that cannot be reached is handled as a call would (gRPC until asked again)."""
        control = self._channel_for("Lookup")
        if control is None:
            return False
        try:
            control.connect()
        except ControlUnreachable as exc:
            self._control_lost(control, exc)
            return False
        return True

    def _channel_for(self, method: str) -> ControlClient | None:
        if method not in _CHANNEL:
            return None
        control = self._control
        if control is not None or time.monotonic() < self._hello_after:
            return control
        with self._control_lock:
            if self._control is None and time.monotonic() >= self._hello_after:
                self._control = self._hello()
            return self._control

    def _hello(self) -> ControlClient | None:
        try:
            reply = self.stub.Hello(pb.HelloRequest(), timeout=min(self.timeout, 5.0),
                                    metadata=self.credentials.metadata())
        except grpc.RpcError as exc:
            unimplemented = exc.code() == grpc.StatusCode.UNIMPLEMENTED
            self._hello_after = time.monotonic() + (_HELLO_AGAIN_S if unimplemented else _HELLO_RETRY_S)
            return None
        if not reply.control_port:
            self._hello_after = time.monotonic() + _HELLO_AGAIN_S
            return None
        if reply.control_tls and self.credentials.tls is None:
            self._hello_after = time.monotonic() + _HELLO_AGAIN_S   # we speak plaintext gRPC to it: cannot happen
            return None
        host = self.address.rsplit(":", 1)[0].strip("[]")
        return ControlClient(host, reply.control_port, reply.instance, connect_timeout=min(self.timeout, 2.0),
                             ssl_context=self.credentials.data_context() if reply.control_tls else None,
                             server_hostname=self.credentials.server_name)

    def _control_lost(self, control: ControlClient, exc: Exception) -> None:
        """Nothing was sent. A channel that had answered before (the master restarted, or closed it) is asked for
        again at the next call; one that never answered (a firewalled port?) only after a minute, with a warning."""
        with self._control_lock:
            if self._control is control:
                self._control = None
                never = not control.answered
                self._hello_after = time.monotonic() + (_HELLO_AGAIN_S if never else 0.0)
                if never and not self._warned:
                    self._warned = True
                    log.warning("kvpool master %s: its control channel cannot be reached (%s); every call goes by "
                                "gRPC (slower). Open its control port or set control_listen", self.address, exc)
        control.close()

    def _control_call(self, control: ControlClient, method: str, request):
        token = self.credentials.token.token() if self.credentials.token is not None else ""
        try:
            code, body = control.call(method, request.SerializeToString(), token, self.timeout)
        except ControlUnreachable:
            raise
        except TimeoutError:
            raise _CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "control channel: no reply in time") from None
        except OSError as exc:
            raise _CallFailed(grpc.StatusCode.UNAVAILABLE, f"control channel: {exc}") from None
        if code == 0:
            return RESPONSES[method].FromString(body)
        raise _CallFailed(_CODES.get(code, grpc.StatusCode.UNKNOWN), body.decode(errors="replace"))

    def future(self, method: str, request):
        """Fire without waiting (a lease release): the caller adds callbacks; errors are the caller's to log."""
        return getattr(self.stub, method).future(request, timeout=self.timeout,
                                                 metadata=self.credentials.metadata())

    def error(self, exc, what: str) -> Exception:
        """The caller's error for a failed call (a grpc.RpcError, or a control-channel call's failure)."""
        code, details = exc.code(), exc.details()
        if code == grpc.StatusCode.UNAVAILABLE:
            # gRPC's details name every address it tried; one line that says what to do reads better
            return PoolUnavailable(f"no kvpool master answering at {self.address}{self._unavailable_hint}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return PoolTimeout(f"no kvpool master answering at {self.address}: {what} got no answer in "
                               f"{self.timeout:g}s{self._timeout_hint}")
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
            return ValueError(details)
        if code == grpc.StatusCode.NOT_FOUND:
            return PoolNotFound(details)
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return PoolAuthError(f"{what} at {self.address} refused: {code.name}: {details}")
        return PoolError(f"{what} at {self.address} failed: {code.name}: {details}")

    def close(self) -> None:
        with self._control_lock:
            control, self._control, self._hello_after = self._control, None, float("inf")
        if control is not None:
            control.close()
        self.channel.close()


__all__ = ["MasterRpc", "CHANNEL_OPTIONS"]
