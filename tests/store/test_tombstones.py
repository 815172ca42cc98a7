"""Removal tombstones (store/tombstones.py): a record written before a removal of its key is never re-adopted, with
the tombstones bounded in number (the oldest fold into a floor; a tenant's into its own key space's) and kept by a
persistent backend across a master restart."""

from __future__ import annotations

import pytest

from kvpool.store.metadata import MemoryMetadata
from kvpool.store.redis_metadata import RedisMetadata
from kvpool.store.tombstones import ADMIN_BUCKETS, SCOPE_BUCKETS, TombstoneChanges, Tombstones, TombstoneState, slot_of
from tests.store.cluster import redis_server  # noqa: F401 - fixture


class Wall:
    """A wall clock in µs the test moves (it may even go back)."""

    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _k(i: int) -> bytes:
    return i.to_bytes(16, "big")


NS_A, NS_B = b"A" * 16, b"B" * 16
ACME, BETA = b"acme", b"beta"        # two tenants' tags: their stored keys start with them (store/tenants.py)


def _t(tag: bytes, i: int) -> bytes:
    """Stored key i of the tenant whose tag is `tag`."""
    return tag + i.to_bytes(12, "big")


def _field(scope: bytes, key: bytes, slots: int) -> bytes:
    """The persisted `buckets` field of `key`'s slot: its scope (b"" for the admin's, else a tenant's tag) and the
    slot's index, u32 big-endian."""
    return scope + slot_of(key, slots).to_bytes(4, "big")


def _twin(key: bytes, slots: int, make=_k) -> bytes:
    """Another key (made by `make`) in the same slot as `key`."""
    return next(other for other in map(make, range(1, 1 << 20)) if other != key
                and slot_of(other, slots) == slot_of(key, slots))


def _apart(keys: list[bytes], slots: int, make=_k) -> bytes:
    """A key (made by `make`, from 100 on) in none of `keys`' slots."""
    taken = {slot_of(k, slots) for k in keys}
    return next(other for other in map(make, range(100, 1 << 20)) if slot_of(other, slots) not in taken)


def test_times_increase_even_when_the_wall_clock_stands_still_or_goes_back():
    wall = Wall(5_000)
    t = Tombstones(10, clock=wall)
    assert [t.now_us(), t.now_us()] == [5_000, 5_001]
    wall.now = 4_000                                    # an NTP step back
    assert t.now_us() == 5_002
    wall.now = 9_000
    assert t.now_us() == 9_000


def test_a_record_written_before_a_removal_of_its_key_or_namespace_is_refused_and_one_written_after_is_not():
    wall = Wall()
    t = Tombstones(10, clock=wall)
    heard = t.now_us()                                  # 1000: what a node heard before the removal
    wall.now = 2_000
    assert t.bury([_k(1)]) == 2_000
    assert t.refuses(_k(1), NS_A, heard) is True        # written before: refused
    assert t.refuses(_k(1), NS_A, 0) is True            # no time (an old node or file): refused
    assert t.refuses(_k(2), NS_A, heard) is False       # another key
    assert t.refuses(_k(1), NS_A, t.now_us()) is False  # written after the removal (a later heartbeat's time)
    wall.now = 3_000
    assert t.bury_namespace(NS_A) == 3_000
    assert [t.refuses(_k(2), NS_A, 2_999), t.refuses(_k(2), NS_A, 3_000), t.refuses(_k(2), NS_B, 2_999)] == \
        [True, False, False]
    assert (len(t), t.floor, t.refused, t.folded, t.limit) == (2, 0, 3, 0, 10)     # one key, one namespace


def test_a_key_buried_again_keeps_its_newest_time():
    wall = Wall()
    t = Tombstones(10, clock=wall)
    t.bury([_k(1)])
    wall.now = 5_000
    t.bury([_k(1)])
    assert [t.refuses(_k(1), NS_A, 4_999), t.refuses(_k(1), NS_A, 5_000)] == [True, False]
    assert len(t) == 1


def test_beyond_the_limit_the_oldest_fold_into_their_key_s_slot_and_the_rule_still_holds():
    wall = Wall(100)
    t = Tombstones(10, buckets=128, clock=wall)
    for i in range(10):
        wall.now = 100 * (i + 1)                         # key i removed at 100 (i + 1)
        t.bury([_k(i)])
    assert (len(t), t.floor, t.floor_of(_k(0))) == (10, 0, 0)
    wall.now = 1_100
    t.bury([_k(10)])                                     # the 11th: fold down to 9 (0.9 of the limit)
    assert (len(t), t.floor, t.folded) == (9, 0, 2)      # keys 0 and 1 (times 100, 200) went into their slots
    # a record of a folded key written before its removal is still refused (by its slot) ...
    assert [t.refuses(_k(0), NS_A, 99), t.refuses(_k(0), NS_A, 100), t.refuses(_k(1), NS_A, 199)] == \
        [True, False, True]
    # ... and so is one of a key sharing its slot (the price of bounded memory), but no other: before 2026-12-06
    # the fold raised one floor, and every record from before it was refused, whatever its key
    twin, apart = _twin(_k(0), 128), _apart([_k(0), _k(1)], 128)
    assert [t.refuses(twin, NS_A, 99), t.refuses(twin, NS_A, 100), t.refuses(apart, NS_A, 0)] == [True, False, False]
    assert [t.floor_of(twin), t.floor_of(_k(1)), t.floor_of(apart)] == [100, 200, 0]
    # the kept tombstones still decide on their own
    assert [t.refuses(_k(2), NS_A, 299), t.refuses(_k(2), NS_A, 300)] == [True, False]


def test_a_folded_namespace_raises_the_floor():
    wall = Wall(100)
    t = Tombstones(2, clock=wall)
    t.bury_namespace(NS_A)                               # 100
    wall.now = 200
    t.bury([_k(1)])
    wall.now = 300
    t.bury([_k(2)])                                      # 3 > 2: down to 1; the namespace and key 1 fold
    assert (len(t), t.floor, t.folded, t.floor_of(_k(1)), t.floor_of(_k(2))) == (1, 101, 2, 200, 101)
    assert [t.refuses(_k(7), NS_B, 100), t.refuses(_k(7), NS_B, 101)] == [True, False]


def test_evict_of_everything_raises_the_floor_and_drops_every_tombstone_before_it():
    wall = Wall()
    t = Tombstones(10, clock=wall, track=True)
    t.bury([_k(1), _k(2)])
    t.bury_namespace(NS_A)
    t.bury_scoped([_t(ACME, 1)])
    t.take_changes()
    wall.now = 7_000
    assert t.bury_all() == 7_000
    assert (len(t), t.floor) == (0, 7_000)
    assert t.take_changes() == TombstoneChanges(gone_keys={_k(1), _k(2)}, gone_namespaces={NS_A},
                                                gone_scoped={_t(ACME, 1)}, floor=7_000)
    assert t.refuses(_k(3), NS_B, 6_999) is True and t.refuses(_k(3), NS_B, 7_000) is False


def test_a_bad_limit_is_refused_naming_it():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="^tombstones must be an int >= 1"):
            Tombstones(bad)
        with pytest.raises(ValueError, match="^scope_limit must be an int >= 1"):
            Tombstones(10, scope_limit=bad)
    for bad in (0, 3, 2**33, True, 4.0):
        for name in ("buckets", "scope_buckets"):
            with pytest.raises(ValueError, match=f"^{name} must be a power of two in \\[1, 2\\*\\*32\\]"):
                Tombstones(10, **{name: bad})


def test_a_tenant_s_tombstones_fold_into_its_own_key_space_and_never_into_anyone_else_s():
    """A tenant may name keys it never stored (they may be on a node that is away); past `scope_limit` its oldest
    fold into its key space's own slots: they refuse only its own records, never the pool's or another tenant's."""
    wall = Wall(100)
    t = Tombstones(2, scope_limit=3, scope_buckets=16, clock=wall, track=True)
    t.bury([_k(1)])                                      # an admin's, at 100
    wall.now = 200
    t.bury_scoped([_t(BETA, 1)])                         # beta's, at 200
    for i in range(4):
        wall.now = 300 + 100 * i                         # acme's keys 0..3, at 300..600
        assert t.bury_scoped([_t(ACME, i)]) == 300 + 100 * i
    # the 4th made 4 > 3: down to 2 (0.9 of 3), acme's keys 0 and 1 (300, 400) into their slots of acme's
    assert (len(t), t.floor, t.folded) == (4, 0, 2)
    changes = t.take_changes()
    assert changes == TombstoneChanges(keys={_k(1): 100}, scoped={_t(BETA, 1): 200, _t(ACME, 2): 500,
                                                                  _t(ACME, 3): 600},
                                       gone_scoped={_t(ACME, 0), _t(ACME, 1)},
                                       buckets={_field(ACME, _t(ACME, 0), 16): 300,
                                                _field(ACME, _t(ACME, 1), 16): 400})
    # acme: a folded key, or one sharing its slot, written before its time: refused; any other acme key is not
    acme = lambda i: _t(ACME, i)     # noqa: E731
    twin, apart = _twin(acme(0), 16, acme), _apart([acme(0), acme(1)], 16, acme)
    assert [t.refuses(acme(0), NS_A, 299), t.refuses(acme(0), NS_A, 300), t.refuses(twin, NS_A, 299),
            t.refuses(apart, NS_A, 0)] == [True, False, True, False]
    assert [t.refuses(acme(3), NS_A, 599), t.refuses(acme(3), NS_A, 600)] == [True, False]
    # beta's own tombstone decides alone; its other keys (those of acme's folded slots too) and the pool's, however
    # old, are not refused
    beta = lambda i: _t(BETA, i)     # noqa: E731
    in_acme_slot = next(beta(i) for i in range(2, 1 << 20) if slot_of(beta(i), 16) == slot_of(acme(0), 16))
    assert [t.refuses(beta(1), NS_A, 199), t.refuses(in_acme_slot, NS_A, 0), t.refuses(_k(0), NS_A, 0),
            t.refuses(_k(1), NS_A, 99)] == [True, False, False, True]
    # an admin's removal of a tenant's stored key is the admin's tombstone (its limit, its slots)
    wall.now = 700
    t.bury([_t(BETA, 5)])
    assert (t.refuses(_t(BETA, 5), NS_A, 699), len(t), t.floor) == (True, 5, 0)


def test_changes_go_to_a_backend_and_a_new_master_loads_them_and_starts_after_them():
    meta = MemoryMetadata(persistent=True)
    wall = Wall()
    t = Tombstones(10, clock=wall, track=True)
    t.bury([_k(1), _k(2)])
    wall.now = 2_000
    t.bury_namespace(NS_A)
    meta.put_tombstones(t.take_changes())
    assert t.take_changes() == TombstoneChanges()        # nothing new
    again = Tombstones(10, clock=Wall(0))                # its wall clock is far behind
    again.load(meta.load_tombstones())
    assert again.now_us() == 2_001
    assert [again.refuses(_k(1), NS_B, 999), again.refuses(_k(2), NS_B, 1_000), again.refuses(_k(9), NS_A, 1_999)] \
        == [True, False, True]


def test_a_failed_write_goes_again_with_the_next_one_and_newer_changes_win():
    wall = Wall()
    t = Tombstones(3, scope_limit=2, clock=wall, track=True)
    t.bury([_k(1)])
    t.bury_scoped([_t(ACME, 1), _t(ACME, 2)])
    failed = t.take_changes()
    wall.now = 2_000
    t.bury([_k(1), _k(2)])                               # newer time for key 1
    t.bury_scoped([_t(ACME, 3)])                         # 3 > 2: acme's 1 and 2 (1_001) fold into their slots
    t.restore_changes(failed)
    assert t.take_changes() == TombstoneChanges(keys={_k(1): 2_000, _k(2): 2_000}, scoped={_t(ACME, 3): 2_001},
                                                gone_scoped={_t(ACME, 1), _t(ACME, 2)},
                                                buckets={_field(ACME, _t(ACME, 1), SCOPE_BUCKETS): 1_001,
                                                         _field(ACME, _t(ACME, 2), SCOPE_BUCKETS): 1_001})


def test_redis_keeps_tombstones_for_a_restarted_master(redis_server):
    wall = Wall()
    t = Tombstones(4, scope_limit=2, clock=wall, track=True)
    a = RedisMetadata(redis_server.url, prefix="tomb")
    for i in range(5):
        wall.now = 1_000 * (i + 1)
        t.bury([_k(i)])
    wall.now = 9_000
    t.bury_namespace(NS_B)                               # the 5th key made 5 > 4: keys 0 and 1 into slots 0, 1
    t.bury_scoped([_t(ACME, 1)])                         # 9_001
    a.put_tombstones(t.take_changes())
    for i, now in ((2, 9_500), (3, 9_600)):
        wall.now = now
        t.bury_scoped([_t(ACME, i)])                     # the 3rd made 3 > 2: down to 1, acme's 1 and 2 folded
    a.put_tombstones(t.take_changes())
    a.close()
    b = RedisMetadata(redis_server.url, prefix="tomb")
    state = b.load_tombstones()
    assert state == TombstoneState(keys={_k(2): 3_000, _k(3): 4_000, _k(4): 5_000}, namespaces={NS_B: 9_000},
                                   scoped={_t(ACME, 3): 9_600},
                                   buckets={_field(b"", _k(0), ADMIN_BUCKETS): 1_000,
                                            _field(b"", _k(1), ADMIN_BUCKETS): 2_000,
                                            _field(ACME, _t(ACME, 1), SCOPE_BUCKETS): 9_001,
                                            _field(ACME, _t(ACME, 2), SCOPE_BUCKETS): 9_500})
    again = Tombstones(4, scope_limit=2, clock=Wall(0))
    again.load(state)
    assert again.now_us() == 9_601
    assert [again.refuses(_k(0), NS_A, 999), again.refuses(_k(0), NS_A, 1_000), again.refuses(_k(7), NS_A, 0),
            again.refuses(_t(ACME, 2), NS_A, 9_499), again.refuses(_t(ACME, 7), NS_A, 0),
            again.refuses(_t(ACME, 3), NS_A, 9_599), again.refuses(_t(BETA, 2), NS_A, 0)] == \
        [True, False, False, True, False, True, False]
    assert RedisMetadata(redis_server.url, prefix="other").load_tombstones() == TombstoneState()


def test_slots_kept_by_a_master_with_more_of_them_merge_into_fewer_and_none_is_lost():
    # a master with 16 slots kept 5 and 13 (one slot of 8) and 6; one with 8 loads them
    in_5, in_13, in_6 = (next(_k(i) for i in range(1 << 20) if slot_of(_k(i), 16) == n) for n in (5, 13, 6))
    other = next(_k(i) for i in range(1 << 20) if slot_of(_k(i), 8) not in (5, 6))
    t = Tombstones(10, buckets=8, clock=Wall())
    t.load(TombstoneState(buckets={(5).to_bytes(4, "big"): 700, (13).to_bytes(4, "big"): 900,
                                   (6).to_bytes(4, "big"): 300}))
    assert [t.floor_of(in_5), t.floor_of(in_13), t.floor_of(in_6), t.floor_of(other)] == [900, 900, 300, 0]
    assert [t.refuses(in_5, NS_A, 899), t.refuses(in_6, NS_A, 299), t.refuses(other, NS_A, 0)] == [True, True, False]
