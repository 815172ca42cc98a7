"""Child `kvpool` processes for commands that orchestrate others (`kvpool demo`) and for tests and benchmarks:
spawn with a log file, wait until serving (gRPC health or an HTTP /health) with a deadline, stop or kill."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = "\n".join(self.log().splitlines()[-15:])
            raise RuntimeError(f"{self.name} exited with code {self.popen.returncode}; its log ends:\n{tail}")


def spawn(name: str, args: list[str], workdir: Path, env: dict | None = None, *, keep_env: bool = False) -> Proc:
    """Start `python -m kvpool.cli ARGS` with output to WORKDIR/NAME.log. KVPOOL_* variables of this process are
    not inherited unless `keep_env` (each child gets exactly the config it is given)."""
    log_path = Path(workdir) / f"{name}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not keep_env:
        full_env = {k: v for k, v in full_env.items() if not k.startswith("KVPOOL_")}
    full_env.update(env or {})
    with open(log_path, "ab") as log_file:
        popen = subprocess.Popen([sys.executable, "-m", "kvpool.cli", "--log-level", "INFO", *args],
                                 stdout=log_file, stderr=subprocess.STDOUT, cwd=str(workdir), env=full_env,
                                 stdin=subprocess.DEVNULL)
    return Proc(name=name, popen=popen, log_path=log_path)


def _check_alive(proc: Proc | subprocess.Popen | None) -> None:
    if isinstance(proc, Proc):
        proc.check_alive()
    elif proc is not None and proc.poll() is not None:
        raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")


def wait_grpc_serving(address: str, deadline_s: float = 30.0, proc: Proc | subprocess.Popen | None = None, *,
                      tls=None) -> None:
    """Until the gRPC health service at `address` says SERVING. `tls`: a store.tls.TlsConfig (a TLS server; the
    health service needs no token, so load balancers and Kubernetes probes can ask too)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from kvpool.store.auth import auth_channel

    end = time.monotonic() + deadline_s
    last: Exception | None = None
    with auth_channel(address, tls=tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < end:
            _check_alive(proc)
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as exc:
                last = exc
            time.sleep(0.05)
    raise TimeoutError(f"{address} not SERVING after {deadline_s}s: {last}")


def wait_http_ok(url: str, deadline_s: float = 120.0, proc: Proc | subprocess.Popen | None = None) -> None:
    end = time.monotonic() + deadline_s
    last: Exception | None = None
    while time.monotonic() < end:
        _check_alive(proc)
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"{url} not answering after {deadline_s}s: {last}")


def post_json(url: str, payload: dict, timeout: float = 600.0) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())
