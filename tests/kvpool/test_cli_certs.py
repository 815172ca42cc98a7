"""`kvpool certs`: the files it writes (modes, subjects, SANs, validity), that they work as TLS credentials, and its
argument errors (exit 2, nothing written)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import stat
import subprocess
import sys

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from kvpool.cli import main
from kvpool.store.tls import TlsConfig


def load(path):
    return x509.load_pem_x509_certificate(open(path, "rb").read())


def subject(cert):
    return {a.oid._name: a.value for a in cert.subject}  # noqa: SLF001


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_cluster_writes_a_ca_server_admin_and_tenant_clients(tmp_path, capsys):
    out = tmp_path / "tls"
    assert main(["certs", "cluster", "--out", str(out), "--host", "10.0.0.5", "--host", "kv.internal",
                 "--tenant", "acme", "--json"]) == 0
    written = json.loads(capsys.readouterr().out)["written"]
    names = ["ca", "server", "admin", "client-acme"]
    assert written == [str(out / f"{n}.{e}") for n in names for e in ("pem", "key")]
    for n in names:
        assert (mode(out / f"{n}.key"), mode(out / f"{n}.pem")) == (0o600, 0o644)
    ca, server = load(out / "ca.pem"), load(out / "server.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1"),
                                                       ipaddress.ip_address("10.0.0.5")]
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "kv.internal"]
    assert list(server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    assert subject(server) == {"commonName": "server", "organizationalUnitName": "node"}
    assert subject(load(out / "admin.pem")) == {"commonName": "admin", "organizationalUnitName": "admin"}
    acme = load(out / "client-acme.pem")
    assert subject(acme) == {"commonName": "client-acme", "organizationalUnitName": "client", "organizationName": "acme"}
    assert list(acme.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    for leaf in (server, acme):
        ca.public_key().verify(leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(leaf.signature_hash_algorithm))
    TlsConfig(cert=str(out / "server.pem"), key=str(out / "server.key"), ca=str(out / "ca.pem"),
              require_client_cert=True).server_ssl_context()
    TlsConfig(cert=str(out / "client-acme.pem"), key=str(out / "client-acme.key"), ca=str(out / "ca.pem"))


def test_single_commands_validity_and_an_expired_certificate(tmp_path, capsys):
    d = tmp_path / "pki"
    assert main(["certs", "ca", "--out", str(d), "--days", "30"]) == 0
    assert main(["certs", "server", "node-1", "--ca-dir", str(d), "--host", "node-1.internal"]) == 0
    assert main(["certs", "client", "old", "--ca-dir", str(d), "--role", "admin", "--days", "1",
                 "--backdate-days", "3"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"wrote {d / 'ca.pem'}"
    ca = load(d / "ca.pem")
    assert ca.not_valid_after_utc - ca.not_valid_before_utc == dt.timedelta(days=30)
    old = load(d / "old.pem")
    assert old.not_valid_after_utc < dt.datetime.now(dt.timezone.utc)
    with pytest.raises(ValueError, match="^cert: .* not now; issue a new one"):
        TlsConfig(cert=str(d / "old.pem"), key=str(d / "old.key"), ca=str(d / "ca.pem"))
    assert subject(load(d / "node-1.pem"))["organizationalUnitName"] == "node"


@pytest.mark.parametrize("argv, message", [
    (["client", "x", "--role", "client"], "tenant: a client certificate is bound to one tenant"),
    (["client", "x", "--role", "admin", "--tenant", "acme"], "tenant: only client certificates carry a tenant"),
    (["server", "x", "--host", "bad host"], "hosts: 'bad host' is neither an IP address nor a DNS name"),
    (["server", "x", "--days", "0"], "days: must be > 0"),
    (["server", "ca"], "out: "),  # would overwrite the CA's own files
])
def test_bad_arguments_exit_2_and_write_nothing(tmp_path, capsys, argv, message):
    d = tmp_path / "pki"
    assert main(["certs", "ca", "--out", str(d)]) == 0
    before = sorted(os.listdir(d))
    capsys.readouterr()
    assert main(["certs", *argv, "--ca-dir", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvpool certs {argv[0]}: {message}"), err
    assert sorted(os.listdir(d)) == before


def test_existing_files_are_kept_unless_forced(tmp_path, capsys):
    d = tmp_path / "pki"
    assert main(["certs", "cluster", "--out", str(d)]) == 0
    key = (d / "server.key").read_bytes()
    assert main(["certs", "cluster", "--out", str(d)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err and (d / "server.key").read_bytes() == key
    os.chmod(d / "server.key", 0o644)
    assert main(["certs", "cluster", "--out", str(d), "--force"]) == 0
    assert (d / "server.key").read_bytes() != key and mode(d / "server.key") == 0o600
    assert main(["certs", "server", "n", "--ca-dir", str(tmp_path / "nowhere")]) == 2
    assert "ca_dir: " in capsys.readouterr().err


def test_the_installed_command_runs(tmp_path):
    run = subprocess.run([sys.executable, "-m", "kvpool.cli", "certs", "ca", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout.splitlines()) == (0, [f"wrote {tmp_path / 'ca.pem'}",
                                                            f"wrote {tmp_path / 'ca.key'}"])
