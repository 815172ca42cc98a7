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

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SaveBatch:
    keys: list[bytes]
    blocks: Any                 # torch tensor [n, *object_shape], owned by the batch (None with `commit`)
    namespace: Any
    commit: Callable[[], list[str]] | None = None   # direct path: the bytes are already in the pool's extents
    pin_s: float = 0.0                               # retention hint of the put (0 = none)


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
