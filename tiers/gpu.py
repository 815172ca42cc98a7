"""The CUDA runtime, reached through ctypes so that tiers/ never imports torch or CuPy.

`cuda_available()` is the one clean GPU check: it loads libcudart (system library or the `nvidia-cuda-runtime`
wheel that a torch CUDA build installs) and asks for the device count. Everything else here is a thin checked
wrapper over the few runtime calls the tiers need: host registration (pinned DRAM arena), device malloc/free and
memcpy (HBM arena). On a machine without CUDA, `cuda_available()` is False and nothing else is ever called.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import importlib.util
import logging
import os

log = logging.getLogger(__name__)

# cudaMemcpyKind
MEMCPY_HOST_TO_DEVICE = 1
MEMCPY_DEVICE_TO_HOST = 2
MEMCPY_DEVICE_TO_DEVICE = 3
HOST_REGISTER_DEFAULT = 0
HOST_REGISTER_PORTABLE = 1


def _candidate_paths() -> list[str]:
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
    found = ctypes.util.find_library("cudart")
    paths = [found] if found else []
    # The runtime shipped as a wheel next to torch's CUDA build; found without importing torch.
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            paths += sorted(glob.glob(os.path.join(root, "cuda_runtime", "lib", "libcudart.so*")))
    return paths + names


@functools.lru_cache(maxsize=1)
def cudart() -> ctypes.CDLL | None:
    """The loaded CUDA runtime library, or None when there is none."""
    for path in _candidate_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.cudaGetDeviceCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        return lib
    return None


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    """True when a CUDA runtime loads and reports at least one device. Cached: devices do not come and go."""
    lib = cudart()
    if lib is None:
        return False
    count = ctypes.c_int(0)
    try:
        rc = lib.cudaGetDeviceCount(ctypes.byref(count))
    except Exception:  # noqa: BLE001 - a broken driver install is "no GPU", not a crash
        log.debug("cudaGetDeviceCount raised", exc_info=True)
        return False
    return rc == 0 and count.value > 0


def check(rc: int, what: str) -> None:
    """Raise RuntimeError carrying CUDA's own message for a non-zero status."""
    if rc != 0:
        lib = cudart()
        msg = lib.cudaGetErrorString(rc).decode() if lib is not None else "unknown"
        raise RuntimeError(f"{what} failed: CUDA error {rc} ({msg})")


def require_cuda() -> ctypes.CDLL:
    if not cuda_available():
        raise RuntimeError("no CUDA device")
    lib = cudart()
    assert lib is not None
    return lib


def host_register(ptr: int, size: int) -> None:
    check(require_cuda().cudaHostRegister(ptr, size, HOST_REGISTER_PORTABLE), "cudaHostRegister")


def host_unregister(ptr: int) -> None:
    check(require_cuda().cudaHostUnregister(ptr), "cudaHostUnregister")
