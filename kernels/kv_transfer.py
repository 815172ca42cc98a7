"""Copies between the engine's paged KV cache and contiguous pool objects (one object = one block).

Engine cache: one tensor reserved at start, every layer's K and V are views of it:

    kv_cache[num_layers, 2, num_blocks, block_tokens, kv_heads, head_dim]
             │          │   └─ block b of layer l, K or V: contiguous [block_tokens, kv_heads, head_dim]
             │          └─ 0 = K, 1 = V; kv_cache[l, 0] is layer l's k_cache [num_blocks, bt, H, D]
             └─ layer

Pool object of block b (DESIGN.md "Objects and tiers"), contiguous and layer-major:

    obj[num_layers, 2, block_tokens, kv_heads, head_dim]
    offset of layer l = l * layer_bytes; inside it K then V, each block_tokens * kv_heads * head_dim elements

So `obj[l, kv] == kv_cache[l, kv, b]`: one object is 2 * num_layers contiguous runs of the cache, and one layer
of one object is two runs. Each copy below is a strided `copy_` with no temporary; the Python loop is per block
(or per block and layer), never per token. Buffers may be any tensors with the right number of elements and the
cache's dtype (e.g. `torch.frombuffer` views of a pool arena); they are reshaped as views, never copied.
`non_blocking=True` (CUDA caches, kernels/streams.py) queues each copy on the current stream: from or into pinned
host memory it is an asynchronous DMA, and the caller owns the ordering (events); on CPU it changes nothing.
"""

from __future__ import annotations

from concurrent.futures import Executor, wait
from typing import Callable, Sequence

import numpy as np
import torch
import xxhash

from kvpool import copyhash


def object_shape(kv_cache: torch.Tensor) -> tuple[int, ...]:
    """Shape of one pool object for this cache: (num_layers, 2, block_tokens, kv_heads, head_dim)."""
    layers, two, _, bt, heads, dim = kv_cache.shape
    return (layers, two, bt, heads, dim)


def _as(buf: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, arg: str) -> torch.Tensor:
    if buf.dtype != dtype:
        if buf.dtype == torch.uint8 and buf.numel() == _numel(shape) * dtype.itemsize:
            return buf.view(dtype).view(shape)
        raise ValueError(f"{arg}: dtype {buf.dtype} does not match the cache dtype {dtype}")
    if buf.numel() != _numel(shape):
        raise ValueError(f"{arg}: has {buf.numel()} elements, one block needs {_numel(shape)} {tuple(shape)}")
    return buf.view(shape)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _check(kv_cache: torch.Tensor, block_ids: Sequence[int], bufs, arg: str) -> None:
    if len(block_ids) != len(bufs):
        raise ValueError(f"{arg}: got {len(bufs)} buffers for {len(block_ids)} block ids")
    num_blocks = kv_cache.shape[2]
    for b in block_ids:
        if not 0 <= int(b) < num_blocks:
            raise ValueError(f"block_ids: {b} is outside [0, {num_blocks})")


def as_byte_tensor(buf) -> torch.Tensor:
    """A flat uint8 tensor sharing `buf`'s memory, never a copy: a tensor as it is; a host buffer (memoryview,
    bytearray, numpy, mmap) through the buffer protocol; a device array (CuPy, anything with `__dlpack__` or
    `__cuda_array_interface__`) through DLPack."""
    if isinstance(buf, torch.Tensor):
        return buf.reshape(-1).view(torch.uint8)
    if hasattr(buf, "__cuda_array_interface__"):
        return torch.from_dlpack(buf).reshape(-1).view(torch.uint8)
    try:
        view = memoryview(buf)
    except TypeError:
        if hasattr(buf, "__dlpack__"):
            return torch.from_dlpack(buf).reshape(-1).view(torch.uint8)
        raise ValueError(f"buffer: {type(buf).__name__} is neither a tensor, a host buffer nor DLPack-capable") from None
    if view.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(view.cast("B") if view.format != "B" or view.ndim != 1 else view, dtype=torch.uint8)


def object_view(buf, kv_cache: torch.Tensor) -> torch.Tensor:
    """`buf` (any buffer `as_byte_tensor` takes) as one pool object [layers, 2, bt, kv_heads, head_dim] of the cache's
    dtype, sharing memory."""
    flat = as_byte_tensor(buf)
    shape = object_shape(kv_cache)
    need = _numel(shape) * kv_cache.dtype.itemsize
    if flat.numel() != need:
        raise ValueError(f"buffer: has {flat.numel()} bytes, one block needs {need} {tuple(shape)}")
    return _as(flat, shape, kv_cache.dtype, "buffer")


def gather_blocks(kv_cache: torch.Tensor, block_ids: Sequence[int], out: Sequence[torch.Tensor], *,
                  non_blocking: bool = False) -> None:
    """Cache blocks -> pool objects: out[i] (one object each, or a [n, *object_shape] tensor) = block block_ids[i]."""
    _check(kv_cache, block_ids, out, "out")
    shape = object_shape(kv_cache)
    for b, buf in zip(block_ids, out):
        _as(buf, shape, kv_cache.dtype, "out").copy_(kv_cache[:, :, int(b)], non_blocking=non_blocking)


def scatter_blocks(kv_cache: torch.Tensor, block_ids: Sequence[int], src: Sequence, *,
                   non_blocking: bool = False, after: Callable[[int, int | None], bool] | None = None,
                   hash_landed: Callable[[int], bool] | None = None, helper: Executor | None = None) -> int:
    """Pool objects -> cache blocks: block block_ids[i] = src[i] (a tensor, or any buffer `object_view` takes).
    Returns how many blocks were copied and accepted.
    `after(i, digest)` (host copies only) runs once block i has landed; False stops the scatter before block i + 1.
    `digest` is None unless `hash_landed(i)` is True (a host cache): then it is the xxh3_64 of block i as it landed
    in the cache, its 2 * num_layers runs hashed right after its copy (from cache, not a second pass over memory) in
    the object's byte order. So the digest is the object's checksum exactly when every byte landed as committed,
    whatever happened to src[i] during or after the copy (the same hook as connector/vllm_layout.py's
    KVPages.scatter_views). With `hash_landed`, every block of the scatter is copied by the one-pass copy where
    kvpool.copyhash is on, the blocks not hashed too (their digest is not handed on).
    `helper` (an executor with a free worker; with `hash_landed` only): the back half of the blocks is copied and
    hashed on it while this thread copies the front half, so the copy uses two cores (the one-pass copy releases
    the GIL). `after` still runs on this thread, in block order, each call after its block landed; the back half's
    once the helper is done. After a stop, blocks past it may have landed too: like any block the return value does
    not count, their contents are undefined. Returns only once the helper is done with every source buffer."""
    _check(kv_cache, block_ids, src, "src")
    if hash_landed is not None and after is None:
        raise ValueError("hash_landed: needs after(i, digest) to hand the digests to")
    if helper is not None and hash_landed is None:
        raise ValueError("helper: only a scatter with hash_landed copies on two threads")
    runs = _LandedRuns(kv_cache, len(block_ids)) if hash_landed is not None else None
    shape = object_shape(kv_cache)

    def land(i: int) -> int | None:
        """Copy block i; its digest where `hash_landed(i)`, else None."""
        b, buf = int(block_ids[i]), src[i]
        hashed = runs is not None and hash_landed(i)
        # the one-pass copy for every block of a host cache where kvpool.copyhash is on, also where no check is
        # wanted (a staged SSD or TCP entry, checked as it arrived): its run copy beats torch's strided copy_
        landed = runs.copy_hashed(b, buf) if runs is not None else None
        if landed is None:
            if isinstance(buf, torch.Tensor):
                obj = _as(buf, shape, kv_cache.dtype, "src")
            else:
                obj = object_view(buf, kv_cache)
            kv_cache[:, :, b].copy_(obj, non_blocking=non_blocking)
            return runs.digest(b) if hashed else None
        return landed if hashed else None

    n = len(block_ids)
    split = (n + 1) // 2 if helper is not None and n > 1 else n
    back = helper.submit(lambda: [land(i) for i in range(split, n)]) if split < n else None
    try:
        for i in range(split):
            digest = land(i)
            if after is not None and not after(i, digest):
                return i
        if back is not None:
            for i, digest in enumerate(back.result(), split):
                if not after(i, digest):
                    return i
        return n
    finally:
        if back is not None:
            wait([back])      # the caller may release the sources once this returns


class _LandedRuns:
    """The 2 * num_layers runs of one block in a contiguous host cache, in object order, as slices of one flat byte
    view (a slice is ~0.1 us; numpy indexing per run cost ~1 us, 15,360 runs in a 4,096-token load). `copy_hashed`
    copies a block's object into its runs and hashes what it stored in the same pass (kvpool/copyhash.py), where
    the one-pass copy is on; `digest` hashes the runs after a copy made elsewhere."""

    __slots__ = ("flat", "run", "starts", "starts_u64", "total")

    def __init__(self, kv_cache: torch.Tensor, blocks: int = 1) -> None:
        if kv_cache.device.type != "cpu":
            raise ValueError(f"hash_landed: only a host cache is hashed as it lands, this one is on {kv_cache.device}")
        if not kv_cache.is_contiguous():
            raise ValueError("hash_landed: the cache must be one contiguous tensor")
        layers, two, num_blocks = kv_cache.shape[:3]
        self.flat = memoryview(kv_cache.reshape(-1).view(torch.uint8).numpy())
        self.run = kv_cache[0, 0, 0].numel() * kv_cache.element_size()
        self.starts = [(layer * two + kv) * num_blocks * self.run for layer in range(layers) for kv in range(two)]
        self.starts_u64 = np.array(self.starts, dtype=np.uint64)
        self.total = blocks * len(self.starts) * self.run     # the bytes this scatter moves (streaming stores)

    def copy_hashed(self, block: int, buf) -> int | None:
        """Copy `buf` (one object: a host tensor or any host buffer, e.g. a pool extent's memoryview, taken as it is)
        into block `block`'s runs and return the xxh3_64 of what landed, in one pass; None where the one-pass copy
        is off or the buffer does not fit it (the caller copies and hashes, and names what is wrong with it)."""
        if isinstance(buf, torch.Tensor):
            if buf.device.type != "cpu" or not buf.is_contiguous():
                return None
            buf = buf.reshape(-1).view(torch.uint8).numpy()
        try:
            view = memoryview(buf)
        except TypeError:       # a device array: object_view takes it through DLPack
            return None
        if view.nbytes != len(self.starts) * self.run or not view.c_contiguous:
            return None
        return copyhash.scatter(self.flat, view, self.starts_u64, self.run, block * self.run, total=self.total)

    def digest(self, block: int) -> int:
        hasher = xxhash.xxh3_64()
        update, flat, run = hasher.update, self.flat, self.run
        at = block * run
        for start in self.starts:
            update(flat[start + at:start + at + run])
        return hasher.intdigest()


def _layer_shape(kv_cache: torch.Tensor) -> tuple[int, ...]:
    return object_shape(kv_cache)[1:]


def _check_layer(kv_cache: torch.Tensor, layer: int) -> None:
    if not 0 <= layer < kv_cache.shape[0]:
        raise ValueError(f"layer: {layer} is outside [0, {kv_cache.shape[0]})")


def gather_layer(kv_cache: torch.Tensor, layer: int, block_ids: Sequence[int], out: Sequence[torch.Tensor]) -> None:
    """One layer of cache blocks -> out[i] of shape [2, block_tokens, kv_heads, head_dim] (= obj[layer])."""
    _check_layer(kv_cache, layer)
    _check(kv_cache, block_ids, out, "out")
    shape = _layer_shape(kv_cache)
    for b, buf in zip(block_ids, out):
        _as(buf, shape, kv_cache.dtype, "out").copy_(kv_cache[layer, :, int(b)])


def scatter_layer(kv_cache: torch.Tensor, layer: int, block_ids: Sequence[int], src: Sequence[torch.Tensor], *,
                  non_blocking: bool = False) -> None:
    """src[i] of shape [2, block_tokens, kv_heads, head_dim] (= obj[layer]) -> that layer of block block_ids[i]."""
    _check_layer(kv_cache, layer)
    _check(kv_cache, block_ids, src, "src")
    shape = _layer_shape(kv_cache)
    for b, buf in zip(block_ids, src):
        kv_cache[layer, :, int(b)].copy_(_as(buf, shape, kv_cache.dtype, "src"), non_blocking=non_blocking)
