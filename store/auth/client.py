"""The calling side: present a token (`TokenSource`) on every RPC of a channel, over TLS or plaintext loopback.

    channel = auth_channel("10.0.0.5:50051", token=TokenSource("file:/etc/kvpool/client.token"), tls=tls_config)
    stub = pbg.MasterServiceStub(channel)

The token goes in the `authorization: Bearer <token>` metadata of each call, added by a client interceptor, the
same way with or without TLS (gRPC's call credentials refuse plaintext channels, and a loopback pool without TLS
is the zero-config default). Sending a token in plaintext to a non-loopback address exposes it to the network:
that is logged as a warning when the channel is made. `TokenSource` re-reads its file when it changes (same
`SourceWatch` as the server), so a rotated client token file is picked up without restart; it presents the file's
first entry (client files may hold `TENANT:TOKEN`; the tenant prefix is not sent: the server knows it).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from typing import Callable, Mapping, Sequence

import grpc

from kvpool.store.auth.config import check_token
from kvpool.store.auth.sources import SourceWatch, parse_source, read_source

log = logging.getLogger(__name__)


class TokenSource:
    """The one token a caller presents, from `file:PATH` or `env:NAME` (ValueError naming `field` if unusable)."""

    def __init__(self, source: str, *, field: str = "token", reload_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, env: Mapping[str, str] | None = None) -> None:
        self.source = parse_source(source, field)
        self._env = env
        self._lock = threading.Lock()
        self._watch = SourceWatch([self.source], interval_s=reload_interval_s, clock=clock)
        self._token = self._load()

    def _load(self) -> str:
        text = read_source(self.source, self._env)
        entries = [e for line in text.splitlines() if not line.lstrip().startswith("#") for e in line.split()]
        if not entries:
            raise ValueError(f"{self.source.field}: {self.source} holds no token")
        token = entries[0].rpartition(":")[2]
        check_token(token, f"{self.source.field} ({self.source})")
        self._watch.mark({self.source: text})
        return token

    def token(self) -> str:
        """The token to present now. When a check of the file is due, a caller waits for a check another thread is
        making rather than presenting the token that check may be replacing (a rotated-out token is refused)."""
        if self._watch.due():
            with self._lock:
                if self._watch.due() and self._watch.changed():
                    try:
                        self._token = self._load()
                    except ValueError as exc:
                        self._watch.mark({})
                        log.error("token reload failed, keeping the previous token: %s", exc)
        return self._token


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base, metadata):
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = base.compression


class BearerInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                        grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` (token read from `source` per call: rotation needs no restart)."""

    def __init__(self, source: TokenSource | Callable[[], str]) -> None:
        self._token = source.token if isinstance(source, TokenSource) else source

    def _details(self, details):
        metadata = [(k, v) for k, v in (details.metadata or ()) if k != "authorization"]
        metadata.append(("authorization", f"Bearer {self._token()}"))
        return _Details(details, metadata)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def is_loopback(target: str) -> bool:
    host = target.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def auth_channel(target: str, *, token: TokenSource | None = None, tls=None,
                 options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
    """A channel to `target`: TLS when `tls` (a store.tls.TlsConfig) is given, the token on every call when
    `token` is. With neither it is exactly `grpc.insecure_channel(target, options)`."""
    if tls is not None:
        channel = grpc.secure_channel(target, tls.channel_credentials(),
                                      options=[*options, *tls.channel_options()])
    else:
        if token is not None and not is_loopback(target):
            log.warning("sending a bearer token without TLS to %s: anyone on the network path can read it; "
                        "configure TLS", target)
        channel = grpc.insecure_channel(target, options=list(options))
    if token is None:
        return channel
    return grpc.intercept_channel(channel, BearerInterceptor(token))
