"""DramArena: the DRAM tier's bytes, one shared-memory file reserved once at start.

```
 /dev/shm/kvpool-<name>   (posix_fallocate'd, so running out of RAM shows at start, not as SIGBUS mid-write)
 [0 ........................................................................... capacity)
   |<- object A ->|      |<---- object B ---->|        offsets come from the master's OffsetAllocator
 node process:   mmap(MAP_SHARED) ──┐
 same-host client: DramArena.attach(path) maps the same pages; a put/get is one memcpy into/out of them
```
Invariants: the mapping lives as long as the arena; `view`/`array` return views of it (never copies) and are
bounds-checked; `write`/`read_into` are exactly one memcpy (measured: memoryview slice assignment and
numpy.copyto run at the same speed for 2 MiB, ~14-15 GB/s here, equal to a plain numpy memcpy; we use the
memoryview form so any buffer-protocol object works without numpy conversions).

The arena knows nothing about which extents are in use; that is the allocator's job (in the master).

Crash hygiene: the creating process holds an exclusive `flock` on its arena file for the arena's life. The kernel
drops it when the process dies, even by SIGKILL, so a file under the prefix that nobody holds is a leftover of a
crashed node: `create` unlinks such files (`sweep_stale_arenas`) before reserving its own, or a node that crashed
and restarted would keep its old arena's RAM pinned in /dev/shm until reboot. Peers that `attach` never lock. The
lock is taken on a descriptor no mapping is made from, so `close` drops it even while views of the arena live on.
`pin()` registers the mapping with CUDA (cudaHostRegister through CuPy, tiers/gpu.py) where a GPU exists so
device copies are direct DMA; it reports whether that worked and never raises.

`prefault()` fills in this process's page tables for the arena ahead of use: a freshly attached mapping otherwise
pays a page fault per 4-64 KiB on its first read of every page (~20 ms of a fresh client's first 180 MiB load,
measured on the 2-core box 2026-11-26). The pages themselves already exist (the owner fallocated them), so it costs
page-table memory (~2 MiB per GiB mapped) and CPU, no RAM for data; a same-host client calls it once, at start.

The tail page: the file is `capacity` rounded up to a page, then the host index region (`index_slots` x 64 bytes,
none by default; the node's published index of its objects, tiers/host_index.py, which this module only maps),
then one page that holds no objects: a magic, the capacity, the arena's *removal generation*, a 64-bit counter
only the owner writes (`bump_generation`), the number of index slots, and (from byte 256) same-host writers' claims
on the extents they are copying into (tiers/writer_claims.py: `writer_claims`, `claimed_ranges`). The node
bumps it when the master tells it objects were removed (`kvpool rm`, an admin evict) and when it registers with a
master, so a same-host client's location cache (kvpool/locations.py) can tell, with one load from its own mapping and
no round trip, that something it remembers may have been removed since the master last told it where that object
was. An aligned 8-byte store is atomic on every platform this runs on: a reader sees the old or the new value.

Huge pages (`huge_pages(directory)`, the `huge_pages` property, the node's "created DRAM arena" log line): an arena
whose file lives on a tmpfs mounted with `huge=within_size` (or `always`) is reserved by fallocate in 2 MiB pages.
Measured 2026-11-29 on the 2-core box (bench/arena_pages.py, medians of 7 and 15 rounds): a fresh client's
prefault of 1 GiB 1.0 ms against 67.9 ms, and copies out of it through the read fence 1.08-1.11x as fast (fewer
TLB misses). `huge=advise` does not give them: fallocate takes base pages there (only faults in a madvised mapping
get huge ones), and the arena is reserved up front so that running out of RAM shows at start. /dev/shm is mounted
without `huge=` on common distributions, so this is the operator's choice: `shm_dir` on such a mount (README
"Huge pages for the arena").

One module of ~600 lines because it is one concept, the arena: its file, its mapping, and views into it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import logging
import mmap
import operator
import os
import re
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import gpu
from .writer_claims import BLOCKS, CELLS, CLAIMS_AT, WriterClaims, claimed

log = logging.getLogger(__name__)

PREFIX = "kvpool-"
_MADV_POPULATE_READ = 22       # Linux >= 5.14; older kernels answer EINVAL and the pages are touched instead
_PREFAULT_CHUNK = 32 << 20     # per madvise call: the GIL is released around each one (ctypes)
_PAGE = mmap.PAGESIZE
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
_TAIL_MAGIC = b"kvpoolT1"      # tail page: magic (8 bytes), capacity (u64 LE), removal generation (u64 LE),
_GEN_AT = 16                   # index slots (u64 LE; 0 in files of nodes without a host index)
_SLOTS_AT = 24
_HUGE_TMPFS = ("always", "within_size")   # tmpfs huge= settings under which fallocate reserves 2 MiB pages
INDEX_SLOT_BYTES = 64          # one host index slot (tiers/host_index.py); a page holds 64 of them
MAX_INDEX_SLOTS = 1 << 24


def _tail_offset(capacity: int) -> int:
    """Where the tail page starts: the capacity rounded up to a page (mmap offsets must be page-aligned)."""
    return -(-capacity // _PAGE) * _PAGE


def as_byte_view(data: Any, argname: str = "data") -> memoryview:
    """A flat unsigned-byte memoryview over `data` (bytes, bytearray, memoryview, numpy array, mmap, ...) without
    copying. ValueError naming `argname` for objects without the buffer protocol or non-contiguous memory."""
    try:
        m = memoryview(data)
    except TypeError:
        raise ValueError(f"{argname} must support the buffer protocol (bytes, bytearray, memoryview, numpy "
                         f"array; for a torch CPU tensor pass tensor.numpy()), got {type(data).__name__}") from None
    if not m.c_contiguous:
        raise ValueError(f"{argname} must be C-contiguous")
    if m.format != "B" or m.ndim != 1:
        m = m.cast("B") if m.nbytes else memoryview(b"")  # cast refuses zeros in the shape
    return m


def sweep_stale_arenas(directory: str = "/dev/shm") -> list[str]:
    """Unlink `kvpool-*` arena files in `directory` whose creating process is gone (no flock held on them).
    Returns the paths removed. Files of live nodes, and anything not named like an arena, are left alone."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(PREFIX):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if not os.path.isfile(path):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue                                # a live process owns it
            os.unlink(path)
            removed.append(path)
            log.warning("removed stale DRAM arena %s (its node is gone)", path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


class DramArena:
    """One shared-memory file of `capacity` bytes, mapped read-write. Use `create` (owner) or `attach` (peer)."""

    def __init__(self, path: str, fd: int, mm: mmap.mmap, capacity: int, owner: bool, tail: mmap.mmap,
                 index_bytes: int = 0) -> None:
        self._path = path
        self._tail: mmap.mmap | None = tail     # the index region, then the tail page
        self._index_bytes = index_bytes
        self._gen: np.ndarray | None = np.frombuffer(tail, dtype="<u8", count=1, offset=index_bytes + _GEN_AT)
        self._fd = fd
        self._mm: mmap.mmap | None = mm
        self._mv: memoryview | None = memoryview(mm)
        self._np: np.ndarray | None = np.frombuffer(mm, dtype=np.uint8)
        self._capacity = capacity
        self._owner = owner
        self._pinned = False
        self._pin_error: str | None = None

    # ---------------------------------------------------------------- construction
    @classmethod
    def create(cls, capacity: int, name: str | None = None, directory: str = "/dev/shm", *,
               index_slots: int = 0) -> DramArena:
        """Create and map `<directory>/kvpool-<name>`; fails if it exists (two nodes must not share an arena).
        `index_slots`: room for a host index (tiers/host_index.py), a multiple of 64 (whole pages), or 0."""
        if not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"capacity must be an int > 0, got {capacity!r}")
        if isinstance(index_slots, bool) or not isinstance(index_slots, int) \
                or not 0 <= index_slots <= MAX_INDEX_SLOTS or (index_slots * INDEX_SLOT_BYTES) % _PAGE:
            raise ValueError(f"index_slots must be an int in [0, {MAX_INDEX_SLOTS}] filling whole pages "
                             f"({_PAGE // INDEX_SLOT_BYTES} slots each), got {index_slots!r}")
        index_bytes = index_slots * INDEX_SLOT_BYTES
        if name is None:
            name = secrets.token_hex(8)
        elif not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(f"name must be 1-200 characters of [A-Za-z0-9_.-], got {name!r}")
        if not os.path.isdir(directory):
            raise ValueError(f"directory {directory!r} does not exist")
        path = os.path.join(directory, PREFIX + name)
        sweep_stale_arenas(directory)
        # Created under a name the sweep ignores, locked, then linked into place: a concurrent sweep in another
        # process can never see the new arena unlocked.
        tmp = os.path.join(directory, f".{PREFIX}new-{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.link(tmp, path)                          # fails if `path` exists: two nodes never share an arena
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.unlink(tmp)
        try:
            size = _tail_offset(capacity) + index_bytes + _PAGE
            try:
                os.posix_fallocate(fd, 0, size)    # reserve the pages now (tmpfs honours this)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    st = os.statvfs(directory)
                    raise OSError(errno.ENOSPC, f"capacity {capacity} bytes does not fit in {directory} "
                                  f"({st.f_bavail * st.f_frsize} bytes free)", path) from None
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                os.ftruncate(fd, size)
            # Mapped through a second open of the file: each mmap keeps a dup of the descriptor it was made from
            # (so the flock's open file description would live as long as any view of the arena), and `close`
            # must drop the lock even while a caller still holds a view (a host index, an engine's buffer).
            map_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                tail = mmap.mmap(map_fd, index_bytes + _PAGE, flags=mmap.MAP_SHARED,
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=_tail_offset(capacity))
                tail[index_bytes:index_bytes + _GEN_AT] = _TAIL_MAGIC + capacity.to_bytes(8, "little")
                tail[index_bytes + _SLOTS_AT:index_bytes + _SLOTS_AT + 8] = index_slots.to_bytes(8, "little")
                mm = mmap.mmap(map_fd, capacity, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(map_fd)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        log.info("created DRAM arena %s (%d bytes, %s)", path, capacity, page_kind(directory))
        return cls(path, fd, mm, capacity, owner=True, tail=tail, index_bytes=index_bytes)

    @classmethod
    def attach(cls, path: str, capacity: int | None = None) -> DramArena:
        """Map an existing arena (a same-host client). `capacity` defaults to the arena's, read from its tail page;
        a larger one is an error, as is a file without a kvpool tail page. Closing an attached arena never unlinks
        it."""
        if capacity is not None and (not isinstance(capacity, int) or capacity <= 0):
            raise ValueError(f"capacity must be an int > 0 or None, got {capacity!r}")
        fd = os.open(path, os.O_RDWR)
        tail = None
        try:
            size = os.fstat(fd).st_size
            if size < _PAGE or size % _PAGE:
                raise ValueError(f"{path!r} is not a kvpool DRAM arena ({size} bytes: no tail page)")
            with mmap.mmap(fd, _PAGE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=size - _PAGE) as last:
                if last[0:8] != _TAIL_MAGIC:
                    raise ValueError(f"{path!r} is not a kvpool DRAM arena (its tail page has no magic)")
                own = int.from_bytes(last[8:_GEN_AT], "little")
                index_bytes = int.from_bytes(last[_SLOTS_AT:_SLOTS_AT + 8], "little") * INDEX_SLOT_BYTES
            if capacity is None:
                capacity = own
            if capacity > own or _tail_offset(own) + index_bytes + _PAGE != size:
                raise ValueError(f"capacity {capacity} does not fit the arena file {path!r} of {own} bytes")
            tail = mmap.mmap(fd, index_bytes + _PAGE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE,
                             offset=_tail_offset(own))
            mm = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            if tail is not None:
                tail.close()
            os.close(fd)
            raise
        return cls(path, fd, mm, capacity, owner=False, tail=tail, index_bytes=index_bytes)

    # ---------------------------------------------------------------- properties
    @property
    def path(self) -> str:
        return self._path

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def huge_pages(self) -> str | None:
        """Why this arena's pages are 2 MiB (`huge_pages` of its directory), or None where they are base pages."""
        return huge_pages(os.path.dirname(self._path))

    @property
    def closed(self) -> bool:
        return self._mm is None

    @property
    def generation(self) -> int:
        """The removal generation (module docstring): it only grows while the owner lives. -1 once closed."""
        gen = self._gen
        return -1 if gen is None else int(gen[0])

    def bump_generation(self) -> int:
        """Owner only (the node, which serialises its callers): generation + 1, returned."""
        if not self._owner:
            raise ValueError("only the arena's owner bumps its removal generation")
        gen = self._gen
        if gen is None:
            raise ValueError("arena is closed")
        gen[0] += 1         # one aligned 8-byte store: readers see the old value or the new one
        return int(gen[0])

    @property
    def index_region(self) -> memoryview | None:
        """The host index region (tiers/host_index.py interprets it), or None when the arena has none or is
        closed."""
        if self._tail is None or not self._index_bytes:
            return None
        return memoryview(self._tail)[:self._index_bytes]

    def writer_claims(self) -> "WriterClaims | None":
        """A same-host writer's block of claims on this arena (tiers/writer_claims.py), held while this arena is
        open here; None when every block is held or the filesystem has no OFD locks (write over the data channel
        then). Not for the owner."""
        if self._owner:
            raise ValueError("the arena's owner scans writers' claims (`claimed_ranges`), it holds none")
        table = self._claims_table()
        return None if table is None else WriterClaims.open(self._fd, table)

    def claimed_ranges(self) -> list[tuple[int, int]]:
        """Owner only (the node's heartbeat): the [start, end) arena ranges that same-host writers alive may be
        copying into now (tiers/writer_claims.py `claimed`)."""
        if not self._owner:
            raise ValueError("only the arena's owner scans writers' claims")
        table = self._claims_table()
        return [] if table is None else claimed(self._fd, table)

    def _claims_table(self) -> np.ndarray | None:
        if self._tail is None:
            return None
        return np.frombuffer(self._tail, dtype="<u8", count=BLOCKS * CELLS * 2,
                             offset=self._index_bytes + CLAIMS_AT)

    @property
    def pinned(self) -> bool:
        return self._pinned

    @property
    def address(self) -> int:
        """Virtual address of byte 0 of this process's mapping (for DMA registration / ctypes copies)."""
        return int(self._array().__array_interface__["data"][0])

    # ---------------------------------------------------------------- data path
    def view(self, offset: int, size: int) -> memoryview:
        """Writable memoryview of [offset, offset + size): no copy."""
        offset, size = self._check(offset, size)
        assert self._mv is not None
        return self._mv[offset:offset + size]

    def views(self, offsets: Sequence[int], sizes: Sequence[int]) -> list[memoryview]:
        """`view` of each (offsets[i], sizes[i]), in one call (a read's batch of extents)."""
        if self._mm is None:
            raise ValueError("arena is closed")
        if len(offsets) != len(sizes):
            raise ValueError(f"offsets and sizes differ in length ({len(offsets)}, {len(sizes)})")
        mv, cap, index = self._mv, self._capacity, operator.index
        assert mv is not None
        out = []
        for i, (offset, size) in enumerate(zip(offsets, sizes)):
            try:
                o, z = index(offset), index(size)
            except TypeError:
                o = _index(offset, f"offsets[{i}]")
                z = _index(size, f"sizes[{i}]")
            if o < 0 or z < 0 or o + z > cap:
                o, z = _index(o, f"offsets[{i}]"), _index(z, f"sizes[{i}]")
                raise ValueError(f"offsets[{i}] + sizes[{i}] ({o} + {z}) exceeds the arena capacity {cap}")
            out.append(mv[o:o + z])
        return out

    def array(self, offset: int, size: int) -> np.ndarray:
        """Writable numpy uint8 view of [offset, offset + size): no copy."""
        offset, size = self._check(offset, size)
        return self._array()[offset:offset + size]

    def write(self, offset: int, data: Any) -> int:
        """Copy `data` (any C-contiguous buffer) to `offset` in one memcpy; returns the byte count."""
        src = as_byte_view(data)
        offset, n = self._check(offset, src.nbytes)
        assert self._mv is not None
        self._mv[offset:offset + n] = src
        return n

    def read_into(self, offset: int, out: Any) -> int:
        """Copy `len(out)` bytes starting at `offset` into the writable buffer `out`; returns the byte count."""
        dst = as_byte_view(out, "out")
        if dst.readonly:
            raise ValueError("out must be a writable buffer")
        offset, n = self._check(offset, dst.nbytes)
        assert self._mv is not None
        dst[:] = self._mv[offset:offset + n]
        return n

    def owner_alive(self) -> bool:
        """Whether the process that created this arena still holds it (its flock). An attached peer asks before it
        commits bytes it copied in: the kernel drops the lock when the owner dies, even by SIGKILL, so a free lock
        means nobody will ever serve these bytes again. (A concurrent `sweep_stale_arenas` briefly holding the lock
        reads as "alive"; it unlinks the file of a dead owner anyway.) The owner itself always answers True."""
        if self._owner:
            return self._fd >= 0
        if self._fd < 0:
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        return False

    # ---------------------------------------------------------------- page tables
    def prefault(self, max_bytes: int | None = None, *, stop: Callable[[], bool] | None = None) -> int:
        """Map this process's page-table entries for the first `max_bytes` of the arena (None: all of it), so
        later copies in or out of it take no page faults. Meant for start-up, off any request's path: a same-host
        client's mapping, and the node's own (its writer thread, store/node.py); runs in chunks that release the
        GIL. `stop`: asked before each chunk, True ends it there (a node closing). Returns the bytes populated (0 on
        a closed arena). Only a bad `max_bytes` raises (ValueError); a kernel without MADV_POPULATE_READ gets one
        read per page instead (on a shared tmpfs mapping a read fault maps the page writable, so the owner's
        writes take no fault after it either)."""
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                      or max_bytes < 0):
            raise ValueError(f"max_bytes must be an int >= 0 or None, got {max_bytes!r}")
        arr = self._np          # held: the mapping stays alive (close() defers the unmap) while we work
        if arr is None:
            return 0
        total = self._capacity if max_bytes is None else min(max_bytes, self._capacity)
        base = int(arr.__array_interface__["data"][0])
        madvise = _libc_madvise()
        done = 0
        while done < total and not (stop is not None and stop()):
            n = min(_PREFAULT_CHUNK, total - done)
            if madvise is None or madvise(ctypes.c_void_p(base + done), ctypes.c_size_t(n),
                                          _MADV_POPULATE_READ) != 0:
                madvise = None  # EINVAL (older kernel) or anything else: read one byte per page from here on
                int(arr[done:done + n:_PAGE].sum(dtype=np.uint64))
            done += n
        return done

    # ---------------------------------------------------------------- pinning
    def pin(self) -> bool:
        """Register this process's mapping as page-locked host memory (cudaHostRegister through CuPy's runtime
        API), so every host <-> device copy into or out of it is DMA, with no driver staging copy. Pinning is per
        process (per mapping): the node pins its own for HBM <-> DRAM moves, a same-host engine pins its attached
        mapping. True = pinned; False = not (no CUDA device, or the registration failed: `pin_error` says why,
        and copies still work, staged by the driver). Never raises."""
        if self._pinned:
            return True
        if self._mm is None:
            self._pin_error = "arena is closed"
            return False
        reason = gpu.unavailable_reason()
        if reason is not None:
            self._pin_error = reason
            return False
        try:
            gpu.host_register(self.address, self._capacity)
        except RuntimeError as exc:   # e.g. RLIMIT_MEMLOCK below the arena size in a container
            fstype, mount = gpu.filesystem_of(self._path)
            hint = "" if fstype in gpu.PINNABLE_FILESYSTEMS else (
                f"; the arena file is on {fstype} ({mount}): Linux 6.5+ refuses long-term pins of writable file "
                f"mappings outside tmpfs/hugetlbfs, so put shm_dir on /dev/shm")
            self._pin_error = f"{exc}{hint}"
            log.warning("DRAM arena %s not pinned (%s); host <-> device copies will be staged", self._path, exc)
            return False
        self._pinned = True
        self._pin_error = None
        log.info("DRAM arena %s pinned (%d bytes registered with CUDA)", self._path, self._capacity)
        return True

    @property
    def pin_error(self) -> str | None:
        """Why the last `pin()` returned False (None when pinned or never asked)."""
        return self._pin_error

    def unpin(self) -> None:
        if self._pinned:
            gpu.host_unregister(self.address)
            self._pinned = False

    # ---------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Unmap and close. Views handed out keep the pages alive until they are dropped (mmap refuses to unmap
        exported memory); the arena itself is unusable after close. Idempotent."""
        if self._mm is None:
            return
        try:
            self.unpin()
        except RuntimeError:
            log.warning("cudaHostUnregister failed for %s", self._path, exc_info=True)
        mm, self._mm = self._mm, None
        self._np = None
        self._gen = None
        tail, self._tail = self._tail, None
        if tail is not None:
            try:
                tail.close()
            except BufferError:     # a host index (tiers/host_index.py) still views it: unmapped when it is dropped
                log.debug("arena %s: index region closed with views outstanding", self._path)
        if self._mv is not None:
            self._mv.release()
            self._mv = None
        try:
            mm.close()
        except BufferError:
            # A caller still holds a view: the mapping is released with the last view (refcounting).
            log.debug("arena %s closed with views outstanding; unmapped when they are dropped", self._path)
        os.close(self._fd)
        self._fd = -1

    def unlink(self) -> None:
        """Remove the shared-memory file (pages are freed once every process has unmapped). Idempotent."""
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> DramArena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        if self._owner:
            self.unlink()

    def __repr__(self) -> str:
        state = "closed" if self._mm is None else ("pinned" if self._pinned else "mapped")
        return f"DramArena({self._path!r}, capacity={self._capacity}, {state})"

    # ---------------------------------------------------------------- internals
    def _array(self) -> np.ndarray:
        if self._np is None:
            raise ValueError("arena is closed")
        return self._np

    def _check(self, offset: Any, size: Any) -> tuple[int, int]:
        """Validated (offset, size) as Python ints (numpy integers from an offsets array are accepted)."""
        if self._mm is None:
            raise ValueError("arena is closed")
        offset, size = _index(offset, "offset"), _index(size, "size")
        if offset + size > self._capacity:
            raise ValueError(f"offset + size ({offset} + {size}) exceeds the arena capacity {self._capacity}")
        return offset, size


def huge_pages(directory: str, *, mountinfo: str | None = None, shmem_enabled: str | None = None) -> str | None:
    """Why an arena created in `directory` is reserved in 2 MiB pages, or None where it gets base pages: the file
    system it lives on, from the mount whose mount point is the longest prefix of the directory's real path (the
    last one listed, where mounts stack): "hugetlbfs", "tmpfs huge=always" / "tmpfs huge=within_size", or "tmpfs
    (shmem_enabled force)" where the kernel forces huge pages on every tmpfs; None on any other file system, a tmpfs
    mounted with huge=never / advise / no huge= option, or where /sys says "deny". `mountinfo` and `shmem_enabled`
    replace /proc/self/mountinfo and /sys/kernel/mm/transparent_hugepage/shmem_enabled (tests); an unreadable one
    counts as empty."""
    if mountinfo is None:
        mountinfo = _read_text("/proc/self/mountinfo")
    if shmem_enabled is None:
        shmem_enabled = _read_text("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
    target = os.path.realpath(directory)
    best: tuple[int, str, str] | None = None
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), rest[0], rest[2])
    if best is None:
        return None
    fstype, options = best[1], best[2].split(",")
    if fstype == "hugetlbfs":
        return "hugetlbfs"
    if fstype != "tmpfs":
        return None
    forced = re.search(r"\[(\w+)\]", shmem_enabled)
    if forced and forced.group(1) == "deny":
        return None
    if forced and forced.group(1) == "force":
        return "tmpfs (shmem_enabled force)"
    huge = next((o.split("=", 1)[1] for o in options if o.startswith("huge=")), "never")
    return f"tmpfs huge={huge}" if huge in _HUGE_TMPFS else None


def page_kind(directory: str) -> str:
    """`huge_pages` in words, as the banner, the node's log and the benches print it: "2 MiB pages, tmpfs
    huge=within_size" (say), or "base pages"."""
    pages = huge_pages(directory)
    return f"2 MiB pages, {pages}" if pages else "base pages"


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


@functools.cache
def _libc_madvise():
    """libc's madvise through ctypes (which releases the GIL around the call), or None where it cannot be found."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def _index(value: Any, argname: str) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{argname} must be an int >= 0, got {value!r}") from None
    if v < 0:
        raise ValueError(f"{argname} must be an int >= 0, got {value!r}")
    return v
