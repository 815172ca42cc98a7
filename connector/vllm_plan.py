"""Scheduler side of the vLLM connector: which blocks a request loads from the pool and which it saves. vLLM-free:
it sees requests through the few attributes vLLM's `Request` has (below), so unit tests drive it without vLLM.

Per request, in vLLM's engine-core process (the scheduler):

    get_num_new_matched_tokens ─▶ lookup(request, local)   keys of the request's full blocks past vLLM's local
                                                           prefix hit; the hit is capped at num_tokens - 1, so
                                                           one token is left to compute (see "The cap" below);
                                                           lookup_prefix in the pool (short deadline: this blocks
                                                           the scheduler) ─▶ hit tokens (0 on any fault)
    update_state_after_alloc ───▶ allocated(request, block_ids, n)   remember a load of n tokens into those blocks
    build_connector_meta ───────▶ build(steps, block_ids_of) -> StepPlan   the loads planned since the last step,
                                                           and a save of every block that becomes full this step
                                                           (prompt or decode) and is not in the pool yet
    request_finished ───────────▶ finished(req_id)

Keys are kvpool's own chained xxh3_128 over the token ids (`kvpool.block_keys`), with the request's `cache_salt` as
the extra bytes, in the namespace that carries the engine/layout tag. Not vLLM's `block_hashes`: those are pickled
sha256 or xxhash seeded per process, equal across instances only if every instance shares a seed.

The cap: vLLM must compute at least one token of a prompt to sample from. Its own prefix cache stops at the last
full block before that token, so a prompt of exactly k blocks recomputes its whole last block (128 tokens). The pool
does not have to: it loads the last full block too and reports one token less than the prompt (k * block - 1
tokens, not block-aligned; vLLM 0.32's scheduler takes such a count as it is), and vLLM computes only the last
token, whose KV slot the forward overwrites. A prompt that ends inside a block loads its full blocks and computes
the partial tail, as vLLM's own hit does. Counters stay in whole blocks (requested, hit tokens by tier).

Save bookkeeping: `saved_upto` = leading blocks known to be in the pool (vLLM's local hit, which this instance saved
when it computed it; blocks loaded from the pool) or handed to the worker for saving. A request whose computed
tokens fall below it was truncated by vLLM (a failed load: the blocks from the first failed one on are recomputed)
or preempted; the pointer is rewound so the recomputed blocks are saved again. Blocks with vLLM's local hit are not
re-offered: re-copying a 4K-token prefix on every hit would cost more than the rare pool that lost them.

Requests with a LoRA adapter, multimodal inputs or prompt embeddings bypass the pool (their KV depends on more than
the token ids); each kind is logged once.

The request attributes used: request_id, all_token_ids (prompt + output so far), num_tokens, cache_salt,
lora_request, mm_features, prompt_embeds, skip_reading_prefix_cache, kv_transfer_params (its "pin_s": the retention
hint of the request's saves, else ConnectorConfig.pin_s).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kvpool.connector.config import ConnectorConfig, LoadPolicy, SavePolicy, request_pin_s
from kvpool.connector.cost import LoadCostModel, prefill_s_per_token
from kvpool.connector.seen import SeenCounts
from kvpool.connector.stats import ConnectorStats
from kvpool.keys import Namespace, block_keys

log = logging.getLogger(__name__)



@dataclass(slots=True)
class LoadSpec:
    """Load `keys` (in order) into vLLM blocks `block_ids` before this step's forward."""

    req_id: str
    keys: list[bytes]
    block_ids: list[int]


@dataclass(slots=True)
class SaveSpec:
    """After this step's forward, copy blocks `block_ids` out and save them under `keys`."""

    req_id: str
    keys: list[bytes]
    block_ids: list[int]
    pin_s: float = 0.0          # retention hint (ConnectorConfig.pin_s or the request's kv_transfer_params)


@dataclass(slots=True)
class StepPlan:
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    num_scheduled_tokens: int = 0       # lets the worker measure this step's compute rate


@dataclass(slots=True)
class ScheduledRequest:
    """One request of a scheduler step: tokens computed before the step, tokens it computes in the step."""

    req_id: str
    num_computed_tokens: int
    num_scheduled_tokens: int


@dataclass(slots=True)
class _State:
    request: Any
    extra: bytes
    keys: list[bytes] = field(default_factory=list)
    counted: bool = False
    lookup_first: int = 0
    lookup_hits: int = 0
    saved_upto: int = 0
    saved_mark: int = 0         # computed tokens below which saved_upto no longer holds (truncation, preemption)


def bypass_reason(request) -> str | None:
    """Why a request's KV is not a function of its token ids alone (None: it is)."""
    if getattr(request, "lora_request", None) is not None:
        return "lora"
    if getattr(request, "mm_features", None):
        return "multimodal"
    if getattr(request, "prompt_embeds", None) is not None:
        return "prompt_embeds"
    return None


class SchedulerPlanner:
    def __init__(self, config: ConnectorConfig, namespace: Namespace, pool_handle, stats: ConnectorStats, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if namespace.block_tokens != config.block_tokens:
            raise ValueError(f"block_tokens: namespace has {namespace.block_tokens}, config {config.block_tokens}")
        self.config = config
        self.namespace = namespace
        self.pool = pool_handle
        self.stats = stats
        self.cost = LoadCostModel(bytes_per_token=namespace.block_bytes // namespace.block_tokens)
        self._clock = clock
        self._reqs: dict[str, _State] = {}
        self._bypassed: dict[str, str] = {}
        self._pending: dict[str, LoadSpec] = {}
        self._seen = SeenCounts()
        self._logged: set[str] = set()

    # ------------------------------------------------------------------ vLLM scheduler hooks

    def lookup(self, request, num_computed_tokens: int) -> int:
        """Tokens past `num_computed_tokens` (vLLM's block-aligned local hit) that the pool can supply: its full
        blocks, the result capped at num_tokens - 1 so one token is left to compute (so it is not block-aligned
        when the prompt is a whole number of blocks); 0 on any pool fault. Counts requested tokens once per
        request."""
        bt = self.config.block_tokens
        state = self._state(request)
        if state is None:
            return 0
        cap = request.num_tokens - 1
        max_blocks = min(request.num_tokens // bt, -(-cap // bt))   # full blocks holding a token below the cap
        first = num_computed_tokens // bt
        if not state.counted:
            state.counted = True
            self.stats.requests += 1
            self.stats.requested_tokens += max_blocks * bt
            self.stats.local_hit_tokens += min(first, max_blocks) * bt
            if self.config.save_policy is SavePolicy.AFTER_N_HITS:
                self._seen.remember(state.keys[:max_blocks])
        state.lookup_first, state.lookup_hits = first, 0
        if min(first, len(state.keys)) > state.saved_upto:
            state.saved_upto = min(first, len(state.keys))
            state.saved_mark = state.saved_upto * bt
        if first >= max_blocks or getattr(request, "skip_reading_prefix_cache", False):
            return 0
        pool = self.pool.get()
        if pool is None:
            return 0
        try:
            self.stats.lookups += 1
            hits = pool.lookup_prefix(state.keys[first:max_blocks], namespace=self.namespace,
                                      prefill_s_per_token=prefill_s_per_token(self.cost))
        except Exception as exc:  # noqa: BLE001 - a pool fault is a miss, never a failed request
            self.pool.fault(exc, "lookup")
            return 0
        tokens = min((first + hits) * bt, cap) - first * bt
        if tokens <= 0 or tokens < self.config.min_hit_tokens:
            return 0
        if self.config.load_policy is LoadPolicy.AUTO and not self.cost.should_load(tokens):
            self.stats.add_fallback("slower_than_recompute")
            return 0
        state.lookup_hits = hits
        return tokens

    def allocated(self, request, block_ids: Sequence[int], num_external_tokens: int) -> None:
        """vLLM allocated `block_ids` (all of the request's blocks) and will count `num_external_tokens` after the
        local hit as computed: plan their load for the next step."""
        state = self._reqs.get(request.request_id)
        bt = self.config.block_tokens
        n = -(-num_external_tokens // bt)      # the last one may be partly counted (the cap): loaded whole
        if state is None or n <= 0:
            return
        first = state.lookup_first
        n = min(n, state.lookup_hits, len(block_ids) - first)
        if n <= 0:
            return
        self._pending[request.request_id] = LoadSpec(request.request_id, state.keys[first:first + n],
                                                     list(block_ids[first:first + n]))
        state.saved_upto = max(state.saved_upto, first + n)
        state.saved_mark = max(state.saved_mark, min((first + n) * bt, first * bt + num_external_tokens))

    def build(self, scheduled: Sequence[ScheduledRequest], block_ids_of: Callable[[str], Sequence[int]]) -> StepPlan:
        """This step's plan: pending loads, and saves of the blocks that become full in it."""
        plan = StepPlan(loads=list(self._pending.values()))
        self._pending.clear()
        saving = self.config.save_policy is not SavePolicy.OFF
        for step in scheduled:
            plan.num_scheduled_tokens += step.num_scheduled_tokens
            state = self._reqs.get(step.req_id)
            if state is None or not saving:
                continue
            try:
                save = self._plan_save(state, step, block_ids_of)
            except Exception:  # noqa: BLE001 - a lost save is a future miss; the step's loads must still go out
                if "save_plan" not in self._logged:
                    self._logged.add("save_plan")
                    log.exception("kvpool connector: planning the saves of request %s failed", step.req_id)
                continue
            if save is not None:
                plan.saves.append(save)
        return plan

    def _plan_save(self, state: _State, step: ScheduledRequest, block_ids_of) -> SaveSpec | None:
        bt = self.config.block_tokens
        if step.num_computed_tokens < state.saved_mark:
            # vLLM truncated the request (a block failed to load) or restarted it (preemption): what it
            # recomputes from here on is saved again.
            state.saved_upto = step.num_computed_tokens // bt
            state.saved_mark = state.saved_upto * bt
        known = len(state.request.all_token_ids)
        block_ids = block_ids_of(step.req_id)
        full = min(step.num_computed_tokens + step.num_scheduled_tokens, known) // bt
        full = min(full, len(block_ids))
        if full <= state.saved_upto:
            return None
        self._refresh_keys(state, full)
        positions = range(state.saved_upto, full)
        if self.config.save_policy is SavePolicy.AFTER_N_HITS:
            need = self.config.save_after_hits
            positions = [i for i in positions if self._seen.count(state.keys[i]) >= need]
        positions = list(positions)
        state.saved_upto = full
        state.saved_mark = full * bt
        if not positions:
            return None
        return SaveSpec(step.req_id, [state.keys[i] for i in positions], [block_ids[i] for i in positions],
                        request_pin_s(state.request, self.config.pin_s, self._logged))

    def finished(self, req_id: str) -> None:
        self._reqs.pop(req_id, None)
        self._bypassed.pop(req_id, None)
        self._pending.pop(req_id, None)

    # ------------------------------------------------------------------ measurements from the worker

    def observe_load(self, nbytes: int, seconds: float) -> None:
        self.cost.observe_load(nbytes, seconds)

    def observe_compute(self, tokens: int, seconds: float) -> None:
        self.cost.observe_prefill(tokens, seconds)

    @property
    def num_tracked(self) -> int:
        return len(self._reqs)

    # ------------------------------------------------------------------ internals

    def _state(self, request) -> _State | None:
        rid = request.request_id
        state = self._reqs.get(rid)
        if state is None:
            if rid in self._bypassed:
                return None
            reason = bypass_reason(request)
            if reason is not None:
                self._bypassed[rid] = reason
                if reason not in self._logged:
                    self._logged.add(reason)
                    log.warning("kvpool connector: requests with %s bypass the pool (not supported yet); they are "
                             "computed by vLLM alone", reason.replace("_", " "))
                return None
            salt = getattr(request, "cache_salt", None)
            state = self._reqs[rid] = _State(request=request, extra=salt.encode() if salt else b"")
        self._refresh_keys(state, request.num_tokens // self.config.block_tokens)
        return state

    def _refresh_keys(self, state: _State, blocks: int) -> None:
        if blocks > len(state.keys):
            bt = self.config.block_tokens
            state.keys = block_keys(self.namespace, list(state.request.all_token_ids[:blocks * bt]), state.extra)

