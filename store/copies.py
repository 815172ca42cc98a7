"""Copies: the inclusive SSD tier's bookkeeping. An object on a faster tier (DRAM, HBM) of a node that has an SSD
also holds an SSD extent, reserved when it is placed (index column `copy`, in 4 KiB pages), so the pool holds as
many objects as its SSDs and every object in DRAM can be written to SSD without evicting anything. Its bytes are
written there later, outside the master lock (store/writebehind.py); `dirty` holds the keys whose copy is reserved
but not written yet, in commit order (a chain's parents first).

    object on DRAM, copy clean   a demotion frees the DRAM extent only: the copy becomes the object, no bytes move
    object on DRAM, copy dirty   a demotion writes it into the reserved extent (what the write-behind would have done)
    SSD hit promoted to DRAM     the SSD record stays as the new object's clean copy: nothing to write behind
    object leaves                its copy extent is freed and the record erased with it (a restart must not
                                 resurrect a removed object)
    restart of a node            copies and SSD objects are the same records: both are re-adopted as SSD objects
    master reloaded from Redis   the journal has the objects, not their copies: a reported record of an object the
                                 index has in DRAM becomes its copy again (`adopt`)

Only a node whose SSD is at least SSD_OVER_FAST times its fast tiers gets copies: the SSD must hold what DRAM holds
(plus a header page per object) and still leave room for its own objects; with a smaller SSD the inclusive tier
would evict SSD objects to copy DRAM ones and hold fewer objects than the exclusive tiers, so such a node keeps them.

An SSD extent normally has one holder. The exception is a promotion while readers still hold a lease on the old SSD
slot: the record is then both the old slot's extent and the new object's copy (`share`), and the last holder to go
frees it. The checksum rules are the SSD tier's: a copy is an ordinary record with the committed checksum, verified
on every read, so a torn or stale copy is a miss, never data. Owned by Placement; called under the master lock.
"""

from __future__ import annotations

from typing import Callable

from kvpool.store.index import COMMITTED, COPY_PAGE, NO_COPY, Index
from kvpool.store.node import Drop
from kvpool.store.records import ObjectRecord
from kvpool.tiers.types import Tier

_SSD = Tier.SSD
_TIERS = tuple(Tier)
MAX_COPY_OFFSET = (NO_COPY - 1) * COPY_PAGE     # the `copy` column's reach (16 TiB): larger SSDs get no copies
SSD_OVER_FAST = 2                               # copies need an SSD at least this many times DRAM + HBM


class Copies:
    def __init__(self, index: Index, enabled: bool, allocate: Callable) -> None:
        """`allocate(node, tier, size, max_atime)`: Placement.allocate, which may evict SSD objects for a copy."""
        self.index = index
        self.enabled = enabled
        self._allocate = allocate
        self.dirty: dict[bytes, None] = {}
        self._shared: dict[tuple[int, int], int] = {}   # (node number, SSD offset) -> holders beyond the first

    def on(self, node, tier: Tier) -> bool:
        """Objects on `tier` of `node` get an SSD copy."""
        info = node.info
        return (self.enabled and tier is not _SSD and _SSD in node.spaces and info.ssd_bytes <= MAX_COPY_OFFSET
                and info.ssd_bytes >= SSD_OVER_FAST * (info.dram_bytes + info.hbm_bytes))

    def offset(self, slot: int) -> int | None:
        page = int(self.index.copy[slot])
        return None if page == NO_COPY else page * COPY_PAGE

    def fits(self, node, size: int) -> bool:
        """A copy of `size` bytes fits on the node's SSD without evicting anything."""
        ssd = node.spaces[_SSD]
        return ssd.allocator.can_allocate(ssd.extent_size(size))

    def reserve(self, slot: int, node, max_atime: int | None = None) -> bool:
        """Give the object at `slot` (on a fast tier of `node`) its SSD extent, making room if needed (SSD objects
        are the victims; other objects' copies never are). False: no copy (off, no SSD, no room)."""
        index = self.index
        if node is None or not self.on(node, _TIERS[int(index.tier[slot])]) or int(index.copy[slot]) != NO_COPY:
            return False
        offset = self._allocate(node, _SSD, int(index.size[slot]), max_atime)
        if offset is None:
            return False
        index.copy[slot] = offset // COPY_PAGE
        return True

    def adopt(self, slot: int, node, r: ObjectRecord) -> bool:
        """A node reported an SSD record of an object the index has on a faster tier of that node without a copy:
        the record becomes its clean copy if its extent is free. False: not this object's copy, or it overlaps
        something (the node then erases it)."""
        index = self.index
        if (r.tier != _SSD or int(index.node[slot]) != node.number or int(index.state[slot]) != COMMITTED
                or not self.on(node, _TIERS[int(index.tier[slot])]) or int(index.copy[slot]) != NO_COPY
                or int(index.size[slot]) != r.size or int(index.checksum[slot]) != r.checksum or r.offset % COPY_PAGE):
            return False
        ssd = node.spaces[_SSD]
        try:
            ssd.allocator.reserve(r.offset, ssd.extent_size(r.size))
        except ValueError:
            return False
        index.copy[slot] = r.offset // COPY_PAGE
        return True

    def move_to(self, slot: int, node, tier: Tier) -> tuple[int, bool]:
        """The object at `slot` is being re-indexed on `tier` of `node` (a promotion, a drain move): the copy page
        its new slot takes over (NO_COPY: none, reserve one) and whether that copy is still dirty."""
        index = self.index
        key = index.key_at(slot)
        if node.number != int(index.node[slot]) or not self.on(node, tier):
            return NO_COPY, False
        if int(index.tier[slot]) == _SSD:     # the promoted record itself becomes the copy
            offset = int(index.offset[slot])
            if int(index.leases[slot]) > 1:   # readers besides the caller's pin: the old slot keeps its hold
                shared = (node.number, offset)
                self._shared[shared] = self._shared.get(shared, 0) + 1
            else:
                index.offset[slot] = -1       # the old slot frees no extent
            return offset // COPY_PAGE, False
        page = int(index.copy[slot])          # a faster-tier object keeps its copy
        index.copy[slot] = NO_COPY
        return page, page != NO_COPY and key in self.dirty

    def free_ssd(self, node, key: bytes, offset: int, size: int, drops: list[Drop]) -> None:
        """Free an SSD extent and erase its record, unless another slot still holds it."""
        shared = (node.number, offset)
        extra = self._shared.get(shared)
        if extra:
            if extra == 1:
                del self._shared[shared]
            else:
                self._shared[shared] = extra - 1
            return
        node.spaces[_SSD].allocator.free(offset)
        drops.append(Drop(key, _SSD, offset, size))

    def forget_node(self, number: int) -> None:
        self._shared = {k: v for k, v in self._shared.items() if k[0] != number}


__all__ = ["Copies", "MAX_COPY_OFFSET", "SSD_OVER_FAST"]
