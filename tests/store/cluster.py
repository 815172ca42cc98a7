"""Multi-process helpers for the distributed-pool tests: a real redis-server, master and node processes started as
`python -m kvpool.cli ...` on 127.0.0.1, each waited for (gRPC health SERVING) with a deadline and killed in the
fixture's finalizer. Import the fixtures into a test module with `from tests.store.cluster import ...`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest


STARTUP_DEADLINE_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(address: str, deadline_s: float = STARTUP_DEADLINE_S, proc: subprocess.Popen | None = None) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    end = time.monotonic() + deadline_s
    last = None
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < end:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process for {address} exited with {proc.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as exc:
                last = exc
            time.sleep(0.05)
    raise TimeoutError(f"{address} not SERVING after {deadline_s}s: {last}")


@dataclass
class Proc:
    """A child process with its log file; `kill()` is SIGKILL, `stop()` is SIGTERM then SIGKILL."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    address: str = ""

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        return self.popen.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def spawn(name: str, args: list[str], workdir: Path, env: dict | None = None) -> Proc:
    log_path = workdir / f"{name}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    for var in [v for v in full_env if v.startswith("KVPOOL_")]:
        if env is None or var not in env:
            del full_env[var]
    with open(log_path, "ab") as log_file:
        popen = subprocess.Popen([sys.executable, "-m", "kvpool.cli", "--log-level", "INFO", *args],
                                 stdout=log_file, stderr=subprocess.STDOUT, cwd=str(workdir), env=full_env)
    return Proc(name=name, popen=popen, log_path=log_path)


@dataclass
class Cluster:
    """Master and nodes of one test; everything started is killed by `close()`. Node arenas live in a private
    directory under /dev/shm that `close()` removes, so a SIGKILLed node leaves nothing behind."""

    workdir: Path
    procs: list[Proc] = field(default_factory=list)
    master: Proc | None = None
    nodes: dict[str, Proc] = field(default_factory=dict)
    shm_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm"))

    def start_master(self, *, port: int | None = None, redis_url: str | None = None, node_ttl_s: float = 1.5,
                     extra: list[str] | None = None) -> Proc:
        port = port or free_port()
        args = ["master", "--listen", f"127.0.0.1:{port}", "--node-ttl-s", str(node_ttl_s), *(extra or [])]
        if redis_url:
            args += ["--redis-url", redis_url]
        proc = spawn(f"master-{len(self.procs)}", args, self.workdir)
        proc.address = f"127.0.0.1:{port}"
        self.procs.append(proc)
        wait_serving(proc.address, proc=proc.popen)
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
        wait_serving(proc.address, proc=proc.popen)
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
