"""Block keys: the content address every component shares.

A namespace fixes everything that makes KV bytes incompatible (model, weights fingerprint, KV dtype, block size,
layer/head layout, tensor-parallel layout, tenant). Its digest is the root of every chain:

    key[-1] = namespace.digest                                  (16 bytes)
    key[i]  = xxh3_128(key[i-1] || int32-LE token ids of block i || extra)

Only full blocks get keys. The scheme is fixed by pinned test vectors in tests/kvpool/test_keys.py: a change here
that changes a digest silently invalidates every pool in production, so it must fail those tests first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NewType, Sequence

import numpy as np
import xxhash

BlockKey = NewType("BlockKey", bytes)
KEY_BYTES = 16

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class Namespace:
    """Everything that makes two KV blocks with the same tokens incompatible. Frozen; validated on creation."""

    model: str
    fingerprint: str
    kv_dtype: str
    block_tokens: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    tenant: str = "default"
    tp_rank: int = 0
    tp_size: int = 1
    layout: str = ""   # engine/page-layout tag (e.g. vLLM version, attention backend, ISA); "" = this project's engine

    def __post_init__(self) -> None:
        for name in ("model", "fingerprint", "tenant"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"Namespace.{name} must be a non-empty string, got {value!r}")
        if self.kv_dtype not in _DTYPE_BYTES:
            raise ValueError(f"Namespace.kv_dtype must be one of {sorted(_DTYPE_BYTES)}, got {self.kv_dtype!r}")
        for name in ("block_tokens", "num_layers", "num_kv_heads", "head_dim", "tp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Namespace.{name} must be a positive int, got {value!r}")
        if not isinstance(self.tp_rank, int) or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"Namespace.tp_rank must be in [0, tp_size={self.tp_size}), got {self.tp_rank!r}")
        if not isinstance(self.layout, str) or "|" in self.layout:
            raise ValueError(f"Namespace.layout must be a string without '|', got {self.layout!r}")

    def canonical(self) -> bytes:
        """Stable text encoding, field order fixed by the dataclass; the input of `digest`. `layout` enters only when
        set, so every namespace made before it existed keeps its digest (the pinned vectors) and its pool objects."""
        parts = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                 if f.name != "layout" or self.layout]
        return ("kvpool-ns-v1|" + "|".join(parts)).encode()

    @property
    def digest(self) -> bytes:
        return xxhash.xxh3_128_digest(self.canonical())

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES[self.kv_dtype]

    @property
    def block_bytes(self) -> int:
        """Size of one pool object: [layers, 2 (K,V), block_tokens, kv_heads, head_dim] of kv_dtype."""
        return self.num_layers * 2 * self.block_tokens * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer's K+V slice inside an object (objects are layer-major, so layer l starts at l*this)."""
        return self.block_bytes // self.num_layers


def block_keys(ns: Namespace, token_ids: Sequence[int] | np.ndarray, extra: bytes = b"") -> list[bytes]:
    """One 16-byte key per FULL block of `token_ids`; a trailing partial block gets none."""
    if not isinstance(extra, (bytes, bytearray)):
        raise ValueError(f"extra must be bytes, got {type(extra).__name__}")
    ids = np.asarray(token_ids)
    if ids.ndim != 1:
        raise ValueError(f"token_ids must be one-dimensional, got shape {ids.shape}")
    if ids.size and (ids.dtype.kind not in "iu" or ids.min() < -(2**31) or ids.max() >= 2**31):
        raise ValueError("token_ids must be integers that fit in int32")
    n_blocks = ids.size // ns.block_tokens
    raw = ids[: n_blocks * ns.block_tokens].astype("<i4", copy=False).tobytes()
    stride = ns.block_tokens * 4
    extra = bytes(extra)
    digest = xxhash.xxh3_128_digest
    keys: list[bytes] = []
    prev = ns.digest
    for i in range(n_blocks):
        prev = digest(prev + raw[i * stride : (i + 1) * stride] + extra)
        keys.append(prev)
    return keys


def check_keys(keys: Sequence[bytes], arg: str = "keys") -> None:
    """Raise ValueError naming `arg` if any key is not 16 bytes."""
    for i, key in enumerate(keys):
        if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
            got = len(key) if isinstance(key, (bytes, bytearray)) else type(key).__name__
            raise ValueError(f"{arg}[{i}] must be a {KEY_BYTES}-byte key, got {got}")
