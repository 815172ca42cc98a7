"""S3FIFOPolicy: three FIFO queues (Yang et al., SOSP'23), here as an eviction-order oracle for the master.

Most KV blocks are one-hit wonders (a prompt nobody repeats); LRU lets every such block push a reused prefix
towards eviction. S3-FIFO makes new keys prove themselves in a small queue first:
```
 insert ─▶ small (≈10% of keys) ──head: used since insert? ──yes──▶ main tail (freq reset)
   ▲                              └─no──▶ victim (ghost remembers the key)
   └── key in ghost (evicted recently, asked again) ─────────────▶ main tail directly
 main ──head: freq > 0? ──yes──▶ freq -= 1, back to main tail ── no ──▶ victim
```
`freq` counts uses (0..3) and is raised by `touch_chain`; queue order never changes on a hit, which is why
FIFO queues suffice. Chains are inserted tail-first, so within one chain the tail is nearer the head of its
queue than its parent and is evicted first when their use counts tie.

Layout (no per-object Python object; the master tracks millions of slots): small and main are doubly linked
lists threaded through int32 `prev`/`next` arrays indexed by the index's slot, plus a byte per slot for the queue
it is in and its freq. The ghost must outlive the slot (the index reuses it), so it remembers 32-bit fingerprints of
KEYS in a direct-mapped table (fingerprint u32 + insertion number i64 per bucket, table size a power of two between
1 and 2x the tracked slots): an entry is live while it is among the last max(len, 1) ghost insertions. A collision
overwrites an older entry (the ghost is a hint; losing one only sends that key through probation again).

Orphans (`mark_orphans`: an ancestor left the pool) wait in a third FIFO that `victims()` drains before small and
main; a touch sends an orphan back to probation in small, as used once.

`victims()` runs the algorithm lazily: moves it makes (small -> main, freq decrements) persist even if the caller
stops early, as they would in the real cache. A victim the caller skips (leased) goes back to the tail of its
queue and is not offered again in the same iteration.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence

from .lru import NIL, grow

MAX_FREQ = 3
_OUT, _SMALL, _MAIN, _ORPHAN = 0, 1, 2, 3
_M64 = (1 << 64) - 1


def fingerprint(key: bytes) -> int:
    """A non-zero 32-bit mix of a key (block keys are already hashes; the mix spreads test keys too)."""
    # Only the key's first 8 bytes: a recorded trace keeps exactly those (store/traffic.py key ids), so a replay
    # through the planner (other high bytes) fills the ghost as the live pool did and gets the same hits.
    h = (int.from_bytes(key[:8], "little") * 0x9E3779B97F4A7C15) & _M64
    return ((h >> 32) ^ h) & 0xFFFFFFFF or 1


class S3FIFOPolicy:
    """Not thread-safe: the master serialises calls. Slots are ints >= 0; `keys` (same order) feed the ghost."""

    name = "s3fifo"
    __slots__ = ("_prev", "_next", "_queue", "_freq", "_head", "_tail", "_count", "_small_ratio",
                 "_gfp", "_gseq", "_gclock", "_gfloor")

    def __init__(self, small_ratio: float = 0.1) -> None:
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"small_ratio must be in (0, 1), got {small_ratio!r}")
        self._small_ratio = small_ratio
        self.clear()

    def insert_chain(self, slots: Sequence[int], keys: Sequence[bytes] | None = None) -> None:
        if keys is not None and len(keys) != len(slots):
            raise ValueError(f"keys has {len(keys)} entries, slots has {len(slots)}")
        if slots:
            self._ensure(max(slots) + 1)
        queue = self._queue
        for i in range(len(slots) - 1, -1, -1):
            slot = slots[i]
            if queue[slot] != _OUT:
                self._bump(slot)
                continue
            to = _MAIN if keys is not None and self._ghost_pop(fingerprint(keys[i])) else _SMALL
            self._freq[slot] = 0
            self._push(slot, to)
        self._ghost_grow()
        self._trim_ghost()

    def touch_chain(self, slots: Sequence[int]) -> None:
        if hasattr(slots, "tolist"):                # a numpy array from the master: plain ints index faster
            slots = slots.tolist()
        queue = self._queue
        n = len(queue)
        for slot in slots:
            if slot < n and queue[slot] != _OUT:
                self._bump(slot)

    def mark_orphans(self, slots: Sequence[int]) -> None:
        """Each tracked slot moves to the tail of the orphan FIFO in the order given, after reversing it: the
        deepest tail of a chain leaves first."""
        queue = self._queue
        n = len(queue)
        for slot in reversed(slots):
            if slot < n and queue[slot] not in (_OUT, _ORPHAN):
                self._unlink(slot)
                self._freq[slot] = 0
                self._push(slot, _ORPHAN)

    def remove(self, slot: int, key: bytes | None = None) -> bool:
        if slot not in self:
            return False
        q = self._queue[slot]
        self._unlink(slot)
        if q == _SMALL and key is not None:   # left while still on probation: remember it
            self._ghost_add(fingerprint(key))
        self._trim_ghost()
        return True

    def victims(self) -> Iterator[int]:
        offered: set[int] = set()
        done = {_ORPHAN: False, _SMALL: False, _MAIN: False}
        spins = {_ORPHAN: 0, _SMALL: 0, _MAIN: 0}  # consecutive offered slots met at the head of each queue
        count, head, tail = self._count, self._head, self._tail
        while not (done[_SMALL] and done[_MAIN] and done[_ORPHAN]):
            if done[_ORPHAN] and count[_ORPHAN] and tail[_ORPHAN] not in offered:
                done[_ORPHAN] = False              # the caller's evictions orphaned more slots: offer them first
            if not done[_ORPHAN]:
                q = _ORPHAN
                use_small = False
            else:
                use_small = not done[_SMALL] and (done[_MAIN] or not count[_MAIN]
                                                  or count[_SMALL] >= self._small_ratio * len(self))
                q = _SMALL if use_small else _MAIN
            if not count[q]:
                done[q] = True
                continue
            slot = head[q]
            if slot in offered:                    # skipped earlier by the caller: rotate past it
                self._unlink(slot)
                self._push(slot, q)
                spins[q] += 1
                if spins[q] >= count[q]:           # every slot left in this queue was offered already
                    done[q] = True
                continue
            spins[q] = 0
            freq = self._freq[slot]
            if freq > 0 and use_small:             # used while on probation: promote to main
                self._unlink(slot)
                self._freq[slot] = 0
                self._push(slot, _MAIN)
                done[_MAIN] = False
                continue
            if freq > 0 and q == _MAIN:            # main: spend one use for another round
                self._freq[slot] = freq - 1
                self._unlink(slot)
                self._push(slot, _MAIN)
                continue
            offered.add(slot)
            yield slot
            if self._queue[slot] == q:             # not evicted (leased / uncommitted): keep it, move on
                self._unlink(slot)
                self._push(slot, q)

    def clear(self) -> None:
        self._prev = array("i")
        self._next = array("i")
        self._queue = bytearray()
        self._freq = bytearray()
        self._head = [NIL, NIL, NIL, NIL]          # indexed by _SMALL / _MAIN / _ORPHAN (0 unused)
        self._tail = [NIL, NIL, NIL, NIL]
        self._count = [0, 0, 0, 0]
        self._gfp = array("I", [0]) * 64
        self._gseq = array("q", [-1]) * 64
        self._gclock = 0                           # ghost insertions so far
        self._gfloor = 0                           # insertion numbers below this are forgotten

    def __len__(self) -> int:
        return self._count[_SMALL] + self._count[_MAIN] + self._count[_ORPHAN]

    def __contains__(self, slot: object) -> bool:
        return isinstance(slot, int) and 0 <= slot < len(self._queue) and self._queue[slot] != _OUT

    def __repr__(self) -> str:
        return (f"S3FIFOPolicy(small={self._count[_SMALL]}, main={self._count[_MAIN]}, "
                f"orphans={self._count[_ORPHAN]}, "
                f"ghost<={self._gclock - self._gfloor})")

    # ---- queues ----

    def _ensure(self, size: int) -> None:
        if size > len(self._queue):
            grow(self._prev, size, NIL)
            grow(self._next, size, NIL)
            self._queue.extend(bytes(len(self._prev) - len(self._queue)))
            self._freq.extend(bytes(len(self._prev) - len(self._freq)))

    def _push(self, slot: int, q: int) -> None:
        tail = self._tail[q]
        self._prev[slot] = tail
        self._next[slot] = NIL
        if tail == NIL:
            self._head[q] = slot
        else:
            self._next[tail] = slot
        self._tail[q] = slot
        self._queue[slot] = q
        self._count[q] += 1

    def _unlink(self, slot: int) -> None:
        q = self._queue[slot]
        p, n = self._prev[slot], self._next[slot]
        if p == NIL:
            self._head[q] = n
        else:
            self._next[p] = n
        if n == NIL:
            self._tail[q] = p
        else:
            self._prev[n] = p
        self._queue[slot] = _OUT
        self._count[q] -= 1

    def _bump(self, slot: int) -> None:
        if self._queue[slot] == _ORPHAN:          # reachable after all: back to probation, as used once
            self._unlink(slot)
            self._freq[slot] = 0
            self._push(slot, _SMALL)
        f = self._freq[slot]
        if f < MAX_FREQ:
            self._freq[slot] = f + 1

    # ---- ghost ----

    def _ghost_add(self, fp: int) -> None:
        b = fp & (len(self._gfp) - 1)
        self._gfp[b] = fp
        self._gseq[b] = self._gclock
        self._gclock += 1

    def _ghost_pop(self, fp: int) -> bool:
        b = fp & (len(self._gfp) - 1)
        if self._gfp[b] == fp and self._gseq[b] >= self._gfloor:
            self._gseq[b] = -1
            return True
        return False

    def _trim_ghost(self) -> None:
        # the ghost remembers about as many keys as the cache holds
        self._gfloor = max(self._gfloor, self._gclock - max(len(self), 1))

    def _ghost_grow(self) -> None:
        size = len(self._gfp)
        if len(self) <= size:
            return
        while size < len(self):
            size *= 2
        fps, seqs = self._gfp, self._gseq
        live = sorted((seqs[b], fps[b]) for b in range(len(fps)) if seqs[b] >= self._gfloor)
        self._gfp = array("I", [0]) * size
        self._gseq = array("q", [-1]) * size
        for seq, fp in live:                       # oldest first, so the newest wins a collision
            b = fp & (size - 1)
            self._gfp[b] = fp
            self._gseq[b] = seq
