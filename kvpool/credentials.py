"""What a client of the pool presents: a bearer token and/or TLS settings (PoolClient, AdminClient, drain, the CLI,
the connector), from arguments or KVPOOL_* variables.

    Credentials.resolve(token=None, tls=None)     an explicit value wins; else the environment:
        KVPOOL_AUTH_TOKEN   file:PATH | env:NAME (a source, like every credential setting: the value itself would
                            show in `kvpool config check --json`; put a literal token in another variable NAME)
        KVPOOL_TLS_CA, KVPOOL_TLS_CERT, KVPOOL_TLS_KEY, KVPOOL_TLS_SERVER_NAME
    .channel(address, options)      the gRPC channel: TLS when configured, the token on every call
    .data_context()                 the ssl.SSLContext for nodes whose data channel speaks TLS (None without TLS
                                    settings: the system's CAs then, in Transfers)

A token file is re-read when it changes (store/auth TokenSource), so rotating a client's token needs no restart.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from typing import Mapping, Sequence

import grpc

from kvpool.store.auth import TokenSource, auth_channel, bearer_metadata
from kvpool.store.auth.client import is_loopback
from kvpool.store.tls import TlsConfig

log = logging.getLogger(__name__)

TOKEN_ENV = "KVPOOL_AUTH_TOKEN"
TLS_ENV = {"ca": "KVPOOL_TLS_CA", "cert": "KVPOOL_TLS_CERT", "key": "KVPOOL_TLS_KEY",
           "server_name": "KVPOOL_TLS_SERVER_NAME"}


@dataclass(frozen=True, slots=True)
class Credentials:
    token: TokenSource | None = None
    tls: TlsConfig | None = None

    @classmethod
    def resolve(cls, token: str | TokenSource | None = None, tls: TlsConfig | None = None, *,
                env: Mapping[str, str] | None = None, field: str = "token") -> "Credentials":
        """`token`: a TokenSource, or a `file:PATH` / `env:NAME` source (ValueError naming `field` otherwise);
        None: KVPOOL_AUTH_TOKEN if set. `tls`: a TlsConfig; None: KVPOOL_TLS_* if any is set."""
        env = os.environ if env is None else env
        if token is None and env.get(TOKEN_ENV):
            token = TokenSource(env[TOKEN_ENV], field=TOKEN_ENV, env=env)
        elif isinstance(token, str):
            token = TokenSource(token, field=field, env=env)
        if tls is None and any(env.get(var) for var in TLS_ENV.values()):
            tls = _tls({name: env.get(var, "") for name, var in TLS_ENV.items()}, lambda f: f"KVPOOL_TLS_{f.upper()}")
        return cls(token, tls)

    def channel(self, address: str, options: Sequence[tuple[str, object]] = (), *,
                with_token: bool = True) -> grpc.Channel:
        """`with_token=False`: the caller passes `metadata()` with each call itself (MasterRpc)."""
        if not with_token and self.token is not None and self.tls is None:
            if not is_loopback(address):
                log.warning("sending a bearer token without TLS to %s: anyone on the network path can read it; "
                            "configure TLS", address)
        return auth_channel(address, token=self.token if with_token else None, tls=self.tls, options=options)

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        """The `authorization` metadata of one call (the token file re-read when it changed), or None."""
        return bearer_metadata(self.token.token()) if self.token is not None else None

    def data_context(self) -> ssl.SSLContext | None:
        return self.tls.client_ssl_context() if self.tls is not None else None

    @property
    def server_name(self) -> str:
        return self.tls.server_name if self.tls is not None else ""


def add_credential_args(p) -> None:
    """`--token` and `--tls-*` for the commands that talk to a master (defaults: KVPOOL_AUTH_TOKEN, KVPOOL_TLS_*)."""
    p.add_argument("--token", default=None, metavar="SOURCE",
                   help="the credential to present: file:PATH or env:NAME, never the token itself (`ps` shows "
                        f"flags) (default: ${TOKEN_ENV})")
    p.add_argument("--tls-ca", default=None, metavar="PEM", help=f"CA that verifies the master (default: "
                                                                 f"${TLS_ENV['ca']}); turns TLS on")
    p.add_argument("--tls-cert", default=None, metavar="PEM", help="client certificate for mutual TLS "
                                                                   f"(default: ${TLS_ENV['cert']})")
    p.add_argument("--tls-key", default=None, metavar="PEM", help=f"its private key (default: ${TLS_ENV['key']})")
    p.add_argument("--tls-server-name", default=None, metavar="NAME",
                   help="name to expect in the master's certificate instead of the address dialled "
                        f"(default: ${TLS_ENV['server_name']})")


def credentials_from_args(args) -> Credentials:
    """Flags over environment; ValueError naming the flag."""
    tls = None
    flags = {"ca": args.tls_ca, "cert": args.tls_cert, "key": args.tls_key, "server_name": args.tls_server_name}
    if any(v is not None for v in flags.values()):
        values = {name: (v if v is not None else os.environ.get(TLS_ENV[name], "")) for name, v in flags.items()}
        tls = _tls(values, lambda f: "--tls-" + f.replace("_", "-"))
    return Credentials.resolve(args.token, tls, field="--token")


def credentials_of(token: str = "", *, ca: str = "", cert: str = "", key: str = "", server_name: str = "",
                   prefix: str = "") -> Credentials:
    """From a config's flat fields `auth_token`, `tls_ca`, ... (errors name them with `prefix`); empty token and TLS
    fields fall back to the environment as `Credentials.resolve` does."""
    tls = _tls({"ca": ca, "cert": cert, "key": key, "server_name": server_name}, lambda f: f"{prefix}tls_{f}")
    return Credentials.resolve(token or None, tls, field=f"{prefix}auth_token")


def _tls(values: dict[str, str], name_of) -> TlsConfig | None:
    """TlsConfig.maybe(**values), its errors naming the flag or variable (`name_of(field)`) instead of the field."""
    try:
        return TlsConfig.maybe(**values)
    except ValueError as exc:
        fields, sep, rest = str(exc).partition(": ")
        names = "/".join(name_of(f) for f in fields.split("/")) if sep and fields.replace("/", "").replace(
            "_", "").isalpha() else fields
        raise ValueError(f"{names}{sep}{rest}") from None


__all__ = ["Credentials", "add_credential_args", "credentials_from_args", "credentials_of", "TOKEN_ENV", "TLS_ENV"]
