"""The engine-hook contract: how an outside KV store (the kvpool connector) plugs into the bundled engine.

A leaf module (docs/internals.md "Layers"): the engine calls connectors only through it, connectors implement it,
and neither imports the other. torch is named for type checkers only, so importing this module costs nothing.

The engine calls a connector only through `KVConnectorBase`; every method has a do-nothing default, so the engine
without a connector is the engine with `KVConnectorBase()`. All calls come from the engine's one thread, in this
order for each request:

 1. attach(info)                    once, when the engine is built. `info` gives the KV cache tensor
                                    [num_layers, 2, num_blocks, block_tokens, kv_heads, head_dim]
                                    (kernels/kv_transfer.py has the layout and the gather/scatter helpers),
                                    block_tokens, the Namespace the engine keys its blocks with, the fingerprint.
 2. get_num_external_tokens(request, num_local_cached_tokens) -> int
                                    at scheduling, before blocks are allocated. How many tokens right after the
                                    local prefix-cache hit the store can supply. Must be a multiple of block_tokens
                                    (full blocks only); the engine floors other values, clamps to leave at least one
                                    prompt token to compute, and treats an exception as 0. Called again (and
                                    load_kv skipped) when the request then does not fit in the free blocks this
                                    step, and again after a preemption.
 3. load_kv(request, block_ids, num_local_cached_tokens, num_external_tokens) -> int
                                    right after allocation, only if step 2 returned > 0. Write the KV of tokens
                                    [num_local_cached_tokens, num_local_cached_tokens + num_external_tokens) into
                                    blocks block_ids[num_local_cached_tokens // block_tokens :] of the cache, and return
                                    how many tokens were loaded (a multiple of block_tokens counted from the start of
                                    the range, e.g. the leading run of blocks that arrived intact). Loading fewer —
                                    even 0, or raising — never fails the request: the engine recomputes the rest.
                                    Blocks beyond the returned count may hold garbage; they are overwritten.
 3b. wait_for_layer_load(layer)     in every forward pass, right before layer `layer` reads or writes the KV cache, for
                                    layers 0..num_layers-1 in order. A connector whose load_kv only QUEUED its copies
                                    (a GPU side stream, layer by layer) makes the compute wait for that layer's copies
                                    here, so layer i+1 loads while layer i computes. load_kv's returned count is then a
                                    promise: those blocks hold the loaded KV by the time their layer is waited for.
                                    Only called when the connector overrides it (the default costs nothing).
 4. save_kv(request, block_ids, num_computed_tokens)
                                    after each step in which the request's prefill completed at least one new full
                                    block. Blocks block_ids[: num_computed_tokens // block_tokens] hold valid KV for
                                    request.token_ids; the connector saves those it has not saved yet (it must copy
                                    them out before returning or pin nothing: the blocks may be reused afterwards).
                                    After a preemption the recompute reports the same blocks again. An exception
                                    is logged and ignored.
 5. request_finished(request)       when the request finishes or is aborted (its blocks are freed after this call).
 6. flush(timeout) -> bool          from any thread (the engine server's POST /v1/kvpool/flush): wait until the saves
                                    offered so far have reached the store; True if they did within `timeout`.
 7. close()                         once, when the engine is closed (LLMEngine.close, LLM.close): release threads,
                                    leases and a store the connector opened itself; no hook is called after it.

`request` is an engine_adapter.request.Request: request_id, token_ids (prompt + output), prompt_token_ids,
num_prompt_tokens, num_computed_tokens, block_ids, kv_transfer_params (None or the dict the caller gave
`add_request` / the HTTP body's "kv_transfer_params", as vLLM names it: per-request connector options such as
{"pin_s": 600}, a retention hint for the blocks saved). Keys: `kvpool.block_keys(info.namespace, request.token_ids)` —
the engine's local prefix cache uses the same keys, so a block is the same object everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvpool.keys import Namespace

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class EngineInfo:
    kv_cache: torch.Tensor          # [num_layers, 2, num_blocks, block_tokens, kv_heads, head_dim]
    block_tokens: int
    namespace: Namespace
    fingerprint: str
    num_layers: int
    num_kv_heads: int
    head_dim: int


class KVConnectorBase:
    """No-op connector; subclass and override what you need."""

    info: EngineInfo | None = None

    def attach(self, info: EngineInfo) -> None:
        self.info = info

    def get_num_external_tokens(self, request, num_local_cached_tokens: int) -> int:
        return 0

    def load_kv(self, request, block_ids: list[int], num_local_cached_tokens: int, num_external_tokens: int) -> int:
        return 0

    def wait_for_layer_load(self, layer: int) -> None:
        return None

    def save_kv(self, request, block_ids: list[int], num_computed_tokens: int) -> None:
        return None

    def request_finished(self, request) -> None:
        return None

    def flush(self, timeout: float = 30.0) -> bool:
        return True

    def close(self) -> None:
        """Release what the connector holds (its threads, leases, a pool it opened itself). The engine calls it
        once, when it is closed (LLMEngine.close); a pool passed in by the caller stays open."""
