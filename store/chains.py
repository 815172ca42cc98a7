"""Chains: which indexed block is whose parent, so the master knows which blocks no prefix lookup can reach.

A block key hashes its whole prefix, so a prefix lookup walks a chain from its root and stops at the first miss:
once a block leaves the pool (removed, evicted on another node or tier, found corrupt, lost with its node) every
block below it is dead weight until the parent comes back. The master learns the links from the two places where
keys arrive in chain order, and threads them through the index's slots (two int32 columns, no Python object per
block):

    put_start(keys)      keys[i] is stored under keys[i-1] (a batch put is one chain, docs/internals.md "Policies")
    leased lookup hits   hits[i] under hits[i-1]; a lookup that starts at a block makes it a root again

    parent[slot]  the parent's slot | ROOT (-1: none or unknown) | ORPHAN (-2: an ancestor left the pool)
    child[slot]   the only child's slot | NONE (-1) | MANY (-2: the children are in `_many[slot]`, in link order)

Branch points (a shared system prompt followed by many conversations) are rare and keep their children in a side
table; everything else costs its 8 bytes in the index row. When a block leaves, `detach` unlinks it and dissolves
the subtree below it: every descendant becomes ORPHAN, unlinked, and is returned in prefix order (breadth first)
so the policies offer them first (`EvictionPolicy.mark_orphans`). A dissolved subtree is linked again by the next
lookup that hits it whole. Relocation (promotion, drain) gives a new slot to the same object: `take` and `give`
move its links without orphaning anyone.

Not thread-safe: owned by Placement, called under the master lock. Unknown links are never a fault: an unlinked
block is simply a root, exactly as before chains were tracked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvpool.store.index import Index

ROOT, ORPHAN = -1, -2       # parent column
NONE, MANY = -1, -2         # child column


@dataclass(slots=True)
class Links:
    """A slot's place in the tree, carried from an old slot to the new one of the same object (`take` / `give`)."""

    parent: int = ROOT
    children: list[int] = field(default_factory=list)


class Chains:
    def __init__(self, index: Index) -> None:
        self.index = index
        self._many: dict[int, dict[int, None]] = {}   # branch point -> its children (an ordered set)

    # ---- reading

    def children(self, slot: int) -> list[int]:
        c = int(self.index.child[slot])
        if c == NONE:
            return []
        if c == MANY:
            return list(self._many[slot])
        return [c]

    def is_orphan(self, slot: int) -> bool:
        return int(self.index.parent[slot]) == ORPHAN

    @property
    def branch_points(self) -> int:
        return len(self._many)

    # ---- linking

    def link(self, child: int, parent: int | None) -> bool:
        """Record `child` as a child of `parent` (None: the block above it is not in the pool, so `child` cannot be
        reached). Returns True when `child` is an orphan afterwards (its parent is missing or itself an orphan)."""
        index = self.index
        if parent is not None and parent == child:
            return False
        current = int(index.parent[child])
        if parent is not None and current == parent:
            return False
        if current >= 0:
            self._remove_child(current, child)
        if parent is None or int(index.parent[parent]) == ORPHAN:
            index.parent[child] = ORPHAN
            return True
        index.parent[child] = parent
        self._add_child(parent, child)
        return False

    def confirm(self, slots: np.ndarray) -> None:
        """A leased lookup hit these slots, in chain order: each is its predecessor's child, and the first one is
        used as a root by this caller (a client that holds the parent in its own cache), so not an orphan."""
        index = self.index
        if not len(slots):
            return
        first = int(slots[0])
        if int(index.parent[first]) == ORPHAN:
            index.parent[first] = ROOT
        if len(slots) > 1:
            wrong = np.flatnonzero(index.parent[slots[1:]] != slots[:-1])  # one compare when the links are known
            for i in wrong.tolist():
                self.link(int(slots[i + 1]), int(slots[i]))

    # ---- a block leaves, or moves to a new slot

    def detach(self, slot: int) -> list[int]:
        """`slot` leaves the pool: unlink it and dissolve its subtree. Returns the descendants (now ORPHAN), parents
        before children."""
        index = self.index
        parent = int(index.parent[slot])
        if parent >= 0:
            self._remove_child(parent, slot)
        index.parent[slot] = ROOT
        frontier = self._take_children(slot)
        out: list[int] = []
        seen = {slot}
        while frontier:
            nxt: list[int] = []
            for c in frontier:
                if c in seen:           # a cycle made by junk lookups ([a, b] then [b, a]): visit once
                    continue
                seen.add(c)
                index.parent[c] = ORPHAN
                out.append(c)
                nxt.extend(self._take_children(c))
            frontier = nxt
        return out

    def take(self, slot: int) -> Links:
        """Unlink `slot` from the tree without orphaning anyone; `give` puts the same links on another slot."""
        index = self.index
        parent = int(index.parent[slot])
        if parent >= 0:
            self._remove_child(parent, slot)
        index.parent[slot] = ROOT
        return Links(parent, self._take_children(slot))

    def give(self, slot: int, links: Links) -> None:
        index = self.index
        if links.parent >= 0:
            self.link(slot, links.parent)
        elif links.parent == ORPHAN:
            index.parent[slot] = ORPHAN
        for c in links.children:
            index.parent[c] = slot
            self._add_child(slot, c)

    # ---- internals

    def _add_child(self, parent: int, child: int) -> None:
        index = self.index
        c = int(index.child[parent])
        if c == NONE:
            index.child[parent] = child
        elif c == MANY:
            self._many[parent][child] = None
        elif c != child:
            self._many[parent] = {c: None, child: None}
            index.child[parent] = MANY

    def _remove_child(self, parent: int, child: int) -> None:
        index = self.index
        c = int(index.child[parent])
        if c == child:
            index.child[parent] = NONE
        elif c == MANY:
            many = self._many[parent]
            many.pop(child, None)
            if len(many) == 1:
                index.child[parent] = next(iter(many))
                del self._many[parent]

    def _take_children(self, slot: int) -> list[int]:
        children = self.children(slot)
        self.index.child[slot] = NONE
        self._many.pop(slot, None)
        return children


__all__ = ["Chains", "Links", "ROOT", "ORPHAN", "NONE", "MANY"]
