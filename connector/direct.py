"""The direct path: KV moves between the engine's cache and the pool's own memory, with no staging copy.

```
 save (engine thread)   reserve_many ──▶ grants; buffers = the granted arena extents (same host) or pinned staging
                        gather_to(cache blocks ─▶ buffers) on the side stream      (GPU: D2H DMA into the extents)
                        the compute stream waits for that copy before it may overwrite the blocks
      (saver thread)    wait for the copy ─▶ commit (xxh3_64 of the bytes in place, PutCommit)
 load (engine thread)   acquire_many per chunk ─▶ leased extents (or staging filled over TCP / from SSD)
                        verify() before queuing: the fence on same-host extents (a mismatch ends the hit there)
                        LayerwiseLoad.start(): per layer, scatter (H2D DMA) on the side stream + an event
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
With immediate copies (CPU, layer-wise off) a load verifies each block AFTER copying it (`verify_after_copy`),
right after it landed, while its bytes are still in cache (one pass over memory, not a copy pass and a hash pass):
the fence then covers bytes a stalled writer changed during the copy, as the staged path's does; entries not
reachable directly land in a ring of buffers touched at start instead of fresh ones per chunk. Where copies are
queued (CUDA, layer-wise) the check stays before the copy: the forward may read a layer before a later check.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kvpool.kernels.kv_transfer import object_view, scatter_blocks
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
        self._step: list[tuple[LayerwiseLoad, list[Any]]] = []        # queued this step, waited per layer
        self._draining: list[tuple[LayerwiseLoad, list[Any]]] = []    # forward done; release when copies end
        # Host copies that run at once (CPU, not layer-wise): each chunk is copied, then verified (the fence hashes
        # the extents after the copy, as kvpool/fence.py wants), then released; its entries not reachable directly
        # (TCP, same-host SSD records) land in one ring of buffers touched here, reused chunk after chunk.
        self.verify_after_copy = not self._on_cuda and not layerwise
        self._ring = (torch.zeros((chunk_blocks, block_bytes), dtype=torch.uint8).numpy()
                      if self.verify_after_copy else None)
        self._ring_next = 0

    # ------------------------------------------------------------------ staging for entries not reachable directly

    def staging(self, nbytes: int) -> Any:
        if self._on_cuda:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return memoryview(bytearray(nbytes))

    def _ring_staging(self, nbytes: int) -> Any:
        """The next row of the load ring (a chunk never holds more entries than the ring has rows)."""
        if nbytes != self.block_bytes or self._ring_next >= len(self._ring):
            return self.staging(nbytes)
        row = self._ring[self._ring_next]
        self._ring_next += 1
        return memoryview(row)

    # ------------------------------------------------------------------ loads

    def load(self, pool, keys: list[bytes], block_ids: list[int]) -> LoadResult:
        """Queue the leading hits of `keys` into `block_ids`. Never raises: a fault ends the run (`error`)."""
        self.reap()
        out = LoadResult()
        reads: list[Any] = []
        sources: list[Any] = []
        start = time.perf_counter()
        after = self.verify_after_copy
        try:
            while out.blocks < len(keys):
                k = min(self.chunk_blocks, len(keys) - out.blocks)
                self._ring_next = 0
                read = pool.acquire_many(keys[out.blocks:out.blocks + k], [self.block_bytes] * k,
                                         staging=self._ring_staging if after else self.staging)
                if after:
                    # Immediate host copies: copy each hit into its block, then verify its extent while the bytes
                    # are still in cache (a stalled writer's bytes that landed during the copy are caught), then
                    # release. The first bad entry stops the copy; its block lies past the loaded prefix and the
                    # engine recomputes it.
                    try:
                        objects = [object_view(b, self.kv_cache) for b in read.buffers[:read.count]]
                        got = scatter_blocks(self.kv_cache, block_ids[out.blocks:out.blocks + read.count], objects,
                                             after=read.verify_entry)
                    finally:
                        read.release()
                else:
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
                                     layerwise=self.layerwise)
                load.start()
                self._step.append((load, reads))
                reads = []
        except Exception as exc:  # noqa: BLE001 - nothing was queued: recompute it all
            out.error, out.blocks, out.tiers = exc, 0, []
        finally:
            for read in reads:            # not handed to a queued load: release now
                read.release()
        out.seconds = time.perf_counter() - start
        return out

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


__all__ = ["DirectTransfer", "LoadResult"]
