"""The pool contract (`Pool`) and the front half both implementations share (`PoolFront`).

    Pool (Protocol)       what DESIGN.md's public API promises: put_many, lookup_prefix, get_many_into,
                          contains_many, remove_many, stats, close, context manager; plus the zero-staging pair
                          reserve_many / acquire_many (kvpool/extents.py) and pin_host_memory for GPU callers
    PoolFront             argument checks (keys, buffers, sizes, namespace), empty batches, put counters, closed
                          state; then one backend call on checked input:
                              _put(keys, views, ns, pin_s)     -> statuses ("stored" | "exists" | "no_space")
                              _lookup(keys, ns, s_per_token)   -> leading hits
                              _get_into(keys, views, ns, tiers_out) -> buffers filled
                              _contains(keys) / _remove(keys) / _stats() / _close()
                              _reserve(keys, sizes, ns, staging, pin_s) -> ExtentWrite
                              _acquire(keys, sizes, ns, staging) -> ExtentRead
                              _pin() -> {node id: "pinned" | why not}
    EmbeddedPool          kvpool/embedded.py: the master and one node in this process
    PoolClient            kvpool/client.py: through a master process and its storage nodes

Every caller mistake raises ValueError naming the argument before anything is sent or changed.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, Sequence, runtime_checkable

from kvpool.buffers import byte_views
from kvpool.extents import ExtentRead, ExtentWrite, Staging, check_max_staged, staging_of
from kvpool.keys import Namespace, check_keys
from kvpool.store import checks
from kvpool.store.checks import MAX_PIN_S, MAX_S_PER_TOKEN, pin_seconds  # noqa: F401 - re-exported for connectors
from kvpool.store.records import NO_NS, NsRef


@runtime_checkable
class Pool(Protocol):
    def put_many(self, keys: Sequence[bytes], buffers: Sequence[Any], *, namespace: Namespace | None = None,
                 pin_s: float = 0.0) -> list[str]: ...

    def lookup_prefix(self, keys: Sequence[bytes], *, namespace: Namespace | None = None,
                      prefill_s_per_token: float = 0.0) -> int: ...

    def get_many_into(self, keys: Sequence[bytes], buffers: Sequence[Any], *, namespace: Namespace | None = None,
                      tiers_out: list[str] | None = None) -> int: ...

    def reserve_many(self, keys: Sequence[bytes], sizes: Sequence[int], *, namespace: Namespace | None = None,
                     staging: Staging | None = None, pin_s: float = 0.0) -> ExtentWrite: ...

    def acquire_many(self, keys: Sequence[bytes], sizes: Sequence[int], *, namespace: Namespace | None = None,
                     staging: Staging | None = None, max_staged: int | None = None,
                     continued: bool = False, lease: bool = True) -> ExtentRead: ...

    def pin_host_memory(self) -> dict[str, str]: ...

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]: ...

    def remove_many(self, keys: Sequence[bytes]) -> int: ...

    def stats(self) -> dict: ...

    def close(self) -> None: ...

    def __enter__(self): ...

    def __exit__(self, *exc: object) -> None: ...


class PoolFront:
    max_object_bytes: int

    def __init__(self, max_object_bytes: int) -> None:
        self.max_object_bytes = max_object_bytes
        self._puts = {"stored": 0, "exists": 0, "no_space": 0}
        self._puts_lock = threading.Lock()
        self._ns_refs: dict[Namespace, NsRef] = {}
        self._closed = False

    # ------------------------------------------------------------------ public API

    def put_many(self, keys: Sequence[bytes], buffers: Sequence[Any], *, namespace: Namespace | None = None,
                 pin_s: float = 0.0) -> list[str]:
        """Store each buffer under its key. One status per key: "stored" | "exists" | "no_space". `pin_s` > 0: a
        retention hint: keep these objects (the stored ones and those that exist already) at least this long unless
        the pool would otherwise have to refuse a put (store/retention.py)."""
        self._check_open()
        pin_s = checks.pin_seconds(pin_s)
        check_keys(keys, "keys")
        views = self._views(keys, buffers, writable=False)
        limit = self.max_object_bytes
        for i, view in enumerate(views):
            if view.nbytes == 0:
                raise ValueError(f"buffers[{i}] is empty; objects must have at least 1 byte")
            if view.nbytes > limit:
                raise ValueError(f"buffers[{i}] has {view.nbytes} bytes, over max_object_bytes={limit}")
        ns = self._ns(namespace)
        if not keys:
            return []
        statuses = self._put(keys, views, ns, pin_s)
        with self._puts_lock:
            for status in statuses:
                self._puts[status] += 1
        return statuses

    def lookup_prefix(self, keys: Sequence[bytes], *, namespace: Namespace | None = None,
                      prefill_s_per_token: float = 0.0) -> int:
        """Number of leading keys present in any tier. `prefill_s_per_token`: the caller's measured prefill seconds
        per token; with a `namespace` the pool counts hit tokens x that as prefill seconds saved."""
        self._check_open()
        s_per_token = checks.seconds_per_token(prefill_s_per_token)
        check_keys(keys, "keys")
        ns = self._ns(namespace)
        return self._lookup(keys, ns, s_per_token) if keys else 0

    def get_many_into(self, keys: Sequence[bytes], buffers: Sequence[Any], *, namespace: Namespace | None = None,
                      tiers_out: list[str] | None = None) -> int:
        """Fill buffers[i] with object keys[i] in order, stopping at the first miss; returns how many were filled.
        Each buffer must have exactly the object's size (checked for every hit before anything is copied).
        `tiers_out`, if given, receives the tier label ("dram", "ssd", ...) each filled buffer was read from."""
        self._check_open()
        check_keys(keys, "keys")
        views = self._views(keys, buffers, writable=True)
        ns = self._ns(namespace)
        return self._get_into(keys, views, ns, tiers_out) if keys else 0

    def reserve_many(self, keys: Sequence[bytes], sizes: Sequence[int], *, namespace: Namespace | None = None,
                     staging: Staging | None = None, pin_s: float = 0.0) -> ExtentWrite:
        """Grant space for each key and hand out the granted bytes themselves (`ExtentWrite.buffers`) for the caller
        to fill, then `commit()`. Direct where the extent is reachable here (same-host DRAM), else a staging buffer
        from `staging(nbytes)` sent at commit. See kvpool/extents.py. `pin_s`: as for put_many."""
        self._check_open()
        pin_s = checks.pin_seconds(pin_s)
        check_keys(keys, "keys")
        sizes = self._sizes(keys, sizes)
        staging = staging_of(staging)
        ns = self._ns(namespace)
        if not keys:
            return ExtentWrite([], [], [], [], list, lambda: None)
        return self._reserve(keys, sizes, ns, staging, pin_s)

    def acquire_many(self, keys: Sequence[bytes], sizes: Sequence[int], *, namespace: Namespace | None = None,
                     staging: Staging | None = None, max_staged: int | None = None,
                     continued: bool = False, lease: bool = True) -> ExtentRead:
        """Lease the leading hits and hand out their bytes (`ExtentRead.buffers`: the extents themselves where
        reachable here, else staging buffers filled and verified), up to the first miss; `verify()` checks the
        direct ones, `release()` ends the lease. `sizes[i]` must be the object's size. See kvpool/extents.py.
        `max_staged`: at most this many entries go through `staging`; the read ends before the next one that would
        (`ExtentRead.staging_full`), so a caller with a fixed set of staging rows can ask for a whole chain and get
        every direct hit up to the point its rows run out; `ExtentRead.rest()` then reads on under the same lease.
        None: no limit. `continued`: this read goes on with keys an earlier acquire_many of the same hit asked for
        already (the rest of a read that ended at `staging_full`, looked up again); the pool's lookup statistics
        and traffic trace count them once, at that first read. `lease=False`: the caller checks every direct entry
        after copying it (`verify_landed` / `verify_entry` right after the copy, never `verify()` before it), so the
        pool may hand the extents out unpinned where that saves the master a round trip (PoolClient: a chain a
        same-host node's host index holds whole): their bytes may then change under the caller, whose check after
        the copy catches it. The default pins them until `release()`."""
        self._check_open()
        check_keys(keys, "keys")
        sizes = self._sizes(keys, sizes)
        staging = staging_of(staging)
        check_max_staged(max_staged)
        if not isinstance(continued, bool):
            raise ValueError(f"continued must be a bool, got {continued!r}")
        if not isinstance(lease, bool):
            raise ValueError(f"lease must be a bool, got {lease!r}")
        ns = self._ns(namespace)
        if not keys:
            return ExtentRead([], [], [], [], lambda n: n, lambda: None)
        return self._acquire(keys, sizes, ns, staging, max_staged, continued, lease)

    def pin_host_memory(self) -> dict[str, str]:
        """Register the host memory this process copies through (the in-process arena, or every same-host node
        arena mapped here, now and when mapped later) as CUDA pinned memory, so a device copy into or out of a
        direct buffer is DMA. Returns {node id: "pinned" or why not}; never raises; call again to re-read."""
        self._check_open()
        return self._pin()

    def warm(self, *, prefault: bool = True) -> dict[str, str]:
        """Get ready for the first get, off its path: reach the master (and open a connection to its control
        channel, where it has one), and map here every same-host node's arena
        (and SSD file), the arena's page tables filled in with `prefault` (a fresh mapping otherwise takes a page
        fault per 4-64 KiB on its first read of each page). Returns {node id: what was done}; an in-process pool
        has nothing to do ({}). Faults raise as any call's (the connector calls it from a thread and logs them)."""
        self._check_open()
        if not isinstance(prefault, bool):
            raise ValueError(f"prefault must be True or False, got {prefault!r}")
        return self._warm(prefault)

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys, "keys")
        return self._contains(keys) if keys else []

    def remove_many(self, keys: Sequence[bytes]) -> int:
        """Remove objects; returns how many existed. An object being read is removed at once for new readers and
        its space is reused only after the reader finishes."""
        self._check_open()
        check_keys(keys, "keys")
        return self._remove(keys) if keys else 0

    def stats(self) -> dict:
        out = self._stats()
        with self._puts_lock:
            out["puts"] = dict(self._puts)
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ backend (implemented by the pools)

    def _put(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef, pin_s: float) -> list[str]:
        raise NotImplementedError

    def _lookup(self, keys: Sequence[bytes], ns: NsRef, s_per_token: float) -> int:
        raise NotImplementedError

    def _get_into(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef,
                  tiers_out: list[str] | None) -> int:
        raise NotImplementedError

    def _contains(self, keys: Sequence[bytes]) -> list[bool]:
        raise NotImplementedError

    def _reserve(self, keys: Sequence[bytes], sizes: list[int], ns: NsRef, staging: Staging,
                 pin_s: float) -> ExtentWrite:
        raise NotImplementedError

    def _acquire(self, keys: Sequence[bytes], sizes: list[int], ns: NsRef, staging: Staging,
                 max_staged: int | None, continued: bool, lease: bool = True) -> ExtentRead:
        raise NotImplementedError

    def _pin(self) -> dict[str, str]:
        raise NotImplementedError

    def _warm(self, prefault: bool) -> dict[str, str]:
        raise NotImplementedError

    def _remove(self, keys: Sequence[bytes]) -> int:
        raise NotImplementedError

    def _stats(self) -> dict:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("pool is closed")

    @staticmethod
    def _views(keys: Sequence[bytes], buffers: Sequence[Any], *, writable: bool) -> list[memoryview]:
        if isinstance(buffers, (bytes, bytearray, memoryview)) or not hasattr(buffers, "__len__"):
            raise ValueError(f"buffers must be a sequence of buffers (one per key), got {type(buffers).__name__}")
        if len(buffers) != len(keys):
            raise ValueError(f"buffers has {len(buffers)} entries, keys has {len(keys)}")
        return byte_views(buffers, "buffers", writable=writable)

    def _sizes(self, keys: Sequence[bytes], sizes: Sequence[int]) -> list[int]:
        if isinstance(sizes, (bytes, bytearray, str)) or not hasattr(sizes, "__len__"):
            raise ValueError(f"sizes must be a sequence of ints (one per key), got {type(sizes).__name__}")
        if len(sizes) != len(keys):
            raise ValueError(f"sizes has {len(sizes)} entries, keys has {len(keys)}")
        out = []
        for i, n in enumerate(sizes):
            if isinstance(n, bool) or not hasattr(n, "__index__") or not 0 < int(n) <= self.max_object_bytes:
                raise ValueError(f"sizes[{i}] must be an int in [1, max_object_bytes={self.max_object_bytes}], "
                                 f"got {n!r}")
            out.append(int(n))
        return out

    def _ns(self, namespace: Namespace | None) -> NsRef:
        if namespace is None:
            return NO_NS
        if not isinstance(namespace, Namespace):
            raise ValueError(f"namespace must be a kvpool.Namespace, got {type(namespace).__name__}")
        ref = self._ns_refs.get(namespace)
        if ref is None:
            ref = self._ns_refs[namespace] = NsRef.of(namespace)
        return ref


__all__ = ["Pool", "PoolFront", "pin_seconds", "MAX_PIN_S", "MAX_S_PER_TOKEN"]
