"""The security settings of the `kvpool` processes and commands, on real processes (127.0.0.1):

* `kvpool up` with authentication, TLS and a tenant quota, driven by the admin commands with `--token` / `--tls-*`
  (and KVPOOL_AUTH_TOKEN / KVPOOL_TLS_*), and its dashboard behind an admin or viewer token over HTTPS;
* a master listening beyond loopback without authentication warns at start, and `kvpool status` says so;
* a token is never a flag or config value: only file:PATH / env:NAME sources are accepted, and the value is not
  echoed in the error.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import pytest

from kvpool import PoolClient
from kvpool.cli import main
from kvpool.launcher import free_port, spawn, wait_grpc_serving
from kvpool.store.tls import TlsConfig
from tests.store.pki import pki  # noqa: F401 - fixture
from tests.store.test_secure_cluster import OBJ, TOKENS, auth_args, blob, key, write_tokens


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def secure_up(tmp_path_factory, pki):  # noqa: F811
    work = tmp_path_factory.mktemp("up-secure")
    tokens = write_tokens(work / "tokens")
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    address, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = spawn("up", ["up", "--listen", address, "--http-listen", http, "--ssd-path", "none", "--dram-bytes", "4MiB",
                        "--shm-dir", shm, "--tls-cert", pki.path("server"), "--tls-key", pki.path("server", "key"),
                        "--tls-ca", pki.path("ca"), "--tenant-quotas", f"acme:total={2 * OBJ}",
                        *auth_args(work / "tokens")], work)
    tls = TlsConfig(ca=pki.path("ca"))
    try:
        wait_grpc_serving(address, 30, proc, tls=tls)
        with PoolClient(address, token=tokens["acme"], tls=tls, timeout=5) as c:
            for i in range(3):  # one by one: the third evicts the first (its quota holds 2)
                assert c.put_many([key(i)], [blob(i)]) == ["stored"]
        yield {"address": address, "http": http, "tokens": tokens, "ca": pki.path("ca"), "proc": proc}
    finally:
        proc.stop()
        shutil.rmtree(shm, ignore_errors=True)


def test_admin_commands_present_token_and_tls_flags(secure_up, capsys):
    s = secure_up
    flags = ["--master", s["address"], "--tls-ca", s["ca"]]
    code, out, err = run(capsys, "status", *flags, "--token", s["tokens"]["admin"])
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"master {s['address']}: 2 objects, 1 node(s) alive"
    assert lines[-1] == "security: authentication on, TLS"
    acme = next(line for line in lines if line.lstrip().startswith("acme"))
    assert acme.split()[:2] == ["acme", "2"] and "32.0 KiB / 32.0 KiB" in acme  # its quota held 2 of the 3 puts
    stats = json.loads(run(capsys, "stats", *flags, "--token", s["tokens"]["viewer"], "--json")[1])
    assert stats["tenants"]["acme"]["quota_evictions"] == 1 and stats["security"]["tls"] is True
    rows = [json.loads(line) for line in run(capsys, "ls", *flags, "--token", s["tokens"]["admin"], "--json")[1]
            .splitlines()]
    assert [r["tenant"] for r in rows] == ["acme", "acme"]
    # Wrong or missing credentials: the master refuses (exit 1), and says why.
    assert run(capsys, "ls", *flags, "--token", s["tokens"]["viewer"]) == (
        1, "", f"kvpool ls: List at {s['address']} refused: PERMISSION_DENIED: /kvpool.v1.MasterService/List: "
               "needs a admin credential; this one is viewer\n")
    code, out, err = run(capsys, "status", *flags)
    assert code == 1 and "refused: UNAUTHENTICATED: authorization: missing credential" in err
    code, out, err = run(capsys, "status", "--master", s["address"], "--token", s["tokens"]["admin"])
    assert code == 1 and err == (f"kvpool status: no kvpool master answering at {s['address']} (start one with "
                                 "`kvpool up`, or point --master / KVPOOL_MASTER at it)\n")  # TLS port, plaintext


def test_credentials_come_from_the_environment_too(secure_up):
    s = secure_up
    env = {**os.environ, "KVPOOL_AUTH_TOKEN": s["tokens"]["admin"], "KVPOOL_TLS_CA": s["ca"]}
    done = subprocess.run([sys.executable, "-m", "kvpool.cli", "nodes", "--master", s["address"], "--json"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert [n["node"] for n in json.loads(done.stdout)] == ["local"]


def test_a_token_is_never_taken_from_a_flag_or_echoed(capsys, tmp_path):
    secret = "admin-token-pasted-on-the-command-line"
    assert run(capsys, "status", "--token", secret) == (
        2, "", "kvpool status: --token: expected file:PATH or env:NAME (the value is not shown: it may be a "
               "secret); put tokens in a file or an environment variable, never in a config value or on a command "
               "line\n")
    done = subprocess.run([sys.executable, "-m", "kvpool.cli", "master", "--listen", f"127.0.0.1:{free_port()}",
                           "--auth-admin-tokens", secret], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "auth_admin_tokens[0]: expected file:PATH or env:NAME" in done.stdout
    assert secret not in done.stdout + done.stderr
    (tmp_path / "bad.tokens").write_text("short\n")
    done = subprocess.run([sys.executable, "-m", "kvpool.cli", "master", "--listen", f"127.0.0.1:{free_port()}",
                           "--auth-admin-tokens", f"file:{tmp_path / 'bad.tokens'}"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "auth_admin_tokens[0] (file:" in done.stdout and "short" not in done.stdout


def _get(url: str, ca: str, auth: str | None = None) -> tuple[int, dict, dict]:
    ctx = ssl.create_default_context(cafile=ca)
    req = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as reply:
            return reply.status, dict(reply.headers), json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"{}")


def test_dashboard_takes_an_admin_or_viewer_token_over_https(secure_up):
    s = secure_up
    base = f"https://{s['http']}"
    assert _get(base + "/health", s["ca"])[0] == 200                       # probes need no token
    status, headers, body = _get(base + "/api/stats", s["ca"])
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic realm=")
    assert body["error"].startswith("authentication required")
    assert _get(base + "/api/stats", s["ca"], f"Bearer {TOKENS['acme']}")[2] == {
        "error": "a client token may not read the dashboard; use an admin or viewer token"}
    assert _get(base + "/metrics", s["ca"], "Bearer not-a-token-at-all-000")[0] == 401
    status, _, stats = _get(base + "/api/stats", s["ca"], f"Bearer {TOKENS['viewer']}")
    assert status == 200 and stats["tenants"]["acme"]["objects"] == 2
    basic = "Basic " + base64.b64encode(f"anyone:{TOKENS['admin']}".encode()).decode()  # what a browser sends
    ctx = ssl.create_default_context(cafile=s["ca"])
    with urllib.request.urlopen(urllib.request.Request(base + "/", headers={"Authorization": basic}), context=ctx,
                                timeout=10) as reply:
        assert reply.status == 200 and b'id="tenants-panel"' in reply.read()
    req = urllib.request.Request(base + "/metrics", headers={"Authorization": basic})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as reply:
        text = reply.read().decode()
    assert 'kvpool_tenant_quota_bytes{kind="total",tenant="acme"} 32768.0' in text
    assert 'kvpool_tenant_quota_evictions_total{tenant="acme"} 1.0' in text
    assert 'kvpool_rpc_errors_total{code="UNAUTHENTICATED",method="Stats"}' in text


def test_a_master_beyond_loopback_without_auth_warns_and_status_says_so(tmp_path, capsys):
    port = free_port()
    proc = spawn("open-master", ["master", "--listen", f"0.0.0.0:{port}"], tmp_path)
    try:
        wait_grpc_serving(f"127.0.0.1:{port}", 30, proc)
        assert "WITHOUT authentication" in proc.log() and "!" * 100 in proc.log()
        code, out, err = run(capsys, "status", "--master", f"127.0.0.1:{port}")
        assert code == 0 and out.splitlines()[-1] == (
            f"WARNING: the master listens on 0.0.0.0:{port} (beyond loopback) WITHOUT authentication: anyone who can "
            "reach it can read every tenant's KV blocks, remove or evict them, and register a node to learn the "
            "secret that signs every grant. Configure auth_*_tokens (and TLS).")
    finally:
        proc.stop()


def test_kvpool_up_on_a_wildcard_address_with_tls_and_auth_registers_its_node(tmp_path, pki):  # noqa: F811
    tokens = write_tokens(tmp_path / "tokens")
    port = free_port()
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    proc = spawn("up-wild", ["up", "--listen", f"0.0.0.0:{port}", "--http-listen", "", "--ssd-path", "none",
                             "--dram-bytes", "2MiB", "--shm-dir", shm, "--tls-cert", pki.path("server"), "--tls-key",
                             pki.path("server", "key"), "--tls-ca", pki.path("ca"),
                             *auth_args(tmp_path / "tokens")], tmp_path)
    try:
        tls = TlsConfig(ca=pki.path("ca"))
        wait_grpc_serving(f"127.0.0.1:{port}", 30, proc, tls=tls)
        from kvpool.admin import AdminClient

        with AdminClient(f"127.0.0.1:{port}", token=tokens["admin"], tls=tls) as admin:
            # the in-process node dialled the master over loopback (the certificate names 127.0.0.1, not 0.0.0.0)
            assert [n["node"] for n in admin.nodes()] == ["local"]
            assert admin.raw_stats()["security"] == {"auth": True, "tls": True, "client_certificates": False,
                                                     "loopback_only": False}
        assert "WITHOUT authentication" not in proc.log()
    finally:
        proc.stop()
        shutil.rmtree(shm, ignore_errors=True)
