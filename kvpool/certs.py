"""Certificates for a test or small cluster: a self-signed CA and the certificates it issues (`kvpool certs`).

Everything is done by the `cryptography` package (no hand-written crypto). Keys are ECDSA P-256 (fast handshakes,
supported by gRPC's BoringSSL and by Python's OpenSSL alike); signatures SHA-256. What gets written:

    <out>/ca.pem  ca.key            the CA (BasicConstraints CA, path length 0, keyCertSign)
    <out>/<name>.pem  <name>.key    a leaf issued by that CA

Private keys are PKCS#8 PEM, unencrypted (a server must start unattended), created with mode 0600 and re-chmod'ed
to 0600 if the file already existed. An existing file is never overwritten unless `force=True`.

Identity in a leaf's subject (read by store/auth.py when the master maps client certificates to roles):

    OU = role   "node" (also the master: cluster-internal peers), "client", or "admin"
    O  = tenant  client certificates only
    CN = name    free text, shown in logs

Server leaves (`kind="server"`) carry serverAuth + clientAuth (a node serves NodeService and calls the master; the
master serves MasterService and calls nodes) and SANs for 127.0.0.1, localhost and the given hosts. Client leaves
carry clientAuth only. `not_before` / `not_after` are free so tests can make an expired certificate.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES = ("node", "client", "admin")
DEFAULT_HOSTS = ("127.0.0.1", "localhost")


@dataclass(slots=True, frozen=True)
class Issued:
    """A certificate and its key as PEM bytes, plus where they were written (if they were)."""

    cert_pem: bytes
    key_pem: bytes
    cert_path: Path | None = None
    key_path: Path | None = None


def _window(days: float, backdate_days: float,
            not_before: dt.datetime | None, not_after: dt.datetime | None) -> tuple[dt.datetime, dt.datetime]:
    if days <= 0:
        raise ValueError(f"days: must be > 0, got {days!r}")
    if backdate_days < 0:
        raise ValueError(f"backdate_days: must be >= 0, got {backdate_days!r}")
    now = dt.datetime.now(dt.timezone.utc)
    start = not_before or now - dt.timedelta(days=backdate_days, minutes=5)  # 5 min of clock skew
    end = not_after or start + dt.timedelta(days=days)
    if end <= start:
        raise ValueError(f"not_after: {end.isoformat()} is not after not_before {start.isoformat()}")
    return start, end


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(name: str = "kvpool-ca", *, days: float = 3650, backdate_days: float = 0,
            not_before: dt.datetime | None = None, not_after: dt.datetime | None = None) -> Issued:
    if not name:
        raise ValueError("name: the CA needs a non-empty common name")
    start, end = _window(days, backdate_days, not_before, not_after)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    seen = set()
    for host in (*DEFAULT_HOSTS, *hosts):
        host = host.strip()
        if not host or host in seen:
            continue
        seen.add(host)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if any(c.isspace() for c in host) or "/" in host:
                raise ValueError(f"hosts: {host!r} is neither an IP address nor a DNS name") from None
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def issue(ca: Issued, name: str, *, kind: str = "server", role: str = "node", tenant: str = "",
          hosts: Sequence[str] = (), days: float = 365, backdate_days: float = 0,
          not_before: dt.datetime | None = None, not_after: dt.datetime | None = None) -> Issued:
    """A leaf signed by `ca`. kind "server" (server+client auth, SANs) or "client" (client auth only)."""
    if kind not in ("server", "client"):
        raise ValueError(f"kind: must be 'server' or 'client', got {kind!r}")
    if role not in ROLES:
        raise ValueError(f"role: must be one of {', '.join(ROLES)}, got {role!r}")
    if not name:
        raise ValueError("name: a certificate needs a non-empty common name")
    if role == "client" and not tenant:
        raise ValueError("tenant: a client certificate is bound to one tenant; give --tenant")
    if role != "client" and tenant:
        raise ValueError(f"tenant: only client certificates carry a tenant (role is {role!r})")
    if kind == "server" and role != "node":
        raise ValueError(f"role: server certificates identify cluster peers (role 'node'), got {role!r}")
    start, end = _window(days, backdate_days, not_before, not_after)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, name), x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role)]
    if tenant:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, tenant))
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if kind == "server" else \
        [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if kind == "server":
        builder = builder.add_extension(_san(hosts), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _write(path: Path, data: bytes, *, private: bool, force: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600 if private else 0o644)
    except FileExistsError:
        raise ValueError(f"out: {path} exists; pass --force to overwrite it") from None
    try:
        if private:
            os.fchmod(fd, 0o600)  # an existing file opened with O_TRUNC keeps its old mode otherwise
        os.write(fd, data)
    finally:
        os.close(fd)


def save(issued: Issued, out_dir: str | os.PathLike, name: str, *, force: bool = False) -> Issued:
    """Write `<out_dir>/<name>.pem` and `<name>.key` (0600); returns the record with the paths filled in."""
    return save_many([(name, issued)], out_dir, force=force)[0]


def save_many(items: Sequence[tuple[str, Issued]], out_dir: str | os.PathLike, *, force: bool = False
              ) -> list[Issued]:
    """`save` for several (name, issued), checking every name and path before writing any file."""
    out = Path(out_dir)
    paths = []
    for name, _ in items:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"name: {name!r} cannot be a file name")
        paths.append((out / f"{name}.pem", out / f"{name}.key"))
    if not force:
        for path in (p for pair in paths for p in pair):
            if path.exists():
                raise ValueError(f"out: {path} exists; pass --force to overwrite it")
    out.mkdir(parents=True, exist_ok=True)
    saved = []
    for (_, issued), (cert_path, key_path) in zip(items, paths):
        _write(key_path, issued.key_pem, private=True, force=force)
        _write(cert_path, issued.cert_pem, private=False, force=force)
        saved.append(Issued(issued.cert_pem, issued.key_pem, cert_path, key_path))
    return saved


def load_ca(ca_dir: str | os.PathLike) -> Issued:
    """The CA written by `save(make_ca(), dir, "ca")`; ValueError naming the missing file."""
    d = Path(ca_dir)
    paths = (d / "ca.pem", d / "ca.key")
    for path in paths:
        if not path.is_file():
            raise ValueError(f"ca_dir: {path} not found (create the CA first: kvpool certs ca --out {d})")
    cert_pem, key_pem = paths[0].read_bytes(), paths[1].read_bytes()
    try:
        x509.load_pem_x509_certificate(cert_pem)
        serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"ca_dir: {d} does not hold a PEM CA certificate and unencrypted key: {exc}") from None
    return Issued(cert_pem, key_pem, paths[0], paths[1])
