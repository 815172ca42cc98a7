"""`LLMEngine`: the step-wise engine (add_request / step / abort_request) that `LLM` and the HTTP server drive.

One engine = one model, one KV cache, one block manager, one scheduler, one connector (no-op by default). It is
not thread-safe: exactly one thread calls it (the server funnels requests through a queue into its engine thread).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass

import torch
import xxhash

from kvpool.keys import Namespace
from kvpool.engine_adapter.block_manager import BlockManager
from kvpool.engine_adapter.config import EngineConfig
from kvpool.hooks import EngineInfo, KVConnectorBase
from kvpool.engine_adapter.loader import load_model
from kvpool.engine_adapter.model_files import resolve_model_path
from kvpool.engine_adapter.model_runner import ModelRunner
from kvpool.engine_adapter.request import Request
from kvpool.engine_adapter.sampling import SamplingParams
from kvpool.engine_adapter.scheduler import Scheduler
from kvpool.engine_adapter.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]                 # generated so far
    text: str
    finished: bool
    finish_reason: str | None
    ttft: float | None                   # seconds from add_request to the first generated token
    num_cached_tokens_local: int         # prompt tokens served by the local prefix cache at admission
    num_cached_tokens_external: int      # prompt tokens loaded through the connector at admission
    num_preemptions: int
    new_token_ids: list[int]             # tokens added by the step that produced this output


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, *, connector: KVConnectorBase | None = None,
                 **overrides) -> None:
        config = dataclasses.replace(config, **overrides) if config is not None else EngineConfig(**overrides)
        self.config = config
        self.model_path = resolve_model_path(config.model)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        loaded = load_model(self.model_path)
        spec = self.spec = loaded.spec
        if config.max_model_len > spec.max_position_embeddings and not config.allow_long_context:
            raise ValueError(f"EngineConfig.max_model_len={config.max_model_len} exceeds the model's context "
                             f"length {spec.max_position_embeddings}")
        self.tokenizer = Tokenizer.from_loaded(loaded)
        self.fingerprint = loaded.fingerprint
        bt = config.block_tokens
        self.namespace = Namespace(model=config.model_name, fingerprint=loaded.fingerprint, kv_dtype=config.dtype,
                                   block_tokens=bt, num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads,
                                   head_dim=spec.head_dim, tenant=config.tenant)
        num_blocks = config.resolve_num_blocks(ModelRunner.block_bytes(loaded, bt))
        if num_blocks * bt < config.max_model_len:
            raise ValueError(f"EngineConfig.num_kv_blocks: {num_blocks} blocks of {bt} tokens cannot hold one "
                             f"sequence of max_model_len={config.max_model_len} tokens; add blocks or lower "
                             f"max_model_len")
        self.device = config.torch_device
        self.runner = ModelRunner(loaded, num_blocks=num_blocks, block_tokens=bt, max_model_len=config.max_model_len,
                                  device=self.device)
        self.block_manager = BlockManager(num_blocks, bt, self.namespace, config.enable_prefix_caching)
        self.connector = connector or KVConnectorBase()
        self.scheduler = Scheduler(self.block_manager, self.connector, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens)
        if type(self.connector).wait_for_layer_load is not KVConnectorBase.wait_for_layer_load:
            self.runner.before_layer = self.connector.wait_for_layer_load   # only a connector that loads per layer
        self.connector.attach(EngineInfo(kv_cache=self.runner.kv_cache, block_tokens=bt, namespace=self.namespace,
                                         fingerprint=self.fingerprint, num_layers=spec.num_layers,
                                         num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim))
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self._closed = False
        log.info("engine ready: %s on %s, %d KV blocks of %d tokens, fingerprint %s", self.model_path, self.device,
                 num_blocks, bt, self.fingerprint)

    @property
    def num_kv_blocks(self) -> int:
        return self.block_manager.num_blocks

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        """Tokenize and check a prompt against the context (ValueError naming `prompt`)."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in prompt):
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.spec.vocab_size]
            if bad:
                raise ValueError(f"prompt: token id {bad[0]} is outside the vocabulary [0, {self.spec.vocab_size})")
        else:
            raise ValueError("prompt: must be a string or a list of token ids")
        if not ids:
            raise ValueError("prompt: is empty")
        if len(ids) >= self.config.max_model_len:
            raise ValueError(f"prompt: {len(ids)} tokens do not fit the context of max_model_len="
                             f"{self.config.max_model_len} tokens (at least one token must be left to generate)")
        return ids

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None,
                    kv_transfer_params: dict | None = None) -> str:
        """`kv_transfer_params`: per-request options for the KV connector (kvpool/hooks.py), e.g. {"pin_s": 600}."""
        self._check_open("add_request")
        params = params if params is not None else SamplingParams()
        if kv_transfer_params is not None and not isinstance(kv_transfer_params, dict):
            raise ValueError(f"kv_transfer_params: expected a dict, got {type(kv_transfer_params).__name__}")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params: expected SamplingParams, got {type(params).__name__}")
        ids = self.encode_prompt(prompt)
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        if params.seed is not None:
            seed = params.seed
        else:  # stable across processes (Python's hash() is salted per process)
            seed = xxhash.xxh3_64_intdigest(f"{self.config.seed}:{request_id}".encode()) >> 1
        eos = () if params.ignore_eos else tuple(self.tokenizer.stop_token_ids)
        req = Request(request_id, ids, params, seed, arrival_time or time.perf_counter(), self.config.max_model_len,
                      eos_token_ids=eos, kv_transfer_params=kv_transfer_params)
        self.requests[request_id] = req
        self.scheduler.add(req)
        return request_id

    def abort_request(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None and not req.is_finished:
            self.scheduler.finish(req, "abort")

    def close(self) -> None:
        """Close the connector: its threads end, its leases are released, a pool it opened itself is closed (a pool
        the caller passed in stays open). Idempotent. Afterwards `add_request` and `step` raise RuntimeError;
        requests still unfinished are not run. Without it, a connector's threads keep the engine (its KV cache, the
        arena it mapped) alive for the life of the process."""
        if self._closed:
            return
        self._closed = True
        self.connector.close()

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"{what}: the engine is closed")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one batch; outputs for every request that got a token (finished ones are then forgotten)."""
        self._check_open("step")
        scheduled = self.scheduler.schedule()
        if not scheduled:
            if self.scheduler.has_unfinished():  # a broken invariant; spinning forever would hide it
                raise RuntimeError(f"scheduler made no progress with {len(self.scheduler.waiting)} waiting and "
                                   f"{len(self.scheduler.running)} running requests")
            return []
        sampled = self.runner.step(scheduled)
        outputs = []
        for req in self.scheduler.update(scheduled, sampled):
            outputs.append(self._output(req, [req.token_ids[-1]]))
            if req.is_finished:
                self.requests.pop(req.request_id, None)
        return outputs

    def _output(self, req: Request, new_ids: list[int]) -> RequestOutput:
        out_ids = req.output_token_ids
        ttft = None if req.first_token_time is None else req.first_token_time - req.arrival_time
        return RequestOutput(req.request_id, list(req.prompt_token_ids), list(out_ids), self.tokenizer.decode(out_ids),
                             req.is_finished, req.finish_reason, ttft, req.num_local_cached_tokens,
                             req.num_external_tokens, req.num_preemptions, new_ids)
