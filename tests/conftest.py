"""Shared fixtures. Tiny sizes, real files, real servers on 127.0.0.1."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import pytest

from kvpool.launcher import free_port


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
