"""How many requests asked for each block key: what the `after_n_hits` save policy reads, shared by the bundled
engine's connector and the vLLM planner. Bounded: the least recently requested keys are forgotten first."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

SEEN_CAPACITY = 200_000  # keys remembered


class SeenCounts:
    def __init__(self, capacity: int = SEEN_CAPACITY) -> None:
        self._counts: OrderedDict[bytes, int] = OrderedDict()
        self._capacity = capacity

    def remember(self, keys: Sequence[bytes]) -> None:
        """One more request asked for each of `keys`."""
        counts = self._counts
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
            counts.move_to_end(key)
        while len(counts) > self._capacity:
            counts.popitem(last=False)

    def count(self, key: bytes) -> int:
        return self._counts.get(key, 0)


__all__ = ["SEEN_CAPACITY", "SeenCounts"]
