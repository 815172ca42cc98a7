"""Continuous batching with chunked prefill and preemption by recompute.

Every step has a token budget (`max_num_batched_tokens`). Running requests go first, in admission order: each
gets min(tokens left to compute, budget) — 1 for a decode, a chunk for a prefill. If its blocks cannot grow, the
most recently admitted running request is preempted (blocks freed, progress reset, back to the head of the queue;
it is recomputed later, its full blocks usually still in the prefix cache). Waiting requests are then admitted in
arrival order while budget, `max_num_seqs` and blocks allow: local prefix-cache hit, then the connector's external
tokens (loaded right away), then a first chunk. Nothing is admitted in a step that preempted, which stops a
preempt/admit ping-pong.

`update` applies the step's results: progress, prefix-cache registration, connector saves, sampled tokens, stops.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from kvpool.engine_adapter.block_manager import BlockManager
from kvpool.hooks import KVConnectorBase
from kvpool.engine_adapter.request import Request, RequestStatus

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """This chunk reaches the end of the known tokens, so its last logits give the next token."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


class Scheduler:
    def __init__(self, block_manager: BlockManager, connector: KVConnectorBase, *, max_num_seqs: int,
                 max_num_batched_tokens: int) -> None:
        self.bm = block_manager
        self.connector = connector
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledRequest]:
        budget = self.max_num_batched_tokens
        out: list[ScheduledRequest] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.bm.can_append(req, req.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                self.bm.append(req, req.num_computed_tokens + n)
                out.append(ScheduledRequest(req, n))
                budget -= n
                i += 1
        while self.waiting and not preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            scheduled = self._admit(req, budget)
            if scheduled is None:
                break
            self.waiting.popleft()
            self.running.append(req)
            out.append(scheduled)
            budget -= scheduled.num_new_tokens
        return out

    def _admit(self, req: Request, budget: int) -> ScheduledRequest | None:
        bt = self.bm.block_tokens
        hits = self.bm.match_prefix(req)
        num_local = len(hits) * bt
        max_cached = (req.num_tokens - 1) // bt * bt      # leave >= 1 token to compute
        num_ext = 0
        try:
            num_ext = int(self.connector.get_num_external_tokens(req, num_local))
        except Exception:  # a store problem never fails a request
            log.exception("connector.get_num_external_tokens failed for %s; recomputing", req.request_id)
        num_ext = max(0, min(num_ext // bt * bt, max_cached - num_local))
        start = num_local + num_ext
        planned = start + min(req.num_tokens - start, budget)
        if not self.bm.can_allocate(hits, planned):
            return None
        self.bm.allocate(req, hits, planned)
        req.num_computed_tokens = num_local
        loaded = 0
        if num_ext:
            try:
                loaded = int(self.connector.load_kv(req, list(req.block_ids), num_local, num_ext))
            except Exception:
                log.exception("connector.load_kv failed for %s; recomputing", req.request_id)
            loaded = max(0, min(loaded // bt * bt, num_ext))
            req.num_computed_tokens += loaded
            self.bm.commit(req, req.num_computed_tokens)
        if not req.admitted:
            req.admitted = True
            req.num_local_cached_tokens, req.num_external_tokens = num_local, loaded
        req.status = RequestStatus.RUNNING
        n = min(req.num_tokens - req.num_computed_tokens, budget, len(req.block_ids) * bt - req.num_computed_tokens)
        return ScheduledRequest(req, n)

    def _preempt(self, req: Request) -> None:
        log.debug("preempting %s at %d tokens", req.request_id, req.num_tokens)
        self.bm.free_request(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def update(self, scheduled: list[ScheduledRequest], sampled: list[int]) -> list[Request]:
        """Apply a step's results; `sampled` has one token per scheduled request that samples, in order.
        Returns the requests that received a token this step."""
        bt = self.bm.block_tokens
        now = time.perf_counter()
        tokens = iter(sampled)
        progressed: list[Request] = []
        for s in scheduled:
            req = s.request
            samples = s.samples
            before = req.num_computed_tokens
            req.num_computed_tokens += s.num_new_tokens
            self.bm.commit(req, req.num_computed_tokens)
            prompt_done = min(req.num_computed_tokens, req.num_prompt_tokens) // bt
            if prompt_done > min(before, req.num_prompt_tokens) // bt:
                try:
                    self.connector.save_kv(req, list(req.block_ids), prompt_done * bt)
                except Exception:
                    log.exception("connector.save_kv failed for %s; continuing", req.request_id)
            if not samples:
                continue
            token = next(tokens)
            req.token_ids.append(token)
            if req.first_token_time is None:
                req.first_token_time = now
            progressed.append(req)
            reason = self._stop_reason(req, token)
            if reason is not None:
                self.finish(req, reason)
        return progressed

    @staticmethod
    def _stop_reason(req: Request, token: int) -> str | None:
        p = req.params
        if token in p.stop_token_ids:
            return "stop"
        if not p.ignore_eos and token in req.eos_token_ids:
            return "stop"
        if len(req.output_token_ids) >= p.max_tokens or req.num_tokens >= req.max_model_len:
            return "length"
        return None

    def finish(self, req: Request, reason: str) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        try:
            self.connector.request_finished(req)
        except Exception:
            log.exception("connector.request_finished failed for %s", req.request_id)
        self.bm.free_request(req)
