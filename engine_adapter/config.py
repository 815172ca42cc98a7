"""`EngineConfig`: one frozen, validated record of everything the bundled engine is built from.

Loadable with `kvpool.config.load_config(EngineConfig, path, **overrides)` (file < KVPOOL_ENGINE_* env < kwargs).
The KV cache is sized either by `num_kv_blocks` or by `kv_cache_bytes` (blocks = bytes // bytes per block); if
neither is set, enough blocks for `max_num_seqs` full-length sequences are reserved, capped at 2 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass

_DTYPES = ("float32",)  # the reference comparison is fp32; other dtypes would need their own tolerance story


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    model: str | None = None            # .gguf path; None = bundled SmolLM2 (engine_adapter.model_files)
    block_tokens: int = 16
    num_kv_blocks: int | None = None
    kv_cache_bytes: int | None = None
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048   # per-step token budget; a longer prompt is prefilled in chunks
    max_model_len: int = 2048            # prompt + generated tokens of one sequence
    enable_prefix_caching: bool = True
    dtype: str = "float32"
    seed: int = 0                        # default seed for requests that sample without their own seed
    num_threads: int | None = None       # torch intra-op threads; None leaves torch's choice
    model_name: str = "smollm2-135m"     # served model id and Namespace.model
    tenant: str = "default"

    def __post_init__(self) -> None:
        def positive(name: str, allow_none: bool = False) -> None:
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"EngineConfig.{name} must be a positive int, got {value!r}")

        for name in ("block_tokens", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            positive(name)
        for name in ("num_kv_blocks", "kv_cache_bytes", "num_threads"):
            positive(name, allow_none=True)
        if self.num_kv_blocks is not None and self.kv_cache_bytes is not None:
            raise ValueError("EngineConfig.num_kv_blocks and EngineConfig.kv_cache_bytes are exclusive; set one")
        if self.dtype not in _DTYPES:
            raise ValueError(f"EngineConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"EngineConfig.enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"EngineConfig.seed must be an int, got {self.seed!r}")
        if self.model is not None and not isinstance(self.model, str):
            raise ValueError(f"EngineConfig.model must be a path string or None, got {self.model!r}")
        for name in ("model_name", "tenant"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"EngineConfig.{name} must be a non-empty string, got {getattr(self, name)!r}")

    def resolve_num_blocks(self, block_bytes: int) -> int:
        """Number of cache blocks given the bytes of one block (all layers, K and V)."""
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        if self.kv_cache_bytes is not None:
            blocks = self.kv_cache_bytes // block_bytes
            if blocks < 1:
                raise ValueError(f"EngineConfig.kv_cache_bytes={self.kv_cache_bytes} is smaller than one block "
                                 f"({block_bytes} bytes)")
            return blocks
        per_seq = -(-self.max_model_len // self.block_tokens)
        return max(1, min(per_seq * self.max_num_seqs, (2 << 30) // block_bytes))
