"""store/rows.py: the index's rows grow in place in a reservation (no copy, same memory), are copied once past it,
fall back to a numpy array grown by copying where the kernel refuses the reservation, and tracemalloc sees the rows
held either way. store/index.py on top: slots are handed out in the same order, and growth keeps the rows' memory."""

from __future__ import annotations

import gc
import sys
import tracemalloc

import numpy as np
import pytest

from kvpool.store import rows as rows_mod
from kvpool.store.index import ROW, Index, State
from kvpool.store.rows import GrowingRows
from kvpool.tiers.types import Tier

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reservation is Linux's mmap")


def _fill(rows: np.ndarray, start: int = 0) -> None:
    rows["offset"][start:] = np.arange(start, len(rows)) * 7 + 1


@linux_only
def test_rows_in_a_reservation_grow_in_place_keeping_their_values():
    g = GrowingRows(ROW, reserve_rows=1 << 16)
    first = g.grow(100)
    _fill(first)
    address = first.ctypes.data
    grown = g.grow(5000)
    assert g.reserved and grown.ctypes.data == address         # the same memory: nothing copied
    assert first["offset"].tolist() == (np.arange(100) * 7 + 1).tolist()   # an old view still sees the rows
    assert grown["offset"][:100].tolist() == (np.arange(100) * 7 + 1).tolist()
    assert not grown[100:].tobytes().strip(b"\0")                # the new rows are zeros
    grown["state"][4999] = 3
    assert g.rows["state"][4999] == 3 and len(g.rows) == 5000


@linux_only
def test_past_the_reservation_the_rows_are_copied_once_into_one_four_times_larger():
    g = GrowingRows(ROW, reserve_rows=64)
    _fill(g.grow(64))
    old = g.rows.ctypes.data
    grown = g.grow(100)                                          # past 64: a reservation of 400 rows
    assert g.reserved and grown.ctypes.data != old
    assert grown["offset"][:64].tolist() == (np.arange(64) * 7 + 1).tolist()
    assert not grown[64:].tobytes().strip(b"\0")
    address = grown.ctypes.data
    assert g.grow(400).ctypes.data == address                   # inside the new one: in place again
    assert g.grow(401).ctypes.data != address


def test_where_the_reservation_is_refused_the_rows_grow_by_copying(monkeypatch):
    monkeypatch.setattr(rows_mod, "_reserve", lambda dtype, rows: None)
    g = GrowingRows(ROW)
    _fill(g.grow(10))
    grown = g.grow(30)
    assert not g.reserved
    assert grown["offset"][:10].tolist() == (np.arange(10) * 7 + 1).tolist()
    assert not grown[10:].tobytes().strip(b"\0")
    assert len(g.grow(31)) == 31 and not g.reserved


def test_bad_sizes_name_their_field_and_change_nothing():
    with pytest.raises(ValueError, match="reserve_rows must be an int >= 1"):
        GrowingRows(ROW, reserve_rows=0)
    g = GrowingRows(ROW, reserve_rows=1 << 10)
    _fill(g.grow(20))
    for bad in (19, -1, 20.5, "30"):
        with pytest.raises(ValueError, match=r"rows must be an int >= 20 \(the rows now\)"):
            g.grow(bad)
    assert len(g.rows) == 20 and g.rows["offset"].tolist() == (np.arange(20) * 7 + 1).tolist()


@linux_only
def test_tracemalloc_sees_the_rows_held_and_forgets_them_with_the_mapping():
    tracemalloc.start()
    try:
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        g = GrowingRows(ROW, reserve_rows=1 << 20)
        g.grow(10_000)
        assert g.reserved
        held = tracemalloc.get_traced_memory()[0] - base
        assert 10_000 * ROW.itemsize <= held <= 10_000 * ROW.itemsize + 4096
        g.grow(50_000)
        held = tracemalloc.get_traced_memory()[0] - base
        assert 50_000 * ROW.itemsize <= held <= 50_000 * ROW.itemsize + 4096   # its size updated, not added
        del g
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - base <= 4096
    finally:
        tracemalloc.stop()


def _add(index: Index, i: int) -> int:
    return index.add(i.to_bytes(16, "big"), node=0, tier=Tier.DRAM, state=State.COMMITTED, offset=i, size=64, ns=0)


def test_the_index_hands_out_slots_lowest_first_and_a_freed_one_next_across_growth():
    index = Index(initial_slots=4)
    assert [_add(index, i) for i in range(6)] == list(range(6))         # grew 4 -> 8 on the fifth
    assert index.capacity == 8
    index.free(2)
    index.free(4)
    assert [_add(index, i) for i in range(10, 15)] == [4, 2, 6, 7, 8]    # last freed first, then the unused ones
    assert index.capacity == 16
    assert [int(index.offset[s]) for s in (0, 1, 2, 3, 4, 5, 6, 7, 8)] == [0, 1, 11, 3, 10, 5, 12, 13, 14]
    index.check_invariants()


@linux_only
def test_the_index_grows_without_moving_its_rows():
    index = Index(initial_slots=1024)
    assert index.rows_reserved
    for i in range(1024):
        _add(index, i)
    address = index.offset.ctypes.data
    _add(index, 1024)                                                  # the doubling
    assert index.capacity == 2048 and index.offset.ctypes.data == address
    assert [int(index.offset[s]) for s in (0, 1023, 1024)] == [0, 1023, 1024]
    index.check_invariants()
