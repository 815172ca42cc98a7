"""`kvpool up` as a real process: prints its address, serves PoolClient, answers `kvpool status|ls|rm`, and on
SIGTERM stops cleanly (exit 0, arena file removed). Every wait is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

from kvpool import PoolClient
from kvpool.tiers.dram import huge_pages
from tests.store.cluster import free_port, pattern, wait_serving


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvpool.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def up(tmp_path):
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "kvpool.cli", "up", "--listen", address, "--dram-bytes", "4MiB",
                             "--ssd-path", str(tmp_path / "ssd"), "--ssd-bytes", "8MiB", "--shm-dir", shm,
                             "--http-listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_serving(address, proc=proc)
        yield proc, address, shm
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        import shutil

        shutil.rmtree(shm, ignore_errors=True)


def test_up_serves_clients_and_the_admin_commands_then_stops_cleanly(up):
    proc, address, shm = up
    banner = proc.stdout.readline()
    pages = huge_pages(shm)         # /dev/shm: base pages unless the machine mounts it with huge=
    pages = "base pages" if pages is None else f"2 MiB pages, {pages}"
    assert banner.startswith(f"kvpool pool up at {address} (DRAM 4 MiB on {pages}, SSD 8 MiB at ")
    url = banner.split("dashboard ", 1)[1].split(";", 1)[0]
    keys = [bytes([i]) * 16 for i in range(3)]
    with PoolClient(address, timeout=5) as c:
        assert c.put_many(keys, [pattern(i, 5000) for i in range(3)]) == ["stored"] * 3
    import json
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + "/api/stats", timeout=10) as r:
        assert json.load(r)["objects"] == 3
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    assert 'kvpool_tier_objects{node="local",tier="dram"} 3.0' in lines
    assert [line for line in lines if line.startswith("kvpool_node_writes_")] == [   # its node's write fence
        "kvpool_node_writes_cut_total 0.0", "kvpool_node_writes_drained_total 0.0", "kvpool_node_writes_late_total 0.0"]
    status = _cli("status", "--master", address)
    assert status.returncode == 0 and f"master {address}: 3 objects, 1 node(s) alive" in status.stdout
    ls = _cli("ls", "--master", address)
    assert [line.split()[0] for line in ls.stdout.splitlines()] == [k.hex() for k in keys]
    assert [line.split()[2:] for line in ls.stdout.splitlines()] == [["local", "dram", "5000"]] * 3
    one = _cli("ls", "--master", address, keys[2].hex(), "ff" * 16)
    assert one.stdout.splitlines() == [f"{keys[2].hex()}  000000000000  local      dram       5000",
                                       f"{'ff' * 16}  missing"]
    bad = _cli("rm", "--master", address, "abc")
    assert bad.returncode == 2 and bad.stderr.strip() == "kvpool rm: KEY 'abc' is not hex: expected 32 hex digits"
    short = _cli("rm", "--master", address, "abcd")
    assert short.stderr.strip() == "kvpool rm: KEY 'abcd' has 4 hex digits, expected 32"
    assert _cli("rm", "--master", address, keys[1].hex()).stdout.strip() == "removed 1 object(s)"
    assert _cli("rm", "--master", address, "--all").stdout.strip() == "removed 2 object(s)"
    assert _cli("ls", "--master", address).stdout == ""
    assert len(os.listdir(shm)) == 1  # the node's arena, shared with same-host clients
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert proc.stdout.read().strip().endswith("kvpool pool stopped")
    assert os.listdir(shm) == []


def test_status_of_a_missing_master_fails_fast_with_the_address():
    address = f"127.0.0.1:{free_port()}"
    result = _cli("status", "--master", address, "--timeout", "2")  # the call has a deadline: it cannot hang
    assert result.returncode == 1 and result.stderr.startswith(f"kvpool status: no kvpool master answering at {address}")


def test_bad_up_config_names_the_field():
    result = _cli("up", "--listen", "127.0.0.1:0", "--heartbeat-s", "20", "--node-ttl-s", "10")
    assert result.returncode == 2
    assert result.stdout.strip() == ("kvpool up: heartbeat_s (20.0) must be below node_ttl_s (10.0), or every node is "
                                     "dropped between two heartbeats")
