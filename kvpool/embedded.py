"""EmbeddedPool: the whole pool in one process = the service's `Master` (memory metadata) + one `StorageNode`,
wired directly (no RPC). Every eviction/demotion decision is the master's, so tests of this class cover the service.

    put_many:      master.put_start ─▶ one memcpy into the DRAM arena at the grant (or an SSD record write)
                   ─▶ xxh3_64 ─▶ master.put_commit
    get_many_into: master.lookup (lease, size check) ─▶ one memcpy out of the arena (or an SSD read that verifies
                   the checksum; a bad one is reported, counted and ends the prefix) ─▶ release ─▶ promote the
                   slow-tier hits (master.promote_pending, after the copy, outside the master lock)

    reserve_many / acquire_many (kvpool/extents.py): the caller copies into / out of the arena extents itself;
                   an HBM hit is handed out as the device extent (CuPy array, DLPack), SSD entries are staged

Argument checks, namespaces and put counters are the shared front (kvpool/pool.py). Thread-safe: the master
serialises metadata; byte copies run outside its lock on extents that a grant or lease makes exclusive. On open with
`ssd_path`, records left on the SSD by an earlier process (even one killed with SIGKILL) are scanned and re-adopted
as committed objects. DRAM does not survive a process, but with `write_behind` (the default) every DRAM object has
an SSD copy written by a writer thread within about `write_behind_s`, and `close()` writes the rest first: a pool
reopened on the same `ssd_path` has what the last one held (after a kill: all but the last write_behind_s of puts).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
import xxhash

from kvpool.buffers import as_writable_bytes
from kvpool.config import load_config
from kvpool.extents import REST_MARGIN_S, ExtentRead, ExtentWrite, SharedLease, Staging
from kvpool.pool import PoolFront
from kvpool.store.config import EmbeddedConfig
from kvpool.store.master import Master, SizeMismatch
from kvpool.store.metadata import MemoryMetadata
from kvpool.store.node import StorageNode
from kvpool.store.records import LookupResult, NsRef, PutStatus
from kvpool.store.writebehind import write_behind_loop
from kvpool.tiers.types import Tier

_HBM = int(Tier.HBM)
_DRAM = int(Tier.DRAM)  # module constants: enum attribute lookups cost ~1 us each on the per-object path
_SSD = int(Tier.SSD)
_TIER_LABELS = tuple(t.label for t in Tier)


class EmbeddedPool(PoolFront):
    def __init__(self, *, config_path: str | os.PathLike | None = None, clock: Callable[[], float] = time.time,
                 **overrides: Any) -> None:
        """Config: dataclass defaults < `config_path` (YAML/TOML) < KVPOOL_* environment < keyword arguments
        (fields of `kvpool.store.config.EmbeddedConfig`: dram_bytes, ssd_path, ssd_bytes, max_object_bytes, ...)."""
        self.config: EmbeddedConfig = load_config(EmbeddedConfig, config_path, **overrides)
        super().__init__(self.config.max_object_bytes)
        self.master = Master(self.config.master_config(), MemoryMetadata(), clock=clock)
        self.config.check_recording()   # an unwritable record_directory fails here, before the node takes memory
        self.node = StorageNode(self.config.node_config())
        self.master.register_node(self.node.info(), self.node, expires=False)
        self.node.heard_master_time(self.master.time_us())  # its SSD records carry it (store/tombstones.py)
        self.recovered = self._adopt_ssd()
        self._stop_writer = threading.Event()
        self._writer = None
        if self.config.write_behind and self.node.ssd is not None:
            self._writer = threading.Thread(target=write_behind_loop, args=(self.master, self._stop_writer),
                                            name="kvpool-embedded-writer", daemon=True)
            self._writer.start()
        self.config.start_recording(self.master)    # record_directory: every lookup and put from here on

    @classmethod
    def from_config(cls, path: str | os.PathLike, **overrides: Any) -> "EmbeddedPool":
        return cls(config_path=path, **overrides)

    def _adopt_ssd(self) -> int:
        records = self.node.scan_ssd()
        if not records and not self.node.ssd_damaged_headers:
            return 0
        result = self.master.report_objects(self.node.node_id, records, corrupt=self.node.ssd_damaged_headers)
        if result.dropped_keys:
            # Duplicates / overlaps: erase them so a later scan cannot find them (or hide newer records behind them).
            placed = self.master.inspect(result.dropped_keys)
            here = {(r.key, r.offset) for r in placed if r is not None}
            dropped = set(result.dropped_keys)
            self.node.ssd.erase_many([r.offset for r in records if r.key in dropped and (r.key, r.offset) not in here])
        return result.adopted

    # ------------------------------------------------------------------ backend of PoolFront

    def _put(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef, pin_s: float) -> list[str]:
        results = self.master.put_start(keys, [v.nbytes for v in views], ns, pin_s=pin_s)
        grant_ids: list[int] = []
        checksums: list[int] = []
        try:
            for result, key, view in zip(results, keys, views):
                grant = result.grant
                if grant is None:
                    continue
                loc = grant.location
                if loc.tier == _DRAM:
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
        return statuses

    def _lookup(self, keys: Sequence[bytes], ns: NsRef, s_per_token: float) -> int:
        return self.master.lookup(keys, ns, lease=False, s_per_token=s_per_token).hits

    def _get_into(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef,
                  tiers_out: list[str] | None) -> int:
        try:
            result = self.master.lookup(keys, ns, lease=True, expect_sizes=[v.nbytes for v in views])
        except SizeMismatch as e:
            raise ValueError(f"buffers[{e.position}] has {e.expected} bytes, object has {e.actual}") from None
        if not result.lease_id:
            return 0
        filled = 0
        try:
            on_ssd = [i for i, tier in enumerate(result.tiers) if tier == _SSD]
            if on_ssd:   # one loop over the SSD hits (kvpool/tiers/ssd.py read_records); the order is kept below
                ok = self.node.read_ssd_many([result.offsets[i] for i in on_ssd], [keys[i] for i in on_ssd],
                                             [result.sizes[i] for i in on_ssd], [views[i] for i in on_ssd])
                ssd_ok = dict(zip(on_ssd, ok))
            for i, (tier, offset, size) in enumerate(zip(result.tiers, result.offsets, result.sizes)):
                if tier == _DRAM:
                    np.copyto(np.frombuffer(views[i], dtype=np.uint8), self.node.dram_array(offset, size))
                elif not (ssd_ok[i] if tier == _SSD else
                          self.node.read_into(Tier(tier), offset, keys[i], size, views[i])):
                    self.master.report_corrupt(result.lease_id, [keys[i]])
                    break
                if tiers_out is not None:
                    tiers_out.append(_TIER_LABELS[tier])
                filled += 1
        finally:
            self.master.release([result.lease_id])
        if self.master.promotion_wanted.is_set():
            self.master.promote_pending()  # after the copy: this call read where the objects were
        return filled

    def _reserve(self, keys: Sequence[bytes], sizes: list[int], ns: NsRef, staging: Staging,
                 pin_s: float) -> ExtentWrite:
        results = self.master.put_start(keys, sizes, ns, pin_s=pin_s)
        statuses, buffers, direct = [], [], []
        for i, result in enumerate(results):
            grant = result.grant
            if grant is None:
                statuses.append(result.status.value)
                buffers.append(None)
                direct.append(False)
                continue
            statuses.append("granted")
            loc = grant.location
            is_dram = loc.tier == _DRAM
            buffers.append(self.node.dram.view(loc.offset, loc.size) if is_dram
                           else as_writable_bytes(staging(loc.size), f"staging({loc.size})"))
            direct.append(is_dram)
        granted = [i for i, r in enumerate(results) if r.grant is not None]

        def commit() -> list[str]:
            out = [s if s != "granted" else "no_space" for s in statuses]
            grant_ids, checksums = [], []
            try:
                for i in granted:
                    loc = results[i].grant.location
                    checksum = xxhash.xxh3_64_intdigest(buffers[i])
                    if loc.tier != _DRAM:
                        self.node.write(loc.tier, loc.offset, keys[i], ns.digest, buffers[i], checksum)
                    grant_ids.append(results[i].grant.grant_id)
                    checksums.append(checksum)
            except BaseException:
                self.master.put_abort([results[i].grant.grant_id for i in granted])
                raise
            for i, ok in zip(granted, self.master.put_commit(grant_ids, checksums)):
                out[i] = "stored" if ok else "no_space"
            with self._puts_lock:
                for status in out:
                    self._puts[status] += 1
            return out

        def abort() -> None:
            self.master.put_abort([results[i].grant.grant_id for i in granted])

        return ExtentWrite(keys, statuses, buffers, direct, commit, abort)

    def _acquire(self, keys: Sequence[bytes], sizes: list[int], ns: NsRef, staging: Staging,
                 max_staged: int | None, continued: bool, lease: bool = True) -> ExtentRead:
        # leased even with lease=False (which only permits an unpinned read): in process a lease costs no round trip
        try:
            result = self.master.lookup(keys, ns, lease=True, expect_sizes=sizes, continued=continued)
        except SizeMismatch as e:
            raise ValueError(f"sizes[{e.position}] is {e.expected} bytes, object has {e.actual}") from None
        if not result.lease_id:
            return ExtentRead(keys, [], [], [], lambda n: n, lambda: None)

        def end_lease() -> None:
            self.master.release([result.lease_id])
            if self.master.promotion_wanted.is_set():
                self.master.promote_pending()

        lease = SharedLease(end_lease)
        try:
            return self._read_leased(keys, sizes, ns, result, lease, 0, staging, max_staged)
        except BaseException:
            lease.leave()
            raise

    def _read_leased(self, keys: Sequence[bytes], sizes: list[int], ns: NsRef, result: LookupResult,
                     lease: SharedLease, start: int, staging: Staging, max_staged: int | None) -> ExtentRead:
        """The hits of one leased lookup from position `start` on, as an ExtentRead holding `lease` (joined by the
        caller); its `rest` reads on under the same lease while it has REST_MARGIN_S to run (else looks the
        remaining keys up again)."""
        buffers: list[Any] = []
        direct: list[bool] = []
        tiers: list[str] = []
        hbm_views = getattr(self.node.hbm, "array", None)   # the real HbmArena: device views (DLPack)
        staged, full = 0, False
        for i in range(start, result.hits):
            tier, offset, size = result.tiers[i], result.offsets[i], result.sizes[i]
            if tier == _DRAM:
                buffers.append(self.node.dram.view(offset, size))
                direct.append(True)
            elif tier == _HBM and hbm_views is not None:
                buffers.append(hbm_views(offset, size))
                direct.append(True)
            else:
                if max_staged is not None and staged == max_staged:
                    full = True
                    break
                staged += 1
                buf = as_writable_bytes(staging(size), f"staging({size})")
                if not self.node.read_into(Tier(tier), offset, keys[i], size, buf):
                    self.master.report_corrupt(result.lease_id, [keys[i]])
                    break
                buffers.append(buf)
                direct.append(False)
            tiers.append(_TIER_LABELS[tier])
        end = start + len(buffers)

        def rest(staging: Staging, max_staged: int | None) -> ExtentRead:
            if self.master.clock() >= result.expires_at - REST_MARGIN_S:
                return self._acquire(keys[end:], sizes[end:], ns, staging, max_staged, True)
            lease.join()
            try:
                return self._read_leased(keys, sizes, ns, result, lease, end, staging, max_staged)
            except BaseException:
                lease.leave()
                raise

        # In-process extents: no stalled peer can touch them under the lease (get_many_into does not hash them
        # either), so verification keeps every entry.
        return ExtentRead(keys[start:], buffers, direct, tiers, lambda n: n, lease.leave, staging_full=full,
                          rest=rest)

    def _pin(self) -> dict[str, str]:
        arena = self.node.dram
        if arena is None:
            return {}
        return {self.node.node_id: "pinned" if arena.pin() else f"not pinned: {arena.pin_error}"}

    def _warm(self, prefault: bool) -> dict[str, str]:
        return {}   # the arena is this process's own: mapped since it was made, and its pages touched by the puts

    def _contains(self, keys: Sequence[bytes]) -> list[bool]:
        return self.master.contains(keys)

    def _remove(self, keys: Sequence[bytes]) -> int:
        return self.master.remove(keys)

    def _stats(self) -> dict:
        out = self.master.stats()
        out["ssd_corrupt_reads"] = self.node.ssd_corrupt_reads
        out["recovered"] = self.recovered
        return out

    def _close(self) -> None:
        self.master.stop_recording()
        self._stop_writer.set()
        if self._writer is not None:
            self._writer.join(timeout=30)
            self.master.flush_node(self.node.node_id)  # what DRAM holds, on SSD before the file closes
        self.node.close()


__all__ = ["EmbeddedPool"]
