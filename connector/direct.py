"""The direct path: KV moves between the engine's cache and the pool's own memory, with no staging copy.

```
 save (engine thread)   reserve_many ──▶ grants; buffers = the granted arena extents (same host) or pinned staging
                        gather_to(cache blocks ─▶ buffers) on the side stream      (GPU: D2H DMA into the extents)
                        the compute stream waits for that copy before it may overwrite the blocks
      (saver thread)    wait for the copy ─▶ commit (xxh3_64 of the bytes in place, PutCommit)
 load (engine thread)   acquire_many per chunk ─▶ leased extents (or staging filled over TCP / from SSD)
                        verify() before queuing: the fence on same-host extents (a mismatch ends the hit there)
                        LayerwiseLoad.start(): per layer, scatter on the side stream + an event (CUDA: two kernels
                        reading the pinned extents in place, kernels/mapped_scatter.py; else H2D DMA per block)
      (forward)         wait_for_layer_load(i): layer i's compute waits for its event; layer i+1 is still copying
      (later hooks)     a load whose copies are done releases its leases (the extents were read until then)
```
The pool's memory is read or written by DMA while the leases/grants hold it: a read lease is released only once
the load's last copy finished (`LayerwiseLoad.done()`, polled at the next hook, or waited for at flush/close); a
write is committed only after its copy finished. Same-host extents are only reachable where the pool's arena is
mapped in this process (`transfer` auto on one host); everything else lands in pinned staging buffers, which torch's
caching host allocator recycles.

On a CPU cache the same code runs with `HostCopies`: immediate copies, or, with layer-wise loading, copies deferred
until their layer is waited for, so a CPU test sees wrong output if the engine reads a layer before its hook.
With immediate copies (CPU, layer-wise off) a load checks each block AFTER copying it (`verify_after_copy`): the
block's runs are hashed as they landed in the cache, right after its copy, while they are still in cache (one pass
over memory, not a copy pass and a hash pass), and that digest must be the committed checksum. So the fence judges
the bytes the cache holds: a stalled writer's change to the extent during the copy is caught even when it is undone
before the check (hashing the extent after the copy would miss that), as the staged path's does; meanwhile the
next chunk is acquired on a prefetch thread (its lookup, and its TCP or SSD reads, overlap the copy). A chunk of
direct extents is copied on two threads where the one-pass copy is on: its back half on a copy helper while the
engine thread copies the front (the engine thread is idle during the load otherwise; the checks still run on it, in
order). Entries not reachable directly land in two rings of buffers touched at start, chunks alternating between
them. Where copies are queued (CUDA, layer-wise) the check stays before the copy: the forward may read a layer before
a later check.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kvpool import copyhash, pinned
from kvpool.kernels.kv_transfer import scatter_blocks
from kvpool.kernels.streams import LayerwiseLoad, copies_for, gather_to

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadResult:
    blocks: int = 0                            # leading blocks queued for loading
    tiers: list[str] = field(default_factory=list)
    seconds: float = 0.0                       # host time: lookups, verification, queuing (the DMA overlaps)
    partial: bool = False                      # the pool had fewer than asked (evicted, bad checksum)
    error: BaseException | None = None         # a fault after `blocks` good ones


class DirectTransfer:
    def __init__(self, kv_cache: torch.Tensor, block_bytes: int, *, chunk_blocks: int, layerwise: bool) -> None:
        self.kv_cache = kv_cache
        self.block_bytes = block_bytes
        self.chunk_blocks = chunk_blocks
        self.layerwise = layerwise
        self.num_layers = kv_cache.shape[0]
        self.copies = copies_for(kv_cache, deferred=layerwise)
        self._on_cuda = kv_cache.device.type == "cuda"
        # CUDA: loads read pinned pool memory in place, two kernels per layer (kernels/mapped_scatter.py)
        self.translate: Callable[[int], int | None] | None = pinned.device_address if self._on_cuda else None
        self.mapped_loads = 0                                         # loads that went that way (bench, tests)
        self._step: list[tuple[LayerwiseLoad, list[Any]]] = []        # queued this step, waited per layer
        self._draining: list[tuple[LayerwiseLoad, list[Any]]] = []    # forward done; release when copies end
        # Host copies that run at once (CPU, not layer-wise): each block is copied, then verified (the fence hashes
        # the block as it landed in the cache, right after the copy, as kvpool/fence.py wants), then the chunk is
        # released; meanwhile the next chunk is acquired on the prefetch thread. Entries not reachable directly
        # (TCP, same-host SSD records) land in two rings of chunk_blocks rows touched here, chunk j in ring j % 2,
        # so chunk j + 1 can be read while chunk j is copied out of the other ring.
        self.verify_after_copy = not self._on_cuda and not layerwise
        self._rings = ([torch.zeros((chunk_blocks, block_bytes), dtype=torch.uint8).numpy() for _ in range(2)]
                       if self.verify_after_copy else [])
        self._prefetch: ThreadPoolExecutor | None = None
        self._copy: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ staging for entries not reachable directly

    def staging(self, nbytes: int) -> Any:
        if self._on_cuda:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return memoryview(bytearray(nbytes))

    def _ring_staging(self, ring: int) -> Callable[[int], Any]:
        """Staging from load ring `ring`, row after row (a chunk never holds more entries than a ring has rows;
        any other size gets a fresh buffer)."""
        rows = iter(self._rings[ring])

        def staging(nbytes: int) -> Any:
            row = next(rows, None) if nbytes == self.block_bytes else None
            return memoryview(row) if row is not None else self.staging(nbytes)

        return staging

    # ------------------------------------------------------------------ loads

    def load(self, pool, keys: list[bytes], block_ids: list[int]) -> LoadResult:
        """Load the leading hits of `keys` into `block_ids` (copied now on CPU, queued on CUDA or layer-wise).
        Never raises: a fault ends the run (`error`)."""
        self.reap()
        if self.verify_after_copy:
            return self._load_now(pool, keys, block_ids)
        out = LoadResult()
        reads: list[Any] = []
        sources: list[Any] = []
        start = time.perf_counter()
        try:
            while out.blocks < len(keys):
                k = min(self.chunk_blocks, len(keys) - out.blocks)
                read = pool.acquire_many(keys[out.blocks:out.blocks + k], [self.block_bytes] * k,
                                         staging=self.staging)
                reads.append(read)
                got = read.verify()
                sources += read.buffers[:got]
                out.tiers += read.tiers[:got]
                out.blocks += got
                if got < k:
                    out.partial = True
                    break
        except Exception as exc:  # noqa: BLE001 - a pool fault is a shorter hit, never an engine failure
            out.error = exc
        try:
            if sources:
                load = LayerwiseLoad(self.kv_cache, block_ids[:out.blocks], sources, self.copies,
                                     layerwise=self.layerwise, translate=self.translate)
                load.start()
                self.mapped_loads += load.mapped
                self._step.append((load, reads))
                reads = []
        except Exception as exc:  # noqa: BLE001 - nothing was queued: recompute it all
            out.error, out.blocks, out.tiers = exc, 0, []
        finally:
            for read in reads:            # not handed to a queued load: release now
                read.release()
        out.seconds = time.perf_counter() - start
        return out

    def _load_now(self, pool, keys: list[bytes], block_ids: list[int]) -> LoadResult:
        """Immediate host copies, read by read: each block copied into the cache and what landed hashed at once
        (a stalled writer's bytes that landed during the copy are caught; the first bad entry stops the copy, and
        its block lies past the loaded prefix, so the engine recomputes it), then the read's lease released.

        At most one lookup for the whole hit (none where a same-host node's host index holds it: `lease=False`):
        the first read asks for all of it but stages at most `chunk_blocks` entries (acquire_many's `max_staged`:
        one ring's rows), so an all-direct hit (same-host DRAM) is one read and one copy on two threads, and SSD or
        TCP entries come `chunk_blocks` at a time, each further ring read by `ExtentRead.rest` under the first
        read's lease, if it took one (no lookup between rings). The next ring is read on the
        prefetch thread while this one is copied, into the other ring, so SSD or TCP reads overlap the copy. That
        holds only where the copy runs on one core (kvpool.copyhash on): reading the next records while torch's copy
        ran on both cores was slower (three busy threads on two cores). With the one-pass copy it pays: a
        4,096-token service-SSD load took 118.7 ms against 156.3 ms reading after the copy (medians of 14
        alternating rounds, 2026-11-28). Taking the rest under the same lease, not with a lookup per ring: the
        disk idles 0.6-0.9 ms between rings instead of 1.6-2.7 ms (a 4,096-token service-SSD load's gaps between
        ring reads, 2.3 against 6.2 ms in all, medians of 6 alternating loads each, 2026-11-29)."""
        out = LoadResult()
        start = time.perf_counter()
        rows = self.chunk_blocks
        pending: Future | None = None
        read: Any = None
        s, ring = 0, 0
        try:
            # lease=False: every direct block is hashed as it lands (scatter_blocks' hash_landed), so the pool may
            # hand out a same-host chain unpinned, with no master round trip
            read = pool.acquire_many(keys, [self.block_bytes] * len(keys), staging=self._ring_staging(ring),
                                     max_staged=rows, lease=False)
            while True:
                n = read.count
                # a hit goes on past this read only when it stopped at its ring's rows
                more = s + n < len(keys) and read.staging_full
                ring ^= 1
                if more and (all(read.direct[:n]) or copyhash.simd()):
                    pending = self._prefetcher().submit(read.rest, staging=self._ring_staging(ring),
                                                        max_staged=rows)
                # the extents as they are: scatter_blocks views them as objects only where it copies in two
                # passes (kernels/kv_transfer.py), the one-pass copy reads their bytes directly
                got = scatter_blocks(self.kv_cache, block_ids[s:s + n], read.buffers[:n],
                                     after=read.verify_copy, hash_landed=read.needs_check,
                                     helper=self._copier(read))
                out.tiers += read.tiers[:got]
                out.blocks += got
                s += got
                if got < n or not more:
                    out.partial = s < len(keys)
                    break
                if pending is not None:
                    fut, pending = pending, None
                    after = fut.result()
                else:
                    after = read.rest(staging=self._ring_staging(ring), max_staged=rows)
                read.release()          # the rest holds the lease on: released here, it ends with the last read
                read = after
        except Exception as exc:  # noqa: BLE001 - a pool fault is a shorter hit, never an engine failure
            out.error = exc
        finally:
            if pending is not None:       # the hit ended before the prefetched read: give its lease back
                try:
                    pending.result().release()
                except Exception:  # noqa: BLE001 - a fault past the loaded prefix changes nothing
                    pass
            if read is not None:
                read.release()
        out.seconds = time.perf_counter() - start
        return out

    def _copier(self, read) -> ThreadPoolExecutor | None:
        """The helper that copies the back half of a chunk of direct extents while the engine thread copies the
        front (kernels/kv_transfer.py scatter_blocks): only with the one-pass copy, which releases the GIL (torch's
        copy_ already runs on its own threads), and only when every entry is direct. A staged chunk's copy keeps
        one core: the prefetch thread is then reading the next chunk's SSD records or TCP bytes on the other."""
        if read.count < 2 or not copyhash.simd() or not all(read.direct[:read.count]):
            return None
        if self._copy is None:
            self._copy = ThreadPoolExecutor(1, thread_name_prefix="kvpool-load-copy")
        return self._copy

    def _prefetcher(self) -> ThreadPoolExecutor:
        if self._prefetch is None:
            self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="kvpool-load-prefetch")
        return self._prefetch

    def wait(self, layer: int) -> None:
        for load, _ in self._step:
            load.wait(layer)
        if layer == self.num_layers - 1 and self._step:
            self._draining += self._step
            self._step = []

    def reap(self, *, block: bool = False) -> int:
        """Release the leases of loads whose copies are done (all of them, waiting, with `block`)."""
        if block and self._step:          # queued but never waited for (e.g. an aborted step): finish them too
            self._draining += self._step
            self._step = []
        kept, released = [], 0
        for load, reads in self._draining:
            if block:
                load.finish()
            if block or load.done():
                for read in reads:
                    read.release()
                released += 1
            else:
                kept.append((load, reads))
        self._draining = kept
        return released

    # ------------------------------------------------------------------ saves

    def save(self, pool, keys: list[bytes], block_ids: list[int], namespace, pin_s: float = 0.0) -> Any:
        """Reserve and queue the copies out of the cache; returns the ExtentWrite and a `finish()` for the saver
        thread (waits for the copy, commits). Raises on a pool fault (nothing reserved is kept). `pin_s`: the
        retention hint of the put."""
        write = pool.reserve_many(keys, [self.block_bytes] * len(keys), namespace=namespace, staging=self.staging,
                                  pin_s=pin_s)
        granted = write.granted
        try:
            marker = gather_to(self.kv_cache, [block_ids[i] for i in granted], [write.buffers[i] for i in granted],
                               self.copies) if granted else None
        except BaseException:
            write.abort()
            raise

        def finish() -> list[str]:
            if marker is not None:
                self.copies.synchronize(marker)
            return write.commit()

        return write, finish

    def close(self) -> None:
        self.reap(block=True)
        for pool in (self._prefetch, self._copy):
            if pool is not None:
                pool.shutdown(wait=True)
        self._prefetch = self._copy = None


__all__ = ["DirectTransfer", "LoadResult"]
