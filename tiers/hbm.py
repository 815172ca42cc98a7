"""HbmArena: the HBM tier, one device allocation reserved at start, cut by the master's OffsetAllocator.

Same shape as DramArena (`create`, `capacity`, `write`, `read_into`, `close`, context manager) but device memory
is not addressable from Python, so there is no `view`/`array`: callers that hold device tensors copy with their
own framework using `address + offset` (the engine's kernels), and host buffers go through `write`/`read_into`
(one cudaMemcpy each). Built on the CUDA runtime through ctypes (tiers/gpu.py), never torch. Only exists where
a CUDA device does: constructing one elsewhere raises RuntimeError("no CUDA device").
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from . import gpu
from .dram import _index, as_byte_view
from .gpu import cuda_available

__all__ = ["HbmArena", "cuda_available"]

log = logging.getLogger(__name__)


class HbmArena:
    """`capacity` bytes of device memory on `device`."""

    def __init__(self, capacity: int, device: int = 0) -> None:
        lib = gpu.require_cuda()                         # RuntimeError("no CUDA device") without a GPU
        if not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"capacity must be an int > 0, got {capacity!r}")
        if not isinstance(device, int) or device < 0:
            raise ValueError(f"device must be an int >= 0, got {device!r}")
        gpu.check(lib.cudaSetDevice(device), "cudaSetDevice")
        ptr = ctypes.c_void_p()
        gpu.check(lib.cudaMalloc(ctypes.byref(ptr), capacity), "cudaMalloc")
        self._lib = lib
        self._ptr: int | None = ptr.value
        self._capacity = capacity
        self._device = device
        log.info("reserved %d bytes of HBM on device %d", capacity, device)

    @classmethod
    def create(cls, capacity: int, device: int = 0) -> HbmArena:
        return cls(capacity, device)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def device(self) -> int:
        return self._device

    @property
    def address(self) -> int:
        """Device address of byte 0."""
        if self._ptr is None:
            raise ValueError("arena is closed")
        return self._ptr

    def write(self, offset: int, data: Any) -> int:
        """Host buffer -> device, one cudaMemcpy; returns the byte count."""
        src = as_byte_view(data)
        offset, n = self._check(offset, src.nbytes)
        host = (ctypes.c_char * n).from_buffer_copy(src) if src.readonly else (ctypes.c_char * n).from_buffer(src)
        gpu.check(self._lib.cudaMemcpy(self.address + offset, ctypes.addressof(host), n,
                                       gpu.MEMCPY_HOST_TO_DEVICE), "cudaMemcpy(H2D)")
        return n

    def read_into(self, offset: int, out: Any) -> int:
        """Device -> writable host buffer, one cudaMemcpy; returns the byte count."""
        dst = as_byte_view(out, "out")
        if dst.readonly:
            raise ValueError("out must be a writable buffer")
        offset, n = self._check(offset, dst.nbytes)
        host = (ctypes.c_char * n).from_buffer(dst)
        gpu.check(self._lib.cudaMemcpy(ctypes.addressof(host), self.address + offset, n,
                                       gpu.MEMCPY_DEVICE_TO_HOST), "cudaMemcpy(D2H)")
        return n

    def close(self) -> None:
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            gpu.check(self._lib.cudaFree(ptr), "cudaFree")

    def __enter__(self) -> HbmArena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, offset: Any, size: Any) -> tuple[int, int]:
        if self._ptr is None:
            raise ValueError("arena is closed")
        offset, size = _index(offset, "offset"), _index(size, "size")
        if offset + size > self._capacity:
            raise ValueError(f"offset + size ({offset} + {size}) exceeds the arena capacity {self._capacity}")
        return offset, size
