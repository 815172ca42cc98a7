"""Multi-process helpers for the distributed-pool tests: a real redis-server, master and node processes started as
`python -m kvpool.cli ...` on 127.0.0.1, each waited for (gRPC health SERVING) with a deadline and killed in the
fixture's finalizer. Import the fixtures into a test module with `from tests.store.cluster import ...`."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvpool.launcher import Proc, free_port, spawn, wait_grpc_serving  # noqa: F401 - re-exported


STARTUP_DEADLINE_S = 20.0


def wait_serving(address: str, deadline_s: float = STARTUP_DEADLINE_S, proc: subprocess.Popen | None = None, *,
                 tls=None) -> None:
    wait_grpc_serving(address, deadline_s, proc, tls=tls)


@dataclass
class Cluster:
    """Master and nodes of one test; everything started is killed by `close()`. Node arenas live in a private
    directory under /dev/shm that `close()` removes, so a SIGKILLed node leaves nothing behind. `tls`: the client
    TlsConfig the health checks use when the servers speak TLS."""

    workdir: Path
    procs: list[Proc] = field(default_factory=list)
    master: Proc | None = None
    nodes: dict[str, Proc] = field(default_factory=dict)
    shm_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm"))
    tls: object = None

    def start_master(self, *, port: int | None = None, redis_url: str | None = None, node_ttl_s: float = 1.5,
                     extra: list[str] | None = None) -> Proc:
        port = port or free_port()
        args = ["master", "--listen", f"127.0.0.1:{port}", "--node-ttl-s", str(node_ttl_s), *(extra or [])]
        if redis_url:
            args += ["--redis-url", redis_url]
        proc = spawn(f"master-{len(self.procs)}", args, self.workdir)
        proc.address = f"127.0.0.1:{port}"
        self.procs.append(proc)
        wait_serving(proc.address, proc=proc.popen, tls=self.tls)
        self.master = proc
        return proc

    def start_node(self, node_id: str, *, dram: str = "8MiB", ssd: str | None = None, port: int | None = None,
                   heartbeat_s: float = 0.3, extra: list[str] | None = None) -> Proc:
        assert self.master is not None
        port = port or free_port()
        args = ["node", "--master", self.master.address, "--node-id", node_id, "--listen", f"127.0.0.1:{port}",
                "--dram-bytes", dram, "--heartbeat-s", str(heartbeat_s), "--share-dram", "true", "--shm-dir", self.shm_dir, *(extra or [])]
        if ssd:
            args += ["--ssd-path", str(self.workdir / f"ssd-{node_id}"), "--ssd-bytes", ssd]
        proc = spawn(f"node-{node_id}-{len(self.procs)}", args, self.workdir)
        proc.address = f"127.0.0.1:{port}"
        self.procs.append(proc)
        wait_serving(proc.address, proc=proc.popen, tls=self.tls)
        self.nodes[node_id] = proc
        return proc

    def logs(self) -> str:
        return "\n".join(f"----- {p.name}\n{p.log()[-4000:]}" for p in self.procs)

    def close(self) -> None:
        for proc in reversed(self.procs):
            try:
                proc.stop(timeout=5)
            except Exception:  # noqa: BLE001 - cleanup must go on
                proc.kill()
        shutil.rmtree(self.shm_dir, ignore_errors=True)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(workdir=tmp_path)
    yield c
    c.close()
    print(c.logs())  # captured: pytest shows it only when the test failed


@dataclass
class RedisServer:
    port: int
    popen: subprocess.Popen
    workdir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)


def start_redis(workdir: Path, *, appendonly: bool = False, port: int | None = None) -> RedisServer:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server not on PATH (scripts/setup.sh installs it)")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(workdir),
            "--appendonly", "yes" if appendonly else "no", "--appendfsync", "always"]
    popen = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    end = time.monotonic() + STARTUP_DEADLINE_S
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if popen.poll() is not None or time.monotonic() > end:
                popen.kill()
                raise RuntimeError(f"redis-server on port {port} did not start")
            time.sleep(0.05)
    client.close()
    return RedisServer(port=port, popen=popen, workdir=workdir)


@pytest.fixture
def redis_server(tmp_path):
    server = start_redis(tmp_path / "redis")
    yield server
    server.kill()


# ---------------------------------------------------------------- client processes (run under multiprocessing spawn)

def pattern(i: int, size: int, version: int = 0) -> bytes:
    """Object i, version v: an 8-byte header (i, v) then one byte value, so a torn or foreign buffer is detectable."""
    import struct

    return struct.pack("<II", i, version) + bytes([(i * 7 + version * 13 + 1) % 256]) * (size - 8)


def check_pattern(buf, i: int) -> int:
    """The version found in `buf` if it is a whole, valid object i; raises AssertionError otherwise."""
    import struct

    data = bytes(buf)
    got_i, version = struct.unpack("<II", data[:8])
    assert got_i == i, f"object {i}: header says {got_i}"
    assert data == pattern(i, len(data), version), f"object {i} version {version}: torn or foreign bytes"
    return version


def key_of(i: int, salt: int = 0) -> bytes:
    return (salt << 32 | i).to_bytes(16, "big")


def client_put(address: str, indices: list[int], size: int, transport: str = "auto", salt: int = 0) -> list[str]:
    from kvpool import PoolClient

    with PoolClient(address, transport=transport, timeout=5) as c:
        return c.put_many([key_of(i, salt) for i in indices], [pattern(i, size) for i in indices])


def client_get(address: str, indices: list[int], size: int, transport: str = "auto", salt: int = 0) -> int:
    """Number of leading objects returned byte-exact (raises on any wrong byte)."""
    from kvpool import PoolClient

    with PoolClient(address, transport=transport, timeout=5) as c:
        bufs = [bytearray(size) for _ in indices]
        n = c.get_many_into([key_of(i, salt) for i in indices], bufs)
        for i, buf in zip(indices[:n], bufs[:n]):
            assert check_pattern(buf, i) == 0
        return n
