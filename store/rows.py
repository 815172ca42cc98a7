"""The master index's rows (store/index.py): a numpy structured array that grows without moving.

Growing by `np.zeros(2n)` and a copy held the master's lock for the copy and for the new array's page faults:
~0.3 s going from 2M to 4M rows of 46 B, every lookup waiting. `GrowingRows` keeps the rows in one anonymous
mapping that reserves address space for `reserve_rows` rows at once (MAP_NORESERVE: nothing is committed, the
kernel hands out zero pages as rows are first written), so growing is a longer view of the same memory: no copy,
no fault up front, the rows never move. Past the reservation, the rows are copied once into one four times larger.

Where the reservation is refused (vm.overcommit_memory=2 ignores MAP_NORESERVE and counts it all; an address-space
ulimit; not Linux) the rows are a numpy array grown by copying, as before, and `reserved` is False.

tracemalloc sees the rows the index has (`rows x itemsize`, what it saw of the numpy array before): the mapping is
registered with PyTraceMalloc_Track as it grows, and untracked when the mapping is freed. The address space a
reservation takes shows in the process's VSZ (12 GiB at the default), not in its RSS.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import weakref

import numpy as np

RESERVE_ROWS = 1 << 28          # 268M rows: 12.3 GiB of address space at the index's 46 B
_MAP_NORESERVE = 0x4000         # Linux (x86-64, arm64); Python's mmap module does not name it
_TRACE_DOMAIN = 0x6B76          # tracemalloc domain of these mappings


def _tracer():
    api = getattr(ctypes, "pythonapi", None)
    track = getattr(api, "PyTraceMalloc_Track", None)
    untrack = getattr(api, "PyTraceMalloc_Untrack", None)
    if track is None or untrack is None:
        return None, None
    track.argtypes, track.restype = [ctypes.c_uint, ctypes.c_size_t, ctypes.c_size_t], ctypes.c_int
    untrack.argtypes, untrack.restype = [ctypes.c_uint, ctypes.c_size_t], ctypes.c_int
    return track, untrack


_TRACK, _UNTRACK = _tracer()


def _untrack(address: int) -> None:
    _UNTRACK(_TRACE_DOMAIN, address)    # -2 where tracemalloc is not tracing: nothing to undo


def _reserve(dtype: np.dtype, rows: int) -> np.ndarray | None:
    """`rows` zero rows in an anonymous MAP_NORESERVE mapping, or None where the kernel refuses it."""
    if not sys.platform.startswith("linux") or _TRACK is None:
        return None
    try:
        mapping = mmap.mmap(-1, rows * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    except (OSError, OverflowError, ValueError):
        return None
    base = np.frombuffer(mapping, dtype=dtype, count=rows)
    weakref.finalize(mapping, _untrack, base.ctypes.data)
    return base


class GrowingRows:
    """Rows of `dtype`, zeros until written, that grow in place (see the module docstring). `reserve_rows`: the
    address space reserved up front, in rows (tests make it small to cross it)."""

    def __init__(self, dtype: np.dtype, *, reserve_rows: int = RESERVE_ROWS) -> None:
        if not isinstance(reserve_rows, int) or reserve_rows < 1:
            raise ValueError(f"reserve_rows must be an int >= 1, got {reserve_rows!r}")
        self.dtype = np.dtype(dtype)
        self._reserve_rows = reserve_rows
        self._base: np.ndarray | None = None     # the whole reservation, None while the rows are a plain array
        self._refused = False                    # the kernel refused a reservation: plain arrays from then on
        self.rows = np.zeros(0, dtype=self.dtype)

    @property
    def reserved(self) -> bool:
        """Whether the rows live in a reservation (grow in place), not a numpy array grown by copying."""
        return self._base is not None

    def grow(self, rows: int) -> np.ndarray:
        """The first `rows` rows (at least as many as now): the rows so far keep their values and, in a
        reservation, their memory; the new ones are zeros. Views of the old `rows` stay valid in a reservation
        (same memory) and see stale copies otherwise: callers rebind every view (the index does)."""
        if not isinstance(rows, int) or rows < len(self.rows):
            raise ValueError(f"rows must be an int >= {len(self.rows)} (the rows now), got {rows!r}")
        if self._base is None or rows > len(self._base):
            want = self._reserve_rows if self._base is None else 4 * rows
            base = None if self._refused else _reserve(self.dtype, max(rows, want))
            if base is None:
                self._refused = True
                self._base = None
                grown = np.zeros(rows, dtype=self.dtype)
                grown[: len(self.rows)] = self.rows
                self.rows = grown
                return grown
            base[: len(self.rows)] = self.rows
            self._base = base
        self.rows = self._base[:rows]
        _TRACK(_TRACE_DOMAIN, self._base.ctypes.data, rows * self.dtype.itemsize)
        return self.rows
