"""PoolConnector: the engine hooks (kvpool/hooks.py) implemented on the public pool API.

Per request, on the engine's thread:

    schedule ──get_num_external_tokens──▶ keys of the full blocks past the local prefix-cache hit
                                          lookup_prefix in the pool ─▶ hit long enough? faster than recompute?
    allocate ──load_kv──────────────────▶ (staged) get_many_into a staging tensor ─▶ scatter into the engine's blocks
    prefill  ──save_kv──────────────────▶ gather new full blocks into a fresh tensor ─▶ bounded async queue
    finish   ──request_finished─────────▶ save the decode's full blocks too (the next turn's prompt has them)

With `transfer` direct (the default, `auto`) load_kv and save_kv instead copy straight between the cache and the
pool's own memory (connector/direct.py): on CUDA on a side stream, layer by layer (`wait_for_layer_load` is its
hook); on CPU at once, each load chunk checked after its copy. `transfer: staged` keeps the path drawn above.

Failure policy: any pool fault (unreachable, timeout, bad checksum, a block evicted between lookup and load) turns
into "recompute those tokens": the hook returns fewer tokens, the fault is counted by reason, logged once per
reason, and the pool is left alone for `retry_after_s` so a dead pool costs each request nothing. Nothing here
raises into the engine except a config mismatch at attach, which is a deployment mistake to catch at start.

Namespace: the engine's (model, weights fingerprint, dtype, layout), with the connector's tenant, so different
models, dtypes or tenants never share blocks.

Retention hints: every save carries `pin_s` (ConnectorConfig.pin_s, or the request's kv_transfer_params["pin_s"]);
a bad per-request value falls back to the config's, logged once. Seconds saved: each lookup carries this connector's
measured prefill seconds per token (none before its first timed prefill), which the master multiplies by the hits.

Why one module of ~450 lines: it is the one implementation of the hook contract (kvpool/hooks.py), a method per
hook; what each hook delegates to lives apart (connector/saver.py, cost.py, direct.py, pool_handle.py).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass

import torch

from kvpool.connector.config import ConnectorConfig, LayerwiseMode, LoadPolicy, SavePolicy, TransferMode, request_pin_s
from kvpool.connector.cost import LoadCostModel, prefill_s_per_token
from kvpool.connector.direct import DirectTransfer
from kvpool.connector.pool_factory import open_pool
from kvpool.connector.saver import BlockSaver, SaveBatch
from kvpool.connector.seen import SeenCounts
from kvpool.connector.stats import ConnectorStats
from kvpool.errors import PoolDataError, PoolError, PoolTimeout
from kvpool.hooks import EngineInfo, KVConnectorBase
from kvpool.kernels.kv_transfer import gather_blocks, object_shape, scatter_blocks
from kvpool.keys import block_keys

log = logging.getLogger(__name__)



@dataclass(slots=True)
class _RequestState:
    keys: list[bytes]                  # keys of the request's full blocks so far (prompt, later outputs too)
    num_key_tokens: int                # tokens those keys cover
    counted: bool = False              # requested/local tokens counted once per request, not per retry
    lookup_first: int = -1             # block index and hit count of the last lookup, reused by load_kv
    lookup_hits: int = 0
    saved_blocks: int = 0              # leading blocks already in the pool (loaded) or offered to it
    mark_time: float = 0.0             # prefill-rate measurement: time and computed tokens at the last mark
    mark_tokens: int = 0


class PoolConnector(KVConnectorBase):
    def __init__(self, config: ConnectorConfig | None = None, *, pool=None) -> None:
        self.config = config or ConnectorConfig()
        self.stats = ConnectorStats()
        self._pool = pool
        self._owns_pool = pool is None
        self._pool_lock = threading.Lock()
        self._retry_at = 0.0
        self._logged: set[str] = set()
        self._requests: dict[str, _RequestState] = {}
        self._seen = SeenCounts()
        self._staging: torch.Tensor | None = None
        self.namespace = None
        self.cost: LoadCostModel | None = None
        self._metrics = None
        self._direct: DirectTransfer | None = None
        self._pin_wanted = False
        self._pinned_pool = None
        self.pin_report: dict[str, str] = {}    # pool memory pinned for DMA here: {node id: "pinned" | why not}
        self.warm_report: dict[str, str] = {}   # what the start-up warm-up did: {node id: "mapped, N bytes ..."}
        self._warm_thread: threading.Thread | None = None
        self._saver = BlockSaver(self._get_pool, max_blocks=self.config.save_queue_blocks,
                                 on_saved=self._on_saved, on_error=lambda exc: self._fault(exc, "save"))

    # ------------------------------------------------------------------ hooks

    def attach(self, info: EngineInfo) -> None:
        if info.block_tokens != self.config.block_tokens:
            raise ValueError(f"block_tokens: the connector config says {self.config.block_tokens}, the engine "
                             f"uses {info.block_tokens}; set them equal")
        super().attach(info)
        self.namespace = dataclasses.replace(info.namespace, tenant=self.config.tenant)
        self.cost = LoadCostModel(bytes_per_token=self.namespace.block_bytes // info.block_tokens)
        self._shape = object_shape(info.kv_cache)
        on_cuda = info.kv_cache.device.type == "cuda"
        layerwise = self.config.layerwise_load is LayerwiseMode.ON or (
            self.config.layerwise_load is LayerwiseMode.AUTO and on_cuda)
        # auto = direct on CPU too since 2026-11-26: one copy, checked after it (connector/direct.py), measured
        # faster than staged from DRAM and even from SSD (its entries land in a reused ring)
        direct = self.config.transfer is not TransferMode.STAGED
        if direct:
            self._direct = DirectTransfer(info.kv_cache, self.namespace.block_bytes,
                                          chunk_blocks=self.config.load_chunk_blocks, layerwise=layerwise)
            self._pin_wanted = on_cuda and self.config.pin_host_memory
            self._staging = None
        else:
            blocks = min(self.config.load_chunk_blocks, info.kv_cache.shape[2])
            # zeros: touched now; pinned on CUDA so the staged copies are DMA too
            self._staging = torch.zeros((blocks, *self._shape), dtype=info.kv_cache.dtype, pin_memory=on_cuda)
        log.info("connector: %s transfer, layer-wise load %s, cache on %s", "direct" if direct else "staged",
                 "on" if direct and layerwise else "off", info.kv_cache.device)
        if self.config.warm_start:
            self._warm_thread = threading.Thread(target=self._warm, name="kvpool-connector-warm", daemon=True)
            self._warm_thread.start()

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Wait for the start-up warm-up (`warm_start`) to end; True once it has, or when none was started."""
        thread = self._warm_thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    @property
    def direct(self) -> bool:
        """Whether KV moves straight between the cache and the pool's memory (connector/direct.py)."""
        return self._direct is not None

    @property
    def mapped_loads(self) -> int:
        """Loads whose layers a CUDA cache read from pinned pool memory in place, two kernels per layer
        (kernels/mapped_scatter.py); 0 on CPU or without the direct path."""
        return self._direct.mapped_loads if self._direct is not None else 0

    def get_num_external_tokens(self, request, num_local_cached_tokens: int) -> int:
        bt = self.config.block_tokens
        if self._direct is not None:
            self._direct.reap()
        state = self._state(request)
        max_blocks = (request.num_tokens - 1) // bt
        if not state.counted:
            state.counted = True
            self._count_request(max_blocks * bt, min(num_local_cached_tokens, max_blocks * bt))
            if self.config.save_policy is SavePolicy.AFTER_N_HITS:
                self._seen.remember(state.keys[:max_blocks])
        first = num_local_cached_tokens // bt
        state.lookup_first, state.lookup_hits = first, 0
        state.mark_time, state.mark_tokens = time.perf_counter(), num_local_cached_tokens
        if first >= max_blocks:
            return 0
        pool = self._get_pool()
        if pool is None:
            return 0
        try:
            self.stats.lookups += 1
            hits = pool.lookup_prefix(state.keys[first:max_blocks], namespace=self.namespace,
                                      prefill_s_per_token=prefill_s_per_token(self.cost))
        except Exception as exc:
            self._fault(exc, "lookup")
            return 0
        tokens = hits * bt
        if tokens == 0 or tokens < self.config.min_hit_tokens:
            return 0
        if self.config.load_policy is LoadPolicy.AUTO and not self.cost.should_load(tokens):
            self._count_fallback("slower_than_recompute")
            return 0
        state.lookup_hits = hits
        return tokens

    def load_kv(self, request, block_ids: list[int], num_local_cached_tokens: int, num_external_tokens: int) -> int:
        bt = self.config.block_tokens
        state = self._state(request)
        first, n = num_local_cached_tokens // bt, num_external_tokens // bt
        pool = self._get_pool()
        if pool is None or n <= 0:
            return 0
        if self._direct is not None:
            return self._load_direct(pool, request, state, block_ids, first, n)
        # Chunks through one staging buffer reserved (and touched) at attach: no request pays page faults for it,
        # and memory stays bounded however long the hit is.
        chunk = self._staging.shape[0]
        flat = self._staging.view(chunk, -1).view(torch.uint8).numpy()
        tiers: list[str] = []
        got = 0
        seconds = 0.0
        try:
            while got < n:
                k = min(chunk, n - got)
                keys = state.keys[first + got:first + got + k]
                start = time.perf_counter()
                done = pool.get_many_into(keys, list(flat[:k]), tiers_out=tiers)
                seconds += time.perf_counter() - start
                if done:
                    scatter_blocks(self.info.kv_cache, block_ids[first + got:first + got + done],
                                   self._staging[:done])
                got += done
                if done < k:
                    break
            if got < n:
                # Evicted between lookup and load, or a block failed its checksum: recompute from there.
                self._count_fallback("partial_load")
        except Exception as exc:
            # Blocks scattered before the fault are valid KV: report them, recompute only the rest.
            self._fault(exc, "load")
        if got:
            nbytes = got * self.namespace.block_bytes
            self.cost.observe_load(nbytes, seconds)
            self.stats.loads += 1
            self.stats.load_seconds += seconds
            self.stats.load_bytes += nbytes
            for tier in tiers[:got] if len(tiers) >= got else ["unknown"] * got:
                self._count_hit(tier, bt)
        state.saved_blocks = max(state.saved_blocks, first + got)
        state.mark_time, state.mark_tokens = time.perf_counter(), (first + got) * bt
        return got * bt

    def _load_direct(self, pool, request, state: _RequestState, block_ids: list[int], first: int, n: int) -> int:
        bt = self.config.block_tokens
        result = self._direct.load(pool, state.keys[first:first + n], block_ids[first:first + n])
        if result.error is not None:
            self._fault(result.error, "load")      # blocks queued before the fault are valid: keep them
        elif result.partial:
            self._count_fallback("partial_load")
        got = result.blocks
        if got:
            nbytes = got * self.namespace.block_bytes
            self.cost.observe_load(nbytes, result.seconds)
            self.stats.loads += 1
            self.stats.load_seconds += result.seconds
            self.stats.load_bytes += nbytes
            for tier in result.tiers:
                self._count_hit(tier, bt)
        state.saved_blocks = max(state.saved_blocks, first + got)
        state.mark_time, state.mark_tokens = time.perf_counter(), (first + got) * bt
        return got * bt

    def wait_for_layer_load(self, layer: int) -> None:
        if self._direct is not None:
            self._direct.wait(layer)

    def save_kv(self, request, block_ids: list[int], num_computed_tokens: int) -> None:
        state = self._state(request)
        now = time.perf_counter()
        if state.mark_time and num_computed_tokens > state.mark_tokens:
            self.cost.observe_prefill(num_computed_tokens - state.mark_tokens, now - state.mark_time)
        state.mark_time, state.mark_tokens = now, num_computed_tokens
        self._save(request, state, block_ids, num_computed_tokens)

    def request_finished(self, request) -> None:
        if self._direct is not None:
            self._direct.reap()
        if request.request_id not in self._requests:
            return
        state = self._state(request)  # refresh keys: they now cover the generated tokens too
        del self._requests[request.request_id]
        if request.block_ids:
            # Decode blocks: a multi-turn chat's next prompt starts with this whole conversation.
            self._save(request, state, list(request.block_ids), request.num_computed_tokens)

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait for queued saves to reach the pool (tests, benchmarks, shutdown)."""
        return self._saver.flush(timeout)

    def pinned_memory(self) -> dict[str, str]:
        """Re-read which pool memory this process has pinned ({node id: "pinned" | why not}); {} before any pool."""
        with self._pool_lock:
            pool = self._pool
        if pool is not None and self._pin_wanted:
            self.pin_report = pool.pin_host_memory()
        return dict(self.pin_report)

    def close(self) -> None:
        self.wait_warm(self.config.load_timeout_s)   # a warm-up in flight maps no arena into a closed pool
        if self._direct is not None:
            self._direct.close()      # every queued copy done, every lease released
        self._saver.close()
        with self._pool_lock:
            if self._owns_pool and self._pool is not None:
                try:
                    self._pool.close()
                except Exception:
                    pass
            self._pool = None

    # ------------------------------------------------------------------ internals

    def _state(self, request) -> _RequestState:
        state = self._requests.get(request.request_id)
        if state is None:
            state = self._requests[request.request_id] = _RequestState(keys=[], num_key_tokens=0)
        bt = self.config.block_tokens
        full = request.num_tokens // bt * bt
        if full > state.num_key_tokens:
            state.keys = block_keys(self.namespace, request.token_ids[:full])
            state.num_key_tokens = full
        return state

    def _save(self, request, state: _RequestState, block_ids: list[int], num_computed_tokens: int) -> None:
        if self.config.save_policy is SavePolicy.OFF:
            return
        bt = self.config.block_tokens
        end = min(num_computed_tokens // bt, len(block_ids), len(state.keys))
        if end <= state.saved_blocks:
            return
        positions = range(state.saved_blocks, end)
        if self.config.save_policy is SavePolicy.AFTER_N_HITS:
            need = self.config.save_after_hits
            positions = [i for i in positions if self._seen.count(state.keys[i]) >= need]
        state.saved_blocks = end
        positions = list(positions)
        if not positions:
            return
        pool = self._get_pool()
        if pool is None:  # pool down: do not copy blocks out only to fail in the saver
            self._count_dropped(len(positions))
            return
        pin_s = request_pin_s(request, self.config.pin_s, self._logged)
        if self._direct is not None:
            self._save_direct(pool, [state.keys[i] for i in positions], [block_ids[i] for i in positions], pin_s)
            return
        blocks = torch.empty((len(positions), *self._shape), dtype=self.info.kv_cache.dtype)
        gather_blocks(self.info.kv_cache, [block_ids[i] for i in positions], blocks)
        batch = SaveBatch([state.keys[i] for i in positions], blocks, self.namespace, pin_s=pin_s)
        if not self._saver.offer(batch):
            self._count_dropped(len(positions))

    def _save_direct(self, pool, keys: list[bytes], block_ids: list[int], pin_s: float) -> None:
        try:
            write, finish = self._direct.save(pool, keys, block_ids, self.namespace, pin_s)
        except Exception as exc:
            self._fault(exc, "save")
            self._count_dropped(len(keys))
            return
        if not self._saver.offer(SaveBatch(keys, None, self.namespace, commit=finish, pin_s=pin_s)):
            write.abort()
            self._count_dropped(len(keys))

    # ------------------------------------------------------------------ counting (stats record + Prometheus)

    def register_metrics(self, registry) -> None:
        """Export this connector's counters into `registry` (called by `kvpool serve`)."""
        from kvpool.metrics import ConnectorMetrics

        self._metrics = ConnectorMetrics.create(registry)

    @property
    def _ns_label(self) -> str:
        return f"{self.namespace.model}/{self.namespace.tenant}" if self.namespace is not None else ""

    def _count_request(self, requested: int, local: int) -> None:
        self.stats.requests += 1
        self.stats.requested_tokens += requested
        self.stats.local_hit_tokens += local
        if self._metrics is not None:
            self._metrics.requested_tokens.labels(namespace=self._ns_label).inc(requested)

    def _count_hit(self, tier: str, tokens: int) -> None:
        self.stats.add_hit(tier, tokens)
        if self._metrics is not None:
            self._metrics.hit_tokens.labels(namespace=self._ns_label, tier=tier).inc(tokens)

    def _count_fallback(self, reason: str) -> None:
        self.stats.add_fallback(reason)
        if self._metrics is not None and not reason.startswith("save_"):
            self._metrics.fallback(reason)

    def _count_dropped(self, blocks: int) -> None:
        self.stats.save_dropped_blocks += blocks
        if self._metrics is not None:
            self._metrics.save_dropped.inc(blocks)

    def _on_saved(self, stored: int, skipped: int) -> None:
        self.stats.saved_blocks += stored
        self.stats.save_skipped_blocks += skipped
        if self._metrics is not None:
            self._metrics.saved_blocks.inc(stored)


    def _warm(self) -> None:
        """At start, in a thread: open the pool now instead of at the first request, and have it map (and
        prefault) the same-host nodes' arenas, so the first load takes no page faults. Never raises: a fault is
        counted and logged like any other, and the requests recompute until the pool answers."""
        pool = self._get_pool()
        if pool is None:
            return
        try:
            self.warm_report = pool.warm()
        except Exception as exc:  # noqa: BLE001 - a pool fault must never reach the engine
            self._fault(exc, "warm")
            return
        if self.warm_report:
            log.info("connector: pool ready: %s", self.warm_report)

    def _get_pool(self):
        pool = self._open_pool()
        if pool is not None and self._pin_wanted and pool is not self._pinned_pool:
            self._pinned_pool = pool
            try:
                self.pin_report = pool.pin_host_memory()
                log.info("connector: pool memory pinned for DMA here: %s", self.pin_report or "(mapped on first use)")
            except Exception as exc:  # noqa: BLE001 - unpinned memory still copies, staged by the driver
                log.warning("connector: pinning the pool's memory failed: %s", exc)
        return pool

    def _open_pool(self):
        with self._pool_lock:
            if self._pool is not None:
                return self._pool
            if time.monotonic() < self._retry_at:
                return None
            try:
                self._pool = open_pool(self.config)
                log.info("connector: pool %s connected", self.config.pool)
                self._logged.discard("unreachable")
            except Exception as exc:
                self._retry_at = time.monotonic() + self.config.retry_after_s
                self._fault(exc, "connect", reopen=False)
            return self._pool

    def _fault(self, exc: BaseException, where: str, *, reopen: bool = True) -> None:
        if isinstance(exc, PoolTimeout):
            reason = "timeout"
        elif isinstance(exc, PoolDataError):
            reason = "checksum"
        elif isinstance(exc, (PoolError, OSError, ConnectionError)):
            reason = "unreachable"
        else:
            reason = "error"
        if where == "save":
            reason = "save_" + reason
        self._count_fallback(reason)
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("connector: pool %s failed during %s (%s: %s); recomputing, will retry in %.0fs",
                        self.config.pool, where, type(exc).__name__, exc, self.config.retry_after_s)
        if reopen and reason != "checksum" and self._owns_pool:
            # Back off: a dead pool must not cost every request a timeout.
            with self._pool_lock:
                pool, self._pool = self._pool, None
                self._retry_at = time.monotonic() + self.config.retry_after_s
            if pool is not None:
                threading.Thread(target=_close_quietly, args=(pool,), daemon=True).start()


def _close_quietly(pool) -> None:
    try:
        pool.close()
    except Exception:
        pass
