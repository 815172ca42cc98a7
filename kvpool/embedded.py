"""EmbeddedPool: the whole pool in one process = the service's `Master` (memory metadata) + one `StorageNode`,
wired directly (no RPC). Every eviction/demotion decision is the master's, so tests of this class cover the service.

    put_many:      master.put_start ─▶ one memcpy into the DRAM arena at the grant (or an SSD record write)
                   ─▶ xxh3_64 ─▶ master.put_commit
    get_many_into: master.lookup (lease, promotion, size check) ─▶ one memcpy out of the arena (or an SSD read
                   that verifies the checksum; a bad one is reported, counted and ends the prefix) ─▶ release

Thread-safe: the master serialises metadata; byte copies run outside its lock on extents that a grant or lease
makes exclusive. On open with `ssd_path`, records left on the SSD by an earlier process (even one killed with
SIGKILL) are scanned and re-adopted as committed objects; DRAM contents never survive a process.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
import xxhash

from kvpool.buffers import as_bytes, as_writable_bytes
from kvpool.config import load_config
from kvpool.keys import Namespace, check_keys
from kvpool.store.config import EmbeddedConfig
from kvpool.store.master import Master, SizeMismatch
from kvpool.store.metadata import MemoryMetadata
from kvpool.store.node import StorageNode
from kvpool.store.records import NO_NS, NsRef, PutStatus
from kvpool.tiers.types import Tier

_DRAM = Tier.DRAM  # module constant: enum attribute lookups cost ~1 us each on the per-object path


class EmbeddedPool:
    def __init__(self, *, config_path: str | os.PathLike | None = None, clock: Callable[[], float] = time.time,
                 **overrides: Any) -> None:
        """Config: dataclass defaults < `config_path` (YAML/TOML) < KVPOOL_* environment < keyword arguments
        (fields of `kvpool.store.config.EmbeddedConfig`: dram_bytes, ssd_path, ssd_bytes, max_object_bytes, ...)."""
        self.config: EmbeddedConfig = load_config(EmbeddedConfig, config_path, **overrides)
        self.master = Master(self.config.master_config(), MemoryMetadata(), clock=clock)
        self.node = StorageNode(self.config.node_config())
        self.master.register_node(self.node.info(), self.node, expires=False)
        self._ns_refs: dict[Namespace, NsRef] = {}
        self._puts = {status.value: 0 for status in PutStatus}
        self._puts_lock = threading.Lock()
        self._closed = False
        self.recovered = self._adopt_ssd()

    @classmethod
    def from_config(cls, path: str | os.PathLike, **overrides: Any) -> "EmbeddedPool":
        return cls(config_path=path, **overrides)

    def _adopt_ssd(self) -> int:
        records = self.node.scan_ssd()
        if not records:
            return 0
        result = self.master.report_objects(self.node.node_id, records)
        if result.dropped_keys:
            # Duplicates / overlaps: erase them so a later scan cannot find them (or hide newer records behind them).
            placed = self.master.inspect(result.dropped_keys)
            here = {(r.key, r.offset) for r in placed if r is not None}
            dropped = set(result.dropped_keys)
            self.node.ssd.erase_many([r.offset for r in records if r.key in dropped and (r.key, r.offset) not in here])
        return result.adopted

    # ------------------------------------------------------------------ public API

    def put_many(self, keys: Sequence[bytes], buffers: Sequence[Any], *, namespace: Namespace | None = None
                 ) -> list[str]:
        """Store each buffer under its key. One status per key: "stored" | "exists" | "no_space"."""
        self._check_open()
        check_keys(keys, "keys")
        views = self._views(keys, buffers, as_bytes)
        limit = self.config.max_object_bytes
        for i, view in enumerate(views):
            if view.nbytes == 0:
                raise ValueError(f"buffers[{i}] is empty; objects must have at least 1 byte")
            if view.nbytes > limit:
                raise ValueError(f"buffers[{i}] has {view.nbytes} bytes, over max_object_bytes={limit}")
        ns = self._ns(namespace)
        results = self.master.put_start(keys, [v.nbytes for v in views], ns)
        grant_ids: list[int] = []
        checksums: list[int] = []
        try:
            for result, key, view in zip(results, keys, views):
                grant = result.grant
                if grant is None:
                    continue
                loc = grant.location
                if loc.tier is _DRAM:
                    np.copyto(self.node.dram_array(loc.offset, loc.size), np.frombuffer(view, dtype=np.uint8))
                    checksum = xxhash.xxh3_64_intdigest(view)
                else:
                    checksum = xxhash.xxh3_64_intdigest(view)
                    self.node.write(loc.tier, loc.offset, key, ns.digest, view, checksum)
                grant_ids.append(grant.grant_id)
                checksums.append(checksum)
        except BaseException:
            self.master.put_abort([r.grant.grant_id for r in results if r.grant is not None])
            raise
        committed = iter(self.master.put_commit(grant_ids, checksums))
        statuses = []
        for result in results:
            status = result.status
            if result.grant is not None and not next(committed):
                status = PutStatus.NO_SPACE  # the grant expired before the commit: not stored
            statuses.append(status.value)
        with self._puts_lock:
            for status in statuses:
                self._puts[status] += 1
        return statuses

    def lookup_prefix(self, keys: Sequence[bytes], *, namespace: Namespace | None = None) -> int:
        """Number of leading keys present in any tier."""
        self._check_open()
        check_keys(keys, "keys")
        return self.master.lookup(keys, self._ns(namespace), lease=False).hits

    def get_many_into(self, keys: Sequence[bytes], buffers: Sequence[Any], *, namespace: Namespace | None = None,
                      tiers_out: list[str] | None = None) -> int:
        """Fill buffers[i] with object keys[i] in order, stopping at the first miss; returns how many were filled.
        Each buffer must have exactly the object's size (checked for every hit before anything is copied).
        `tiers_out`, if given, receives the tier label ("dram", "ssd", ...) each filled buffer was read from."""
        self._check_open()
        check_keys(keys, "keys")
        views = self._views(keys, buffers, as_writable_bytes)
        try:
            result = self.master.lookup(keys, self._ns(namespace), lease=True,
                                        expect_sizes=[v.nbytes for v in views])
        except SizeMismatch as e:
            raise ValueError(f"buffers[{e.position}] has {e.expected} bytes, object has {e.actual}") from None
        if not result.lease_id:
            return 0
        filled = 0
        try:
            for i, loc in enumerate(result.locations):
                if loc.tier is _DRAM:
                    np.copyto(np.frombuffer(views[i], dtype=np.uint8), self.node.dram_array(loc.offset, loc.size))
                elif not self.node.read_into(loc.tier, loc.offset, keys[i], loc.size, views[i]):
                    self.master.report_corrupt(result.lease_id, [keys[i]])
                    break
                if tiers_out is not None:
                    tiers_out.append(loc.tier.label)
                filled += 1
        finally:
            self.master.release([result.lease_id])
        return filled

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys, "keys")
        return self.master.contains(keys)

    def remove_many(self, keys: Sequence[bytes]) -> int:
        """Remove objects; returns how many existed. An object being read is removed at once for new readers and
        its space is reused only after the reader finishes."""
        self._check_open()
        check_keys(keys, "keys")
        return self.master.remove(keys)

    def stats(self) -> dict:
        out = self.master.stats()
        with self._puts_lock:
            out["puts"] = dict(self._puts)
        out["ssd_corrupt_reads"] = self.node.ssd_corrupt_reads
        out["recovered"] = self.recovered
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.node.close()

    def __enter__(self) -> "EmbeddedPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("pool is closed")

    @staticmethod
    def _views(keys: Sequence[bytes], buffers: Sequence[Any], convert) -> list[memoryview]:
        if isinstance(buffers, (bytes, bytearray, memoryview)) or not hasattr(buffers, "__len__"):
            raise ValueError(f"buffers must be a sequence of buffers (one per key), got {type(buffers).__name__}")
        if len(buffers) != len(keys):
            raise ValueError(f"buffers has {len(buffers)} entries, keys has {len(keys)}")
        return [convert(b, f"buffers[{i}]") for i, b in enumerate(buffers)]

    def _ns(self, namespace: Namespace | None) -> NsRef:
        if namespace is None:
            return NO_NS
        if not isinstance(namespace, Namespace):
            raise ValueError(f"namespace must be a kvpool.Namespace, got {type(namespace).__name__}")
        ref = self._ns_refs.get(namespace)
        if ref is None:
            ref = self._ns_refs[namespace] = NsRef.of(namespace)
        return ref
