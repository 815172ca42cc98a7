"""tiers/gpu.py: the cheap check and its reasons, CuPy imported only where a driver and CuPy exist, the refusals
without a device; on a GPU: pinned registration of the DRAM arena as CUDA reports it, HBM <-> pinned DRAM copies on
the dedicated stream, and DLPack exchange with torch.

The CPU tests drive the real check in each of its three stages: the driver probe is replaced (this box has no
libcuda) only to reach the later stages; the CuPy stage runs the real `import cupy` and CuPy's own "no device"
answer where CuPy is installed (scripts/setup.sh installs the `gpu` extra), and is skipped, saying so, where not.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from kvpool.tiers import gpu
from kvpool.tiers.dram import DramArena
from kvpool.tiers.gpu import filesystem_of
from kvpool.tiers.hbm import HbmArena

NO_GPU = f"needs a CUDA device: {gpu.unavailable_reason()}"
HAVE_CUPY = importlib.util.find_spec("cupy") is not None


@pytest.fixture
def fresh_check(monkeypatch):
    """Clear the cached answers before and after, so a staged answer never leaks into another test."""
    gpu.unavailable_reason.cache_clear()
    gpu._driver_reason.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    gpu.unavailable_reason.cache_clear()
    gpu._driver_reason.cache_clear()


# ---------------------------------------------------------------- without a GPU


@pytest.mark.skipif(gpu.cuda_available(), reason="a CUDA device is present")
def test_no_driver_is_the_first_answer_and_never_imports_cupy(tmp_path):
    # A fresh interpreter: the node's whole import path and the check, then ask what got imported.
    code = ("import sys\n"
            "from kvpool.tiers import cuda_available\n"
            "from kvpool.tiers.gpu import unavailable_reason\n"
            "import kvpool.store.node, kvpool.store.master\n"
            "from kvpool.store.config import NodeConfig\n"
            "from kvpool.store.node import StorageNode\n"
            f"n = StorageNode(NodeConfig(dram_bytes=1 << 20, shm_dir={str(tmp_path)!r}))\n"
            "print(n.dram.pin(), cuda_available(), unavailable_reason(), 'cupy' in sys.modules, 'torch' in sys.modules)\n"
            "n.close()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False False no CUDA driver (libcuda.so.1 does not load) False False"


def test_driver_present_but_cupy_missing_names_the_extra(fresh_check):
    fresh_check.setattr(gpu, "_driver_reason", lambda: None)
    fresh_check.setitem(sys.modules, "cupy", None)   # find_spec answers None, as for a package never installed
    assert gpu.unavailable_reason() == ("CuPy is not installed (pip install 'kvpool[gpu]' (the cupy-cuda12x wheel; "
                                        "cupy-cuda13x for a CUDA 13 driver))")
    assert not gpu.cuda_available()
    with pytest.raises(RuntimeError) as err:
        gpu.require_cupy()
    assert str(err.value) == "no CUDA device: " + gpu.unavailable_reason()


def test_registrations_translate_any_pointer_inside_a_range_by_its_first_byte_s_shift():
    regs = gpu._Registrations()
    regs.add(0x10000, 0x3000)
    regs.add(0x40000, 0x1000)
    assert [regs.find(p) for p in (0xFFFF, 0x10000, 0x12FFF, 0x13000, 0x40FFF, 0x41000)] == [
        None, (0x10000, None), (0x10000, None), None, (0x40000, None), None]
    regs.learn(0x10000, 0x7F0000)
    assert regs.find(0x12345) == (0x10000, 0x7F0000)
    regs.remove(0x10000)
    regs.learn(0x10000, 0x1)                 # a late answer for a range that is gone is dropped
    assert regs.find(0x12345) is None and regs.find(0x40000) == (0x40000, None)
    regs.add(0x40000, 0x2000)                # registered again (after an unregister): its answer is asked again
    assert regs.find(0x41000) == (0x40000, None)


@pytest.mark.skipif(not HAVE_CUPY, reason="CuPy is not installed here (pip install 'kvpool[gpu]')")
@pytest.mark.skipif(gpu.cuda_available(), reason="a CUDA device is present")
def test_cupy_imports_without_a_device_and_says_so(fresh_check):
    fresh_check.setattr(gpu, "_driver_reason", lambda: None)   # get past the driver probe to CuPy's own answer
    reason = gpu.unavailable_reason()
    assert reason.startswith("CuPy sees no CUDA device (CUDARuntimeError: cudaError"), reason
    assert "cupy" in sys.modules
    assert not gpu.cuda_available()


@pytest.mark.skipif(gpu.cuda_available(), reason="a CUDA device is present")
def test_every_device_call_is_refused_with_the_reason(tmp_path):
    message = f"no CUDA device: {gpu.unavailable_reason()}"
    for call in (lambda: gpu.host_register(4096, 4096), lambda: gpu.host_unregister(4096), lambda: gpu.CopyStream(),
                 lambda: HbmArena(4096)):
        with pytest.raises(RuntimeError) as err:
            call()
        assert str(err.value) == message
    assert gpu.is_pinned(4096) is False
    with DramArena.create(1 << 20, directory=str(tmp_path)) as arena:
        assert arena.pin() is False and not arena.pinned and arena.pin_error == gpu.unavailable_reason()
        arena.unpin()   # a no-op, never a CUDA call
        arena.write(0, b"still a plain arena")
        assert bytes(arena.view(0, 19)) == b"still a plain arena"


def test_host_address_is_the_buffer_itself():
    buf = np.arange(64, dtype=np.uint8)
    assert gpu.host_address(buf) == buf.ctypes.data
    assert gpu.host_address(memoryview(buf)[8:]) == buf.ctypes.data + 8
    assert gpu.host_address(b"") == 0


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.skipif(not gpu.cuda_available(), reason=NO_GPU)
def test_dram_arena_pinned_as_cuda_reports_it(shm_path):
    with DramArena.create(8 << 20, directory=str(shm_path)) as arena:
        assert not gpu.is_pinned(arena.address) and gpu.device_pointer(arena.address) is None
        assert arena.pin() is True and arena.pinned and arena.pin_error is None
        for offset in (0, 4 << 20, (8 << 20) - 1):
            assert gpu.is_pinned(arena.address + offset)
            # registered mapped: kernels read it, at the address CUDA itself gives (the shift learnt from byte 0)
            assert gpu.device_pointer(arena.address + offset) == gpu._ask_device_pointer(arena.address + offset)
            assert gpu.device_pointer(arena.address + offset) is not None
        # a same-host peer maps the same pages at another address: its mapping is pinned separately
        peer = DramArena.attach(arena.path)
        try:
            assert not gpu.is_pinned(peer.address)
            assert peer.pin() is True and gpu.is_pinned(peer.address)
        finally:
            peer.close()
        arena.unpin()
        assert not arena.pinned and not gpu.is_pinned(arena.address)
        assert gpu.device_pointer(arena.address + 4096) is None            # forgotten with the registration


@pytest.mark.gpu
@pytest.mark.skipif(not gpu.cuda_available(), reason=NO_GPU)
def test_hbm_and_pinned_dram_round_trip_on_the_copy_stream(shm_path):
    n = 3 << 20
    data = np.random.default_rng(5).integers(0, 256, n, dtype=np.uint8)
    with DramArena.create(4 * n, directory=str(shm_path)) as dram, HbmArena(4 * n) as hbm:
        assert dram.pin()
        dram.write(n, data)
        stream = gpu.CopyStream()
        stream.h2d(hbm.address + 2 * n, dram.address + n, n)       # pinned DRAM -> HBM
        stream.d2h(dram.address + 3 * n, hbm.address + 2 * n, n)   # HBM -> another DRAM extent
        stream.record().synchronize()
        assert np.array_equal(dram.array(3 * n, n), data)
        assert hbm.read_into(2 * n, out := np.zeros(n, np.uint8)) == n and np.array_equal(out, data)
        assert hbm.write(0, dram.view(n, n)) == n and np.array_equal(hbm.array(0, n).get(), data)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu.cuda_available(), reason=NO_GPU)
def test_an_arena_file_cuda_cannot_pin_says_where_it_lives(tmp_path):
    """Seen on an H100 machine (Linux 6.18): the arena file on /tmp (a disk file system) was refused, /dev/shm was
    pinned. Where the kernel allows the pin, it must simply work."""
    fstype, mount = filesystem_of(str(tmp_path))
    with DramArena.create(1 << 20, directory=str(tmp_path)) as arena:
        if not arena.pin():
            assert fstype not in ("tmpfs", "hugetlbfs")
            assert arena.pin_error.endswith(f"the arena file is on {fstype} ({mount}): Linux 6.5+ refuses long-term "
                                            f"pins of writable file mappings outside tmpfs/hugetlbfs, so put shm_dir "
                                            f"on /dev/shm")
        else:
            assert arena.pinned and arena.pin_error is None


@pytest.mark.gpu
@pytest.mark.skipif(not gpu.cuda_available(), reason=NO_GPU)
def test_hbm_extent_is_shared_with_torch_through_dlpack():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} has no CUDA build here")
    with HbmArena(1 << 20) as hbm:
        view = torch.from_dlpack(hbm.array(4096, 8192))
        assert view.is_cuda and view.data_ptr() == hbm.address + 4096 and view.numel() == 8192
        view.fill_(7)                                            # torch writes, the arena sees it: no copy
        torch.cuda.synchronize()
        out = np.zeros(8192, np.uint8)
        hbm.read_into(4096, out)
        assert (out == 7).all()
