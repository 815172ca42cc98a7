"""store/index.py: slot reuse, DOOMED unlinking, invariants, and the memory budget (<= 200 B/object at 1M), with each
key table (store/keytable.py: the C table, and the dict where it is not built)."""

import tracemalloc

import numpy as np
import pytest

from kvpool.store.index import Index, State
from kvpool.store.keytable import native_available
from kvpool.tiers.types import Tier


@pytest.fixture(autouse=True, params=["c", "dict"])
def keys(request, monkeypatch):
    if request.param == "c" and not native_available():
        pytest.skip("kvpool.store._keytable is not built here (no C compiler at install)")
    monkeypatch.setenv("KVPOOL_NATIVE_KEYS", "1" if request.param == "c" else "0")
    return request.param


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
    idx.doom(slot)
    assert idx.slot_of(key(1)) == -1 and list(idx.slots()) == [slot]
    assert (idx.tenant_bytes(0), idx.tenant_slots(0)) == (0, 0)     # gone for its tenant from the doom on
    # The key can be indexed again (a new put) while the doomed slot waits for its readers.
    assert idx.add(key(1), node=0, tier=Tier.DRAM, state=State.PENDING, offset=4096, size=3, ns=0) != slot
    idx.check_invariants()
    idx.free(slot)
    assert idx.slot_of(key(1)) >= 0 and (idx.tenant_bytes(0), idx.tenant_slots(0)) == (3, 1)
    idx.check_invariants()


def test_namespace_interning():
    idx = Index()
    assert idx.intern_ns(b"a" * 16) == 0 and idx.intern_ns(b"b" * 16) == 1 and idx.intern_ns(b"a" * 16) == 0
    assert idx.ns_digest(1) == b"b" * 16


def test_memory_per_object_at_one_million_is_within_budget(keys):
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
    print(f"index bytes/object at 1M ({keys} key table): {per_object:.1f}")
    assert per_object <= (100 if keys == "c" else 200)   # the C table: 76.8 B (~25 B keys + 48 B rows); dict 176


def test_rows_are_46_bytes_with_u32_last_access_and_size_chain_links_copy_page_and_u16_ns_leases_tenant():
    from kvpool.store.index import NO_COPY, ROW

    assert ROW.itemsize == 46 and ROW["atime"] == np.dtype(np.uint32) and ROW["copy"] == np.dtype(np.uint32)
    assert ROW["parent"] == ROW["child"] == np.dtype(np.int32) and ROW["tenant"] == np.dtype(np.uint16)
    assert ROW["ns"] == ROW["leases"] == np.dtype(np.uint16) and ROW["size"] == np.dtype(np.uint32)
    idx = Index()
    slot = idx.add(key(1), node=0, tier=Tier.DRAM, state=State.COMMITTED, offset=0, size=1, ns=0, atime=4_000_000_000,
                   tenant=65535)
    assert idx.meta(slot).atime == 4_000_000_000 and int(idx.atime[slot]) == 4_000_000_000
    # a new object is a chain root with no child and no SSD copy
    assert int(idx.parent[slot]) == -1 and int(idx.child[slot]) == -1 and int(idx.copy[slot]) == NO_COPY
    assert idx.meta(slot).tenant == 65535


def test_bytes_are_counted_per_tenant_and_tier_through_add_move_and_free():
    idx = Index(initial_slots=2)
    a = idx.add(key(1), node=0, tier=Tier.DRAM, state=State.PENDING, offset=0, size=100, ns=0, tenant=2)
    b = idx.add(key(2), node=0, tier=Tier.DRAM, state=State.COMMITTED, offset=4096, size=30, ns=0, tenant=2)
    c = idx.add(key(3), node=0, tier=Tier.SSD, state=State.COMMITTED, offset=0, size=7, ns=0)
    assert (idx.tenant_bytes(2, Tier.DRAM), idx.tenant_bytes(2), idx.tenant_slots(2)) == (130, 130, 2)
    assert (idx.tenant_bytes(0, Tier.SSD), idx.tenant_bytes(1), idx.tenant_slots(1)) == (7, 0, 0)
    assert idx.tenant_bytes(9) == 0  # a tenant the index never saw
    idx.set_tier(b, Tier.SSD)
    assert (idx.tenant_bytes(2, Tier.DRAM), idx.tenant_bytes(2, Tier.SSD), idx.tenant_bytes(2)) == (100, 30, 130)
    idx.check_invariants()
    idx.doom(a)  # removed while leased: its space still held, no longer its tenant's
    assert (idx.tenant_bytes(2), idx.tenant_slots(2)) == (30, 1)
    idx.check_invariants()
    idx.free(a)  # counts nothing again
    idx.free(c)
    assert (idx.tenant_bytes(2), idx.tenant_slots(2), idx.tenant_bytes(0), idx.tenant_slots(0)) == (30, 1, 0, 0)
    idx.check_invariants()


def test_the_narrow_columns_bounds_are_enforced_before_anything_changes():
    from kvpool.store.config import MAX_OBJECT_BYTES, MasterConfig
    from kvpool.store.index import MAX_NAMESPACES, MAX_SIZE, NamespaceTableFull

    assert MAX_OBJECT_BYTES == MAX_SIZE == 2**32 - 1
    assert MasterConfig(max_object_bytes=MAX_OBJECT_BYTES).max_object_bytes == MAX_OBJECT_BYTES
    with pytest.raises(ValueError, match=r"^max_object_bytes must be <= 4294967295"):
        MasterConfig(max_object_bytes=MAX_OBJECT_BYTES + 1)
    idx = Index()
    ids = [idx.intern_ns(i.to_bytes(16, "little")) for i in range(MAX_NAMESPACES)]
    assert ids == list(range(MAX_NAMESPACES))
    assert idx.intern_ns((7).to_bytes(16, "little")) == 7                     # a known digest still resolves
    with pytest.raises(NamespaceTableFull, match=r"^namespace: this master already holds 65536"):
        idx.intern_ns(b"\xff" * 16)
    assert idx.ns_id_of(b"\xff" * 16) == -1
