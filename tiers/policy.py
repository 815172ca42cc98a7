"""EvictionPolicy: which object of a (node, tier) to evict first. One policy object per node per tier, owned by
the master (which serialises calls and skips victims that are leased or uncommitted).

"Chain" methods take keys in prefix order (parent first). A batch put or a hit touches a whole chain at once, so
its keys tie on recency; the policy must then rank the TAIL colder than its parent, because a tail is only useful
while its parents are present: evicting a parent first would strand every descendant.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

POLICY_NAMES = ("lru", "s3fifo")


@runtime_checkable
class EvictionPolicy(Protocol):
    def insert_chain(self, keys: Sequence[bytes]) -> None:
        """Track newly committed keys (prefix order) as the hottest; an already-tracked key is touched."""

    def touch_chain(self, keys: Sequence[bytes]) -> None:
        """Record a use of these keys (prefix order); untracked keys are ignored."""

    def remove(self, key: bytes) -> bool:
        """Stop tracking `key`; False if it was not tracked."""

    def victims(self) -> Iterator[bytes]:
        """Tracked keys, coldest first, each at most once. The caller may remove/insert/touch keys while
        iterating; removed keys are not yielded."""

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...


def make_policy(name: str) -> EvictionPolicy:
    """A new, empty policy by name: one of POLICY_NAMES."""
    if name == "lru":
        from .lru import LRUPolicy
        return LRUPolicy()
    if name == "s3fifo":
        from .s3fifo import S3FIFOPolicy
        return S3FIFOPolicy()
    raise ValueError(f"policy must be one of {list(POLICY_NAMES)}, got {name!r}")
