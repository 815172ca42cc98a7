"""HbmArena: the HBM tier, one CuPy device allocation reserved at start, cut by the master's OffsetAllocator.

```
 device memory (cupy.cuda.Memory, one cudaMalloc)
 [0 ........................................................................... capacity)
   |<- object A ->|      |<---- object B ---->|        offsets come from the master's OffsetAllocator
 host buffers:   write / read_into   one cudaMemcpyAsync on the arena's own stream, then wait for it
                                     (DMA when the host side is page-locked, e.g. the pinned DRAM arena)
 same process:   array(offset, size) a CuPy uint8 view of the extent (no copy); torch takes it zero-copy through
                                     DLPack (torch.from_dlpack), so an engine copies device to device
```
Same shape as DramArena (`create`, `capacity`, `write`, `read_into`, `close`, context manager); `address` is the
device address of byte 0. CuPy is imported only through tiers/gpu.py, when an arena is built: constructing one
where `cuda_available()` is False raises RuntimeError("no CUDA device: <reason>").
"""

from __future__ import annotations

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
        cp = gpu.require_cupy()                          # RuntimeError("no CUDA device: ...") without a GPU
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(f"capacity must be an int > 0, got {capacity!r}")
        if not isinstance(device, int) or isinstance(device, bool) or device < 0:
            raise ValueError(f"device must be an int >= 0, got {device!r}")
        with cp.cuda.Device(device):
            try:
                self._mem: Any = cp.cuda.Memory(capacity)   # one cudaMalloc, outside CuPy's pool: freed at close
            except cp.cuda.memory.OutOfMemoryError as exc:
                raise RuntimeError(f"cannot reserve {capacity} bytes of HBM on device {device}: {exc}") from None
        self._cp = cp
        self._capacity = capacity
        self._device = device
        self._stream = gpu.CopyStream(device)
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
        if self._mem is None:
            raise ValueError("arena is closed")
        return int(self._mem.ptr)

    @property
    def stream(self) -> gpu.CopyStream:
        """The arena's own copy stream (its events order a caller's work after the arena's copies)."""
        return self._stream

    def array(self, offset: int, size: int) -> Any:
        """CuPy uint8 device array over [offset, offset + size): a view, never a copy. Exposes `__dlpack__` and
        `__cuda_array_interface__`, so `torch.from_dlpack(arena.array(o, n))` shares the bytes."""
        offset, size = self._check(offset, size)
        cp = self._cp
        return cp.ndarray((size,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(self._mem, offset))

    def write(self, offset: int, data: Any) -> int:
        """Host buffer -> device, one copy; returns the byte count once the bytes are on the device."""
        src = as_byte_view(data)
        offset, n = self._check(offset, src.nbytes)
        self._stream.h2d(self.address + offset, gpu.host_address(src), n)
        self._stream.synchronize()   # the caller may reuse `data` as soon as this returns
        return n

    def read_into(self, offset: int, out: Any) -> int:
        """Device -> writable host buffer, one copy; returns the byte count once the bytes are in `out`."""
        dst = as_byte_view(out, "out")
        if dst.readonly:
            raise ValueError("out must be a writable buffer")
        offset, n = self._check(offset, dst.nbytes)
        self._stream.d2h(gpu.host_address(dst), self.address + offset, n)
        self._stream.synchronize()
        return n

    def close(self) -> None:
        """Free the allocation once queued copies are done. Views from `array` must not be used afterwards."""
        if self._mem is not None:
            self._stream.synchronize()
            self._mem = None      # CuPy frees the cudaMalloc when the last reference (a live view) goes

    def __enter__(self) -> HbmArena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, offset: Any, size: Any) -> tuple[int, int]:
        if self._mem is None:
            raise ValueError("arena is closed")
        offset, size = _index(offset, "offset"), _index(size, "size")
        if offset + size > self._capacity:
            raise ValueError(f"offset + size ({offset} + {size}) exceeds the arena capacity {self._capacity}")
        return offset, size
