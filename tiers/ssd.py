"""SsdFile: the SSD tier, one preallocated data file of self-describing records that survives a restart.

The master's OffsetAllocator chooses each record's offset (aligned to ALIGN = 4096); this file only writes,
reads, erases and scans records. A record is a fixed header page followed by the payload:
```
 offset ─▶ +0   magic      4B  b"KVPR"
           +4   version    2B  u16 LE (FORMAT_VERSION)
           +6   flags      2B  u16 LE (0; reserved)
           +8   key       16B  block key
           +24  ns_digest 16B  namespace digest
           +40  size       8B  u64 LE payload bytes
           +48  checksum   8B  u64 LE xxh3_64(payload)
           +56  hdr_sum    8B  u64 LE xxh3_64(bytes +0..+56)
           +64  written_us 8B  u64 LE master clock (µs since the Unix epoch) when written   } only with flags
           +72  time_sum   8B  u64 LE xxh3_64(bytes +0..+72)                               } bit 0 (WRITTEN)
           +80  (unused up to HEADER_BYTES = 4096)
 offset + 4096 ─▶ payload (size bytes)         record_size(size) = 4096 + size
```
`written_us` is the master's clock as the writing node had last heard it when it wrote the record. It lets the master
refuse to re-adopt, after a restart's scan, a record written before a removal of its key (store/tombstones.py).
It is an extension of the same format version, flagged in `flags` and checked by its own sum, rather than a new
version: a reader from before 2026-12-06 (a same-host client reads records itself) checks +0..+56 and ignores the
rest, so it still reads every record, and this reader takes a record without the flag (written by a node from
before) with written_us = 0 (unknown). Every write sets the flag.
Why a whole 4 KiB page for an 80-byte header: KV blocks are multiples of 4 KiB, so with the allocator's 4 KiB
alignment an 80-byte header would cost a full extra page anyway; a page-sized header keeps every payload
page-aligned (O_DIRECT / io_uring later, whole-page reads now) at no extra space in the common case.

Crash rules (the file is the only state that survives a kill):
* `write` invalidates any old header at the offset, writes the payload, and only then the header. A process
  killed at any point leaves either no valid header or a complete record. (Across a power loss the kernel may
  reorder the page writes; the payload checksum then turns a torn record into a miss.)
* `erase` zeroes the header, so a removed object is not resurrected by the next `scan`. The owner must erase a
  record before its extent is reused: `scan` skips over a valid record's whole extent, so a stale, un-erased
  header would hide newer records inside its extent (only `scan(verify=True)` detects that case).
* `read_into` verifies magic, version, header checksum, key, size and payload checksum; any mismatch, short
  read (truncated file) or I/O error is a miss (`False`) and counts in `corrupt_reads`. The payload has then
  already been read into the caller's buffer (no staging copy); callers treat False as "contents undefined".

One module over 400 lines on purpose: the record format has one owner. SsdFile (the node's writer, reader and
scan) and SsdReader (a same-host client's read-only handle) share its header layout and its checks
(`read_records`); split, the format would be spelled out in two places. Its reads have a native twin for speed
(kvpool/_copyhash.c `read_records`, which spells out the header's layout once more in C); this module stays the
format's owner, and tests/tiers/test_ssd_native.py holds the twin to this module's reader, case by case.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from kvpool import copyhash

from .dram import as_byte_view

log = logging.getLogger(__name__)

DATA_FILE = "kvpool.data"
MAGIC = b"KVPR"
FORMAT_VERSION = 1
WRITTEN = 1                                  # flags bit: written_us and time_sum follow hdr_sum
HEADER_BYTES = 4096
ALIGN = 4096
KEY_BYTES = 16
_HDR = struct.Struct("<4sHH16s16sQQ")        # everything the header checksum covers (56 bytes)
_BASE_LEN = _HDR.size + 8                    # + header checksum: 64, the shortest header (no WRITTEN flag)
_TIME = struct.Struct("<QQ")                 # written_us, time_sum (xxh3_64 of bytes +0..+72)
_HDR_LEN = _BASE_LEN + _TIME.size            # 80: the bytes read of every header
_FULL = struct.Struct("<4sHH16s16sQQQQQ")   # all of them: _HDR, hdr_sum, written_us, time_sum (_unpack_header)
_ERASED = bytes(_HDR_LEN)                    # zeroes a header and its extension
_SCAN_CHUNK = 256 * 1024                     # pages inspected per read while looking for headers
_IOV_CAP = 1024                              # Linux's IOV_MAX: buffers one preadv may fill
_MAX_GAP = 64 * 1024                         # unallocated bytes between two records read along rather than skipped
_MAX_RUN = 1 << 20                           # bytes one preadv reads (unless one record is larger): see read_records
_GAP_VIEW = memoryview(bytearray(_MAX_GAP))  # where those bytes land (never read back; shared by every thread)
_PAD_VIEW = memoryview(bytearray(HEADER_BYTES - _HDR_LEN))  # a header page's unused bytes, read and dropped alike


@dataclass(slots=True)
class SsdRecord:
    """A record found by `scan`."""

    key: bytes
    ns_digest: bytes
    offset: int
    size: int               # payload bytes
    checksum: int           # xxh3_64 of the payload
    written_us: int = 0     # the master's clock (µs) when written; 0 = unknown (a record without the WRITTEN flag)

    @property
    def record_size(self) -> int:
        return HEADER_BYTES + self.size


def record_size(payload_size: int) -> int:
    """Bytes the caller must allocate for a payload of `payload_size` bytes (header + payload)."""
    if not isinstance(payload_size, int) or payload_size < 0:
        raise ValueError(f"payload_size must be an int >= 0, got {payload_size!r}")
    return HEADER_BYTES + payload_size


def checksum_of(payload: Any) -> int:
    """xxh3_64 of a buffer, the checksum records carry."""
    return xxhash.xxh3_64_intdigest(as_byte_view(payload, "payload"))


def _pack_header(key: bytes, ns_digest: bytes, size: int, checksum: int, written_us: int = 0) -> bytes:
    body = _HDR.pack(MAGIC, FORMAT_VERSION, WRITTEN, key, ns_digest, size, checksum)
    head = body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little") + written_us.to_bytes(8, "little")
    return head + xxhash.xxh3_64_intdigest(head).to_bytes(8, "little")


def _unpack_header(buf: Any, at: int = 0) -> tuple[bytes, bytes, int, int, int] | None:
    """(key, ns_digest, size, checksum, written_us) of a valid header at `buf[at:]` (written_us 0 without the
    WRITTEN flag: a record of a node from before), else None. `buf` holds the page's first bytes: `_HDR_LEN`, or
    fewer where the file ends. A whole header is read in place: one unpack, its checksum hashed from a slice, no
    copy (the reads' hot path: `_verified_at`)."""
    head = buf[at:at + _HDR_LEN]
    short = len(head) < _HDR_LEN
    if short:               # where the file ends: only a header without the extension fits
        if len(head) < _BASE_LEN:
            return None
        head = bytes(head).ljust(_HDR_LEN, b"\0")
    magic, version, flags, key, ns_digest, size, checksum, hdr_sum, written_us, time_sum = _FULL.unpack_from(head)
    if magic != MAGIC:
        return None
    if flags & WRITTEN:     # one hash: time_sum covers every byte before it (hdr_sum included; the flag itself too)
        if short or xxhash.xxh3_64_intdigest(head[:_BASE_LEN + 8]) != time_sum:
            return None
    else:                   # a record of a node from before: hdr_sum (it covers flags: a cleared flag fails here)
        if xxhash.xxh3_64_intdigest(head[:_HDR.size]) != hdr_sum:
            return None
        written_us = 0
    if version != FORMAT_VERSION:
        return None
    return key, ns_digest, size, checksum, written_us


def read_record(fd: int, offset: int, key: bytes, payload: memoryview, ns_digest: bytes | None = None) -> int | None:
    """Read the record at `offset` of `fd` whose payload is `payload.nbytes` bytes: header page and payload in one
    preadv (the payload straight into `payload`, no staging copy). Returns the payload's xxh3_64 (verified equal to
    the header's), or None when the header's magic, version, checksum, key, size (or `ns_digest`, when given) do
    not match, the payload does not hash to the header's checksum, the read comes up short or fails."""
    return read_records(fd, (offset,), (key,), (payload,), ns_digest)[0]


def read_records(fd: int, offsets, keys, payloads, ns_digest: bytes | None = None) -> list[int | None]:
    """`read_record` of each (offset, key, payload), one list of results in the callers' order.

    Read in C (kvpool/_copyhash.c `read_records`, the same plan and checks in one call with the GIL released) where
    it takes the arguments, with this function's Python reader (`_read_records`) otherwise: a payload of 240 bytes
    or fewer, the one-pass copy off (KVPOOL_NATIVE_COPY=0) or not built. At 64 KiB the Python reader spent ~4 us of
    interpreter time per record. tests/tiers/test_ssd_native.py runs both over the same good and damaged records.
    """
    results = _read_native(fd, offsets, keys, payloads, None, ns_digest)
    return _read_records(fd, offsets, keys, payloads, ns_digest) if results is None else results


def _read_native(fd: int, offsets, keys, payloads, sizes, ns_digest: bytes | None,
                 limit: int = (1 << 64) - 1) -> list[int | None] | None:
    """`copyhash.read_records` (the C reader), each record whose read failed logged; None where it refuses."""
    native = copyhash.read_records(fd, offsets, keys, payloads, sizes, ns_digest, limit)
    if native is None:
        return None
    results, failures = native
    for offset, err in failures:
        log.warning("SSD read failed at offset %d: %s", offset, os.strerror(err))
    return results


def _read_records(fd: int, offsets, keys, payloads, ns_digest: bytes | None = None) -> list[int | None]:
    """The Python reader of `read_records`.

    Records that lie one after the other in the file (a chain's blocks written together, the common case) are read
    with one preadv per run: header, the rest of its page, payload, header..., each payload straight into its
    caller's buffer, a header page's unused bytes and a gap of up to `_MAX_GAP` bytes between two records into
    scratch buffers shared by every call (80 bytes of header per record are all a call allocates). At 64 KiB a preadv
    per record cost ~18% of the read on the team machine (bench/ssd_read.py). A run stops at `_MAX_RUN` bytes: each
    payload is hashed right after its run's preadv, and a 1 MiB run is still in the core's cache then (2-core EPYC VM,
    1 MiB L2 per core, 2026-11-28, 192 MiB read with the page cache dropped, medians of 7 interleaved passes: 720 KiB
    records 2.33 GB/s with 1 MiB runs against 2.20 unbounded, 2.19 with 256 KiB; 64 KiB records 2.23 against
    2.10). A run that fails (an I/O error, a short read) is read again record by record, so one bad record is one
    miss, as before."""
    n = len(offsets)
    out: list[int | None] = [None] * n
    if n == 0:
        return out
    heads = memoryview(bytearray(_HDR_LEN * n))     # the header's bytes; the rest of its page lands in _PAD_VIEW
    order = sorted(range(n), key=offsets.__getitem__) if n > 1 else [0]
    preadv = os.preadv
    at = 0
    while at < n:
        first = order[at]
        start = offsets[first]
        iov = [heads[first * _HDR_LEN:(first + 1) * _HDR_LEN], _PAD_VIEW, payloads[first]]
        end = start + HEADER_BYTES + payloads[first].nbytes
        stop = at + 1
        while stop < n and len(iov) + 4 <= _IOV_CAP:
            i = order[stop]
            gap = offsets[i] - end
            if gap < 0 or gap > _MAX_GAP or offsets[i] + HEADER_BYTES + payloads[i].nbytes - start > _MAX_RUN:
                break
            if gap:
                iov.append(_GAP_VIEW[:gap])
            iov += (heads[i * _HDR_LEN:(i + 1) * _HDR_LEN], _PAD_VIEW, payloads[i])
            end = offsets[i] + HEADER_BYTES + payloads[i].nbytes
            stop += 1
        run = order[at:stop]
        try:
            got = preadv(fd, iov, start)
        except OSError:
            if len(run) == 1:
                log.warning("SSD read failed at offset %d", start, exc_info=True)
            got = -1
        for i in run:
            if got >= offsets[i] + HEADER_BYTES + payloads[i].nbytes - start:
                out[i] = _verified_at(heads, i * _HDR_LEN, payloads[i], keys[i], ns_digest)
            elif len(run) > 1:   # the run failed or came up short: this record alone decides
                out[i] = _read_records(fd, (offsets[i],), (keys[i],), (payloads[i],), ns_digest)[0]
        at = stop
    return out


def _verified_at(heads: memoryview, at: int, payload: memoryview, key: bytes, ns_digest: bytes | None) -> int | None:
    """The payload's xxh3_64 when heads[at:at + _HDR_LEN] is a valid header of `key` (and `ns_digest`, when given)
    for exactly `payload.nbytes` bytes and the payload hashes to its checksum; else None."""
    parsed = _unpack_header(heads, at)
    if parsed is None or parsed[0] != key or parsed[2] != payload.nbytes or (ns_digest is not None and
                                                                           parsed[1] != ns_digest):
        return None
    digest = xxhash.xxh3_64_intdigest(payload)
    return digest if digest == parsed[3] else None


class SsdReader:
    """Read-only access to a node's data file from another process on its host (kvpool/transfer.py: a same-host
    client reads SSD records itself instead of through the node's data channel). Opens the file O_RDONLY and
    never locks or writes it; `read_into` runs SsdFile's checks. Safe against a concurrent writer: the payload is
    hashed in the caller's buffer after the read, so bytes the node changed meanwhile fail the check (a miss)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read_into(self, offset: int, key: bytes, out: memoryview) -> int | None:
        """The record at `offset` (key `key`, payload `out.nbytes` bytes) into `out`: its verified xxh3_64, or
        None (a miss; `out` is then undefined)."""
        return self.read_many_into((offset,), (key,), (out,))[0]

    def read_many_into(self, offsets, keys, outs) -> list[int | None]:
        """`read_into` of each (offset, key, out) in turn, in one loop (the C reader checks the offsets itself;
        what it refuses is checked here, by name, before the Python reader runs)."""
        if self._fd < 0:
            raise ValueError(f"SsdReader of {self.path} is closed")
        results = _read_native(self._fd, offsets, keys, outs, None, None)
        if results is not None:
            return results
        for offset in offsets:
            if offset < 0 or offset % ALIGN:
                raise ValueError(f"offset must be an int >= 0 and a multiple of {ALIGN}, got {offset!r}")
        return _read_records(self._fd, offsets, keys, outs)

    def replaced(self) -> bool:
        """Whether `path` names another file now (or none) than the one this reader has open."""
        try:
            now = os.stat(self.path)
        except OSError:
            return True
        held = os.fstat(self._fd) if self._fd >= 0 else None
        return held is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            self.close()

    def __repr__(self) -> str:
        return f"SsdReader({self.path!r})"


class SsdFile:
    """One preallocated data file under `directory`. Thread-safe: positional I/O only (pread/pwrite/preadv)."""

    def __init__(self, directory: str, path: str, fd: int, capacity: int) -> None:
        self._directory = directory
        self._path = path
        self._fd = fd
        self._capacity = capacity
        self._corrupt_reads = 0
        self._lock = threading.Lock()       # counters only

    @classmethod
    def open(cls, directory: str, capacity: int | None, *, create: bool = True) -> SsdFile:
        """Open (or create and preallocate) `<directory>/kvpool.data` of `capacity` bytes. An existing smaller
        file is grown (a record cut by the old end is erased: a truncated object is a miss); a larger one is a
        ValueError. `capacity=None` with create=False adopts the file's size. The file is locked (flock) so two
        SsdFile objects, in any process, never share it; the kernel drops the lock when its owner dies."""
        if capacity is not None and (not isinstance(capacity, int) or capacity <= 0):
            raise ValueError(f"capacity must be an int > 0, got {capacity!r}")
        if capacity is None and create:
            raise ValueError("capacity is required when create=True")
        if create:
            os.makedirs(directory, exist_ok=True)
        elif not os.path.isdir(directory):
            raise ValueError(f"directory {directory!r} does not exist")
        path = os.path.join(directory, DATA_FILE)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RuntimeError(f"{path} is in use by another SsdFile (close it first)") from None
            existing = os.fstat(fd).st_size
            if capacity is None:
                capacity = existing
                if capacity <= 0:
                    raise ValueError(f"capacity: {path} is empty; pass a capacity")
            if existing > capacity:
                raise ValueError(f"capacity {capacity} is smaller than the existing data file {path} "
                                 f"({existing} bytes); use a larger capacity or a new directory")
            ssd = cls(directory, path, fd, capacity)
            if existing < capacity:
                if existing:
                    # A record cut by the old end would read back as zeros once the file grows: erase it now so
                    # no later scan (or a record the allocator later puts inside its extent) can trip over it.
                    for _ in ssd._scan(existing, verify=False, on_truncated=lambda r: ssd.erase(r.offset)):
                        pass
                _preallocate(fd, existing, capacity)
        except BaseException:
            os.close(fd)
            raise
        log.info("opened SSD tier %s (%d bytes, %d pre-existing)", path, capacity, existing)
        return ssd

    # ---------------------------------------------------------------- properties
    @property
    def directory(self) -> str:
        return self._directory

    @property
    def path(self) -> str:
        return self._path

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def corrupt_reads(self) -> int:
        return self._corrupt_reads

    @property
    def closed(self) -> bool:
        return self._fd < 0

    # ---------------------------------------------------------------- write / read / erase
    def write(self, offset: int, key: bytes, ns_digest: bytes, payload: Any, checksum: int | None = None, *,
              written_us: int = 0) -> int:
        """Write one record at `offset` (allocated with `record_size(len(payload))` bytes); returns the payload
        checksum (computed unless the caller passes the one it already has for the same bytes). `written_us` goes
        into the header: the master's clock (µs since the Unix epoch) as this node last heard it, 0 = unknown."""
        src = as_byte_view(payload, "payload")
        self._check_key(key, "key")
        self._check_key(ns_digest, "ns_digest")
        if isinstance(written_us, bool) or not isinstance(written_us, int) or not 0 <= written_us < 1 << 64:
            raise ValueError(f"written_us must be an int in [0, 2**64), got {written_us!r}")
        offset = self._check_extent(offset, record_size(src.nbytes))
        if checksum is None:
            checksum = xxhash.xxh3_64_intdigest(src)
        elif not isinstance(checksum, int) or not 0 <= checksum < 1 << 64:
            raise ValueError(f"checksum must be an unsigned 64-bit int, got {checksum!r}")
        _pwrite_all(self._fd, _ERASED, offset)               # an old header never vouches for new bytes
        _pwrite_all(self._fd, src, offset + HEADER_BYTES)
        _pwrite_all(self._fd, _pack_header(key, ns_digest, src.nbytes, checksum, written_us), offset)
        return checksum

    def read_into(self, offset: int, key: bytes, size: int, out: Any, *, ns_digest: bytes | None = None) -> bool:
        """Read the record at `offset` into `out[:size]` (one preadv, no staging copy) and verify it. False (a
        miss, counted in `corrupt_reads`) on any mismatch, short read or I/O error; `out` is then undefined."""
        dst = as_byte_view(out, "out")
        if dst.readonly:
            raise ValueError("out must be a writable buffer")
        if not isinstance(size, int) or size < 0 or size > dst.nbytes:
            raise ValueError(f"size must be an int in [0, {dst.nbytes}] (the size of out), got {size!r}")
        self._check_key(key, "key")
        offset = self._check_extent(offset, record_size(size))
        if read_record(self._fd, offset, key, dst[:size], ns_digest) is None:
            return self._corrupt()
        return True

    def read_many_into(self, offsets, keys, sizes, outs) -> list[bool]:
        """`read_into` of each (offset, key, size, out), every argument checked before anything is read, the reads
        in one loop (`read_records`). False entries are misses, counted in `corrupt_reads`."""
        if not len(offsets) == len(keys) == len(sizes) == len(outs):
            raise ValueError(f"offsets, keys, sizes and outs must be as long, got {len(offsets)}, {len(keys)}, "
                             f"{len(sizes)}, {len(outs)}")
        if self._fd < 0 and len(offsets):
            raise ValueError("SSD file is closed")
        capacity = self._capacity
        digests = _read_native(self._fd, offsets, keys, outs, sizes, None, capacity)
        if digests is not None:     # every argument as a get passes it, checked in C (else the loop below names it)
            return self._count_misses([d is not None for d in digests])
        views, checked = [], []
        for i, (offset, key, size, out) in enumerate(zip(offsets, keys, sizes, outs, strict=True)):
            # what a get passes (a flat writable byte memoryview, int offset and size, a 16-byte key): the checks
            # below in one expression, no argument names built (~1 us per record of a 64 KiB get's CPU time)
            if type(out) is memoryview and type(size) is int and type(offset) is int and type(key) is bytes \
                    and len(key) == KEY_BYTES and out.format == "B" and out.ndim == 1 and out.c_contiguous \
                    and not out.readonly and 0 <= size <= out.nbytes and offset >= 0 and not offset % ALIGN \
                    and offset + HEADER_BYTES + size <= capacity:
                checked.append(offset)
                views.append(out if size == out.nbytes else out[:size])
                continue
            dst = as_byte_view(out, f"outs[{i}]")
            if dst.readonly:
                raise ValueError(f"outs[{i}] must be a writable buffer")
            if not isinstance(size, int) or size < 0 or size > dst.nbytes:
                raise ValueError(f"sizes[{i}] must be an int in [0, {dst.nbytes}] (the size of outs[{i}]), "
                                 f"got {size!r}")
            self._check_key(key, f"keys[{i}]")
            checked.append(self._check_extent(offset, record_size(size)))
            views.append(dst[:size])
        return self._count_misses([r is not None for r in read_records(self._fd, checked, keys, views)])

    def payload_offsets(self, offsets, keys, sizes) -> list[int | None]:
        """For each record at offsets[i]: the file offset of its payload when its header is valid for keys[i] and
        exactly sizes[i] payload bytes (magic, version, header sum), else None (a miss, counted in
        `corrupt_reads`). The payload itself is neither read nor hashed: this is for a reader that hashes it as it
        lands and checks it against the committed checksum (the data channel sends it to such a client with
        os.sendfile from `fileno()`, store/data_channel.py FLAG_CHECKED). Every argument is checked before anything
        is read (ValueError naming it)."""
        if not len(offsets) == len(keys) == len(sizes):
            raise ValueError(f"offsets, keys and sizes must be as long, got {len(offsets)}, {len(keys)}, "
                             f"{len(sizes)}")
        checked = []
        for i, (offset, key, size) in enumerate(zip(offsets, keys, sizes)):
            self._check_key(key, f"keys[{i}]")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValueError(f"sizes[{i}] must be an int >= 0, got {size!r}")
            checked.append(self._check_extent(offset, record_size(size)))
        out: list[int | None] = []
        for offset, key, size in zip(checked, keys, sizes):
            try:
                parsed = _unpack_header(os.pread(self._fd, _HDR_LEN, offset))
            except OSError:
                log.warning("SSD header read failed at offset %d", offset, exc_info=True)
                parsed = None
            out.append(offset + HEADER_BYTES if parsed is not None and parsed[0] == key and parsed[2] == size
                       else None)
        self._count_misses([o is not None for o in out])
        return out

    def fileno(self) -> int:
        """The data file's descriptor (-1 once closed), for `payload_offsets`' reader: read it, never write it."""
        return self._fd

    def _count_misses(self, results: list[bool]) -> list[bool]:
        bad = results.count(False)
        if bad:
            with self._lock:
                self._corrupt_reads += bad
        return results

    def erase(self, offset: int) -> None:
        """Invalidate the record at `offset` so `scan` never finds it again."""
        offset = self._check_extent(offset, HEADER_BYTES)
        _pwrite_all(self._fd, _ERASED, offset)

    def erase_many(self, offsets: Any) -> None:
        for offset in offsets:
            self.erase(int(offset))

    # ---------------------------------------------------------------- recovery
    def scan(self, *, verify: bool = False, on_damaged: Any = None) -> Iterator[SsdRecord]:
        """Valid records in offset order. Each aligned page whose header parses is a record; the scan then
        skips its extent. (Records cut by a truncated file were erased by `open`.) With
        verify=True each payload is re-checksummed and a bad one is dropped (the scan then resumes at the next
        page, not past the bad extent); without it, corrupt payloads are found lazily by `read_into`.
        `on_damaged(offset)` is called for each page that starts with the record magic but whose header does not
        verify (a damaged header: the record is lost)."""
        return self._scan(self._capacity, verify, on_truncated=None, on_damaged=on_damaged)

    def _scan(self, end: int, verify: bool, on_truncated: Any, on_damaged: Any = None) -> Iterator[SsdRecord]:
        magic = np.frombuffer(MAGIC, dtype=np.uint8)
        pos = 0                                              # always page-aligned
        while pos + _BASE_LEN <= end:                      # (a WRITTEN header cut by the end fails to parse)
            try:                                             # jump over never-written (unwritten/hole) extents
                pos = max(pos, os.lseek(self._fd, pos, os.SEEK_DATA) // ALIGN * ALIGN)
            except OSError as e:
                if e.errno == errno.ENXIO:                   # nothing but holes up to the end of the file
                    return
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
            if pos + _BASE_LEN > end:
                return
            chunk = os.pread(self._fd, min(_SCAN_CHUNK, end - pos), pos)
            if len(chunk) < _BASE_LEN:
                return
            n_pages = (len(chunk) - _BASE_LEN) // ALIGN + 1  # pages whose base header lies in this chunk
            heads = np.frombuffer(chunk, dtype=np.uint8)[np.arange(n_pages)[:, None] * ALIGN + np.arange(4)]
            skip_to = pos                                    # the next offset a record may start at
            for page in np.flatnonzero((heads == magic).all(axis=1)).tolist():
                off = pos + page * ALIGN
                if off < skip_to:
                    continue                                 # inside the previous record's payload
                parsed = _unpack_header(memoryview(chunk)[page * ALIGN:page * ALIGN + _HDR_LEN])
                if parsed is None:
                    if on_damaged is not None:  # the magic is there, the header's checksum or version is not
                        on_damaged(off)
                    continue
                rec = SsdRecord(parsed[0], parsed[1], off, parsed[2], parsed[3], parsed[4])
                if off + rec.record_size > end:
                    log.info("SSD record at %d runs past the end of the file (truncated): dropped", off)
                    if on_truncated is not None:
                        on_truncated(rec)
                    continue
                if verify and not self.verify(rec):
                    log.info("SSD record at %d fails its checksum: dropped", off)
                    continue
                yield rec
                skip_to = off + _round_up(rec.record_size, ALIGN)
            pos = max(pos + n_pages * ALIGN, skip_to)

    def verify(self, record: SsdRecord) -> bool:
        """Re-read and re-checksum a record's payload (streaming, 4 MiB at a time)."""
        h = xxhash.xxh3_64()
        pos, left = record.offset + HEADER_BYTES, record.size
        while left:
            data = os.pread(self._fd, min(left, 4 << 20), pos)
            if not data:
                return False
            h.update(data)
            pos += len(data)
            left -= len(data)
        return h.intdigest() == record.checksum

    # ---------------------------------------------------------------- lifetime
    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)             # also drops the flock

    def __enter__(self) -> SsdFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SsdFile({self._path!r}, capacity={self._capacity}, corrupt_reads={self._corrupt_reads})"

    # ---------------------------------------------------------------- internals
    def _corrupt(self) -> bool:
        with self._lock:
            self._corrupt_reads += 1
        return False

    def _check_key(self, key: Any, argname: str) -> None:
        if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
            raise ValueError(f"{argname} must be {KEY_BYTES} bytes, got {key!r:.60}")

    def _check_extent(self, offset: Any, size: int) -> int:
        if self._fd < 0:
            raise ValueError("SSD file is closed")
        if not isinstance(offset, (int, np.integer)) or offset < 0 or offset % ALIGN:
            raise ValueError(f"offset must be an int >= 0 and a multiple of {ALIGN}, got {offset!r}")
        if offset + size > self._capacity:
            raise ValueError(f"offset + record size ({offset} + {size}) exceeds the SSD capacity {self._capacity}")
        return int(offset)


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _preallocate(fd: int, start: int, end: int) -> None:
    try:
        os.posix_fallocate(fd, start, end - start)
    except OSError as e:                      # e.g. a filesystem without fallocate: sparse file instead
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, end)


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data)
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n
