"""`AuthInterceptor`: every RPC is authenticated (who?) and authorised (may that role call this method?) before its
handler runs; the handler reads the caller with `current_identity()`.

    metadata "authorization: Bearer <token>" ──TokenStore.identify──▶ Identity ─┐
    (no token, cert_roles on) verified client certificate OU/O/CN ──────────────┼─▶ METHOD_RULES[method]
    neither, or an unknown token ──▶ UNAUTHENTICATED                              │    role not allowed
                                                                                  ▼    ──▶ PERMISSION_DENIED
                                        handler runs with current_identity() = Identity(role, tenant, name)

A bearer token, when sent, decides alone: a bad token is refused even if a good certificate came with it (no
silent fallback). A certificate counts only when gRPC verified it against the server's CA (mutual TLS with
`require_client_cert`; otherwise gRPC does not even ask for one). Refused calls never reach the handler: its
behaviour is swapped for one that aborts without reading the request stream. `current_identity()` is a
ContextVar set around the handler (and around each step of a streaming reply), so the master derives the tenant
from it, never from a request field. With auth off, do not install the interceptor: servers behave exactly as
before and `current_identity()` is None.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Callable, Mapping

import grpc

from kvpool.store.auth.config import Identity, Role
from kvpool.store.auth.methods import GRANT, METHOD_RULES, PUBLIC, Rule
from kvpool.store.auth.table import TokenStore

log = logging.getLogger(__name__)

_identity: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("kvpool_identity", default=None)
_CERT_CACHE_MAX = 1024
_BEHAVIOURS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def current_identity() -> Identity | None:
    """The caller of the RPC this thread is serving (None: auth off, or a PUBLIC / GRANT method)."""
    return _identity.get()


@contextlib.contextmanager
def serving_as(ident: Identity | None):
    """Run the block with current_identity() = ident: for servers other than gRPC that authenticate a caller
    themselves (the master's control channel, store/control_channel.py)."""
    token = _identity.set(ident)
    try:
        yield
    finally:
        _identity.reset(token)


def role_refusal(method: str, rule: Rule | None, ident: Identity) -> str:
    """Why `ident` may not call `method` under `rule` ("" = it may); rule None: the method is in no table."""
    if rule is None:
        return f"{method}: not callable with authentication on"
    if ident.role not in rule:
        need = " or ".join(sorted(r.value for r in rule))
        return f"{method}: needs a {need} credential; this one is {ident.role.value}"
    return ""


def _bearer(metadata) -> str | None:
    """The token of the first `authorization` entry; "" when that entry is not `Bearer <token>`."""
    for key, value in metadata or ():
        if key == "authorization":
            scheme, _, token = (value if isinstance(value, str) else "").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


def identity_from_cert(pem: bytes) -> Identity | None:
    """OU = role, O = tenant (client certificates), CN = name; None if the subject names no kvpool role."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        subject = x509.load_pem_x509_certificate(pem).subject
    except ValueError:
        return None

    def one(oid) -> str | None:
        attrs = subject.get_attributes_for_oid(oid)
        return attrs[0].value if len(attrs) == 1 else None  # two OUs or two Os would be ambiguous: no identity

    try:
        role = Role(one(NameOID.ORGANIZATIONAL_UNIT_NAME))
    except ValueError:
        return None
    tenant = one(NameOID.ORGANIZATION_NAME) or ""
    if (role is Role.CLIENT) != bool(tenant):
        return None
    return Identity(role, tenant, f"cert CN={one(NameOID.COMMON_NAME) or '?'}")


class AuthInterceptor(grpc.ServerInterceptor):
    """Install with `grpc.server(..., interceptors=[AuthInterceptor(store)])`.

    `cert_roles`: accept a verified client certificate as the identity when no token is sent (store may then be
    None: certificates only). `on_reject(method, code)` is called for each refused RPC (metrics). `rules` is the
    method table (tests pass an extended one).
    """

    def __init__(self, store: TokenStore | None, *, cert_roles: bool = False,
                 rules: Mapping[str, Rule] = METHOD_RULES,
                 on_reject: Callable[[str, grpc.StatusCode], None] | None = None) -> None:
        if store is None and not cert_roles:
            raise ValueError("store: give a TokenStore, or cert_roles=True to identify callers by certificate")
        self.store = store
        self.cert_roles = cert_roles
        self.rules = rules
        self.on_reject = on_reject
        self._cert_cache: dict[bytes, Identity | None] = {}
        self._unlisted: set[str] = set()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # UNIMPLEMENTED, as without auth
        method = handler_call_details.method
        rule = self.rules.get(method)
        if rule is PUBLIC or rule is GRANT:
            return handler
        token = _bearer(handler_call_details.invocation_metadata)
        if token is not None:
            ident = self.store.identify(token) if token and self.store is not None else None
            if ident is None:
                why = "unknown or revoked token" if token else "malformed header, expected 'Bearer <token>'"
                return self._deny(handler, method, grpc.StatusCode.UNAUTHENTICATED, f"authorization: {why}")
            refusal = self._role_refusal(method, rule, ident)
            if refusal:
                return self._deny(handler, method, grpc.StatusCode.PERMISSION_DENIED, refusal)
            return self._bind(handler, lambda context: ident)
        if not self.cert_roles:
            return self._deny(handler, method, grpc.StatusCode.UNAUTHENTICATED,
                              "authorization: missing credential (send 'authorization: Bearer <token>')")
        return self._bind(handler, lambda context: self._from_cert(method, rule, context))

    def _role_refusal(self, method: str, rule: Rule | None, ident: Identity) -> str:
        """Why `ident` may not call `method` ("" = it may)."""
        if rule is None and method not in self._unlisted:  # a served method nobody put in the table: say so once
            self._unlisted.add(method)
            log.error("auth: %s is served but not in the method table; refused", method)
        return role_refusal(method, rule, ident)

    def _from_cert(self, method: str, rule: Rule | None, context) -> Identity:
        """Runs inside the handler (the verified certificate is on the context, not on the call details)."""
        auth = context.auth_context()
        pems = auth.get("x509_pem_cert") if auth.get("transport_security_type") == [b"ssl"] else None
        ident = None
        if pems:
            pem = pems[0]
            if pem not in self._cert_cache:
                if len(self._cert_cache) >= _CERT_CACHE_MAX:
                    self._cert_cache.clear()
                self._cert_cache[pem] = identity_from_cert(pem)
            ident = self._cert_cache[pem]
        if ident is None:
            self._rejected(method, grpc.StatusCode.UNAUTHENTICATED)
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "authorization: no token, and no client certificate naming a kvpool role (OU)")
        refusal = self._role_refusal(method, rule, ident)
        if refusal:
            self._rejected(method, grpc.StatusCode.PERMISSION_DENIED)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        return ident

    def _rejected(self, method: str, code: grpc.StatusCode) -> None:
        log.debug("auth: %s refused: %s", method, code.name)
        if self.on_reject is not None:
            self.on_reject(method, code)

    def _deny(self, handler, method: str, code: grpc.StatusCode, message: str):
        def abort(request_or_iterator, context):
            self._rejected(method, code)
            context.abort(code, message)  # raises; the request stream is never read

        return handler._replace(**{_behaviour(handler): abort})

    @staticmethod
    def _bind(handler, resolve: Callable[[object], Identity]):
        """The same handler, run with current_identity() = resolve(context)."""
        name = _behaviour(handler)
        inner = getattr(handler, name)
        if handler.response_streaming:
            def streaming(request, context):
                ident = resolve(context)
                token = _identity.set(ident)
                try:
                    replies = iter(inner(request, context))
                finally:
                    _identity.reset(token)
                return _with_identity(replies, ident)

            return handler._replace(**{name: streaming})

        def unary(request, context):
            token = _identity.set(resolve(context))
            try:
                return inner(request, context)
            finally:
                _identity.reset(token)

        return handler._replace(**{name: unary})


def _with_identity(replies, ident: Identity):
    # gRPC pulls a streaming reply step by step, possibly after the wrapper returned: bind each step, and the close
    # of the handler's generator when the call ends early (cancelled), so its cleanup sees the caller too.
    try:
        while True:
            token = _identity.set(ident)
            try:
                item = next(replies)
            except StopIteration:
                return
            finally:
                _identity.reset(token)
            yield item
    finally:
        close = getattr(replies, "close", None)
        if close is not None:
            token = _identity.set(ident)
            try:
                close()
            finally:
                _identity.reset(token)


def _behaviour(handler) -> str:
    return _BEHAVIOURS[2 * bool(handler.request_streaming) + bool(handler.response_streaming)]
