"""A storage node holds bytes; the master decides where. `NodeOps` is everything the master ever asks a node to do.

    master ── demote(moves) ──▶ node: copy to a slower tier (HBM -> DRAM; DRAM -> SSD record: header+payload+checksum)
           ── promote(moves) ─▶ node: copy to a faster tier (SSD record -> DRAM/HBM, verifying the checksum:
                                False = lost, a miss; DRAM -> HBM)
           ── drop(drops) ────▶ node: forget an extent (SSD: erase the header so a restart does not re-adopt it)
           ── publish(p) ─────▶ node: its host index says where committed DRAM objects are, for same-host clients
                                that read them with no Lookup (optional: `PublishOps`; tiers/host_index.py)

Calls are batched and take plain records, so a gRPC proxy (issue 3, NodeService Demote/Promote/Drop) implements the
same protocol. `StorageNode` is the in-process implementation over one `DramArena`, an optional `SsdFile` and, where a
CUDA device is, an optional `HbmArena` (host <-> device copies through its `write`/`read_into`); it also
serves client reads/writes at granted locations (`write`, `read_into`) and `scan_ssd()` for re-registration.
It does no bounds bookkeeping of its own: extents come from the master's allocators.

`demote` only copies: the master decides whether the source is freed (a demotion) or kept (the write-behind copy of
an object that stays in DRAM, store/writebehind.py). SSD durability follows `NodeConfig.ssd_fsync_s`: a syncer
thread fdatasyncs the file at that period while it has unsynced writes (0: at the end of every write batch), and
`close` syncs; `ssd_syncs` counts them. A node with DRAM prefaults its own arena's page tables at start, on a
thread of its own (`prefaulted` is set when done), so the pool's first fill takes no page fault per page.

One module of ~440 lines because it is one concept, the node's tiers: the records the master sends (Move, Drop,
Publication), the protocol it calls, and the one implementation that owns the arena, the SSD file and their threads.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from kvpool.store.config import NodeConfig
from kvpool.store.records import NodeInfo, ObjectRecord
from kvpool.tiers.host_index import DRAM_ROW, SSD_ROW, HostIndex
from kvpool.tiers.ssd import record_size
from kvpool.tiers.types import Tier

log = logging.getLogger(__name__)

GENERATION_ONLY_BYTES = 4096  # an SSD-only node's arena: one page that holds no objects, its host index, its tail
INDEX_BYTES_PER_SLOT = 32 << 10     # a host index has a slot per 32 KiB of shared DRAM and SSD (64 B: 0.2%)


def index_slots(shared_bytes: int) -> int:
    """Host index slots for `shared_bytes` of DRAM and SSD that same-host clients read: a power of two >=
    shared_bytes / 32 KiB, in [256, 2**22] (at most 256 MiB of index, in the arena file)."""
    want = max(1, shared_bytes // INDEX_BYTES_PER_SLOT)
    return 1 << min(22, max(8, (want - 1).bit_length()))


@dataclass(slots=True, frozen=True)
class Move:
    """Copy one object between tiers of one node (MoveRequest columns)."""

    key: bytes
    ns_digest: bytes
    size: int
    checksum: int
    src_tier: Tier
    src_offset: int
    dst_tier: Tier
    dst_offset: int


@dataclass(slots=True, frozen=True)
class Drop:
    key: bytes
    tier: Tier
    offset: int
    size: int


@dataclass(slots=True, frozen=True)
class Publication:
    """What a node's host index (tiers/host_index.py) is to say: objects committed in its DRAM or SSD tier (keys[i]
    at offsets[i] of tiers[i], sizes[i] bytes, checksum checksums[i]; `tiers` empty: all DRAM), and keys it is to
    forget (`gone`)."""

    keys: tuple[bytes, ...] = ()
    offsets: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    checksums: tuple[int, ...] = ()
    gone: tuple[bytes, ...] = ()
    tiers: tuple[Tier, ...] = ()


@runtime_checkable
class PublishOps(Protocol):
    """The optional part of NodeOps: a node with a host index publishes its DRAM objects to same-host clients."""

    def publish(self, publication: Publication) -> int: ...


class NodeUnavailable(OSError):
    """A node could not be asked to move bytes (not connected, RPC failed): nothing is known about its copies, so
    the objects concerned stay where they are. Never a reason to call an object corrupt."""


@runtime_checkable
class NodeOps(Protocol):
    """Byte moves the master asks of a node, batched. `demote` / `promote` answer one bool per move: False means the
    node refused that copy (for a promotion: the source SSD record failed verification). `promote` raises
    NodeUnavailable when the node cannot be asked at all."""

    def demote(self, moves: list[Move], drops: Sequence[Drop] = ()) -> list[bool]:
        """`drops` (only for a node whose NodeInfo says `move_drops`): records erased before any move is made."""
        ...

    def promote(self, moves: list[Move]) -> list[bool]: ...

    def drop(self, drops: list[Drop]) -> int: ...

    def objects_removed(self, keys: Sequence[bytes] | None = None) -> None:
        """The master removed objects (`remove`, an admin `evict`): bump the DRAM arena's removal generation and the
        removal stamp so location caches (same-host, TCP) stop serving what they remember (tiers/dram.py,
        kvpool/locations.py). Returns once both are bumped. `keys` (only to a node whose NodeInfo says
        `removes_keys`): the stored keys removed, the only rows its host index forgets; None: it forgets every row
        (the master publishes again what the node still holds)."""
        ...


class StorageNode:
    """One node's tiers in this process. Thread-safety: distinct extents may be read/written concurrently; the
    master guarantees an extent is never moved or reused while granted or leased."""

    def __init__(self, config: NodeConfig, *, hbm=None) -> None:
        """`hbm`: an arena with the HbmArena interface (capacity, write, read_into, close) to use instead of creating
        one from config.hbm_bytes; the node owns and closes it."""
        from kvpool.tiers.dram import DramArena, page_kind
        from kvpool.tiers.ssd import SsdFile

        self.config = config
        self.node_id = config.node_id
        self.incarnation = os.urandom(8).hex()
        self._removals = 0          # removals the master told this node of, and its registrations (removal_stamp)
        self._stamp = bytes.fromhex(self.incarnation) + bytes(8)
        self.dram = None
        self._marker = None         # an SSD-only node's generation-only arena (below), never a DRAM tier
        self._dram_np = None
        self._dram_pages = ""
        self.ssd = None
        self.ssd_damaged_headers = 0  # records whose header failed verification at a scan (erased, reported)
        self.master_time_us = 0     # the master's clock as last heard (heard_master_time): SSD records carry it
        self.hbm = hbm
        if hbm is None and config.hbm_bytes > 0:
            from kvpool.tiers.hbm import HbmArena
            self.hbm = HbmArena.create(config.hbm_bytes, config.hbm_device)
        self.host_index = None      # tiers/host_index.py: written under _gen_lock
        # the host index has room for the objects of every tier same-host clients read themselves (DRAM, SSD)
        shared = config.dram_bytes + (config.ssd_bytes if config.ssd_path is not None else 0)
        if config.dram_bytes > 0:
            slots = index_slots(shared) if config.share_dram else 0
            self.dram = DramArena.create(config.dram_bytes, directory=config.shm_dir, index_slots=slots)
            if slots:
                self.host_index = HostIndex(self.dram.index_region, writer=True)
            self._dram_np = self.dram.array(0, config.dram_bytes)  # sliced per object: no per-call checks
            self._dram_pages = page_kind(config.shm_dir)    # the node says it at registration (`kvpool nodes`)
            if not config.share_dram:
                # Nobody else maps it: unlink now so a killed process leaves nothing behind in /dev/shm.
                self.dram.unlink()
            if self.hbm is not None:
                self.dram.pin()  # HBM <-> DRAM moves are then DMA; False (logged, pin_error) still works, staged
        elif config.share_dram and config.ssd_path is not None:
            # No DRAM tier, but same-host clients read the SSD records themselves: a one-page arena that holds no
            # objects (the master places none here: dram_bytes 0), for its tail page and its host index (the node's
            # SSD records). Its removal generation and its owner's lock date and vouch for the SSD locations those
            # clients remember (kvpool/locations.py).
            self._marker = DramArena.create(GENERATION_ONLY_BYTES, directory=config.shm_dir,
                                            index_slots=index_slots(shared))
            self.host_index = HostIndex(self._marker.index_region, writer=True)
        if config.ssd_path is not None:
            self.ssd = SsdFile.open(config.ssd_path, config.ssd_bytes, create=True)
        self.ssd_syncs = 0
        self.synced = threading.Event()     # set after each sync (tests wait on it instead of sleeping)
        self._unsynced = False
        self._sync_lock = threading.Lock()
        self._gen_lock = threading.Lock()   # the arena's removal generation has one writer at a time
        self._closing = threading.Event()
        self._local = threading.local()
        # The DRAM arena's page tables, filled in off every request's path: the owner's first write of each 4 KiB
        # page otherwise takes a fault (a TCP put's payload lands in fresh pages until the pool is full once).
        self.prefaulted = threading.Event()     # set once the whole arena is mapped (or the node closed first)
        self._prefaulter = None
        if self.dram is not None:
            self._prefaulter = threading.Thread(target=self._prefault, name=f"kvpool-prefault-{config.node_id}",
                                                daemon=True)
            self._prefaulter.start()
        else:
            self.prefaulted.set()
        self._syncer = None
        if self.ssd is not None and config.ssd_fsync_s > 0:
            self._syncer = threading.Thread(target=self._sync_loop, args=(config.ssd_fsync_s,),
                                            name=f"kvpool-ssd-sync-{config.node_id}", daemon=True)
            self._syncer.start()

    def info(self) -> NodeInfo:
        overhead = record_size(0) if self.ssd is not None else 0
        return NodeInfo(node_id=self.node_id, dram_bytes=self.config.dram_bytes, incarnation=self.incarnation,
                        ssd_bytes=self.config.ssd_bytes if self.ssd is not None else 0,
                        ssd_record_overhead=overhead,
                        dram_path=str(self.shared_arena.path) if self.shared_arena is not None else "",
                        hbm_bytes=self.hbm.capacity if self.hbm is not None else 0, ssd_index_rows=True,
                        dram_pages=self._dram_pages, move_drops=True, removes_keys=True,
                        writer_claims=self.dram is not None and self.config.share_dram)

    def claimed_ranges(self) -> list[tuple[int, int]]:
        """The DRAM ranges same-host writers alive may be copying into now (tiers/writer_claims.py): what each
        heartbeat tells the master (NodeInfo.writer_claims). [] where the arena is not shared."""
        if self.dram is None or not self.config.share_dram:
            return []
        return self.dram.claimed_ranges()

    @property
    def shared_arena(self):
        """The arena same-host clients map (its path is NodeInfo.dram_path), or None: the DRAM tier's when shared,
        else an SSD-only node's generation-only arena."""
        if self.dram is not None:
            return self.dram if self.config.share_dram else None
        return self._marker

    def ssd_share_path(self) -> str:
        """The SSD data file same-host clients may read records from themselves (transfer.py), or "" (no SSD tier,
        or `share_dram` off: then every read goes through the data channel's token check)."""
        return self.ssd.path if self.ssd is not None and self.config.share_dram else ""

    # ---- client data path (same process) ----

    def dram_array(self, offset: int, size: int) -> np.ndarray:
        """uint8 view of a DRAM extent: the caller copies into / out of it (that copy is the transfer)."""
        return self._dram_np[offset:offset + size]

    def heard_master_time(self, time_us: int) -> None:
        """The master's clock (µs) from a registration or heartbeat reply. An SSD record written after it carries
        it (never less than the last one heard): a lower bound of the master time of the write, which is what lets
        the master refuse a record written before a removal of its key (store/tombstones.py)."""
        if time_us > self.master_time_us:
            self.master_time_us = time_us

    def write(self, tier: Tier, offset: int, key: bytes, ns_digest: bytes, payload, checksum: int | None) -> None:
        """`checksum`: the payload's xxh3_64 if the caller has it (None: computed for an SSD record)."""
        if tier == Tier.DRAM:
            np.copyto(self.dram.array(offset, len(payload)), np.frombuffer(payload, dtype=np.uint8))
        elif tier == Tier.SSD:
            self.ssd.write(offset, key, ns_digest, payload, checksum, written_us=self.master_time_us)
            self._ssd_written()
        elif tier == Tier.HBM and self.hbm is not None:
            self.hbm.write(offset, payload)
        else:
            raise ValueError(f"tier {tier!r} is not on this node")

    def read_into(self, tier: Tier, offset: int, key: bytes, size: int, out) -> bool:
        """Fill `out` (writable, `size` bytes). False = SSD record missing or corrupt (counted by the SsdFile)."""
        if tier == Tier.DRAM:
            np.copyto(np.frombuffer(out, dtype=np.uint8), self.dram.array(offset, size))
            return True
        if tier == Tier.SSD:
            return bool(self.ssd.read_into(offset, key, size, out))
        if tier == Tier.HBM and self.hbm is not None:
            self.hbm.read_into(offset, memoryview(out).cast("B")[:size])
            return True
        raise ValueError(f"tier {tier!r} is not on this node")

    def read_ssd_many(self, offsets, keys, sizes, outs) -> list[bool]:
        """SSD records into `outs` in one loop (tiers.ssd.SsdFile.read_many_into); False = missing or corrupt."""
        if self.ssd is None:
            raise ValueError("tier SSD is not on this node")
        return self.ssd.read_many_into(offsets, keys, sizes, outs)

    # ---- NodeOps ----

    def demote(self, moves: list[Move], drops: Sequence[Drop] = ()) -> list[bool]:
        """The moves, after erasing `drops` (a move may write where a dropped record was)."""
        ok = []
        with self._batch():
            self.drop(drops)
            for m in moves:
                try:
                    ok.append(self._move(m))
                except OSError:
                    log.exception("demote of %s failed", m.key.hex())
                    ok.append(False)
        return ok

    def promote(self, moves: list[Move]) -> list[bool]:
        with self._batch():
            return [self._move(m) for m in moves]

    def _move(self, m: Move) -> bool:
        """Copy one object between two tiers. DRAM is the host side of every HBM copy; without it (or SSD <-> HBM)
        the bytes pass through a temporary host buffer. False = the SSD source failed verification."""
        if m.src_tier == Tier.DRAM:
            src = self.dram.view(m.src_offset, m.size)
        elif m.dst_tier == Tier.DRAM:  # read straight into the destination extent
            return self.read_into(m.src_tier, m.src_offset, m.key, m.size, self.dram.view(m.dst_offset, m.size))
        else:
            src = bytearray(m.size)
            if not self.read_into(m.src_tier, m.src_offset, m.key, m.size, src):
                return False
        self.write(m.dst_tier, m.dst_offset, m.key, m.ns_digest, src, m.checksum)
        return True

    def objects_removed(self, keys: Sequence[bytes] | None = None) -> None:
        arena = self.dram if self.dram is not None else self._marker
        with self._gen_lock:
            if arena is not None:
                if self.host_index is not None:     # before the bump: a client that sees the new generation finds none
                    if keys is None:
                        self.host_index.clear()
                    elif keys:
                        self.host_index.unpublish(keys)
                arena.bump_generation()
            self._removals += 1
            self._stamp = bytes.fromhex(self.incarnation) + self._removals.to_bytes(8, "little")

    def removal_stamp(self) -> bytes:
        """16 bytes that change whenever the master tells this node of a removal (or it registers with a master)
        and differ between two node processes: the incarnation's 8 random bytes, then that count (u64 LE). What a
        TCP client's location cache dates its entries with; the data channel refuses a dated read whose stamp is not
        this one (store/data_channel.py READ_DATED), as a same-host client drops entries older than the arena's
        removal generation."""
        return self._stamp

    def publish(self, publication: Publication) -> int:
        """Apply a Publication to the host index (checked by the caller: store/node_checks.py): `gone` first, then
        the new entries. How many entries it now holds of those published; 0 without a host index."""
        if self.host_index is None:
            return 0
        with self._gen_lock:
            if publication.gone:
                self.host_index.unpublish(publication.gone)
            if publication.keys:
                places = [SSD_ROW if t == Tier.SSD else DRAM_ROW for t in publication.tiers]
                self.host_index.publish(publication.keys, publication.offsets, publication.sizes,
                                        publication.checksums, places)
        return len(publication.keys)

    def drop(self, drops: list[Drop]) -> int:
        n = 0
        with self._batch():
            for d in drops:
                if d.tier == Tier.SSD and self.ssd is not None:
                    self.ssd.erase(d.offset)
                    self._ssd_written()
                n += 1
        return n

    # ---- SSD durability ----

    def sync_ssd(self) -> None:
        """fdatasync the SSD file now if anything was written since the last sync."""
        with self._sync_lock:
            if self.ssd is None or not self._unsynced:
                return
            self._unsynced = False
            self.ssd.sync()
            self.ssd_syncs += 1
        self.synced.set()

    def _ssd_written(self) -> None:
        # Set after the write returned: a sync that clears the flag later covers it, a write after that sets it again.
        self._unsynced = True
        if self.config.ssd_fsync_s == 0 and not getattr(self._local, "depth", 0):
            self.sync_ssd()

    @contextmanager
    def _batch(self):
        """With ssd_fsync_s == 0, one sync at the end of a batch of writes (per calling thread), not per record."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0 and self.config.ssd_fsync_s == 0:
                self.sync_ssd()

    def _prefault(self) -> None:
        try:
            self.dram.prefault(stop=self._closing.is_set)
        except Exception:  # noqa: BLE001 - only a slower first fill: every write still faults its pages in
            log.warning("node %s: prefaulting the DRAM arena failed", self.node_id, exc_info=True)
        finally:
            self.prefaulted.set()

    def _sync_loop(self, period: float) -> None:
        while not self._closing.wait(period):
            try:
                self.sync_ssd()
            except (OSError, ValueError):  # closed under us: close() syncs itself
                return

    def scan_ssd(self) -> list[ObjectRecord]:
        """Every intact-looking record on the SSD file, for (re-)registration with a master. Records whose header
        is damaged are erased (so they are found, and counted in `ssd_damaged_headers`, once)."""
        if self.ssd is None:
            return []
        damaged: list[int] = []
        records = [ObjectRecord(key=r.key, ns_digest=r.ns_digest, node_id=self.node_id, tier=Tier.SSD,
                                offset=r.offset, size=r.size, checksum=r.checksum, written_us=r.written_us)
                   for r in self.ssd.scan(on_damaged=damaged.append)]
        if damaged:
            log.warning("SSD %s: %d record header(s) damaged (lost, erased, counted in ssd_corrupt)", self.ssd.path,
                        len(damaged))
            self.ssd.erase_many(damaged)
            self.ssd_damaged_headers += len(damaged)
        return records

    @property
    def ssd_corrupt_reads(self) -> int:
        return int(getattr(self.ssd, "corrupt_reads", 0)) if self.ssd is not None else 0

    def close(self) -> None:
        self._closing.set()
        if self._prefaulter is not None:
            self._prefaulter.join(timeout=10)   # ends at its next chunk: the arena is not closed under it
        if self._syncer is not None:
            self._syncer.join(timeout=10)
        if self.hbm is not None:
            self.hbm.close()
            self.hbm = None
        if self.ssd is not None:
            self.sync_ssd()
            with self._sync_lock:
                self.ssd.close()
                self.ssd = None
        if self._marker is not None:
            self._marker.unlink()
            self.host_index = None      # its views of the index region go first: close() then drops the lock
            self._marker.close()
            self._marker = None
        if self.dram is not None:
            if self.config.share_dram:
                self.dram.unlink()
            self._dram_np = None
            self.host_index = None
            self.dram.close()
            self.dram = None
