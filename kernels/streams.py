"""KV copies off the compute path: a side stream with events, and a load that arrives layer by layer.

```
 compute stream:  ... | layer 0 attn+MLP | layer 1 attn+MLP | layer 2 ... |
                       ^ wait(ev0)         ^ wait(ev1)          ^ wait(ev2)        (GPU-side waits: the host never blocks)
 side stream:     | copy L0 |ev0| copy L1 |ev1| copy L2 |ev2| ...                   (H2D DMA from pinned pool memory)
```
`LayerwiseLoad` queues one scatter per layer (every block of the request, that layer's K and V) on the side stream
and records an event after each, so layer i+1 copies while layer i computes. The engine calls `wait(i)` right
before layer i touches the cache (the `wait_for_layer_load` hook); `finish()` is the host-side wait before the pool
memory the copies read from is released. Without overlap (`layerwise=False`) every layer waits for the whole load.

With `translate` (CUDA: where the GPU reads pinned host memory, kvpool/pinned.py) and every source mapped, a layer
is two kernels reading the pool's memory in place (kernels/mapped_scatter.py) instead of one copy per block: the
per-block copies are kept for sources that are not (device buffers, unpinned memory) and wherever `translate` is None.

`Copies` hides the device: `CudaCopies` (torch.cuda.Stream + Event, copies `non_blocking`) and `HostCopies` for CPU
caches, where a copy either runs at once or, `deferred=True`, only when its marker is waited on. Deferred is exactly
what a stream guarantees and nothing more: a layer read before its `wait` still holds the old bytes, so a CPU test
catches a hook called late or not at all. Both begin by ordering the side stream after the work already queued on
the compute stream (blocks being written by the step that just ran, or freed blocks still being read).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch

from kvpool.kernels.kv_transfer import gather_blocks, object_view, scatter_blocks, scatter_layer
from kvpool.kernels.mapped_scatter import MappedScatter

log = logging.getLogger(__name__)


class HostCopies:
    """CPU: copies run at `submit` (deferred=False) or at the first `wait`/`synchronize` of their marker."""

    def __init__(self, *, deferred: bool = False) -> None:
        self.deferred = deferred

    def begin(self) -> None:
        return None

    def submit(self, fn: Callable[[], None]) -> Any:
        if not self.deferred:
            fn()
            return None
        return [fn]                     # a one-slot box: emptied when run, so each copy runs once

    def wait(self, marker: Any) -> None:
        if marker:
            marker.pop()()

    synchronize = wait

    def done(self, marker: Any) -> bool:
        return not marker


class CudaCopies:
    """A dedicated CUDA stream on `device`; markers are CUDA events."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)

    def begin(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def submit(self, fn: Callable[[], None]) -> Any:
        with torch.cuda.stream(self.stream):
            fn()
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, marker: Any) -> None:
        torch.cuda.current_stream(self.device).wait_event(marker)

    def synchronize(self, marker: Any) -> None:
        marker.synchronize()

    def done(self, marker: Any) -> bool:
        return bool(marker.query())


def copies_for(kv_cache: torch.Tensor, *, deferred: bool = False) -> HostCopies | CudaCopies:
    """The copy engine for a cache's device (`deferred` only matters on CPU)."""
    if kv_cache.device.type == "cuda":
        return CudaCopies(kv_cache.device)
    return HostCopies(deferred=deferred)


class LayerwiseLoad:
    """Pool objects -> cache blocks, queued per layer (or as one copy) on `copies`."""

    def __init__(self, kv_cache: torch.Tensor, block_ids: Sequence[int], sources: Sequence[Any],
                 copies: HostCopies | CudaCopies, *, layerwise: bool = True,
                 translate: Callable[[int], int | None] | None = None) -> None:
        if len(block_ids) != len(sources):
            raise ValueError(f"sources: got {len(sources)} buffers for {len(block_ids)} block ids")
        self.kv_cache = kv_cache
        self.block_ids = [int(b) for b in block_ids]
        self.sources = list(sources)
        # validated object views, for the per-block copies; a mapped load never needs them (their hundreds of tensor
        # views cost more host time than its whole plan), so with `translate` they are made only if it falls back
        self.objects = [object_view(s, kv_cache) for s in sources] if translate is None else None
        self.copies = copies
        self.layerwise = layerwise
        self.translate = translate
        self.num_layers = kv_cache.shape[0]
        self.markers: list[Any] = []
        self.mapped = False            # True once started through MappedScatter (two kernels per layer)
        self._plan: MappedScatter | None = None

    def start(self) -> None:
        """Queue every copy now; returns at once on CUDA."""
        if self.markers:
            raise RuntimeError("LayerwiseLoad.start called twice")
        kv, ids = self.kv_cache, self.block_ids
        plan = None
        if self.translate is not None:
            try:
                plan = MappedScatter.plan(kv, ids, self.sources, self.translate)
            except (RuntimeError, ValueError, TypeError) as exc:  # the per-block copies below still work
                log.warning("mapped layer loads unavailable (%s: %s); copying block by block", type(exc).__name__, exc)
        if plan is None and self.objects is None:
            self.objects = [object_view(s, kv) for s in self.sources]
        objs = self.objects
        self.copies.begin()
        self.mapped = plan is not None
        self._plan = plan                # lives as long as the load (its queued kernels read its tensors)
        if plan is not None and self.layerwise:
            self.markers = [self.copies.submit(lambda l=layer: plan.scatter(l, l + 1))
                            for layer in range(self.num_layers)]
        elif plan is not None:
            whole = self.copies.submit(lambda: plan.scatter(0, self.num_layers))
            self.markers = [whole] * self.num_layers
        elif self.layerwise:
            self.markers = [self.copies.submit(lambda l=layer: scatter_layer(kv, l, ids, [o[l] for o in objs],
                                                                             non_blocking=True))
                            for layer in range(self.num_layers)]
        else:
            whole = self.copies.submit(lambda: scatter_blocks(kv, ids, objs, non_blocking=True))
            self.markers = [whole] * self.num_layers

    def wait(self, layer: int) -> None:
        """Order the compute of `layer` after its copies (GPU-side on CUDA)."""
        if self.markers:
            self.copies.wait(self.markers[layer])

    def finish(self) -> None:
        """Host waits for every copy: the source memory may be released afterwards."""
        for marker in self.markers:
            self.copies.synchronize(marker)

    def done(self) -> bool:
        return all(self.copies.done(m) for m in self.markers)


def gather_to(kv_cache: torch.Tensor, block_ids: Sequence[int], destinations: Sequence[Any],
              copies: HostCopies | CudaCopies) -> Any:
    """Cache blocks -> pool memory (e.g. the granted arena extents) on the side stream; returns the marker to
    `synchronize` before the destination bytes are read (checksummed, committed). The compute stream is made to
    wait for it, so a later step cannot overwrite those blocks while the copy still reads them."""
    outs = [object_view(d, kv_cache) for d in destinations]
    copies.begin()
    marker = copies.submit(lambda: gather_blocks(kv_cache, block_ids, outs, non_blocking=True))
    copies.wait(marker)   # CUDA: the compute stream waits (GPU-side); deferred host copies run now, not later
    return marker


__all__ = ["CudaCopies", "HostCopies", "LayerwiseLoad", "copies_for", "gather_to"]
