"""`TlsConfig`: one set of PEM files turned into everything that speaks TLS in kvpool.

    TlsConfig(cert, key, ca, require_client_cert, server_name)
      ├─ server_credentials()   gRPC servers (master, node); mutual TLS when require_client_cert
      ├─ channel_credentials()  gRPC channels (client, CLI, connector, node -> master, master -> node)
      ├─ server_ssl_context()   the node's raw TCP data channel (store/data_channel.py DataServer)
      └─ client_ssl_context()   DataClient

Fields: `cert` + `key` = this process's own certificate chain and private key (a server needs them; a client
sends them for mutual TLS); `ca` = the CA bundle that verifies the peer (a client without one trusts the system
roots; a server needs one to verify client certificates); `server_name` = the name a client checks the server's
certificate against when the address it dials is not in the certificate's SANs (gRPC's target name override; the
data channel's server_hostname). Validation reads and parses every file and checks that key and cert match, so a
typo fails at start with the field named. Expiry is the peer's business at handshake time (an expired certificate
is refused there, and tests/store/test_tls.py shows it); a process's own certificate that is already expired or
not yet valid is refused here too, since no peer would accept it.

TLS 1.2 is the floor for the data channel (gRPC's own default is the same); ECDHE key exchange and AEAD ciphers are
the libraries' defaults. gRPC reads PEM bytes at credential creation, so rotating certificates needs a restart.
"""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path


def _read(path: str, name: str) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{name}: file {path} not found")
    try:
        return p.read_bytes()
    except OSError as exc:
        raise ValueError(f"{name}: cannot read {path}: {exc.strerror}") from None


def _certs(pem: bytes, name: str, path: str) -> list:
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        certs = []
    if not certs:
        raise ValueError(f"{name}: {path} holds no PEM certificate")
    return certs


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    cert: str = ""
    key: str = ""
    ca: str = ""
    require_client_cert: bool = False
    server_name: str = ""

    def __post_init__(self) -> None:
        from cryptography.hazmat.primitives import serialization

        for name in ("cert", "key", "ca", "server_name"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}: expected a string, got {getattr(self, name)!r}")
        if not isinstance(self.require_client_cert, bool):
            raise ValueError(f"require_client_cert: expected true or false, got {self.require_client_cert!r}")
        if bool(self.cert) != bool(self.key):
            raise ValueError("cert/key: give both (a certificate chain and its private key) or neither")
        if self.require_client_cert and not (self.ca and self.cert):
            raise ValueError("require_client_cert: needs ca (to verify client certificates) and this server's "
                             "cert/key")
        if not (self.cert or self.ca):
            raise ValueError("cert/ca: a TLS config needs this process's cert+key, a ca, or both")
        if self.cert:
            leaf = _certs(_read(self.cert, "cert"), "cert", self.cert)[0]
            try:
                key = serialization.load_pem_private_key(_read(self.key, "key"), password=None)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"key: {self.key} is not an unencrypted PEM private key ({exc})") from None
            pub = serialization.PublicFormat.SubjectPublicKeyInfo
            if (key.public_key().public_bytes(serialization.Encoding.DER, pub)
                    != leaf.public_key().public_bytes(serialization.Encoding.DER, pub)):
                raise ValueError(f"key: {self.key} is not the private key of the certificate in {self.cert}")
            now = dt.datetime.now(dt.timezone.utc)
            if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
                raise ValueError(f"cert: {self.cert} is valid from {leaf.not_valid_before_utc:%Y-%m-%d %H:%M} to "
                                 f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, not now; issue a new one")
        if self.ca:
            _certs(_read(self.ca, "ca"), "ca", self.ca)

    @classmethod
    def maybe(cls, *, cert: str = "", key: str = "", ca: str = "", require_client_cert: bool = False,
              server_name: str = "") -> "TlsConfig | None":
        """None (TLS off) when no file is named: how a process config's flat tls_* fields become a TlsConfig."""
        if not (cert or key or ca):
            if require_client_cert:
                raise ValueError("require_client_cert: needs TLS (cert, key and ca)")
            return None
        return cls(cert=cert, key=key, ca=ca, require_client_cert=require_client_cert, server_name=server_name)

    def _own(self) -> tuple[bytes, bytes] | None:
        return (_read(self.key, "key"), _read(self.cert, "cert")) if self.cert else None

    def _need_cert(self, what: str) -> tuple[bytes, bytes]:
        own = self._own()
        if own is None:
            raise ValueError(f"cert/key: {what} needs its own certificate and key")
        return own

    def server_credentials(self):
        import grpc

        key, cert = self._need_cert("a TLS server")
        ca = _read(self.ca, "ca") if self.ca else None
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                           require_client_auth=self.require_client_cert)

    def channel_credentials(self):
        import grpc

        own = self._own()
        return grpc.ssl_channel_credentials(root_certificates=_read(self.ca, "ca") if self.ca else None,
                                            private_key=own[0] if own else None,
                                            certificate_chain=own[1] if own else None)

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def server_ssl_context(self) -> ssl.SSLContext:
        self._need_cert("a TLS server")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cafile=self.ca)
        return ctx

    def client_ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca:
            ctx.load_verify_locations(cafile=self.ca)
        else:
            ctx.load_default_certs()
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx
