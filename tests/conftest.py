"""Shared fixtures. Tiny sizes, real files, real servers on 127.0.0.1."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile

import pytest

from kvpool.launcher import free_port

# The checkout's top-level directories (store/, tiers/, proto/, kernels/, ...) are the sources of kvpool's subpackages
# (pyproject.toml package-dir), never top-level packages of their own. `python3 -m pytest` run from the checkout puts
# it first on sys.path, where kernels/ shadowed Hugging Face's `kernels` package, which transformers 5.25 requires and
# imports (the reference tests failed to load transformers: "cannot import name 'CUDAProperties' from 'kernels'").
# So the checkout goes last: installed packages come first, and `tests.*` stays importable by name, which the client
# processes tests start with multiprocessing need (spawn gives them this sys.path). kvpool comes from its install.
CHECKOUT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if pathlib.Path(p or os.curdir).resolve() != CHECKOUT] + [str(CHECKOUT)]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def shm_path(tmp_path):
    """A fresh directory on tmpfs (/dev/shm), where arenas live in production: CUDA pins a shared file mapping only
    there (Linux 6.5+ refuses long-term pins of writable mappings of disk files, as tmp_path may be). Falls back to
    tmp_path where /dev/shm does not exist."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    path = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    try:
        yield pathlib.Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


SMALL_UP_OBJ = 8 << 10      # the object size `small_up` is sized for


@pytest.fixture
def small_up(tmp_path, shm_path):
    """A `kvpool up` pool in this process (LocalCluster: gRPC master + node on 127.0.0.1, control channel on) whose
    DRAM holds exactly four SMALL_UP_OBJ-byte objects, with an SSD tier below it and no promotion on hit."""
    from kvpool.store.config import UpConfig
    from kvpool.store.local_cluster import LocalCluster

    cfg = UpConfig(listen=f"127.0.0.1:{free_port()}", http_listen="", shm_dir=str(shm_path),
                   dram_bytes=4 * SMALL_UP_OBJ, ssd_path=str(tmp_path / "ssd"), ssd_bytes=64 * SMALL_UP_OBJ,
                   promote_on_hit=False)
    cluster = LocalCluster(cfg).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["one pass", "two pass"])
def copy_path(request):
    """Runs the test with the one-pass copy + hash (kvpool/copyhash.py) and with numpy/torch's copy then xxhash."""
    from kvpool import copyhash

    if request.param == "one pass" and copyhash.REASON:
        pytest.skip(f"the one-pass copy is not built: {copyhash.REASON}")
    previous = copyhash.use(request.param == "one pass")
    yield request.param
    copyhash.use(previous)


@pytest.fixture
def two_pass():
    """The one-pass copy off for the test (the helper-thread paths only run on the two-pass copy)."""
    from kvpool import copyhash

    previous = copyhash.use(False)
    yield
    copyhash.use(previous)
