"""Asynchronous saving of computed blocks: a bounded queue drained by one background thread.

The engine thread only copies the blocks out of its KV cache (they may be reused once the hook returns) and offers
the batch to the queue; it never waits on the pool. A full queue drops the batch and counts it: losing a save costs
a future hit, blocking decode would cost every request now. Keys the pool already holds cost no bandwidth: the
pool's put answers them "exists" before any byte moves (PutStart), so the worker asks nothing beforehand.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SaveBatch:
    keys: list[bytes]
    blocks: Any                 # torch tensor [n, *object_shape], owned by the batch (None with `commit`)
    namespace: Any
    commit: Callable[[], list[str]] | None = None   # direct path: the bytes are already in the pool's extents
    pin_s: float = 0.0                               # retention hint of the put (0 = none)
    on_done: Callable[[], None] | None = None        # the saver is done with `blocks` (saved, failed or closed)


class BlockSaver:
    def __init__(self, pool_getter: Callable[[], Any], *, max_blocks: int,
                 on_saved: Callable[[int, int], None], on_error: Callable[[BaseException], None]) -> None:
        self._pool_getter = pool_getter
        self._max_blocks = max_blocks
        self._queued_blocks = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue[SaveBatch | None] = queue.SimpleQueue()
        self._on_saved = on_saved
        self._on_error = on_error
        self._thread = threading.Thread(target=self._run, name="kvpool-saver", daemon=True)
        self._thread.start()

    def offer(self, batch: SaveBatch) -> bool:
        """Queue a batch unless that would pass `max_blocks` queued blocks; never blocks."""
        n = len(batch.keys)
        with self._lock:
            if self._queued_blocks + n > self._max_blocks:
                return False
            self._queued_blocks += n
        self._queue.put(batch)
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued batch has been handled (tests, shutdown). True if drained in time."""
        with self._idle:
            return self._idle.wait_for(lambda: self._queued_blocks == 0, timeout)

    def close(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            try:
                self._save(batch)
            except BaseException as exc:  # a pool fault never reaches the engine
                self._on_error(exc)
            finally:
                if batch.on_done is not None:
                    batch.on_done()
                with self._idle:
                    self._queued_blocks -= len(batch.keys)
                    self._idle.notify_all()

    def _save(self, batch: SaveBatch) -> None:
        if batch.commit is not None:
            statuses = batch.commit()
            self._on_saved(statuses.count("stored"), statuses.count("exists"))
            return
        pool = self._pool_getter()
        if pool is None:
            raise ConnectionError("pool not connected")
        flat = batch.blocks.reshape(batch.blocks.shape[0], -1)
        statuses = pool.put_many(batch.keys, [flat[i].numpy() for i in range(len(batch.keys))],
                                 namespace=batch.namespace, pin_s=batch.pin_s)
        self._on_saved(statuses.count("stored"), statuses.count("exists"))


class SaveBuffers:
    """Host buffers for blocks copied out of a KV cache to be saved, reused once the saver is done with them. A
    fresh buffer is paged in by the copy into it: on a 2-core VM that first touch cost ~100 ms for 32 x 5.6 MiB,
    more than the copy itself (~30 ms into a buffer already paged in). Keeps at most `keep_rows` rows of spares;
    a larger save gets a fresh buffer, as before."""

    def __init__(self, row_bytes: int, keep_rows: int) -> None:
        self._row_bytes = row_bytes
        self._keep_rows = keep_rows
        self._lock = threading.Lock()
        self._spares: list[torch.Tensor] = []

    def take(self, n: int) -> torch.Tensor:
        """A uint8 buffer of at least n rows (the smallest spare that fits, else a new one)."""
        with self._lock:
            fits = [i for i, b in enumerate(self._spares) if b.shape[0] >= n]
            if fits:    # by position: `list.remove` would compare tensors with ==, element by element
                return self._spares.pop(min(fits, key=lambda i: self._spares[i].shape[0]))
        return torch.empty((n, self._row_bytes), dtype=torch.uint8)

    def give_back(self, buf: torch.Tensor) -> None:
        """`buf` (from `take`) is no longer read by anyone: keep it if the spares stay within `keep_rows`."""
        with self._lock:
            if sum(b.shape[0] for b in self._spares) + buf.shape[0] <= self._keep_rows:
                self._spares.append(buf)

    def after(self, parts: int, buf: torch.Tensor) -> Callable[[], None]:
        """A callback for each of `parts` batches cut from `buf`: the last call gives `buf` back."""
        left = [parts]
        lock = threading.Lock()

        def done() -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self.give_back(buf)
        return done
