"""`EngineConfig`: one frozen, validated record of everything the bundled engine is built from.

Loadable with `kvpool.config.load_config(EngineConfig, path, **overrides)` (file < KVPOOL_ENGINE_* env < kwargs).
`device`: "auto" (the first CUDA device when torch sees one, else the CPU), "cpu", "cuda" or "cuda:N"; asking for
CUDA where torch sees none is a ValueError naming the field. The model, the KV cache and every step's tensors live
there; logits come back to the CPU for sampling, so sampling is the same code on both.
The KV cache is sized either by `num_kv_blocks` or by `kv_cache_bytes` (blocks = bytes // bytes per block); if
neither is set, enough blocks for `max_num_seqs` full-length sequences are reserved, capped at 2 GiB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:[0-9]+)?)$")
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
    device: str = "auto"                 # auto | cpu | cuda | cuda:N
    allow_long_context: bool = False     # max_model_len past the model's trained context (RoPE extrapolated):
                                         # timing long prompts only (bench/gpu_path.py); outputs are not meaningful

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
        if not isinstance(self.allow_long_context, bool):
            raise ValueError(f"EngineConfig.allow_long_context must be a bool, got {self.allow_long_context!r}")
        if not isinstance(self.device, str) or not _DEVICE_RE.match(self.device):
            raise ValueError(f"EngineConfig.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise ValueError(f"EngineConfig.device={self.device!r} asks for a GPU but torch sees no CUDA device "
                                 f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}); "
                                 f"set device='cpu' or 'auto'")
            index = int(self.device.partition(":")[2] or 0)
            if index >= torch.cuda.device_count():
                raise ValueError(f"EngineConfig.device={self.device!r}: torch sees {torch.cuda.device_count()} CUDA "
                                 f"device(s)")
        for name in ("model_name", "tenant"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"EngineConfig.{name} must be a non-empty string, got {getattr(self, name)!r}")

    @property
    def torch_device(self) -> str:
        """The device the engine runs on: "cpu" or "cuda:N" ("auto" resolved)."""
        if self.device == "cpu":
            return "cpu"
        if self.device == "auto":
            import torch

            return "cuda:0" if torch.cuda.is_available() else "cpu"
        return self.device if ":" in self.device else "cuda:0"

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
