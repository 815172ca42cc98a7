"""Pool objects in page-locked host memory -> cache blocks, a whole layer at a time, read by the GPU through the
host memory's device mapping (UVA zero-copy): two kernels per layer instead of one copy per block and layer.

```
 host (pinned arena / staging, mapped into the GPU's address space)
   obj 0 [L0:K|V][L1:K|V]...      obj 1 [L0:K|V][L1:K|V]...      ...  (anywhere; each at its own address)
          │ rows = alias.as_strided((n, run), (1, 1)): row r = the `run` words starting at word r
          ▼
   layer l:  g = rows.index_select(0, starts[l])            one gather kernel: reads obj i's K and V runs of layer l
             cache[l, :, block_ids] = g.view(N, 2, run).permute(1, 0, 2)     one index_put kernel into the blocks
```
Why: the per-block path (kernels/kv_transfer.py scatter_layer) issues one `copy_` per block and layer: 30 layers x
256 blocks = 7,680 copies for a 4K-token hit, ~300 ms of launches on an H100 where the bytes need ~4 ms of DMA
(bench/gpu_path.py, 2026-11-27). Here a layer is two launches whatever the block count.

`MappedScatter.plan(...)` returns None (the caller keeps the per-block copies) unless every source is host memory
the cache's device can read at one common address translation: `translate(host_ptr)` must return the device address
of each source (on CUDA: the pointer's registered device mapping, kvpool/pinned.py; None = not mapped). The window
spanning the sources is only a base for the index arithmetic: the kernels touch the sources' own bytes and nothing
between them. On a CPU cache `translate` is the identity and the same arithmetic runs (how the index math is tested
where no GPU is).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Sequence

import numpy as np
import torch

from kvpool.kernels.kv_transfer import object_shape

# (word bytes, dtype, __cuda_array_interface__ typestr): the widest word every address and run length divides
_WORDS = ((8, torch.int64, "<i8"), (4, torch.int32, "<i4"), (2, torch.int16, "<i2"), (1, torch.uint8, "|u1"))


def host_address(buf: Any, nbytes: int) -> int | None:
    """Address of a contiguous host buffer of exactly `nbytes` (numpy array, host tensor, anything the buffer
    protocol exposes), or None: a device buffer, another size, not contiguous. Cheap for numpy arrays and tensors
    (the arena's views), which a load has hundreds of."""
    if isinstance(buf, np.ndarray):
        ok = buf.flags.c_contiguous and buf.nbytes == nbytes
        return int(buf.__array_interface__["data"][0]) if ok else None
    if isinstance(buf, torch.Tensor):
        ok = buf.device.type == "cpu" and buf.is_contiguous() and buf.numel() * buf.element_size() == nbytes
        return buf.data_ptr() if ok else None
    if isinstance(buf, memoryview) and not buf.readonly:    # a mapped arena's extent: ~0.5 us, ~4 us by numpy
        ok = buf.c_contiguous and buf.nbytes == nbytes > 0
        return ctypes.addressof(ctypes.c_char.from_buffer(buf)) if ok else None
    if hasattr(buf, "__cuda_array_interface__") or hasattr(buf, "__dlpack__"):
        return None
    try:
        arr = np.frombuffer(buf, dtype=np.uint8)       # memoryview, bytearray, mmap: ~2 us, no copy
    except (TypeError, ValueError):
        return None
    return int(arr.__array_interface__["data"][0]) if arr.nbytes == nbytes else None


class _DeviceWindow:
    """A device address range as an object torch takes zero-copy (`torch.as_tensor` reads this interface)."""

    def __init__(self, ptr: int, n: int, typestr: str) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (ptr, False), "version": 3,
                                         "strides": None}


class MappedScatter:
    """One plan per load: N sources (one pool object each) -> N cache blocks. `scatter(l0, l1)` queues layers
    [l0, l1) on the current stream (CUDA) or copies them now (CPU)."""

    def __init__(self, kv_cache: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor, block_ids: torch.Tensor,
                 run: int, dtype: torch.dtype) -> None:
        layers, two, num_blocks = kv_cache.shape[:3]
        self._cache = kv_cache.view(layers, two, num_blocks, -1).view(dtype)   # [L, 2, blocks, run words]
        self._rows = rows                # [n, run]: row r = the run of words starting at word r of the window
        self._starts = starts            # [L, N * 2]: row of layer l's K (even) and V (odd) run of each object
        self._block_ids = block_ids      # [N]
        self._run = run
        self.count = int(block_ids.numel())

    @classmethod
    def plan(cls, kv_cache: torch.Tensor, block_ids: Sequence[int], sources: Sequence[Any],
             translate: Callable[[int], int | None]) -> MappedScatter | None:
        """The plan, or None where the sources cannot all be read through one translation (a device buffer among
        them, a pointer `translate` does not map, a translation that is not one constant shift)."""
        if not sources or len(sources) != len(block_ids) or not kv_cache.is_contiguous():
            return None
        obj_bytes = kv_cache[:, :, 0].numel() * kv_cache.element_size()
        ptrs = [host_address(s, obj_bytes) for s in sources]
        if None in ptrs:
            return None
        layers, two, bt, heads, dim = object_shape(kv_cache)
        run_bytes = bt * heads * dim * kv_cache.element_size()
        shift = None
        for p in ptrs:
            dev = translate(p)
            if dev is None or (shift is not None and dev - p != shift):
                return None
            shift = dev - p
        base, end = min(ptrs), max(ptrs) + obj_bytes
        word, dtype, typestr = next(w for w in _WORDS if all(p % w[0] == 0 for p in ptrs) and run_bytes % w[0] == 0)
        n_words, run = (end - base) // word, run_bytes // word
        if kv_cache.device.type == "cuda":
            alias = torch.as_tensor(_DeviceWindow(base + shift, n_words, typestr))   # zero-copy, on the mapping's device
            if alias.data_ptr() != base + shift or alias.device != kv_cache.device:
                return None      # mapped for another device: a kernel of the cache's device cannot read it
        else:
            window = (ctypes.c_char * (end - base)).from_address(base)
            alias = torch.frombuffer(window, dtype=dtype)
        rows = alias.as_strided((n_words - run + 1, run), (1, 1))
        first = torch.tensor([(p - base) // word for p in ptrs], dtype=torch.int64)        # [N]
        per_run = torch.arange(layers * two, dtype=torch.int64).view(layers, 1, two) * run   # [L, 1, 2]
        starts = (first.view(1, -1, 1) + per_run).reshape(layers, -1)                       # [L, N * 2]
        ids = torch.tensor([int(b) for b in block_ids], dtype=torch.int64)
        if kv_cache.device.type == "cuda":
            starts, ids = starts.pin_memory(), ids.pin_memory()     # go up at the first scatter (see there)
        return cls(kv_cache, rows, starts, ids, run, dtype)

    def scatter(self, l0: int, l1: int) -> None:
        """Layers [l0, l1) of every source into its block: per layer one gather and one index_put. The index tensors
        go to the device at the first call, on the stream current then (the copy stream): a device tensor made on
        another stream and dropped while these kernels are queued would be handed back to that stream's allocations
        (seen on an H100: the forward overwrote the indices of a queued gather, a device-side assert)."""
        n = self.count
        if self._starts.device != self._cache.device:
            self._starts = self._starts.to(self._cache.device, non_blocking=True)
            self._block_ids = self._block_ids.to(self._cache.device, non_blocking=True)
        for layer in range(l0, l1):
            got = self._rows.index_select(0, self._starts[layer])                 # [N * 2, run]
            self._cache[layer][:, self._block_ids] = got.view(n, 2, self._run).permute(1, 0, 2)


__all__ = ["MappedScatter", "host_address"]
