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

Retries: only calls marked `retry=True` (idempotent reads and removals), on UNAVAILABLE / DEADLINE_EXCEEDED, with
a short exponential back-off. Thread-safe (gRPC stubs are).
"""

from __future__ import annotations

import time

import grpc

from kvpool.credentials import Credentials
from kvpool.errors import PoolAuthError, PoolError, PoolNotFound, PoolTimeout, PoolUnavailable
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store.remote_node import RECONNECT_OPTIONS

# A restarted master is found again within ~1 s (RECONNECT_OPTIONS), not after gRPC's default back-off (up to 120 s).
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20),
                   *RECONNECT_OPTIONS]
_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class MasterRpc:
    def __init__(self, address: str, *, timeout: float, retries: int = 0, unavailable_hint: str = "",
                 timeout_hint: str = "", credentials: Credentials | None = None) -> None:
        self.address = address
        self.timeout = float(timeout)
        self.retries = retries
        self._unavailable_hint = unavailable_hint
        self._timeout_hint = timeout_hint
        self.credentials = credentials or Credentials()
        self.channel = self.credentials.channel(address, CHANNEL_OPTIONS, with_token=False)
        self.stub = pbg.MasterServiceStub(self.channel)

    def wait_ready(self, timeout: float) -> None:
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise PoolUnavailable(f"no kvpool master answering at {self.address} within {timeout}s"
                                  f"{self._unavailable_hint}") from None

    def call(self, method: str, request, *, retry: bool = False, what: str | None = None):
        """`stub.<method>(request)` with the deadline; faults raised as the module docstring says."""
        rpc = getattr(self.stub, method)
        attempts = 1 + (self.retries if retry else 0)
        for attempt in range(attempts):
            try:
                return rpc(request, timeout=self.timeout, metadata=self.credentials.metadata())
            except grpc.RpcError as exc:
                if exc.code() in _RETRY_CODES and attempt + 1 < attempts:
                    time.sleep(min(0.05 * 2 ** attempt, 1.0))
                    continue
                raise self.error(exc, what or method) from None
        raise AssertionError("unreachable")

    def future(self, method: str, request):
        """Fire without waiting (a lease release): the caller adds callbacks; errors are the caller's to log."""
        return getattr(self.stub, method).future(request, timeout=self.timeout,
                                                 metadata=self.credentials.metadata())

    def error(self, exc: grpc.RpcError, what: str) -> Exception:
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
        self.channel.close()


__all__ = ["MasterRpc", "CHANNEL_OPTIONS"]
