"""Certificates for the TLS / auth tests, made once per module with kvpool/certs.py (the code `kvpool certs` runs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpool import certs


@dataclass
class Pki:
    dir: Path
    ca: certs.Issued
    server: certs.Issued          # OU=node, SANs 127.0.0.1 / localhost
    acme: certs.Issued            # client cert OU=client O=acme
    admin: certs.Issued           # client cert OU=admin
    nobody: certs.Issued          # client cert of this CA with no kvpool role
    rogue_ca: certs.Issued
    rogue: certs.Issued           # OU=admin, but signed by another CA
    expired_client: certs.Issued  # OU=admin, this CA, expired yesterday
    expired_server: certs.Issued  # this CA, expired yesterday

    def path(self, name: str, ext: str = "pem") -> str:
        return str(self.dir / f"{name}.{ext}")


def _no_role_cert(ca: certs.Issued) -> certs.Issued:
    """A CA-signed client certificate whose subject names no kvpool role (no OU): valid TLS, no identity."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nobody")]))
            .issuer_name(x509.load_pem_x509_certificate(ca.cert_pem).subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .sign(serialization.load_pem_private_key(ca.key_pem, None), hashes.SHA256()))
    return certs.Issued(cert.public_bytes(serialization.Encoding.PEM),
                        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))


def make_pki(out: Path) -> Pki:
    ca = certs.make_ca()
    rogue_ca = certs.make_ca("rogue-ca")
    pki = Pki(out, ca, certs.issue(ca, "server"),
              certs.issue(ca, "engine-a", kind="client", role="client", tenant="acme"),
              certs.issue(ca, "alice", kind="client", role="admin"), _no_role_cert(ca), rogue_ca,
              certs.issue(rogue_ca, "mallory", kind="client", role="admin"),
              certs.issue(ca, "old-admin", kind="client", role="admin", days=1, backdate_days=2),
              certs.issue(ca, "old-server", days=1, backdate_days=2))
    for name in ("ca", "server", "acme", "admin", "nobody", "rogue_ca", "rogue", "expired_client", "expired_server"):
        certs.save(getattr(pki, name), out, name)
    return pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))
