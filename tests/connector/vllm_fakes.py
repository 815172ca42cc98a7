"""Plain stand-ins for what vLLM hands the connector, for the vLLM-free unit tests: a request record with the
attributes the planner reads, a KV cache laid out like vLLM's CPU backend (per-layer views of one allocation), and a
pool wrapper that injects one fault into a real pool."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kvpool.connector.config import ConnectorConfig
from kvpool.connector.pool_handle import PoolHandle
from kvpool.connector.stats import ConnectorStats
from kvpool.connector.vllm_layout import KVLayout

BT = 4                       # tokens per block (vLLM uses 128 on CPU; the planner does not care)
LAYERS, HEADS, HEAD_DIM = 3, 2, 8
LAYOUT = KVLayout(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=HEAD_DIM, block_tokens=BT, kv_dtype="float32",
                  page_bytes=HEADS * BT * 2 * HEAD_DIM * 4, tag="vllm-0.32.0/CPU_ATTN/vec/LBHNC")
NS = LAYOUT.namespace(model="tiny", fingerprint="f" * 32, tenant="default")


@dataclass
class FakeRequest:
    request_id: str
    all_token_ids: list[int]
    cache_salt: str | None = None
    lora_request: Any = None
    mm_features: list = field(default_factory=list)
    prompt_embeds: Any = None
    skip_reading_prefix_cache: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


def kv_cache(num_blocks: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Like vLLM's CPU backend: one allocation, layer l = [num_blocks, heads, block, 2*head_dim] view of it."""
    g = torch.Generator().manual_seed(seed)
    whole = torch.randn((LAYERS, num_blocks, HEADS, BT, 2 * HEAD_DIM), generator=g)
    return {f"model.layers.{i}.self_attn.attn": whole[i] for i in range(LAYERS)}


def config(**kw) -> ConnectorConfig:
    kw.setdefault("pool", "127.0.0.1:1")
    kw.setdefault("min_hit_tokens", 0)
    kw.setdefault("load_policy", "always")
    return ConnectorConfig(block_tokens=BT, **kw)


def handle(pool, stats: ConnectorStats, **kw) -> PoolHandle:
    def count(reason: str, where: str) -> None:
        stats.add_fallback("save_" + reason if where == "save" else reason)

    opener = pool if callable(pool) else (lambda: pool)
    return PoolHandle(opener, address="test", retry_after_s=kw.pop("retry_after_s", 60.0), on_fault=count, **kw)


class FaultyPool:
    """A real pool whose `fail_on` method raises `exc` on call number `at` (1-based); everything else passes. With
    fail_on "acquire_many", a read's `rest` (ExtentRead.rest: the next read of a load, under the same lease)
    counts as a call too: the load's reads fail from the `at`-th on, however they are made."""

    def __init__(self, pool, fail_on: str, exc: BaseException, at: int = 1) -> None:
        self.pool, self.fail_on, self.exc, self.at = pool, fail_on, exc, at
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str):
        target = getattr(self.pool, name)
        if name != self.fail_on:
            return target

        def call(*args, **kwargs):
            return self._call(name, lambda: target(*args, **kwargs))
        return call

    def _call(self, name: str, fn):
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.calls[name] == self.at:
            raise self.exc
        out = fn()
        return _FaultyRead(out, self) if name == "acquire_many" else out


class _FaultyRead:
    """A read whose `rest` goes through its FaultyPool's count of acquire_many calls."""

    def __init__(self, read, owner: FaultyPool) -> None:
        self.read, self.owner = read, owner

    def rest(self, **kwargs):
        return self.owner._call("acquire_many", lambda: self.read.rest(**kwargs))

    def __getattr__(self, name: str):
        return getattr(self.read, name)

    def close(self) -> None:
        pass
