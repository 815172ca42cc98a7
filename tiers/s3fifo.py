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

`victims()` runs the algorithm lazily: moves it makes (small -> main, freq decrements) persist even if the caller
stops early, as they would in the real cache. A victim the caller skips (leased) goes back to the tail of its
queue and is not offered again in the same iteration.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

MAX_FREQ = 3


class S3FIFOPolicy:
    """Not thread-safe: the master serialises calls."""

    name = "s3fifo"
    __slots__ = ("_small", "_main", "_ghost", "_freq", "_small_ratio")

    def __init__(self, small_ratio: float = 0.1) -> None:
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"small_ratio must be in (0, 1), got {small_ratio!r}")
        self._small: OrderedDict[bytes, None] = OrderedDict()
        self._main: OrderedDict[bytes, None] = OrderedDict()
        self._ghost: OrderedDict[bytes, None] = OrderedDict()
        self._freq: dict[bytes, int] = {}
        self._small_ratio = small_ratio

    def insert_chain(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):
            if key in self._freq:
                self._bump(key)
            elif self._ghost.pop(key, 0) is None:
                self._main[key] = None
                self._freq[key] = 0
            else:
                self._small[key] = None
                self._freq[key] = 0
        self._trim_ghost()

    def touch_chain(self, keys: Sequence[bytes]) -> None:
        for key in keys:
            if key in self._freq:
                self._bump(key)

    def remove(self, key: bytes) -> bool:
        if self._freq.pop(key, None) is None:
            return False
        if self._small.pop(key, 0) is None:
            self._ghost[key] = None          # left while still on probation: remember it
            self._trim_ghost()
        else:
            del self._main[key]
        return True

    def victims(self) -> Iterator[bytes]:
        offered: set[bytes] = set()
        done = {"small": False, "main": False}
        spins = {"small": 0, "main": 0}            # consecutive offered keys met at the head of each queue
        while not (done["small"] and done["main"]):
            use_small = not done["small"] and (done["main"] or not self._main
                                               or len(self._small) >= self._small_ratio * len(self))
            name, queue = ("small", self._small) if use_small else ("main", self._main)
            if not queue:
                done[name] = True
                continue
            key = next(iter(queue))
            if key in offered:                     # skipped earlier by the caller: rotate past it
                queue.move_to_end(key)
                spins[name] += 1
                if spins[name] >= len(queue):      # every key left in this queue was offered already
                    done[name] = True
                continue
            spins[name] = 0
            freq = self._freq[key]
            if freq > 0 and use_small:             # used while on probation: promote to main
                del self._small[key]
                self._main[key] = None
                self._freq[key] = 0
                done["main"] = False
                continue
            if freq > 0:                           # main: spend one use for another round
                self._freq[key] = freq - 1
                queue.move_to_end(key)
                continue
            offered.add(key)
            yield key
            if key in queue:                       # not evicted (leased / uncommitted): keep it, move on
                queue.move_to_end(key)

    def clear(self) -> None:
        self._small.clear()
        self._main.clear()
        self._ghost.clear()
        self._freq.clear()

    def __len__(self) -> int:
        return len(self._freq)

    def __contains__(self, key: object) -> bool:
        return key in self._freq

    def __repr__(self) -> str:
        return f"S3FIFOPolicy(small={len(self._small)}, main={len(self._main)}, ghost={len(self._ghost)})"

    def _bump(self, key: bytes) -> None:
        f = self._freq[key]
        if f < MAX_FREQ:
            self._freq[key] = f + 1

    def _trim_ghost(self) -> None:
        limit = max(len(self._freq), 1)      # the ghost remembers about as many keys as the cache holds
        while len(self._ghost) > limit:
            self._ghost.popitem(last=False)
