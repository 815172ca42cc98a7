"""Mooncake Store as a peer column for bench/pool_remote.py (optional: `pip install mooncake-transfer-engine-non-cuda`).

Set-up mirrors ours: `mooncake_master` (with its built-in HTTP metadata server) in one process, a "storage" process
that mounts a segment of `segment_bytes` (like our node's DRAM arena), and the measuring client in this process,
which mounts no memory of its own and moves bytes with `batch_put_from` / `batch_get_into` from/to registered
buffers (Mooncake's zero-copy API) over its TCP transport, in the same batches as our client.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np


def unavailable() -> str | None:
    """None when Mooncake's store and master are installed, else why not."""
    try:
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        return f"mooncake store not installed ({exc}); pip install mooncake-transfer-engine-non-cuda to add it"
    import shutil

    if shutil.which("mooncake_master") is None:
        return "mooncake_master not on PATH"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_STORAGE = """
import sys, time
from mooncake.store import MooncakeDistributedStore
st = MooncakeDistributedStore()
rc = st.setup("127.0.0.1", sys.argv[1], int(sys.argv[3]), 16 << 20, "tcp", "", sys.argv[2])
print("ready" if rc == 0 else f"setup failed {rc}", flush=True)
time.sleep(3600)
"""


class Mooncake:
    def __init__(self, segment_bytes: int, workdir: str) -> None:
        from mooncake.store import MooncakeDistributedStore

        rpc, meta = _free_port(), _free_port()
        self.meta_url = f"http://127.0.0.1:{meta}/metadata"
        self.master_addr = f"127.0.0.1:{rpc}"
        log = open(os.path.join(workdir, "mooncake.log"), "ab")
        self.procs = [subprocess.Popen(["mooncake_master", f"-rpc_port={rpc}", "-rpc_address=127.0.0.1",
                                        "-enable_http_metadata_server=true", f"-http_metadata_server_port={meta}",
                                        f"-metrics_port={_free_port()}"], stdout=log, stderr=log)]
        self._wait_port(rpc)
        self._wait_port(meta)
        storage = subprocess.Popen([sys.executable, "-c", _STORAGE, self.meta_url, self.master_addr,
                                    str(segment_bytes)], stdout=subprocess.PIPE, stderr=log, text=True)
        self.procs.append(storage)
        line = storage.stdout.readline().strip()
        if line != "ready":
            self.close()
            raise RuntimeError(f"mooncake storage process: {line or 'exited'}")
        self.store = MooncakeDistributedStore()
        rc = self.store.setup("127.0.0.1", self.meta_url, 0, 16 << 20, "tcp", "", self.master_addr)
        if rc != 0:
            self.close()
            raise RuntimeError(f"mooncake client setup failed: {rc}")
        self._registered: list[np.ndarray] = []

    @staticmethod
    def _wait_port(port: int, deadline: float = 20.0) -> None:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mooncake_master did not open port {port}")

    def register(self, arrays: list[np.ndarray]) -> None:
        for a in arrays:
            if self.store.register_buffer(a.ctypes.data, a.nbytes) != 0:
                raise RuntimeError("mooncake register_buffer failed")
            self._registered.append(a)

    def put(self, keys: list[str], arrays: list[np.ndarray]) -> None:
        rc = self.store.batch_put_from(keys, [a.ctypes.data for a in arrays], [a.nbytes for a in arrays])
        if any(r != 0 for r in rc):
            raise RuntimeError(f"mooncake batch_put_from: {sorted(set(rc))}")

    def get(self, keys: list[str], arrays: list[np.ndarray]) -> None:
        rc = self.store.batch_get_into(keys, [a.ctypes.data for a in arrays], [a.nbytes for a in arrays])
        if any(r != a.nbytes for r, a in zip(rc, arrays)):
            raise RuntimeError(f"mooncake batch_get_into: {sorted(set(rc))}")

    def clear(self) -> None:
        self.store.remove_all(True)

    def close(self) -> None:
        store = getattr(self, "store", None)
        if store is not None:
            for a in self._registered:
                store.unregister_buffer(a.ctypes.data)
            store.close()
            self.store = None
        for p in reversed(self.procs):
            p.kill()
            p.wait()
