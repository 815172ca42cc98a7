"""Who may call what: roles, identities, and `AuthConfig` (where the tokens of each role come from).

    role     holds                                   may call (store/auth/methods.py has the exact table)
    node     storage nodes and the master itself     RegisterNode / Heartbeat / ReportObjects; the master's
                                                     Demote / Promote / Drop on a node
    client   an engine or application, ONE tenant    put / lookup / get / contains / remove / stats, in its tenant
    admin    an operator                             list / inspect / evict / rm / drain / stats of everything
    viewer   a dashboard reader or a Prometheus      stats of everything, the master's dashboard and /metrics;
             scraper                                 nothing that changes the pool or reads a key

Token files (and variables) hold whitespace-separated entries; a line starting with `#` is a comment:

    node_tokens / admin_tokens /
    viewer_tokens:                TOKEN                  e.g.  3f9c...e1   (openssl rand -hex 32)
    client_tokens:                TENANT:TOKEN           e.g.  acme:7b21...9d

A role (or a tenant) may list several tokens: that is rotation. Add the new token next to the old one, move every
caller to the new one, then delete the old one; no restart (TokenStore re-reads changed files). A caller that
*presents* a token from a source presents its first entry. A token is 16-512 characters of [A-Za-z0-9._~+/=-];
the same token under two roles or two tenants is refused (it would make the identity ambiguous).

`cert_roles` maps a verified client certificate (mutual TLS) to an identity when no bearer token is sent:
OU = role, O = tenant (clients), CN = a name for logs; see kvpool/certs.py, which writes such certificates.
"""

from __future__ import annotations

import enum
import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Mapping

from kvpool.store.auth.sources import Source, parse_source, read_source

MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 512
_TOKEN_RE = re.compile(r"^[A-Za-z0-9._~+/=-]+$")
_SPLIT_RE = re.compile(r"[\s,]+")


class Role(str, enum.Enum):
    NODE = "node"
    CLIENT = "client"
    ADMIN = "admin"
    VIEWER = "viewer"


@dataclass(slots=True, frozen=True)
class Identity:
    """The caller of one RPC. `tenant` is set for CLIENT only; `name` says where the identity came from (a source
    field such as "client_tokens[0]" or a certificate's CN), for logs. It never holds a secret."""

    role: Role
    tenant: str = ""
    name: str = ""


def split_sources(value: object, name: str) -> tuple[str, ...]:
    # A config file gives a list; a KVPOOL_* variable gives one string: "file:/a,file:/b" or whitespace-separated.
    if isinstance(value, str):
        value = tuple(p for p in _SPLIT_RE.split(value.strip()) if p)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name}: expected a list of file:PATH / env:NAME sources, got a {type(value).__name__}")
    return tuple(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthConfig:
    """Token sources per role, checked on every RPC by AuthInterceptor. Nothing configured = auth off.

    `reload_interval_s`: token files are stat'ed at most this often (0 = on every RPC); a rotation is in force on
    the first RPC after that. `validate_sources=False` checks only the syntax (for tools that describe a config on
    another machine); a TokenStore always loads, and so validates, the sources.
    """

    node_tokens: tuple[str, ...] = ()
    admin_tokens: tuple[str, ...] = ()
    client_tokens: tuple[str, ...] = ()
    viewer_tokens: tuple[str, ...] = ()
    cert_roles: bool = False
    reload_interval_s: float = 1.0
    validate_sources: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        for name in ("node_tokens", "admin_tokens", "client_tokens", "viewer_tokens"):
            object.__setattr__(self, name, split_sources(getattr(self, name), name))
            for i, text in enumerate(getattr(self, name)):
                parse_source(text, f"{name}[{i}]")
        if not isinstance(self.cert_roles, bool):
            raise ValueError(f"cert_roles: expected true or false, got {self.cert_roles!r}")
        r = self.reload_interval_s
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 3600:
            raise ValueError(f"reload_interval_s: expected seconds in [0, 3600], got {r!r}")
        if self.validate_sources:
            load_entries(self)

    @property
    def enabled(self) -> bool:
        return bool(self.node_tokens or self.admin_tokens or self.client_tokens or self.viewer_tokens
                    or self.cert_roles)

    def sources(self) -> list[tuple[Role, Source]]:
        out = []
        for role, name in ((Role.NODE, "node_tokens"), (Role.ADMIN, "admin_tokens"), (Role.CLIENT, "client_tokens"),
                           (Role.VIEWER, "viewer_tokens")):
            out.extend((role, parse_source(text, f"{name}[{i}]")) for i, text in enumerate(getattr(self, name)))
        return out


def digest(key: bytes, token: str | bytes) -> bytes:
    """What a TokenStore keys its table by: keyed BLAKE2b-256 (a PRF, like HMAC, and ~4x cheaper than OpenSSL's
    one-shot HMAC-SHA256 here) under the store's own random key (see table.py)."""
    return hashlib.blake2b(token.encode() if isinstance(token, str) else token, key=key, digest_size=32).digest()


def check_token(token: str, where: str) -> None:
    if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS or not _TOKEN_RE.match(token):
        # The entry is not echoed: a near-miss of a real token is still a secret.
        raise ValueError(f"{where}: a token must be {MIN_TOKEN_CHARS}-{MAX_TOKEN_CHARS} characters of "
                         "[A-Za-z0-9._~+/=-] (e.g. `openssl rand -hex 32`)")


def parse_entries(text: str, role: Role, src: Source) -> list[tuple[str, Identity]]:
    """(token, identity) for each entry of one source's text."""
    out = []
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    for n, entry in enumerate(p for p in _SPLIT_RE.split("\n".join(lines)) if p):
        where = f"{src.field} ({src}, entry {n + 1})"
        tenant = ""
        if role is Role.CLIENT:
            tenant, sep, entry = entry.rpartition(":")
            if not sep or not tenant:
                raise ValueError(f"{where}: client entries are TENANT:TOKEN")
        check_token(entry, where)
        out.append((entry, Identity(role, tenant, src.field)))
    if not out:
        raise ValueError(f"{src.field}: {src} holds no token")
    return out


def load_entries(config: AuthConfig, env: Mapping[str, str] | None = None, *, key: bytes | None = None
                 ) -> tuple[dict[bytes, Identity], dict[Source, str]]:
    """Read every source: ({digest(key, token): identity}, {file source: its text}). ValueError naming the field for
    a missing source, a malformed entry, or one token under two identities (role or tenant)."""
    key = os.urandom(32) if key is None else key
    table: dict[bytes, Identity] = {}
    texts: dict[Source, str] = {}
    for role, src in config.sources():
        text = read_source(src, env)
        if src.kind == "file":
            texts[src] = text
        for token, ident in parse_entries(text, role, src):
            d = digest(key, token)
            seen = table.get(d)
            if seen is not None and (seen.role, seen.tenant) != (ident.role, ident.tenant):
                raise ValueError(f"{src.field}: a token of {src} is also listed by {seen.name} for another "
                                 f"{'tenant' if seen.role == ident.role else 'role'}; every token names one identity")
            table.setdefault(d, ident)
    return table, texts
