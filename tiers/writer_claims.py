"""Same-host writers' claims on the DRAM extents they are copying into, kept in the arena file's tail page, so that
a node can tell its master which expired grants' extents a stalled writer may still be writing.

Why: a same-host client copies a put's bytes straight into the node's arena. It checks its grant's deadline right
before the copy, but nothing can stop a copy once it has started: a writer stopped in the middle of it (SIGSTOP, a
long GC pause) past its grant's expiry used to land the rest of its bytes on whatever the master had placed on that
extent since, an acknowledged object lost (a checksum miss for every reader). Now the master frees such an extent
only once the node has seen that no writer claims it.

Layout (tail page of the arena, tiers/dram.py; bytes 0-31 are the arena's own header):

    CLAIMS_AT + 16 * (block * CELLS + cell)   two u64: start + 1 and end of the arena range a copy into which may
                                              run now (0, 0: none)

A writer process owns one block of CELLS cells. It holds an OFD write lock (fcntl F_OFD_SETLK) on byte
`LOCK_BASE + block` of the arena file (past its end: the lock takes no bytes); the kernel drops it when the process
closes the arena or dies, even by SIGKILL. A copy in flight takes a cell (a thread's copies, one at a time; or a
zero-staging put's extents, from its reserve to its commit, as one range around them all).

    writer (kvpool/transfer.py,   hold(cell, start, end), then check the grant's deadline, copy, drop(cell)
      kvpool/client.py)
    node (its heartbeat)          `claimed(fd, table)`: the ranges claimed by writers alive; a block whose lock
                                  nobody holds belongs to a writer gone, and is cleared under that lock
    master (store/master.py)      frees an expired DRAM grant's extent on such a node only on the second heartbeat
                                  after the expiry whose scan names no range over it

Why that is enough: the writer stores its claim before it reads the clock for its deadline check, and its deadline
is before the grant's expiry. The heartbeat the master counts is sent after the node received the reply to one the
master answered after the expiry, so its scan ran after the expiry too: a writer whose check passed had stored its
claim before the scan began, and its claim is gone from that scan only once its copy is over. (An aligned 8-byte
store is atomic; the scan comes seconds, never nanoseconds, after the store.)

A process that gets no block (every block held: BLOCKS writer processes on one node's arena at once), or no free
cell (CELLS copies of its own in flight), writes over that node's data channel instead, where the node's own write
fence applies (store/write_fence.py).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading

import numpy as np

CLAIMS_AT = 256                 # in the tail page; the arena's header uses its first 32 bytes
CELLS = 8                       # a writer process's claims at once (a thread's copies, a zero-staging put)
BLOCKS = (mmap.PAGESIZE - CLAIMS_AT) // (16 * CELLS)    # 30 with 4 KiB pages
LOCK_BASE = 1 << 40             # lock bytes past the end of any arena file
_FLOCK = struct.Struct("hh4xqqi4x")     # struct flock on Linux x86-64 / aarch64: type, whence, start, len, pid
_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)


def _lock(fd: int, block: int, kind: int) -> bool:
    """An OFD lock (F_WRLCK) or unlock (F_UNLCK) of the block's byte; False when another description holds it."""
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, LOCK_BASE + block, 1, 0))
    except (BlockingIOError, PermissionError):     # EAGAIN / EACCES: held elsewhere
        return False
    return True


class WriterClaims:
    """This process's block of claims on one arena (`DramArena.writer_claims`). Thread-safe: `take` a cell (None
    while all CELLS are taken), `hold` / `drop` it around each copy, `give` it back."""

    def __init__(self, table: np.ndarray, block: int, fd: int = -1) -> None:
        # two words per cell, as a memoryview of native u64 (stores ~4x cheaper than numpy's element assignment)
        self._words = memoryview(table[block * CELLS * 2:(block + 1) * CELLS * 2]).cast("B").cast("Q")
        self.block = block
        self._fd = fd               # the mapping's descriptor the block's lock is on
        self._free = list(range(CELLS))
        self._lock = threading.Lock()

    @classmethod
    def open(cls, fd: int, table: np.ndarray) -> WriterClaims | None:
        """Take the first block no process holds (its lock, on `fd`), cleared; None if all are held or the
        filesystem has no OFD locks."""
        for block in range(BLOCKS):
            try:
                got = _lock(fd, block, fcntl.F_WRLCK)
            except OSError:     # EINVAL and the like: no OFD locks here
                return None
            if got:
                table[block * CELLS * 2:(block + 1) * CELLS * 2] = 0   # a writer before died holding it
                return cls(table, block, fd)
        return None

    def close(self) -> None:
        """Clear the block and let its lock go (before the mapping closes `fd`; no copy may be in flight). Copies
        after this find no cell."""
        with self._lock:
            self._free = []
            words, self._words = self._words, None
        if words is None:
            return
        for i in range(len(words)):
            words[i] = 0
        words.release()
        if self._fd >= 0:
            _lock(self._fd, self.block, fcntl.F_UNLCK)

    def take(self) -> int | None:
        with self._lock:
            return self._free.pop() if self._free else None

    def give(self, cell: int) -> None:
        self.drop(cell)
        with self._lock:
            if self._words is not None:     # (closed: the cell is gone with the block)
                self._free.append(cell)

    def hold(self, cell: int, start: int, end: int) -> None:
        """Claim arena bytes [start, end): call before the deadline check that precedes a copy into them."""
        words = self._words
        words[2 * cell + 1] = end
        words[2 * cell] = start + 1     # the scan reads a claim from this word: set last, cleared first

    def drop(self, cell: int) -> None:
        """The copies into the claimed range are over (or were never started)."""
        words = self._words
        if words is not None:
            words[2 * cell] = 0


def claimed(fd: int, table: np.ndarray) -> list[tuple[int, int]]:
    """The node's scan: the [start, end) ranges claimed by writers alive. A block with claims whose lock nobody
    holds (its writer closed the arena or died) is cleared while the node holds that lock, so no writer takes it
    meanwhile."""
    cells = table.reshape(BLOCKS, CELLS, 2)
    out: list[tuple[int, int]] = []
    for block in np.flatnonzero(cells[:, :, 0].any(axis=1)):
        block = int(block)
        if _lock(fd, block, fcntl.F_WRLCK):
            cells[block] = 0
            _lock(fd, block, fcntl.F_UNLCK)
        else:
            for start, end in cells[block].tolist():
                if start:
                    out.append((start - 1, end))
    return out


def overlaps(ranges: list[tuple[int, int]], offset: int, size: int) -> bool:
    """Whether the extent [offset, offset + size) meets any of `ranges`."""
    return any(start < offset + size and offset < end for start, end in ranges)


__all__ = ["BLOCKS", "CELLS", "CLAIMS_AT", "WriterClaims", "claimed", "overlaps"]
