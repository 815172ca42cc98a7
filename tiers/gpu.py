"""The GPU layer of the tiers: CuPy, imported lazily, only inside the functions that touch a device.

    cuda_available()      the one cheap check. In order, stopping at the first "no":
                            1. the CUDA driver library (libcuda.so.1) loads          ctypes, no CuPy
                            2. CuPy is installed (`pip install 'kvpool[gpu]'`)       importlib.util.find_spec
                            3. CuPy's runtime reports at least one device             first `import cupy` here
                          so a CPU machine answers from step 1 or 2 without ever importing CuPy.
    unavailable_reason()  the words for a "no" (skip reasons, config errors, RuntimeError messages)
    host_register / host_unregister / is_pinned
                          cudaHostRegister on an existing mapping (the DRAM arena), through cupy.cuda.runtime
    device_pointer        where a kernel reads pinned host memory (UVA): the zero-copy layer loads read there
    filesystem_of         which file system holds a path: CUDA pins shared file mappings only on tmpfs/hugetlbfs
    CopyStream            a dedicated non-blocking CUDA stream with events: the arenas' copies never queue behind
                          an engine's kernels on the default stream, and a caller can wait on an event instead of
                          the whole device

Everything here except the three checks raises RuntimeError("no CUDA device: <reason>") where `cuda_available()`
is False. `store/` and `tiers/` import this module freely: it imports nothing but the standard library at load.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import importlib.util
import logging
import os
import threading
from typing import Any

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'kvpool[gpu]' (the cupy-cuda12x wheel; cupy-cuda13x for a CUDA 13 driver)"
HOST_REGISTER_PORTABLE = 1     # cudaHostRegisterPortable: pinned for every CUDA context of the process
HOST_REGISTER_MAPPED = 2       # cudaHostRegisterMapped: also mapped into the device address space (kernels read it)
MEMORY_TYPE_HOST = 1           # cudaMemoryTypeHost: what pointerGetAttributes says of registered host memory


@functools.lru_cache(maxsize=1)
def _driver_reason() -> str | None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver (libcuda.so.1 does not load)"
    return None


def _cupy_installed() -> bool:
    try:
        return importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Why kvpool cannot use a GPU here, or None when it can. Cached: devices and installs do not come and go."""
    reason = _driver_reason()
    if reason is not None:
        return reason
    if not _cupy_installed():
        return f"CuPy is not installed ({INSTALL_HINT})"
    try:
        import cupy as cp  # the only place CuPy is first imported: after the driver and the install were found

        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - a broken driver/runtime pair is "no GPU", not a crash
        return f"CuPy sees no CUDA device ({type(exc).__name__}: {exc})"
    if count <= 0:
        return "the CUDA driver reports no device"
    return None


def cuda_available() -> bool:
    """True when a CUDA device can be used through CuPy. Imports CuPy only where a driver and CuPy are present."""
    return unavailable_reason() is None


def require_cupy() -> Any:
    """The CuPy module; RuntimeError("no CUDA device: <reason>") where `cuda_available()` is False."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"no CUDA device: {reason}")
    import cupy as cp

    return cp


def _runtime_error(what: str, exc: BaseException) -> RuntimeError:
    return RuntimeError(f"{what} failed: {type(exc).__name__}: {exc}")


class _Registrations:
    """The ranges this process registered with `host_register`, each with the device address of its first byte once
    asked: a registration is mapped into the device's address space as one piece, so any pointer inside it
    translates by the same shift, with no CUDA call (a 16K-token load translates ~1,000 pointers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bases: list[int] = []                          # sorted
        self._ranges: dict[int, list] = {}                   # base -> [size, device address of base or None]

    def add(self, ptr: int, size: int) -> None:
        with self._lock:
            if ptr not in self._ranges:
                bisect.insort(self._bases, ptr)
            self._ranges[ptr] = [size, None]

    def remove(self, ptr: int) -> None:
        with self._lock:
            if self._ranges.pop(ptr, None) is not None:
                self._bases.remove(ptr)

    def find(self, ptr: int) -> tuple[int, int | None] | None:
        """(base, its device address or None if not asked yet) of the registration holding `ptr`, or None."""
        with self._lock:
            i = bisect.bisect_right(self._bases, ptr) - 1
            if i < 0:
                return None
            base = self._bases[i]
            size, dev = self._ranges[base]
            return (base, dev) if ptr < base + size else None

    def learn(self, base: int, dev: int) -> None:
        with self._lock:
            entry = self._ranges.get(base)
            if entry is not None:
                entry[1] = dev


_registrations = _Registrations()


def host_register(ptr: int, size: int) -> None:
    """Page-lock [ptr, ptr + size) of this process for DMA (cudaHostRegister, portable and mapped: kernels may read
    it through `device_pointer`). RuntimeError on failure (e.g. RLIMIT_MEMLOCK, a range already registered, or a
    file mapping CUDA refuses: seen on an H100 machine for a file on /tmp, while the same arena on /dev/shm pinned)."""
    cp = require_cupy()
    try:
        cp.cuda.runtime.hostRegister(ptr, size, HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED)
    except cp.cuda.runtime.CUDARuntimeError as exc:
        raise _runtime_error("cudaHostRegister", exc) from None
    _registrations.add(ptr, size)


def host_unregister(ptr: int) -> None:
    cp = require_cupy()
    _registrations.remove(ptr)      # first: no translation may outlive the mapping
    try:
        cp.cuda.runtime.hostUnregister(ptr)
    except cp.cuda.runtime.CUDARuntimeError as exc:
        raise _runtime_error("cudaHostUnregister", exc) from None


def is_pinned(ptr: int) -> bool:
    """What CUDA itself says: is `ptr` page-locked host memory (registered or cudaHostAlloc'd)? False without CUDA."""
    if not cuda_available():
        return False
    cp = require_cupy()
    try:
        return int(cp.cuda.runtime.pointerGetAttributes(ptr).type) == MEMORY_TYPE_HOST
    except cp.cuda.runtime.CUDARuntimeError:
        return False


def device_pointer(ptr: int) -> int | None:
    """The address at which device kernels read the page-locked host memory at `ptr` (registered mapped, or
    cudaHostAlloc'd: torch's pinned tensors), or None: not such memory, or no CUDA. On a 64-bit Linux machine with
    unified addressing it is `ptr` itself; callers still use what CUDA says. Inside a range `host_register`
    registered, CUDA is asked once per range (for its first byte) and the rest is the same shift."""
    if not cuda_available():
        return None
    hit = _registrations.find(ptr)
    if hit is not None:
        base, dev = hit
        if dev is None:
            dev = _ask_device_pointer(base)
            if dev is None:
                return None
            _registrations.learn(base, dev)
        return dev + (ptr - base)
    return _ask_device_pointer(ptr)


def _ask_device_pointer(ptr: int) -> int | None:
    cp = require_cupy()
    try:
        attrs = cp.cuda.runtime.pointerGetAttributes(ptr)
    except cp.cuda.runtime.CUDARuntimeError:
        return None
    if int(attrs.type) != MEMORY_TYPE_HOST:
        return None
    return int(attrs.devicePointer) or None


def host_address(buf: Any) -> int:
    """Address of byte 0 of a C-contiguous host buffer (bytes, bytearray, memoryview, numpy, mmap), no copy."""
    import numpy as np

    arr = np.frombuffer(buf, dtype=np.uint8)
    return int(arr.__array_interface__["data"][0]) if arr.nbytes else 0


PINNABLE_FILESYSTEMS = ("tmpfs", "hugetlbfs")   # where CUDA pins a shared file mapping (tiers/dram.py DramArena.pin)


def filesystem_of(path: str) -> tuple[str, str]:
    """(filesystem type, mount point) holding `path`, from /proc/self/mounts (the longest mount point that
    contains it); ("unknown", "") where that cannot be read."""
    real = os.path.realpath(path)
    best = ("unknown", "")
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best[1]):
                    best = (fields[2], mount)
    except OSError:
        pass
    return best


class CopyStream:
    """A dedicated non-blocking stream on `device` for host <-> device copies with raw addresses.

    `h2d`/`d2h`/`d2d` enqueue and return at once (truly asynchronous only from page-locked host memory: from
    pageable memory the driver stages the copy and returns when it is done). `record()` gives an event a caller can
    `synchronize()` or make another stream wait on; `synchronize()` waits for everything queued here."""

    def __init__(self, device: int = 0) -> None:
        cp = require_cupy()
        self._cp = cp
        self.device = device
        with cp.cuda.Device(device):
            self.stream = cp.cuda.Stream(non_blocking=True)

    def _copy(self, dst: int, src: int, size: int, kind: int, what: str) -> None:
        if size <= 0:
            return
        rt = self._cp.cuda.runtime
        try:
            with self._cp.cuda.Device(self.device):
                rt.memcpyAsync(dst, src, size, kind, self.stream.ptr)
        except rt.CUDARuntimeError as exc:
            raise _runtime_error(f"cudaMemcpyAsync({what})", exc) from None

    def h2d(self, dst: int, src: int, size: int) -> None:
        self._copy(dst, src, size, self._cp.cuda.runtime.memcpyHostToDevice, "H2D")

    def d2h(self, dst: int, src: int, size: int) -> None:
        self._copy(dst, src, size, self._cp.cuda.runtime.memcpyDeviceToHost, "D2H")

    def d2d(self, dst: int, src: int, size: int) -> None:
        self._copy(dst, src, size, self._cp.cuda.runtime.memcpyDeviceToDevice, "D2D")

    def record(self) -> Any:
        """A CuPy event marking everything queued so far on this stream."""
        with self._cp.cuda.Device(self.device):
            event = self._cp.cuda.Event(block=False, disable_timing=False)
            event.record(self.stream)
        return event

    def synchronize(self) -> None:
        self.stream.synchronize()


__all__ = ["CopyStream", "cuda_available", "require_cupy", "device_pointer", "filesystem_of", "host_address",
           "host_register", "host_unregister", "is_pinned", "unavailable_reason", "INSTALL_HINT", "PINNABLE_FILESYSTEMS"]
