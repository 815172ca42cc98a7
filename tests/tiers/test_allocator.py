"""OffsetAllocator: exact offsets, best-fit, coalescing, recovery reservations, invariants under random load."""

from __future__ import annotations

import random

import pytest

from kvpool.tiers.allocator import OffsetAllocator

K = 4096


def free_extents(a: OffsetAllocator) -> list[tuple[int, int]]:
    return sorted(a._free_start.items())


def test_scripted_sequence_exact_offsets():
    a = OffsetAllocator(16 * K)
    assert a.allocate(K) == 0
    assert a.allocate(5000) == K                  # rounded up to 2 pages
    assert a.size_of(K) == 2 * K
    assert a.allocate(1) == 3 * K
    assert (a.used_bytes, a.free_bytes, a.num_allocations) == (4 * K, 12 * K, 3)
    assert a.free(K) == 2 * K
    # holes: [1K,3K) size 2 pages and [4K,16K) size 12 pages; best fit takes the 2-page hole
    assert a.allocate(K) == K
    assert a.allocate(3 * K) == 4 * K             # the 1-page hole at 2K is too small
    assert a.allocate(K) == 2 * K                 # exact fit for the remaining 1-page hole
    assert free_extents(a) == [(7 * K, 9 * K)]
    a.check_invariants()


def test_best_fit_prefers_tightest_hole_then_lowest_offset():
    a = OffsetAllocator(10 * K)
    offs = [a.allocate(K) for _ in range(10)]
    assert offs == [i * K for i in range(10)]
    for o in (1 * K, 2 * K, 3 * K, 5 * K, 8 * K):  # holes: 3 pages at 1K, 1 page at 5K, 1 page at 8K
        a.free(o)
    assert a.allocate(K) == 5 * K                 # tightest fit, lowest offset among equals
    assert a.allocate(K) == 8 * K
    assert a.allocate(2 * K) == K
    assert a.allocate(2 * K) is None              # 1 page left in total
    assert a.largest_free == K
    a.check_invariants()


def test_free_coalesces_both_neighbours():
    a = OffsetAllocator(4 * K)
    offs = [a.allocate(K) for _ in range(4)]
    assert a.allocate(1) is None                  # full is ordinary, not an exception
    a.free(offs[0])
    a.free(offs[2])
    assert free_extents(a) == [(0, K), (2 * K, K)]
    a.free(offs[1])                               # joins left and right
    assert free_extents(a) == [(0, 3 * K)]
    a.free(offs[3])
    assert free_extents(a) == [(0, 4 * K)]
    assert a.largest_free == 4 * K and a.used_bytes == 0
    a.check_invariants()


def test_unaligned_capacity_tail_is_usable_only_by_fitting_sizes():
    a = OffsetAllocator(2 * K + 100)
    assert a.allocate(K) == 0
    assert a.allocate(K) == K
    assert a.allocate(1) is None                  # 100-byte tail < one aligned unit
    assert a.free_bytes == 100
    a.check_invariants()


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="capacity"):
        OffsetAllocator(-1)
    with pytest.raises(ValueError, match="alignment"):
        OffsetAllocator(K, alignment=3000)
    a = OffsetAllocator(4 * K)
    for bad in (0, -5, 1.5):
        with pytest.raises(ValueError, match="size"):
            a.allocate(bad)
    with pytest.raises(ValueError, match="offset 123 is not an allocated extent"):
        a.free(123)
    with pytest.raises(ValueError, match="offset"):
        a.size_of(0)
    assert a.used_bytes == 0
    a.check_invariants()


def test_zero_capacity_allocates_nothing():
    a = OffsetAllocator(0)
    assert a.allocate(1) is None
    assert a.largest_free == 0
    a.check_invariants()


def test_reserve_for_recovery_and_overlap_errors():
    a = OffsetAllocator(16 * K)
    a.reserve(4 * K, 2 * K)
    a.reserve_many([(10 * K, 100), (0, K)])
    assert a.num_allocations == 3 and a.used_bytes == 4 * K
    assert free_extents(a) == [(K, 3 * K), (6 * K, 4 * K), (11 * K, 5 * K)]
    with pytest.raises(ValueError, match="overlaps"):
        a.reserve(5 * K, K)                       # inside the reservation at 4K
    with pytest.raises(ValueError, match="overlaps"):
        a.reserve(9 * K, 2 * K)                   # runs into the one at 10K
    with pytest.raises(ValueError, match="overlaps"):
        a.reserve_many([(2 * K, K), (2 * K, K)])  # overlapping each other: all-or-nothing
    with pytest.raises(ValueError, match="overlaps"):
        a.reserve(15 * K, 2 * K)                  # past capacity
    with pytest.raises(ValueError, match="offset"):
        a.reserve(100, K)                         # unaligned
    assert a.num_allocations == 3 and a.used_bytes == 4 * K
    a.check_invariants()
    assert a.allocate(K) == K                     # tightest hole: 3 pages at 1K
    assert a.free(4 * K) == 2 * K
    a.check_invariants()


def test_reserved_extents_are_allocated_around_and_freed_like_any():
    a = OffsetAllocator(8 * K)
    a.reserve_many([(K, K), (3 * K, K)])
    assert [a.allocate(K) for _ in range(6)] == [0, 2 * K, 4 * K, 5 * K, 6 * K, 7 * K]
    a.free(K)
    a.free(2 * K)
    a.free(3 * K)
    assert free_extents(a) == [(K, 3 * K)]
    a.check_invariants()


def test_check_invariants_detects_corruption():
    a = OffsetAllocator(4 * K)
    a.allocate(K)
    a._used_bytes += 1
    with pytest.raises(AssertionError, match="used_bytes"):
        a.check_invariants()
    b = OffsetAllocator(4 * K)
    b.allocate(K)
    b._starts[0] |= 1 << 2                        # a start bit inside the free extent [K, 4K): a phantom extent
    with pytest.raises(AssertionError):
        b.check_invariants()


def test_used_extents_live_in_a_start_bitmap_not_a_dict():
    a = OffsetAllocator(64 * K)
    offs = [a.allocate(K * (1 + i % 3)) for i in range(10)]
    assert [a.size_of(o) for o in offs] == [K * (1 + i % 3) for i in range(10)]
    assert not hasattr(a, "_used") and len(a._starts) == 8     # 64 units -> 8 bytes of bits
    for bad in (offs[1] + K, 63 * K, -K, 64 * K, 1.0):          # inside an extent, free, out of range, not an int
        with pytest.raises(ValueError, match="is not an allocated extent"):
            a.free(bad)
        assert bad not in a
    assert a.free(offs[1]) == 2 * K and offs[1] not in a
    with pytest.raises(ValueError, match=f"offset {offs[1]} is not an allocated extent"):
        a.free(offs[1])                                         # double free
    a.check_invariants()


def test_randomized_10k_ops_keep_invariants_and_never_overlap():
    rng = random.Random(1234)
    a = OffsetAllocator(256 * K + 123)
    live: dict[int, int] = {}
    sizes = [K, K, K, 3000, 2 * K, 5 * K, 16 * K, 100]
    for step in range(10_000):
        if live and rng.random() < 0.45:
            off = rng.choice(list(live))
            assert a.free(off) == live.pop(off)
        else:
            size = rng.choice(sizes)
            fits = a.largest_free >= a.rounded(size)
            off = a.allocate(size)
            assert (off is not None) == fits
            if off is not None:
                assert off % K == 0 and off + a.rounded(size) <= a.capacity
                live[off] = a.rounded(size)
        if step % 100 == 99:
            a.check_invariants()
            spans = sorted(live.items())
            assert all(o1 + s1 <= o2 for (o1, s1), (o2, _) in zip(spans, spans[1:]))
            assert a.used_bytes == sum(live.values())
    for off in list(live):
        a.free(off)
    a.check_invariants()
    assert free_extents(a) == [(0, 256 * K + 123)]


def test_allocate_many_returns_exactly_what_repeated_allocate_returns():
    """Two allocators driven through the same random history: one takes each batch with allocate_many, the other
    with repeated allocate; offsets, free extents and counters stay identical (equal-sized holes, holes smaller
    than the object, a batch spanning several holes, running out of space mid-batch)."""
    rng = random.Random(99)
    a, b = OffsetAllocator(512 * K + 77), OffsetAllocator(512 * K + 77)
    live: list[int] = []
    batches = with_ties = short = spans = 0
    for step in range(3_000):
        if live and rng.random() < 0.5:
            for off in rng.sample(live, min(len(live), rng.randint(1, 12))):
                live.remove(off)
                assert a.free(off) == b.free(off)
            continue
        size, count = rng.choice([K, K, 3000, 2 * K, 5 * K]), rng.randint(1, 40)
        holes = sorted(s for _, s in free_extents(a))
        with_ties += len(holes) != len(set(holes))
        want = []
        for _ in range(count):
            off = b.allocate(size)
            if off is None:
                break
            want.append(off)
        got = a.allocate_many(size, count)
        assert got == want, step
        short += len(got) < count
        spans += any(y - x != a.rounded(size) for x, y in zip(got, got[1:]))
        batches += 1
        live.extend(got)
        assert free_extents(a) == free_extents(b)
        assert (a.used_bytes, a.num_allocations, a.largest_free) == (b.used_bytes, b.num_allocations, b.largest_free)
        if step % 50 == 0:
            a.check_invariants()
    assert batches > 1000 and with_ties > 100 and short > 50 and spans > 100   # the cases named above happened
    a.check_invariants()


def test_allocate_many_bad_size_names_the_argument_and_changes_nothing():
    a = OffsetAllocator(8 * K)
    with pytest.raises(ValueError, match="size must be an int > 0"):
        a.allocate_many(0, 3)
    assert a.allocate_many(K, 0) == [] and a.free_bytes == 8 * K
    assert a.allocate_many(3 * K, 5) == [0, 3 * K]      # the third does not fit
    assert free_extents(a) == [(6 * K, 2 * K)]


def test_free_within_lists_the_free_parts_of_a_range_widened_to_the_alignment():
    a = OffsetAllocator(16 * 4096, alignment=4096)
    offs = [a.allocate(4096) for _ in range(4)]         # [0, 16K) used
    a.free(offs[1])                                     # [4K, 8K) free
    assert a.free_within(0, 16 * 4096) == [(4096, 4096), (4 * 4096, 12 * 4096)]
    assert a.free_within(4097, 5000) == [(4096, 4096)]  # widened to [4K, 8K)
    assert a.free_within(0, 4096) == [] and a.free_within(15 * 4096 + 1, 99 * 4096) == [(15 * 4096, 4096)]
    a.reserve_many(a.free_within(4096, 6 * 4096))
    assert a.free_within(0, 16 * 4096) == [(6 * 4096, 10 * 4096)]
    a.check_invariants()
