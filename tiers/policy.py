"""EvictionPolicy: which object of a (node, tier) to evict first. One policy object per node per tier, owned by
the master (which serialises calls and skips victims that are leased or uncommitted).

Policies track the index's SLOTS (plain ints >= 0, reused by the index once an object is gone), not keys: the
master tracks millions of objects and a per-object Python object costs more than the whole budget (docs/internals.md,
200 B per object). The caller removes a slot before the index reuses it. Keys are passed alongside where a policy
may need to remember an object beyond its slot's life (S3-FIFO's ghost).

"Chain" methods take slots in prefix order (parent first). A batch put or a hit touches a whole chain at once, so
its keys tie on recency; the policy must then rank the TAIL colder than its parent, because a tail is only useful
while its parents are present: evicting a parent first would strand every descendant.

Orphans: when an object leaves while its descendants stay (a parent removed, evicted on another node or tier, found
corrupt, or lost with its node), no prefix lookup from the root can reach them any more. The master tells the policy
(`mark_orphans`) and the policy offers them before every other slot, so they are the first space reclaimed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

POLICY_NAMES = ("lru", "s3fifo", "wlru", "clru", "bclru", "lclru")


@runtime_checkable
class EvictionPolicy(Protocol):
    def insert_chain(self, slots: Sequence[int], keys: Sequence[bytes] | None = None) -> None:
        """Track newly committed slots (prefix order) as the hottest; an already-tracked slot is touched. `keys`
        (one per slot, same order) are the objects' keys, for policies that remember evicted keys."""

    def touch_chain(self, slots: Sequence[int]) -> None:
        """Record a use of these slots (prefix order); untracked slots are ignored."""

    def remove(self, slot: int, key: bytes | None = None) -> bool:
        """Stop tracking `slot` (whose object has key `key`, if given); False if it was not tracked."""

    def mark_orphans(self, slots: Sequence[int]) -> None:
        """These tracked slots (prefix order) lost an ancestor: offer them before every other slot in `victims()`,
        tails first. Untracked slots are ignored. A later touch or insert makes a slot ordinary again (a client
        that holds the parent in its own cache may still read it)."""

    def victims(self) -> Iterator[int]:
        """Tracked slots, coldest first (orphans before everything else), each at most once. The caller may
        remove/insert/touch slots while iterating; removed slots are not yielded."""

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
    if name == "wlru":
        from .wlru import WeightedLRUPolicy
        return WeightedLRUPolicy()
    if name == "clru":
        from .clru import ClassLRUPolicy
        return ClassLRUPolicy()
    if name == "bclru":
        from .bclru import BalancedClassLRUPolicy
        return BalancedClassLRUPolicy()
    if name == "lclru":
        from .lclru import LengthClassLRUPolicy
        return LengthClassLRUPolicy()
    raise ValueError(f"policy must be one of {list(POLICY_NAMES)}, got {name!r}")
