"""Shared plumbing of the fault suite (tests/faults/): real processes on 127.0.0.1, faults injected with signals, and
one way to print and check what each scenario shows.

    Cluster, start_redis, RedisServer   tests/store/cluster.py: master / node processes, a real redis-server
    Sentinel                            two redis-servers (a master and its replica) watched by one redis-sentinel
    stop / cont / wait_stopped          SIGSTOP / SIGCONT a process and wait until the kernel reports it stopped
    ChildClient                         a PoolClient in a spawned child process driven over a pipe; `pause_at(target)`
                                        makes the child SIGSTOP itself the next time it calls `target` (an injected
                                        pause at an exact point of the data path)
    master_stub, node_stub, stats, inspect, wait_until
    read_back_exact                     a key read back over same-host and TCP by fresh clients, byte-exact
    Ledger                              what a load generator was told: keys acknowledged "stored", and when
    Figures                             the line every scenario prints (wrong bytes, acknowledged-then-lost objects,
                                        recovery time, ...) and the assertions the design promises

Every wait is bounded and polls for the event it needs (a process state, a stats field), never a fixed sleep for
something to happen. Scenarios are marked `faults` and `slow` (pyproject markers): `pytest -m faults` runs the suite.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest

from kvpool.launcher import free_port
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from tests.store.cluster import (  # noqa: F401 - re-exported for the scenarios
    STARTUP_DEADLINE_S,
    Cluster,
    RedisServer,
    check_pattern,
    key_of,
    pattern,
    start_redis,
)

# ---------------------------------------------------------------------------------------------- waiting


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll `predicate` until it returns something truthy (returned); AssertionError naming `what` after timeout_s."""
    end = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


# ---------------------------------------------------------------------------------------------- signals


def process_state(pid: int) -> str:
    """The kernel's one-letter state of `pid` (R, S, T = stopped, Z, ...); '' once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return ""


def wait_stopped(pid: int, timeout_s: float = 20.0) -> None:
    wait_until(lambda: process_state(pid) in ("T", "t"), timeout_s, f"process {pid} to stop")


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    wait_stopped(pid)


def cont(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


# ---------------------------------------------------------------------------------------------- gRPC


def master_stub(address: str) -> pbg.MasterServiceStub:
    return pbg.MasterServiceStub(grpc.insecure_channel(address))


def node_stub(address: str) -> pbg.NodeServiceStub:
    return pbg.NodeServiceStub(grpc.insecure_channel(address))


def stats(address: str, timeout: float = 5.0) -> dict:
    with grpc.insecure_channel(address) as ch:
        return json.loads(pbg.MasterServiceStub(ch).Stats(pb.StatsRequest(), timeout=timeout).json)


def inspect(address: str, keys: list[bytes]) -> list[pb.ObjectInfo | None]:
    with grpc.insecure_channel(address) as ch:
        reply = pbg.MasterServiceStub(ch).Inspect(pb.InspectRequest(keys=keys), timeout=5)
    found = iter(reply.objects)
    return [next(found) if ok else None for ok in reply.found]


def connected_nodes(address: str) -> set[str]:
    """Nodes registered with the master process at `address` right now (not merely reloaded from Redis)."""
    try:
        eps = stats(address, timeout=2).get("endpoints", {})
    except grpc.RpcError:
        return set()
    return {n for n, e in eps.items() if e.get("connected")}


# ---------------------------------------------------------------------------------------------- a client in a child


def _child_main(conn, address: str, kwargs: dict) -> None:
    """The child's loop: one command per message, one reply per command (("ok", value) or ("error", text))."""
    import importlib

    from kvpool import PoolClient

    client = PoolClient(address, **kwargs)
    armed: dict[str, bool] = {}

    def arm(target: str) -> None:
        module_name, attr = target.split(":")
        owner = importlib.import_module(module_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)
        armed[target] = True

        def paused(*args, **kw):
            if armed.pop(target, False):
                setattr(owner, name, original)
                os.kill(os.getpid(), signal.SIGSTOP)  # the parent SIGCONTs us when it has done its part
            return original(*args, **kw)

        setattr(owner, name, paused)

    try:
        while True:
            op, args = conn.recv()
            try:
                if op == "close":
                    conn.send(("ok", None))
                    return
                if op == "pause_at":
                    arm(args)
                    value = None
                elif op == "put":
                    keys, size, version = args
                    value = client.put_many([bytes(k) for k in keys], [_payload(k, size, version) for k in keys])
                elif op == "get":
                    keys, size = args
                    bufs = [bytearray(size) for _ in keys]
                    n = client.get_many_into([bytes(k) for k in keys], bufs)
                    value = (n, [bytes(b) for b in bufs[:n]])
                elif op == "stats":
                    value = client.stats()
                else:
                    raise ValueError(f"unknown op {op!r}")
                conn.send(("ok", value))
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        client.close()


def _payload(key: bytes, size: int, version: int) -> bytes:
    return payload_of(key, size, version)


def payload_of(key: bytes, size: int, version: int = 0) -> bytes:
    """The bytes of (key, version): the key and version up front, then a fill derived from both, so a buffer that
    holds another key's (or another version's) bytes, whole or in part, never passes as this one."""
    head = bytes(key) + version.to_bytes(4, "little")
    fill = bytes([(sum(key) + 31 * version + 1) % 251 + 1])
    return head + fill * (size - len(head))


class ChildClient:
    """A PoolClient living in a spawned child process. Each call sends one command and waits for its reply; `send`
    and `recv` split a call so the parent can act while the child is stopped mid-command."""

    def __init__(self, address: str, **client_kwargs) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(child, address, client_kwargs), daemon=True)
        self.proc.start()
        self.pid = self.proc.pid

    def send(self, op: str, args: Any = None) -> None:
        self._conn.send((op, args))

    def recv(self, timeout_s: float = 60.0) -> Any:
        if not self._conn.poll(timeout_s):
            raise AssertionError(f"child client {self.pid} gave no answer in {timeout_s}s "
                                 f"(state {process_state(self.pid) or 'gone'})")
        status, value = self._conn.recv()
        if status != "ok":
            raise AssertionError(f"child client failed: {value}")
        return value

    def call(self, op: str, args: Any = None, timeout_s: float = 60.0) -> Any:
        self.send(op, args)
        return self.recv(timeout_s)

    def pause_at(self, target: str) -> None:
        """The next call of `target` ("module:Class.method") in the child SIGSTOPs the child first."""
        self.call("pause_at", target)

    def close(self) -> None:
        if self.proc.is_alive():
            cont(self.pid)
            try:
                self.call("close", timeout_s=10)
            except (AssertionError, EOFError, OSError):
                pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


# ---------------------------------------------------------------------------------------------- figures


@dataclass
class Ledger:
    """Acknowledgements a writer received: key -> (time the call started, time it returned), monotonic seconds
    (CLOCK_MONOTONIC is system-wide on Linux, so children and the test compare directly)."""

    acked: dict[bytes, tuple[float, float]] = field(default_factory=dict)

    def add(self, keys, statuses, started: float, ended: float) -> None:
        for k, s in zip(keys, statuses):
            if s == "stored":
                self.acked[bytes(k)] = (started, ended)

    def merge(self, other: "Ledger") -> None:
        self.acked.update(other.acked)

    def started_after(self, t: float) -> list[bytes]:
        return [k for k, (t0, _) in self.acked.items() if t0 > t]

    def ended_before(self, t: float) -> list[bytes]:
        return [k for k, (_, t1) in self.acked.items() if t1 < t]


@dataclass
class Figures:
    """What one scenario shows, printed as one line (also when pytest captures output) and checked."""

    scenario: str
    wrong_bytes: int = 0          # reads that returned bytes other than the committed object's
    acked: int = 0                # puts acknowledged "stored"
    acked_lost: int = 0           # acknowledged, not lost by a named event, and not readable afterwards
    lost_by_event: int = 0        # acknowledged, then lost by a named event (a node killed or restarted, a record
    event: str = "lost with the killed node (named event)"  # found corrupt and counted): what lost_by_event means
    recovery_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        parts = [f"wrong bytes {self.wrong_bytes}", f"acknowledged {self.acked}",
                 f"acknowledged-then-lost {self.acked_lost}"]
        if self.lost_by_event:
            parts.append(f"{self.event} {self.lost_by_event}")
        if self.recovery_s is not None:
            parts.append(f"recovery {self.recovery_s:.2f} s")
        parts += [f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in self.extra.items()]
        return f"FAULT {self.scenario}: " + ", ".join(parts)

    def report(self, capsys=None) -> None:
        if capsys is not None:
            with capsys.disabled():
                print("\n" + self.line(), flush=True)
        else:
            print(self.line(), flush=True)

    def check(self, *, lost_allowed: bool = False) -> None:
        """Wrong bytes are never allowed; acknowledged-then-lost only where the design makes no promise."""
        assert self.wrong_bytes == 0, self.line()
        if not lost_allowed:
            assert self.acked_lost == 0, self.line()


def read_back_exact(address: str, key: bytes, size: int, figures: Figures) -> None:
    """`key` read by a fresh client over the same-host path and one over TCP: each must be payload_of(key, size),
    exactly (wrong bytes and misses counted in `figures` first)."""
    from kvpool import PoolClient

    for transport in ("auto", "tcp"):
        with PoolClient(address, timeout=5, transport=transport) as reader:
            buf = bytearray(size)
            n = reader.get_many_into([key], [buf])
            figures.wrong_bytes += n == 1 and bytes(buf) != payload_of(key, size)
            figures.acked_lost += n == 0
            assert n == 1 and bytes(buf) == payload_of(key, size), f"read over {transport}"


# ---------------------------------------------------------------------------------------------- Redis Sentinel


def sentinel_command() -> list[str]:
    """redis-sentinel (Debian package redis-sentinel, installed by scripts/setup.sh), else redis-server --sentinel."""
    exe = shutil.which("redis-sentinel")
    if exe:
        return [exe]
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server not on PATH (scripts/setup.sh installs it)")
    return [exe, "--sentinel"]


@dataclass
class Sentinel:
    """A Redis master, one replica and one sentinel watching them as `service`, all on 127.0.0.1 in `workdir`."""

    workdir: Path
    service: str = "kvpool"
    down_after_ms: int = 500
    servers: list[RedisServer] = field(default_factory=list)
    sentinel: subprocess.Popen | None = None
    sentinel_port: int = 0

    def start(self) -> "Sentinel":
        import redis

        primary = start_redis(self.workdir / "r0", appendonly=False)
        replica = start_redis(self.workdir / "r1", appendonly=False)
        self.servers = [primary, replica]
        r = redis.Redis(port=replica.port)
        r.replicaof("127.0.0.1", primary.port)
        wait_until(lambda: r.info("replication").get("master_link_status") == "up", STARTUP_DEADLINE_S,
                   "the replica to sync")
        r.close()
        self.sentinel_port = free_port()
        conf = self.workdir / "sentinel.conf"
        conf.write_text("\n".join([
            f"port {self.sentinel_port}", "bind 127.0.0.1", f"dir {self.workdir}",
            f"sentinel monitor {self.service} 127.0.0.1 {primary.port} 1",
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
            f"sentinel failover-timeout {self.service} 5000",
            f"sentinel parallel-syncs {self.service} 1", ""]))
        log = open(self.workdir / "sentinel.log", "ab")
        self.sentinel = subprocess.Popen([*sentinel_command(), str(conf)], stdout=log, stderr=subprocess.STDOUT)
        s = redis.Redis(port=self.sentinel_port)
        wait_until(lambda: _sentinel_sees(s, self.service, 1), STARTUP_DEADLINE_S, "the sentinel to see the replica")
        s.close()
        return self

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.service}/0"

    def primary_port(self) -> int:
        import redis

        s = redis.Redis(port=self.sentinel_port)
        try:
            return int(s.sentinel_get_master_addr_by_name(self.service)[1])
        finally:
            s.close()

    def server_on(self, port: int) -> RedisServer:
        return next(srv for srv in self.servers if srv.port == port)

    def close(self) -> None:
        if self.sentinel is not None and self.sentinel.poll() is None:
            self.sentinel.kill()
            self.sentinel.wait(10)
        for srv in self.servers:
            srv.kill()


def _sentinel_sees(s, service: str, replicas: int) -> bool:
    import redis

    try:
        return len(s.sentinel_slaves(service)) >= replicas
    except redis.RedisError:
        return False


__all__ = ["Cluster", "RedisServer", "start_redis", "Sentinel", "ChildClient", "Ledger", "Figures", "wait_until",
           "wait_stopped", "stop", "cont", "process_state", "master_stub", "node_stub", "stats", "inspect",
           "connected_nodes", "payload_of", "key_of", "pattern", "check_pattern", "free_port", "STARTUP_DEADLINE_S"]
