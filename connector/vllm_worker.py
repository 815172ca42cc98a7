"""Worker side of the vLLM connector: carry out a step's plan (vllm_plan.StepPlan) against the pool over vLLM's KV
tensors. vLLM-free, so unit tests run it on plain tensors and a real pool.

    start_load_kv ─▶ load(plan.loads)   before the forward, synchronously: acquire_many leases the objects,
                                        each read asking for the rest of the hit and staging at most one
                                        buffer's rows (`max_staged`), so a same-host DRAM hit is one lease and
                                        one copy; same-host DRAM extents are copied straight into vLLM's pages,
                                        each page hashed as it lands (the read fence); others (TCP, SSD) land in
                                        a staging buffer reserved (and touched) at start, checked as they
                                        arrive. Blocks not loaded (miss, evicted since the lookup, bad checksum,
                                        pool down) are collected for get_block_ids_with_load_errors(): vLLM then
                                        recomputes from the first of them. Nothing raises.
    wait_for_save ─▶ save(plan.saves)   after the forward: gather the blocks that became full into a fresh buffer
                                        and hand it to the bounded async BlockSaver, so no vLLM block stays pinned
                                        and decode never waits on the pool. Blocks of a request whose load failed
                                        in this step are not saved (their KV was computed over garbage).

Counters (ConnectorStats) are kept here for the loads and saves; the scheduler side keeps the lookup ones.
Measured load bandwidth and compute rate go back to the scheduler's cost model through `take_rates`.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Sequence


from kvpool import fence
from kvpool.connector.config import ConnectorConfig
from kvpool.connector.saver import BlockSaver, SaveBatch, SaveBuffers
from kvpool.connector.stats import ConnectorStats
from kvpool.connector.vllm_layout import KVPages
from kvpool.connector.vllm_plan import LoadSpec, SaveSpec
from kvpool.keys import Namespace

log = logging.getLogger(__name__)


class WorkerTransfer:
    def __init__(self, config: ConnectorConfig, namespace: Namespace, pages: KVPages, pool_handle,
                 stats: ConnectorStats, *, clock: Callable[[], float] = time.perf_counter) -> None:
        if pages.object_bytes != namespace.block_bytes:
            raise ValueError(f"namespace block_bytes {namespace.block_bytes} != KV object bytes {pages.object_bytes}")
        self.config = config
        self.namespace = namespace
        self.pages = pages
        self.pool = pool_handle
        self.stats = stats
        self._clock = clock
        self._staging = pages.new_buffer(min(config.load_chunk_blocks, pages.num_blocks))
        self._staging_np = [self._staging[i].numpy() for i in range(self._staging.shape[0])]
        self._invalid: set[int] = set()
        self._failed_reqs: set[str] = set()
        self._rates = [0, 0.0, 0, 0.0]   # load bytes, load seconds, computed tokens, compute seconds
        self._forward_start: float | None = None
        self._saver = BlockSaver(pool_handle.get, max_blocks=config.save_queue_blocks, on_saved=self._on_saved,
                                 on_error=lambda exc: pool_handle.fault(exc, "save"))
        # Copy-out buffers come back once their puts are done: up to as many rows as the load staging keeps.
        self._save_buffers = SaveBuffers(pages.object_bytes, self._staging.shape[0])

    # ------------------------------------------------------------------ per step

    def begin_step(self) -> None:
        """vLLM bound this step's metadata: its forward follows (after the sync loads, if any)."""
        self._failed_reqs.clear()
        self._forward_start = self._clock()

    def load(self, loads: Sequence[LoadSpec]) -> None:
        for spec in loads:
            try:
                got = self._load_one(spec)
            except Exception:  # noqa: BLE001 - a bug here must still leave vLLM recomputing, never using garbage
                log.exception("kvpool connector: loading %d blocks failed", len(spec.block_ids))
                self.stats.add_fallback("error")
                got = 0
            if got < len(spec.block_ids):
                self._invalid.update(spec.block_ids[got:])
                self._failed_reqs.add(spec.req_id)
        if loads:
            self._forward_start = self._clock()

    def fail(self, loads: Sequence[LoadSpec]) -> None:
        """Report every block of `loads` as not loaded (the adapter's last resort when a hook itself failed)."""
        for spec in loads:
            self._invalid.update(spec.block_ids)
            self._failed_reqs.add(spec.req_id)

    def save(self, saves: Sequence[SaveSpec], num_scheduled_tokens: int = 0) -> None:
        """After the forward. `num_scheduled_tokens` (the step's tokens) times the forward for the cost model."""
        if self._forward_start is not None and num_scheduled_tokens >= self.config.block_tokens:
            self._rates[2] += num_scheduled_tokens
            self._rates[3] += self._clock() - self._forward_start
        self._forward_start = None
        # grouped by retention hint: one put per hint (a put carries one pin_s)
        todo = sorted((s for s in saves if s.req_id not in self._failed_reqs), key=lambda s: s.pin_s)
        n = sum(len(s.keys) for s in todo)
        if n == 0:
            return
        if self.pool.get() is None:   # backing off: do not copy blocks out only to fail in the saver
            self.stats.save_dropped_blocks += n
            return
        buf = self._save_buffers.take(n)
        try:
            block_ids = [b for s in todo for b in s.block_ids]
            self.pages.gather(block_ids, buf)
        except Exception:  # noqa: BLE001 - a failed copy loses a save, never a request
            log.exception("kvpool connector: copying %d blocks out of vLLM's KV cache failed", n)
            self.stats.save_dropped_blocks += n
            self._save_buffers.give_back(buf)
            return
        hints = sorted({s.pin_s for s in todo})
        done = self._save_buffers.after(len(hints), buf)
        start = 0
        for pin_s in hints:
            keys = [k for s in todo if s.pin_s == pin_s for k in s.keys]
            batch = SaveBatch(keys, buf[start:start + len(keys)], self.namespace, pin_s=pin_s, on_done=done)
            start += len(keys)
            if not self._saver.offer(batch):
                self.stats.save_dropped_blocks += len(keys)
                done()

    def take_invalid_block_ids(self) -> set[int]:
        invalid, self._invalid = self._invalid, set()
        return invalid

    def take_rates(self) -> tuple[int, float, int, float]:
        rates, self._rates = tuple(self._rates), [0, 0.0, 0, 0.0]
        return rates  # type: ignore[return-value]

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout: float = 30.0) -> bool:
        return self._saver.flush(timeout)

    def close(self, timeout: float = 10.0) -> None:
        self._saver.close(timeout)

    # ------------------------------------------------------------------ internals

    def _load_one(self, spec: LoadSpec) -> int:
        n = len(spec.keys)
        pool = self.pool.get()
        if pool is None:   # backing off after a fault: the scheduler's hit cannot be loaded in this process
            self.stats.add_fallback("unreachable")
            return 0
        tiers: list[str] = []
        got = 0
        read = None
        start = self._clock()
        try:
            # One lookup for the whole hit. A read that filled the staging buffer goes on under its lease
            # (ExtentRead.rest, once its rows are copied out), so a long SSD or TCP hit is read buffer by buffer
            # without asking the master again.
            while got < n:
                if read is None:
                    # No namespace: the scheduler's lookup_prefix already counted these tokens in the pool's hit
                    # stats (a namespaced read would count every loaded token a second time). lease=False: every
                    # direct page is checked after its copy (_scatter), so a same-host chain may come unpinned.
                    read = pool.acquire_many(spec.keys, [self.pages.object_bytes] * n, staging=self._rows(),
                                             max_staged=len(self._staging_np), lease=False)
                else:
                    after = read.rest(staging=self._rows(), max_staged=len(self._staging_np))
                    read.release()
                    read = after
                done, goes_on = self._scatter(read, spec.block_ids[got:], tiers)
                got += done
                if got < n and not goes_on:
                    # Evicted since the lookup, or a block failed its checksum: recompute from there.
                    self.stats.add_fallback("partial_load")
                    break
        except Exception as exc:  # noqa: BLE001 - blocks scattered before the fault are valid; the rest recompute
            self.pool.fault(exc, "load")
        finally:
            if read is not None:
                read.release()
        seconds = self._clock() - start
        if got:
            nbytes = got * self.pages.object_bytes
            self.stats.loads += 1
            self.stats.load_seconds += seconds
            self.stats.load_bytes += nbytes
            self._rates[0] += nbytes
            self._rates[1] += seconds
            bt = self.config.block_tokens
            for tier in tiers[:got] if len(tiers) >= got else ["unknown"] * got:
                self.stats.add_hit(tier, bt)
        return got

    def _rows(self):
        """A read's staging: the staging buffer's rows in order (a read stages at most as many entries)."""
        rows = iter(self._staging_np)
        return lambda nbytes: next(rows)

    def _scatter(self, read, block_ids: Sequence[int], tiers: list[str]) -> tuple[int, bool]:
        """Copy a read's entries into `block_ids`: (how many are valid, whether the hit goes on past them).
        Same-host DRAM objects are copied from the pool's mapped extents straight into vLLM's pages (one copy, not
        get-into-staging then scatter); others (TCP, SSD) arrive in rows of the staging buffer, checked as they
        land. The read stages at most the buffer's rows (`max_staged`) and ends before the next entry that would
        need one (`staging_full`): the hit goes on there, under the same lease (`rest`)."""
        if not read.count:
            return 0, False
        # The same-host read fence, object by object: on host KV tensors each page is hashed after its copy
        # (from cache; on the fence's helper thread while the next page copies, for loads of PIPELINE_MIN bytes
        # or more), and the object's hash of what landed in vLLM's pages must be the committed checksum;
        # on a device, the extent is hashed after its copy (only a change and its exact undo would pass). A
        # mismatch (a stalled peer wrote the extent) ends the hit there: the blocks from it on are reported as
        # not loaded, so vLLM recomputes them. The extents stay leased until release().
        host = self.pages.host
        pipeline = host and read.pipeline and read.count * self.pages.object_bytes >= fence.PIPELINE_MIN
        done = self.pages.scatter_views(block_ids[:read.count], read.buffers[:read.count], after=read.verify_copy,
                                        hash_landed=read.needs_check if host else None, pipeline=pipeline)
        tiers += read.tiers[:done]
        return done, done == read.count and read.staging_full

    def _on_saved(self, stored: int, skipped: int) -> None:
        self.stats.saved_blocks += stored
        self.stats.save_skipped_blocks += skipped
