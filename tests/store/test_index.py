"""store/index.py: slot reuse, DOOMED unlinking, invariants, and the memory budget (<= 200 B/object at 1M)."""

import tracemalloc

import numpy as np
import pytest

from kvpool.store.index import Index, State
from kvpool.tiers.types import Tier


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_add_lookup_free_reuses_lowest_slot():
    idx = Index(initial_slots=2)
    assert [idx.add(key(i), node=0, tier=Tier.DRAM, state=State.PENDING, offset=i * 4096, size=4096, ns=0)
            for i in range(5)] == [0, 1, 2, 3, 4]  # grew 2 -> 4 -> 8 on the way
    assert idx.slot_of(key(3)) == 3 and idx.slot_of(key(9)) == -1
    assert int(idx.offset[3]) == 3 * 4096 and idx.state[3] == State.PENDING
    idx.free(1)
    assert key(1) not in idx and len(idx) == 4
    assert idx.add(key(7), node=0, tier=Tier.SSD, state=State.COMMITTED, offset=0, size=10, ns=0, checksum=99) == 1
    m = idx.meta(1)
    assert (m.key, m.tier, m.state, m.size, m.checksum) == (key(7), Tier.SSD, State.COMMITTED, 10, 99)
    with pytest.raises(KeyError):
        idx.add(key(7), node=0, tier=Tier.SSD, state=State.COMMITTED, offset=0, size=10, ns=0)
    idx.check_invariants()


def test_unlinked_slot_stays_reserved_until_freed():
    idx = Index()
    slot = idx.add(key(1), node=0, tier=Tier.DRAM, state=State.COMMITTED, offset=0, size=1, ns=0)
    idx.unlink_key(slot)
    idx.state[slot] = State.DOOMED
    assert idx.slot_of(key(1)) == -1 and list(idx.slots()) == [slot]
    # The key can be indexed again (a new put) while the doomed slot waits for its readers.
    assert idx.add(key(1), node=0, tier=Tier.DRAM, state=State.PENDING, offset=4096, size=1, ns=0) != slot
    idx.free(slot)
    assert idx.slot_of(key(1)) >= 0
    idx.check_invariants()


def test_namespace_interning():
    idx = Index()
    assert idx.intern_ns(b"a" * 16) == 0 and idx.intern_ns(b"b" * 16) == 1 and idx.intern_ns(b"a" * 16) == 0
    assert idx.ns_digest(1) == b"b" * 16


def test_memory_per_object_at_one_million_is_within_budget():
    n = 1_000_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        idx = Index()
        for i in range(n):  # keys are created here, so their own bytes objects are counted too
            idx.add(i.to_bytes(16, "little"), node=0, tier=Tier.DRAM, state=State.COMMITTED, offset=i, size=4096,
                    ns=0)
        per_object = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert len(idx) == n
    print(f"index bytes/object at 1M: {per_object:.1f}")
    assert per_object <= 200


def test_rows_are_52_bytes_with_u32_last_access_chain_links_and_copy_page():
    from kvpool.store.index import NO_COPY, ROW

    assert ROW.itemsize == 52 and ROW["atime"] == np.dtype(np.uint32) and ROW["copy"] == np.dtype(np.uint32)
    assert ROW["parent"] == ROW["child"] == np.dtype(np.int32)
    idx = Index()
    slot = idx.add(key(1), node=0, tier=Tier.DRAM, state=State.COMMITTED, offset=0, size=1, ns=0, atime=4_000_000_000)
    assert idx.meta(slot).atime == 4_000_000_000 and int(idx.atime[slot]) == 4_000_000_000
    # a new object is a chain root with no child and no SSD copy
    assert int(idx.parent[slot]) == -1 and int(idx.child[slot]) == -1 and int(idx.copy[slot]) == NO_COPY
