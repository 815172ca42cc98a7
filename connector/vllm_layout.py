"""vLLM's paged KV cache as kvpool objects: the layout tag that goes into the namespace, the model fingerprint, and
gather/scatter between vLLM's per-layer KV tensors and contiguous pool objects. vLLM-free (torch only).

What vLLM 0.32.0's CPU backend (CPU_ATTN) gives a connector (read in vllm/v1/attention/backends/cpu_attn.py and
checked with a real run that printed shapes, strides and the ISA; see docs in engine_adapter/vllm/connector.py):

    register_kv_caches({layer_name: kv})     one tensor per attention layer, all views of ONE allocation
    kv: [num_blocks, num_kv_heads, block_size, 2 * head_size]   contiguous, e.g. (364, 3, 128, 128) fp32
        viewed by the kernel as [num_blocks, num_kv_heads, 2 * block_size, head_size] and split in two:
        K rows then V rows of each head. How the bytes inside K are arranged depends on the attention ISA the
        metadata builder picked (`vec`/`vec16`: K stored transposed for the dot-product kernel; `amx`: tiles
        pre-packed for AMX; `neon`, `vsx`, ... their own), so a page is opaque bytes, valid only for readers with
        the same ISA, backend and vLLM version. That is what `layout_tag` captures.

One pool object = one vLLM block across all layers, layer-major, each layer's page copied byte for byte:

    object = [ page(layer 0) | page(layer 1) | ... | page(layer L-1) ]     page = kv[l][block_id], P bytes
    object bytes = L * P = L * kv_heads * block_size * 2 * head_size * dtype_bytes  (= Namespace.block_bytes)

so a layer's slice sits at l * P, as in every kvpool object.
"""

from __future__ import annotations

import functools
import glob
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import xxhash

from kvpool import copyhash, fence
from kvpool.keys import Namespace

_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
_FULL_HASH_LIMIT = 4 << 30        # hash every byte of models up to this size; sample bigger ones
_SAMPLES_PER_FILE = 16
_SAMPLE_BYTES = 1 << 20


def layout_tag(*, engine: str, version: str, backend: str, isa: str, kv_layout: str) -> str:
    """'vllm-0.32.0/CPU_ATTN/vec/LBHNC': everything about an engine that changes the bytes of a page."""
    parts = {"engine": engine, "version": version, "backend": backend, "isa": isa, "kv_layout": kv_layout}
    for name, value in parts.items():
        if not isinstance(value, str) or not value or "/" in value or "|" in value:
            raise ValueError(f"layout_tag {name} must be a non-empty string without '/' or '|', got {value!r}")
    return f"{engine}-{version}/{backend}/{isa}/{kv_layout}"


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> 'float32' (the names kvpool.Namespace.kv_dtype accepts)."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, slots=True, kw_only=True)
class KVLayout:
    """What the scheduler side knows about the worker's KV cache before any tensor exists (from vLLM's KV cache
    spec); the worker checks its real tensors against it (`KVPages.check`)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_tokens: int
    kv_dtype: str
    page_bytes: int          # one layer's page of one block, as vLLM's spec sizes it
    tag: str

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_tokens", "page_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"KVLayout.{name} must be a positive int, got {value!r}")
        dense = 2 * self.block_tokens * self.num_kv_heads * self.head_dim * self.dtype_bytes
        if self.page_bytes != dense:
            # A padded or scaled page (quantised KV with per-token scales, ...) has bytes the Namespace's size
            # formula does not describe; refuse rather than store objects of a size nobody can predict.
            raise ValueError(f"KVLayout.page_bytes is {self.page_bytes}, but a dense K+V page of this shape has "
                             f"{dense} bytes; this KV cache layout is not supported")

    @property
    def dtype_bytes(self) -> int:
        return torch.empty((), dtype=getattr(torch, self.kv_dtype)).element_size()

    @property
    def object_bytes(self) -> int:
        return self.num_layers * self.page_bytes

    def namespace(self, *, model: str, fingerprint: str, tenant: str, tp_rank: int = 0, tp_size: int = 1
                  ) -> Namespace:
        ns = Namespace(model=model, fingerprint=fingerprint, kv_dtype=self.kv_dtype, block_tokens=self.block_tokens,
                       num_layers=self.num_layers, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                       tenant=tenant, tp_rank=tp_rank, tp_size=tp_size, layout=self.tag)
        assert ns.block_bytes == self.object_bytes
        return ns


def model_fingerprint(path: str) -> str:
    """xxh3_128 hex over config.json and every weight file of a model folder, in name order (name, size, bytes).
    Models over 4 GiB hash each file's size, first 64 KiB (the safetensors header) and 16 evenly spaced 1 MiB
    samples instead of every byte, so start-up stays seconds; a fine-tune of the same architecture still differs
    in the sampled weights. Not a directory (a hub id): ValueError, pass `model_fingerprint` in the extra config."""
    if not os.path.isdir(path):
        raise ValueError(f"model_fingerprint: {path!r} is not a local model folder; set "
                         f"kv_connector_extra_config.model_fingerprint to a string that identifies its weights")
    files = sorted({f for pat in ("config.json", *_WEIGHT_PATTERNS) for f in glob.glob(os.path.join(path, pat))})
    if not any(not f.endswith("config.json") for f in files):
        raise ValueError(f"model_fingerprint: no weight files ({', '.join(_WEIGHT_PATTERNS)}) in {path!r}")
    stats = tuple((os.path.basename(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files)
    return _fingerprint_cached(os.path.realpath(path), stats)


@functools.lru_cache(maxsize=8)
def _fingerprint_cached(path: str, stats: tuple) -> str:
    total = sum(size for _, size, _ in stats)
    h = xxhash.xxh3_128()
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    for name, size, _ in stats:
        h.update(f"{name}|{size}|".encode())
        with open(os.path.join(path, name), "rb", buffering=0) as f:
            if total <= _FULL_HASH_LIMIT:
                while n := f.readinto(buf):
                    h.update(view[:n])
            else:
                h.update(f.read(64 << 10))
                for i in range(_SAMPLES_PER_FILE):
                    f.seek(size * i // _SAMPLES_PER_FILE)
                    h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()


class KVPages:
    """vLLM's per-layer KV tensors seen as pages: gather blocks into pool objects, scatter objects into blocks.

    Buffers are uint8 tensors [n, object_bytes] (what PoolClient reads into and writes from); each is viewed as
    [n, layers, page elements] of the KV dtype, so a copy is one strided copy per layer and nothing is converted.
    """

    def __init__(self, kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor]) -> None:
        tensors = list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)
        if not tensors:
            raise ValueError("kv_caches is empty: the connector needs the attention layers' KV tensors")
        first = tensors[0]
        for i, t in enumerate(tensors):
            if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
                raise ValueError(f"kv_caches[{i}] is {tuple(t.shape)} {t.dtype} on {t.device}, layer 0 is "
                                 f"{tuple(first.shape)} {first.dtype} on {first.device}: one layout per cache")
            if not t[0].is_contiguous() or t.stride(0) != t[0].numel():
                raise ValueError(f"kv_caches[{i}] blocks are not contiguous pages (shape {tuple(t.shape)}, "
                                 f"strides {t.stride()})")
        self.layers = [t.view(t.shape[0], -1) for t in tensors]    # [num_blocks, page elements] per layer
        # Host tensors also as numpy byte pages [num_blocks, page bytes]: a page's np.copyto is one memcpy whatever
        # the dtype (bfloat16 too), with no per-call tensor set-up, and its destination can be hashed right after.
        self.host = first.device.type == "cpu"
        self._host_pages = [t.view(torch.uint8).numpy() for t in self.layers] if self.host else None
        self.num_layers = len(tensors)
        self.num_blocks = first.shape[0]
        self.dtype = first.dtype
        self.page_elems = first[0].numel()
        self.page_bytes = self.page_elems * first.element_size()
        self.object_bytes = self.num_layers * self.page_bytes

    def check(self, layout: KVLayout) -> None:
        """The worker's tensors must be what the scheduler side keyed its blocks for (RuntimeError at start)."""
        got = (self.num_layers, dtype_name(self.dtype), self.page_bytes)
        want = (layout.num_layers, layout.kv_dtype, layout.page_bytes)
        if got != want:
            raise RuntimeError(f"vLLM's KV tensors (layers, dtype, page bytes) = {got} differ from its KV cache spec "
                               f"{want}: this vLLM build's layout is not the one the connector was written for")

    def new_buffer(self, n: int) -> torch.Tensor:
        """A zeroed (so already paged in) uint8 staging buffer for n objects."""
        return torch.zeros((n, self.object_bytes), dtype=torch.uint8)

    def _typed(self, buf: torch.Tensor, n: int) -> torch.Tensor:
        if buf.dtype != torch.uint8 or buf.dim() != 2 or buf.shape[1] != self.object_bytes or buf.shape[0] < n:
            raise ValueError(f"buffer must be uint8 [>= {n}, {self.object_bytes}], got {buf.dtype} "
                             f"{tuple(buf.shape)}")
        return buf[:n].view(self.dtype).view(n, self.num_layers, self.page_elems)

    def gather(self, block_ids: Sequence[int], out: torch.Tensor) -> torch.Tensor:
        """Copy blocks `block_ids` of every layer into out[:len(block_ids)] (objects in that order)."""
        n = len(block_ids)
        if n == 0:
            return out[:0]
        typed = self._typed(out, n)
        idx = self._index(block_ids)
        if self.host and out.device.type == "cpu":     # one np.copyto per page: no temporary, no tensor set-up
            rows = out[:n].numpy().reshape(n, self.num_layers, self.page_bytes)
            for i, block in enumerate(block_ids):
                for layer, kv in enumerate(self._host_pages):
                    np.copyto(rows[i, layer], kv[block])
            return out[:n]
        for layer, kv in enumerate(self.layers):
            typed[:, layer].copy_(kv.index_select(0, idx))   # index_select cannot write into a strided slice
        return out[:n]

    def scatter(self, block_ids: Sequence[int], src: torch.Tensor) -> None:
        """Copy objects src[:len(block_ids)] into blocks `block_ids` of every layer."""
        n = len(block_ids)
        if n == 0:
            return
        typed = self._typed(src, n)
        idx = self._index(block_ids)
        for layer, kv in enumerate(self.layers):
            kv.index_copy_(0, idx, typed[:, layer])

    def scatter_views(self, block_ids: Sequence[int], objects: Sequence,
                      after: Callable[[int, int | None], bool] | None = None, *,
                      hash_landed: Callable[[int], bool] | None = None, pipeline: bool = False) -> int:
        """Copy objects[i] (any buffer of object_bytes: a pool extent mapped here, a staging row) into block
        block_ids[i] of every layer: one copy per page, no staging buffer in between.
        `hash_landed(i)` True: object i is hashed as it lands, each page fed to an xxh3_64 after its copy (from
        cache, not a second pass over memory) in the object's byte order, so the digest is the object's checksum
        exactly when every byte landed as committed. Host KV tensors only.
        `after(i, digest)` runs once object i has landed (digest: that hash, None where not hashed); False stops
        before object i + 1. Where the one-pass copy is on (kvpool/copyhash.py), a hashed object's pages are copied
        and hashed in one pass and `pipeline` is moot. Otherwise, with `pipeline`, the pages are hashed on the read
        fence's helper thread while this one copies the next (kvpool/fence.py HashPipe), and `after` runs for each
        object in order once every object has landed: a refusal then leaves the later blocks written but not
        counted.
        Returns how many objects were copied and accepted."""
        if len(objects) != len(block_ids):
            raise ValueError(f"objects has {len(objects)} entries, block_ids {len(block_ids)}")
        if (hash_landed is not None or pipeline) and not self.host:
            raise ValueError("hash_landed, pipeline: only host KV tensors are hashed as they land, these are on "
                             f"{self.layers[0].device}")
        self._index(block_ids)
        if self.host:
            srcs = [_host_bytes(obj) for obj in objects]
        else:
            srcs = [obj if isinstance(obj, torch.Tensor) else torch.frombuffer(obj, dtype=torch.uint8)
                    for obj in objects]
        for src in srcs:
            size = src.size if self.host else src.numel()
            if src.dtype != (np.uint8 if self.host else torch.uint8) or size != self.object_bytes:
                raise ValueError(f"objects must be {self.object_bytes} bytes, got {size} {src.dtype}")
        if not self.host:
            for i, (block, src) in enumerate(zip(block_ids, srcs)):
                pages = src.view(self.dtype).view(self.num_layers, self.page_elems)
                for layer, kv in enumerate(self.layers):
                    kv[block].copy_(pages[layer])
                if after is not None and not after(i, None):
                    return i
            return len(srcs)
        if hash_landed is not None and copyhash.simd():
            # one pass: each page stored and folded into the object's hash from one load (kvpool/copyhash.py)
            for i, (block, src) in enumerate(zip(block_ids, srcs)):
                pages = [kv[block] for kv in self._host_pages]
                digest = copyhash.copy_into(pages, src, total=len(srcs) * self.object_bytes) if hash_landed(i) else None
                if digest is None:
                    for page, part in zip(pages, src.reshape(self.num_layers, self.page_bytes)):
                        np.copyto(page, part)
                    if hash_landed(i):
                        digest = _landed_digest(pages)
                if after is not None and not after(i, digest):
                    return i
            return len(srcs)
        pipe = fence.HashPipe() if pipeline else None
        hashers: list[xxhash.xxh3_64 | None] = []
        try:
            for i, (block, src) in enumerate(zip(block_ids, srcs)):
                pages = src.reshape(self.num_layers, self.page_bytes)
                hasher = xxhash.xxh3_64() if hash_landed is not None and hash_landed(i) else None
                for layer, kv in enumerate(self._host_pages):
                    page = kv[block]
                    np.copyto(page, pages[layer])
                    if hasher is None:
                        continue
                    if pipe is None:
                        hasher.update(page)
                    else:
                        pipe.add(hasher, page)
                if pipe is not None:
                    hashers.append(hasher)
                elif after is not None and not after(i, None if hasher is None else hasher.intdigest()):
                    return i
        finally:
            if pipe is not None:
                pipe.finish()       # every queued page hashed: nothing in flight when this returns or raises
        for i, hasher in enumerate(hashers):
            if after is not None and not after(i, None if hasher is None else hasher.intdigest()):
                return i
        return len(srcs)

    def _index(self, block_ids: Sequence[int]) -> torch.Tensor:
        idx = torch.as_tensor(list(block_ids), dtype=torch.long)
        if int(idx.min()) < 0 or int(idx.max()) >= self.num_blocks:
            raise ValueError(f"block_ids must be in [0, {self.num_blocks}), got {list(block_ids)}")
        return idx


def _landed_digest(pages) -> int:
    hasher = xxhash.xxh3_64()
    for page in pages:
        hasher.update(page)
    return hasher.intdigest()


def _host_bytes(obj) -> np.ndarray:
    """A flat uint8 numpy view of a host buffer (numpy array, CPU tensor, memoryview, bytearray), no copy."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise ValueError(f"objects must be host buffers for host KV tensors, got one on {obj.device}")
        obj = obj.numpy()
    if isinstance(obj, np.ndarray) and obj.dtype == np.uint8 and obj.ndim == 1:
        return obj
    return np.frombuffer(obj, dtype=np.uint8)
