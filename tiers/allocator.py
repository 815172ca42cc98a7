"""OffsetAllocator: hands out aligned extents of one address range [0, capacity).

The master runs one allocator per (node, tier); the tier itself (a DRAM arena, an SSD file) only ever sees the
offsets it is given. The allocator never touches the bytes.

Choice: best-fit over free extents, coalescing neighbours on free.
```
  [0 ............................................................................ capacity)
  | used A | free 8K | used B | used C |      free 64K       | used D |   free tail    |
  ^        ^         ^        ^        ^                     ^        ^                 _starts: one bit per
                                                                                      alignment unit, set at
                                                                                      every extent's start
             ^ _free_start[off] = size, _free_end[off + size] = off   (O(1) neighbour lookup)
  _sizes = [8K, 64K, tail]   sorted distinct free sizes      (bisect -> smallest size that fits)
  _buckets[size] = heap of offsets                             (lowest offset among equal sizes)
```
Used extents cost nothing per object: an extent starting at `off` (bit set, not in `_free_start`) ends where the
next start bit is (or at capacity), because extents tile [0, capacity). A dict of used extents would cost ~116 B
per object at 1M objects; the bitmap costs 1 bit per alignment unit (128 KiB for 4 GiB at 4 KiB), which is what
lets the whole master stay under 200 B per object.
* allocate(n): n is rounded up to `alignment`; take the smallest free extent that fits (lowest offset on a tie),
  split off the remainder. Deterministic, so tests can assert exact offsets.
* free(off): merge with the free extent ending at `off` and the one starting at `off + size` (two dict
  lookups), so free extents are always maximal: no two free extents touch.
* Heaps use lazy deletion: an entry is live only if `_free_start[off] == size`; stale entries are dropped when
  popped and the heap is compacted when stale entries dominate.

Fragmentation: KV objects of one namespace all have the same size, so in the common case every hole left by a
free is exactly the size of the next allocation (best-fit takes it exactly) and coalescing rebuilds large
extents as neighbours die: external fragmentation stays near zero. With mixed sizes (several namespaces on one
tier) best-fit prefers the tightest hole, keeping large extents intact for large objects, but a tier can still
end up with enough free bytes in total and no single extent large enough (`largest_free` < request). That is
reported as an ordinary `None`; the master then evicts (eviction frees neighbours, which coalesce) and retries.
Internal fragmentation is at most `alignment - 1` bytes per object (KV blocks are usually multiples of 4 KiB).

Recovery: `reserve_many(extents)` marks known extents used in one sorted pass (an SSD tier re-adopting its
records after a restart); `reserve(off, size)` is the single-extent wrapper.
"""

from __future__ import annotations

import bisect
import heapq
import operator
import re
from collections.abc import Iterable

_NONZERO = re.compile(rb"[^\x00]")   # first non-zero byte of the start bitmap: a C-speed scan


class OffsetAllocator:
    """Best-fit, coalescing allocator of `alignment`-aligned extents in [0, capacity). Not thread-safe: the owner
    (the master, per tier) serialises calls."""

    __slots__ = ("_capacity", "_alignment", "_shift", "_starts", "_num_used", "_used_bytes", "_free_start",
                 "_free_end", "_sizes", "_buckets", "_size_counts")

    def __init__(self, capacity: int, alignment: int = 4096) -> None:
        if not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be an int >= 0, got {capacity!r}")
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two > 0, got {alignment!r}")
        self._capacity = capacity
        self._alignment = alignment
        self._shift = alignment.bit_length() - 1
        units = (capacity + alignment - 1) >> self._shift
        self._starts = bytearray((units + 7) >> 3)  # bit u set: an extent (used or free) starts at u * alignment
        self._num_used = 0
        self._used_bytes = 0
        self._free_start: dict[int, int] = {}      # offset -> size
        self._free_end: dict[int, int] = {}        # offset + size -> offset
        self._sizes: list[int] = []                # sorted distinct sizes of free extents
        self._buckets: dict[int, list[int]] = {}   # size -> heap of offsets (lazy deletion)
        self._size_counts: dict[int, int] = {}     # size -> live free extents of that size
        if capacity:
            self._add_free(0, capacity)

    # ---------------------------------------------------------------- properties
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def alignment(self) -> int:
        return self._alignment

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    @property
    def free_bytes(self) -> int:
        return self._capacity - self._used_bytes

    @property
    def largest_free(self) -> int:
        return self._sizes[-1] if self._sizes else 0

    @property
    def num_allocations(self) -> int:
        return self._num_used

    def rounded(self, size: int) -> int:
        """The extent size `allocate(size)` would take."""
        a = self._alignment
        return (size + a - 1) & ~(a - 1)

    def size_of(self, offset: int) -> int:
        """Rounded size of the allocation at `offset`; ValueError if there is none."""
        off = self._used_start(offset)
        if off < 0:
            raise ValueError(f"offset {offset!r} is not an allocated extent")
        return self._next_start(off) - off

    def __contains__(self, offset: object) -> bool:
        return self._used_start(offset) >= 0

    # ---------------------------------------------------------------- allocate / free
    def can_allocate(self, size: int) -> bool:
        return self.largest_free >= self.rounded(self._check_size(size))

    def allocate(self, size: int) -> int | None:
        """Offset of a new extent of `rounded(size)` bytes, or None when no free extent is large enough."""
        out = self.allocate_many(size, 1)
        return out[0] if out else None

    def allocate_many(self, size: int, count: int) -> list[int]:
        """The offsets `count` calls of `allocate(size)` would return, in order, stopping at the first None (so
        fewer than `count` when space runs out), at the cost of one step per free extent rather than one per
        object: the best fit's remainder is smaller than every other free extent that fits, so it is the next
        call's best fit, and a free extent is simply cut into as many consecutive objects as it holds."""
        need = self.rounded(self._check_size(size))
        out: list[int] = []
        sizes = self._sizes
        while len(out) < count:
            i = bisect.bisect_left(sizes, need)
            if i == len(sizes):
                break
            fsize = sizes[i]
            heap = self._buckets[fsize]
            while True:                          # drop stale (lazily deleted) entries
                off = heapq.heappop(heap)
                if self._free_start.get(off) == fsize:
                    break
            self._remove_free(off, fsize)
            k = min(count - len(out), fsize // need)
            out.append(off)
            for start in range(off + need, off + k * need, need):
                self._set_bit(start)
                out.append(start)
            if fsize > k * need:
                self._add_free(off + k * need, fsize - k * need)
            self._num_used += k
            self._used_bytes += k * need
        return out

    def free(self, offset: int) -> int:
        """Release the extent at `offset`; returns its (rounded) size. ValueError if `offset` is not allocated."""
        off = self._used_start(offset)
        if off < 0:
            raise ValueError(f"offset {offset!r} is not an allocated extent")
        size = self._next_start(off) - off
        self._num_used -= 1
        self._used_bytes -= size
        start, end = off, off + size
        prev = self._free_end.get(start)
        if prev is not None:
            self._remove_free(prev, start - prev)
            self._clear_bit(start)
            start = prev
        nxt = self._free_start.get(end)
        if nxt is not None:
            self._remove_free(end, nxt)
            self._clear_bit(end)
            end += nxt
        self._add_free(start, end - start)
        return size

    # ---------------------------------------------------------------- recovery
    def free_within(self, start: int, end: int) -> list[tuple[int, int]]:
        """The free parts of [start, end) widened to `alignment`: (offset, size) pieces, in order, that
        `reserve_many` takes as they are."""
        a = self._alignment
        lo, hi = max(start // a * a, 0), min(-(-end // a) * a, self._capacity)
        out = []
        for off, size in sorted(self._free_start.items()):
            s, e = max(off, lo), min(off + size, hi)
            if s < e:
                out.append((s, e - s))
        return out

    def reserve(self, offset: int, size: int) -> None:
        """Mark [offset, offset + rounded(size)) used. ValueError if it is not wholly free. For many extents use
        `reserve_many`, which is one sorted pass instead of one pass per extent."""
        self.reserve_many([(offset, size)])

    def reserve_many(self, extents: Iterable[tuple[int, int]]) -> None:
        """Mark every (offset, size) extent used. All-or-nothing: on ValueError nothing changed."""
        wanted: list[tuple[int, int]] = []
        for offset, size in extents:
            try:
                off = operator.index(offset)
            except TypeError:
                off = -1
            if off < 0 or off % self._alignment:
                raise ValueError(f"offset must be an int >= 0 and a multiple of {self._alignment}, got {offset!r}")
            wanted.append((off, self.rounded(self._check_size(size))))
        if not wanted:
            return
        wanted.sort()
        free = sorted(self._free_start.items())
        pieces: list[tuple[int, int]] = []       # new free extents
        fi = 0
        cur_start, cur_end = (free[0][0], free[0][0] + free[0][1]) if free else (0, 0)
        for offset, size in wanted:
            end = offset + size
            # advance to the free extent that could contain `offset`
            while fi < len(free) and cur_end <= offset:
                if cur_end > cur_start:
                    pieces.append((cur_start, cur_end - cur_start))
                fi += 1
                if fi < len(free):
                    cur_start, cur_end = free[fi][0], free[fi][0] + free[fi][1]
            if fi == len(free) or offset < cur_start or end > cur_end:
                raise ValueError(f"extent at offset {offset} (size {size}) overlaps an allocated extent "
                                 f"or lies outside [0, {self._capacity})")
            if offset > cur_start:
                pieces.append((cur_start, offset - cur_start))
            cur_start = end
        while fi < len(free):
            if cur_end > cur_start:
                pieces.append((cur_start, cur_end - cur_start))
            fi += 1
            if fi < len(free):
                cur_start, cur_end = free[fi][0], free[fi][0] + free[fi][1]
        # commit: nothing above mutated state
        for offset, size in wanted:
            self._set_bit(offset)
            self._used_bytes += size
        self._num_used += len(wanted)
        self._rebuild_free(pieces)

    # ---------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant."""
        free = sorted(self._free_start.items())
        used = [(off, self._next_start(off) - off) for off in self._start_offsets() if off not in self._free_start]
        assert len(used) == self._num_used, f"num_allocations {self._num_used} != used extents {len(used)}"
        for off, size in used:
            assert size % self._alignment == 0, f"used extent at {off} has unaligned size {size}"
        for off, _ in free:
            assert self._bit(off), f"free extent at {off} has no start bit"
        free_total = 0
        for i, (off, size) in enumerate(free):
            assert size > 0, f"free extent at {off} has size {size}"
            assert self._free_end.get(off + size) == off, f"free extent at {off} missing from the end index"
            if i:
                p_off, p_size = free[i - 1]
                assert p_off + p_size <= off, f"free extents at {p_off} and {off} overlap"
                assert p_off + p_size != off, f"free extents at {p_off} and {off} touch but were not coalesced"
            free_total += size
        assert len(self._free_end) == len(free), "free end index has stale entries"
        counts: dict[int, int] = {}
        for _, size in free:
            counts[size] = counts.get(size, 0) + 1
        assert counts == self._size_counts, f"free size counts {self._size_counts} != actual {counts}"
        assert self._sizes == sorted(counts), f"sorted size list {self._sizes} != actual {sorted(counts)}"
        for size in counts:
            live = {o for o in self._buckets.get(size, ()) if self._free_start.get(o) == size}
            assert live == {o for o, s in free if s == size}, f"bucket of size {size} misses free extents"
        used_total = sum(s for _, s in used)
        assert used_total == self._used_bytes, f"used_bytes {self._used_bytes} != sum of extents {used_total}"
        assert used_total + free_total == self._capacity, (
            f"used {used_total} + free {free_total} != capacity {self._capacity}")
        pos = 0
        for off, size in sorted(free + used):   # extents tile [0, capacity) exactly
            assert off == pos, f"gap or overlap at offset {pos} (next extent starts at {off})"
            pos = off + size
        assert pos == self._capacity, f"extents end at {pos}, capacity is {self._capacity}"

    # ---------------------------------------------------------------- internals
    def _check_size(self, size: int) -> int:
        """`size` as a Python int (numpy integers accepted); ValueError naming `size` otherwise."""
        try:
            n = operator.index(size)
        except TypeError:
            n = 0
        if n <= 0 or isinstance(size, bool):
            raise ValueError(f"size must be an int > 0, got {size!r}")
        return n

    def _used_start(self, offset: object) -> int:
        """`offset` as an int if a used extent starts there, else -1."""
        try:
            off = operator.index(offset)
        except TypeError:
            return -1
        if off < 0 or off >= self._capacity or off & (self._alignment - 1) or not self._bit(off) \
                or off in self._free_start:
            return -1
        return off

    def _bit(self, off: int) -> int:
        u = off >> self._shift
        return self._starts[u >> 3] & (1 << (u & 7))

    def _set_bit(self, off: int) -> None:
        u = off >> self._shift
        self._starts[u >> 3] |= 1 << (u & 7)

    def _clear_bit(self, off: int) -> None:
        u = off >> self._shift
        self._starts[u >> 3] &= ~(1 << (u & 7)) & 0xFF

    def _next_start(self, off: int) -> int:
        """Start of the extent after the one starting at `off` (capacity if it is the last one)."""
        u = (off >> self._shift) + 1
        bits = self._starts
        i = u >> 3
        if i >= len(bits):
            return self._capacity
        b = bits[i] >> (u & 7)
        if b:
            return min((u + (b & -b).bit_length() - 1) << self._shift, self._capacity)
        m = _NONZERO.search(bits, i + 1)
        if m is None:
            return self._capacity
        j = m.start()
        b = bits[j]
        return min(((j << 3) + (b & -b).bit_length() - 1) << self._shift, self._capacity)

    def _start_offsets(self) -> list[int]:
        out = []
        for m in _NONZERO.finditer(self._starts):
            j, b = m.start(), self._starts[m.start()]
            out.extend(((j << 3) + bit) << self._shift for bit in range(8) if b >> bit & 1)
        return out

    def _add_free(self, off: int, size: int) -> None:
        self._set_bit(off)
        self._free_start[off] = size
        self._free_end[off + size] = off
        n = self._size_counts.get(size, 0)
        self._size_counts[size] = n + 1
        heap = self._buckets.get(size)
        if heap is None:
            heap = self._buckets[size] = []
        heapq.heappush(heap, off)
        if n == 0:
            bisect.insort(self._sizes, size)
        elif len(heap) > 4 * (n + 1) + 64:       # stale entries dominate: compact
            live = {o for o in heap if self._free_start.get(o) == size}
            heap[:] = sorted(live)

    def _remove_free(self, off: int, size: int) -> None:
        # The heap entry stays behind (lazy deletion) unless the caller already popped it.
        del self._free_start[off]
        del self._free_end[off + size]
        n = self._size_counts[size] - 1
        if n:
            self._size_counts[size] = n
        else:
            del self._size_counts[size]
            del self._buckets[size]
            del self._sizes[bisect.bisect_left(self._sizes, size)]

    def _rebuild_free(self, pieces: list[tuple[int, int]]) -> None:
        self._free_start = dict(pieces)
        self._free_end = {o + s: o for o, s in pieces}
        self._buckets = {}
        self._size_counts = {}
        for off, size in pieces:                 # pieces are sorted by offset, so each bucket is a valid heap
            self._set_bit(off)
            self._buckets.setdefault(size, []).append(off)
            self._size_counts[size] = self._size_counts.get(size, 0) + 1
        self._sizes = sorted(self._size_counts)

    def __repr__(self) -> str:
        return (f"OffsetAllocator(capacity={self._capacity}, used={self._used_bytes}, "
                f"allocations={self._num_used}, largest_free={self.largest_free})")
