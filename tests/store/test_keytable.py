"""store/keytable.py and store/_keytable.c: the index's key <-> slot table, the C table and the dict fallback held to
one model (a dict and a list) through random operations, their refusals, and the C table's memory."""

import random
import tracemalloc

import pytest

from kvpool.store.keytable import DictKeyTable, native_available, new_key_table

IMPLS = ["c", "dict"]


def make(impl: str, slots: int = 0):
    if impl == "c" and not native_available():
        pytest.skip("kvpool.store._keytable is not built here (no C compiler at install)")
    return new_key_table(slots, native=impl == "c")


@pytest.fixture(params=IMPLS)
def impl(request):
    return request.param


def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def test_new_key_table_follows_the_switch(monkeypatch):
    monkeypatch.setenv("KVPOOL_NATIVE_KEYS", "0")
    assert isinstance(new_key_table(), DictKeyTable)
    monkeypatch.setenv("KVPOOL_NATIVE_KEYS", "1")
    assert isinstance(new_key_table(), DictKeyTable) != native_available()
    monkeypatch.setenv("KVPOOL_NATIVE_KEYS", "yes")
    with pytest.raises(ValueError, match="KVPOOL_NATIVE_KEYS must be 0"):
        new_key_table()


def test_without_the_extension_the_index_gets_the_dict(monkeypatch):
    import sys

    from kvpool.store.index import Index

    monkeypatch.setitem(sys.modules, "kvpool.store._keytable", None)    # as where no C compiler built it
    monkeypatch.delenv("KVPOOL_NATIVE_KEYS", raising=False)
    assert not native_available() and isinstance(new_key_table(), DictKeyTable)
    from kvpool.store.index import State
    from kvpool.tiers.types import Tier

    idx = Index()
    slot = idx.add(key(1), node=0, tier=Tier.DRAM, state=State.COMMITTED, offset=0, size=1, ns=0)
    assert idx.find(key(1), -1) == slot and idx.key_at(slot) == key(1)
    assert isinstance(idx.find.__self__, dict)      # the dict's own get, bound as `find`


def test_link_find_unlink_clear(impl):
    t = make(impl)
    t.link(key(1), 5)
    t.link(key(2), 0)
    assert (t.get(key(1), -1), t.get(key(2)), t.get(key(3), -1), t.get(key(3))) == (5, 0, -1, None)
    assert key(1) in t and key(3) not in t and len(t) == 2
    assert t.key_at(5) == key(1) and t.key_at(1) is None and t.key_at(10**6) is None
    assert t.keys_of([0, 5, 3]) == [key(2), key(1), None]
    assert t.linked() == [(key(2), 0), (key(1), 5)]
    # unlink: unfindable, still held (a DOOMED slot); the key may be linked again at another slot
    assert t.unlink(5) is True and t.unlink(5) is False
    assert t.get(key(1), -1) == -1 and t.key_at(5) == key(1) and len(t) == 1
    t.link(key(1), 7)
    assert t.get(key(1), -1) == 7 and t.key_at(5) == key(1)
    # freeing the old slot leaves the newer object's key linked
    t.clear(5)
    assert t.key_at(5) is None and t.get(key(1), -1) == 7 and len(t) == 2
    t.clear(7)
    assert t.get(key(1), -1) == -1 and t.key_at(7) is None and len(t) == 1
    t.link(key(9), 5)       # a cleared slot takes a key again
    assert t.linked() == [(key(2), 0), (key(9), 5)]


def test_refusals_change_nothing(impl):
    t = make(impl)
    t.link(key(1), 3)
    before = (t.linked(), len(t), t.keys_of(range(8)))
    with pytest.raises(KeyError):
        t.link(key(1), 4)                   # linked already
    with pytest.raises(ValueError, match="slot: 3 already holds a key"):
        t.link(key(2), 3)
    with pytest.raises(ValueError, match="key: must be 16 bytes"):
        t.link(b"short", 4)
    with pytest.raises(ValueError, match="slot: must be"):
        t.link(key(2), -1)
    assert (t.linked(), len(t), t.keys_of(range(8))) == before
    t.unlink(3)
    with pytest.raises(ValueError, match="slot: 3 already holds a key"):
        t.link(key(2), 3)                   # a DOOMED slot keeps its key until cleared
    assert t.get(key(2), -1) == -1 and t.key_at(3) == key(1)


def test_lookups_take_any_key_like_a_dict(impl):
    t = make(impl)
    t.link(key(1), 2)
    assert t.get(memoryview(key(1)), -1) == 2           # a buffer of the same 16 bytes
    assert t.get(b"x" * 15, -1) == -1 and t.get(b"", -1) == -1 and t.get(key(1) + b"\0", -1) == -1
    assert b"x" not in t
    for other in (None, 7, "0123456789abcdef"):         # no buffer, or not 16 bytes: found nowhere, as in a dict
        assert t.get(other, -1) == -1 and other not in t
    with pytest.raises(ValueError, match="key: must be 16 bytes"):
        t.link(None, 4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_operations_match_a_model(impl, seed):
    """~20,000 operations against a dict and a list, with the live keys held near half the C table's first size (64
    entries) for long stretches, so probe runs are long and removals shift entries back within them; then growth."""
    rng = random.Random(seed)
    t = make(impl, slots=rng.choice([0, 1, 40]))
    slot_of: dict[bytes, int] = {}      # linked keys
    held: dict[int, bytes] = {}         # slot -> key held (linked or not)
    universe = [key(rng.getrandbits(128)) for _ in range(200)]
    for step in range(20_000):
        cap = 32 if step < 12_000 else 3_000
        op = rng.random()
        if op < 0.4 and len(slot_of) < cap:
            k = rng.choice(universe) if rng.random() < 0.7 else key(rng.getrandbits(128))
            slot = rng.randrange(max(64, 2 * len(held) + 8))
            if k in slot_of:
                with pytest.raises(KeyError):
                    t.link(k, slot)
            elif slot in held:
                with pytest.raises(ValueError):
                    t.link(k, slot)
            else:
                t.link(k, slot)
                slot_of[k], held[slot] = slot, k
        elif op < 0.55 and held:
            slot = rng.choice(list(held))
            was = slot_of.get(held[slot]) == slot
            assert t.unlink(slot) is was
            if was:
                del slot_of[held[slot]]
        elif op < 0.7 and held:
            slot = rng.choice(list(held))
            t.clear(slot)
            if slot_of.get(held[slot]) == slot:
                del slot_of[held[slot]]
            del held[slot]
        else:
            k = rng.choice(universe)
            assert t.get(k, -1) == slot_of.get(k, -1)
            assert (k in t) == (k in slot_of)
        if step % 1000 == 999:
            assert t.linked() == sorted(((k, s) for k, s in slot_of.items()), key=lambda item: item[1])
            assert len(t) == len(slot_of)
            probe = sorted(held)[:50] + [max(held, default=0) + 1]
            assert t.keys_of(probe) == [held.get(s) for s in probe]
    for k, s in slot_of.items():
        assert t.get(k, -1) == s


def test_the_c_table_costs_under_34_bytes_a_key_at_one_million_and_tracemalloc_sees_it():
    t = make("c")
    n = 1_000_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        t.reserve(1 << 20)
        for i in range(n):
            t.link(i.to_bytes(16, "little"), i)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    slots, entries, linked, held, moving = t.stats()
    assert (slots, entries, linked, moving) == (1 << 20, 1 << 21, n, 0)
    assert held == slots * 17 + entries * 4
    assert held <= used <= held + 1024      # every byte it holds is traced (the rest: the loop's last objects)
    assert used / n < 34
    assert t.get((n - 1).to_bytes(16, "little"), -1) == n - 1 and t.get(n.to_bytes(16, "little"), -1) == -1


def test_slots_may_be_numpy_integers(impl):
    import numpy as np

    t = make(impl)
    t.link(key(1), np.int64(3))
    assert t.key_at(np.int64(3)) == key(1) and t.keys_of(np.array([3, 0])) == [key(1), None]
    assert t.unlink(np.int32(3)) is True
    t.clear(np.uint16(3))
    assert t.key_at(3) is None


def test_keys_one_byte_apart_are_different_keys(impl):
    t = make(impl)
    base = bytes(range(16))
    near = [base[:i] + bytes([base[i] ^ 0x80]) + base[i + 1:] for i in range(16)]
    t.link(base, 0)
    for i, k in enumerate(near):
        assert t.get(k, -1) == -1
        t.link(k, i + 1)
    assert [t.get(k, -1) for k in [base] + near] == list(range(17))
    t.unlink(0)
    assert t.get(base, -1) == -1 and [t.get(k, -1) for k in near] == list(range(1, 17))


@pytest.mark.parametrize("varying", [0, 15])
def test_keys_sharing_fifteen_bytes_in_a_half_full_table(impl, varying):
    """32 keys that differ only in byte `varying` fill the C table's first 64 entries to half: probe runs pass
    through one another's entries, so a compare of fewer than 16 bytes would answer the absent neighbours."""
    t = make(impl)

    def near(b: int) -> bytes:
        k = bytearray(b"\x5a" * 16)
        k[varying] = b
        return bytes(k)

    for b in range(0, 64, 2):
        t.link(near(b), b)
    assert [t.get(near(b), -1) for b in range(64)] == [b if b % 2 == 0 else -1 for b in range(64)]
    if impl == "c":
        assert t.stats()[1] == 64       # still the first table: half full


def test_the_c_table_grows_a_little_at_every_call_and_finds_every_key_meanwhile():
    """Growth moves the old table into the new one MOVE_STEP (64) entries per link / unlink, not all at once (a
    2M-key rehash held the master's lock ~0.36 s). Through eleven growths (64 -> 131,072 entries), with links,
    unlinks and clears interleaved while both tables exist, every key is found exactly where the model says, and
    each growth ends within old entries / 64 calls."""
    t = make("c")
    rng = random.Random(11)
    slot_of: dict[bytes, int] = {}
    held: dict[int, bytes] = {}
    next_slot = 0
    growths = 0

    def link() -> None:
        nonlocal next_slot
        k = key(rng.getrandbits(128))
        t.link(k, next_slot)
        slot_of[k], held[next_slot] = next_slot, k
        next_slot += 1

    def check(sample: int) -> None:
        for k in rng.sample(list(slot_of), min(sample, len(slot_of))):
            assert t.get(k, -1) == slot_of[k]
        for s in rng.sample(list(held), min(sample, len(held))):
            if slot_of.get(held[s]) != s:
                assert t.get(held[s], -1) == -1 and held[s] not in t

    while t.stats()[1] < 1 << 17:
        size = t.stats()[1]
        while t.stats()[1] == size:
            link()
        growths += 1
        old_entries = size
        assert t.stats()[4] > 0 or old_entries <= 64           # the old table is still being moved
        calls = 0
        while t.stats()[4]:
            before = t.stats()[4]
            op = rng.random()
            if op < 0.5:
                link()
                changed = True
            elif op < 0.8:
                s = rng.choice(list(held))
                changed = slot_of.get(held[s]) == s
                assert t.unlink(s) is changed
                if changed:
                    del slot_of[held[s]]
            else:
                s = rng.choice(list(held))
                changed = slot_of.get(held[s]) == s
                t.clear(s)
                if changed:
                    del slot_of[held[s]]
                del held[s]
            if changed:     # a call that links or unlinks a key moves; one that finds nothing to do does not
                calls += 1
                assert t.stats()[4] <= max(0, before - 64)
            check(len(held) if old_entries <= 8192 else 64)    # every key after every call while that is cheap
        assert calls <= old_entries // 64
        assert len(t) == len(slot_of)
        check(len(held))
    assert growths == 11
    assert t.linked() == sorted(slot_of.items(), key=lambda item: item[1])


def test_settle_finishes_a_growth_at_once():
    t = make("c")
    i = 0
    while t.stats()[1] < 1 << 12:
        t.link(key(i), i)
        i += 1
    assert t.stats()[4] > 0
    t.settle()
    assert t.stats()[4] == 0 and t.stats()[1] == 1 << 12
    assert [t.get(key(j), -1) for j in range(i)] == list(range(i))
