"""EmbeddedPool end to end on tiny pools: byte-exact round trips, exact eviction/demotion/promotion order, corrupt
SSD records, prefix semantics, caller mistakes (ValueError naming the argument, pool unchanged), config."""

import os

import numpy as np
import pytest

from kvpool import EmbeddedPool, Namespace, block_keys

OBJ = 4096


def key(i: int) -> bytes:
    return bytes([i]) * 16


def value(k: bytes, size: int = OBJ) -> np.ndarray:
    """Bytes derived from the key, so any mix-up is visible."""
    return np.random.default_rng(int.from_bytes(k[:8], "little")).integers(0, 256, size, dtype=np.uint8)


@pytest.fixture
def make(tmp_path):
    pools = []

    def _make(dram_objects=3, ssd_objects=0, **kw):
        if ssd_objects:
            kw.update(ssd_path=str(tmp_path / "ssd"), ssd_bytes=ssd_objects * 2 * OBJ)  # header page + payload
        pool = EmbeddedPool(dram_bytes=dram_objects * OBJ, shm_dir=str(tmp_path), **kw)
        pools.append(pool)
        return pool

    yield _make
    for pool in pools:
        pool.close()


def where(pool, keys):
    return [None if r is None else r.tier.label for r in pool.master.inspect(keys)]


def test_round_trip_through_dram_is_byte_exact(make):
    pool = make(dram_objects=4)
    keys = [key(i) for i in range(4)]
    assert pool.put_many(keys, [value(k) for k in keys]) == ["stored"] * 4
    assert where(pool, keys) == ["dram"] * 4
    out = [np.zeros(OBJ, np.uint8) for _ in keys]
    assert pool.get_many_into(keys, out) == 4
    for k, o in zip(keys, out):
        assert np.array_equal(o, value(k))
    assert pool.put_many(keys[:1], [value(keys[0])]) == ["exists"]
    pool.remove_many(keys[:2])
    rows = np.stack([value(keys[0]), value(keys[0])])  # a 2-D array is a sequence of row buffers
    assert pool.put_many([keys[0], keys[0]], rows) == ["stored", "exists"]  # a key twice in one batch
    assert pool.stats()["puts"] == {"stored": 5, "exists": 2, "no_space": 0}


def test_round_trip_through_ssd_is_byte_exact(make):
    pool = make(dram_objects=1, ssd_objects=4, promote_on_hit=False)
    keys = [key(i) for i in range(4)]
    for k in keys:
        assert pool.put_many([k], [value(k).tobytes()]) == ["stored"]
    assert where(pool, keys) == ["ssd", "ssd", "ssd", "dram"]
    out = [bytearray(OBJ) for _ in keys]
    assert pool.get_many_into(keys, out) == 4
    assert [bytes(o) for o in out] == [value(k).tobytes() for k in keys]
    s = pool.stats()
    assert s["hit_keys_by_tier"] == {"hbm": 0, "dram": 1, "ssd": 3} and s["promotions"] == 0


def test_objects_larger_than_dram_go_straight_to_ssd(make):
    pool = make(dram_objects=1, ssd_objects=4)
    big = value(key(9), 2 * OBJ)
    assert pool.put_many([key(9)], [big]) == ["stored"] and where(pool, [key(9)]) == ["ssd"]
    out = np.zeros(2 * OBJ, np.uint8)
    assert pool.get_many_into([key(9)], [out]) == 1 and np.array_equal(out, big)


def test_exact_eviction_and_demotion_order(make):
    pool = make(dram_objects=3, ssd_objects=4, write_behind=False)  # exclusive tiers: 3 + 4 objects
    keys = [key(i) for i in range(8)]
    expected = [  # after put i: which tier each of keys[0..7] is in
        ["dram", None, None, None, None, None, None, None],
        ["dram", "dram", None, None, None, None, None, None],
        ["dram", "dram", "dram", None, None, None, None, None],
        ["ssd", "dram", "dram", "dram", None, None, None, None],
        ["ssd", "ssd", "dram", "dram", "dram", None, None, None],
        ["ssd", "ssd", "ssd", "dram", "dram", "dram", None, None],
        ["ssd", "ssd", "ssd", "ssd", "dram", "dram", "dram", None],
        [None, "ssd", "ssd", "ssd", "ssd", "dram", "dram", "dram"],  # SSD full: its coldest (0) is evicted
    ]
    for i, k in enumerate(keys):
        assert pool.put_many([k], [value(k)]) == ["stored"]
        assert where(pool, keys) == expected[i], f"after put {i}"
    s = pool.stats()
    assert (s["demotions"], s["evictions"], s["promotions"]) == (5, {"dram": 0, "ssd": 1}, 0)
    assert s["tiers"]["dram"]["objects"] == 3 and s["tiers"]["ssd"]["objects"] == 4
    assert pool.lookup_prefix(keys) == 0 and pool.lookup_prefix(keys[1:]) == 7


def test_dram_only_pool_evicts_coldest(make):
    pool = make(dram_objects=2)
    for i in range(3):
        pool.put_many([key(i)], [value(key(i))])
    assert where(pool, [key(0), key(1), key(2)]) == [None, "dram", "dram"]
    assert pool.stats()["evictions"] == {"dram": 1, "ssd": 0} and pool.stats()["demotions"] == 0


def test_chain_tails_are_evicted_before_parents_and_hits_refresh(make):
    pool = make(dram_objects=3)
    a, b, c, d, e = (key(i) for i in range(5))
    pool.put_many([a, b, c], [value(k) for k in (a, b, c)])  # one chain: c (tail) is the coldest
    pool.put_many([d], [value(d)])
    assert where(pool, [a, b, c, d]) == ["dram", "dram", None, "dram"]
    assert pool.get_many_into([a], [np.zeros(OBJ, np.uint8)]) == 1  # a hit: b is now the coldest
    pool.put_many([e], [value(e)])
    assert where(pool, [a, b, d, e]) == ["dram", None, "dram", "dram"]


def test_promotion_on_hit(make):
    pool = make(dram_objects=2, ssd_objects=4)
    keys = [key(i) for i in range(4)]
    for k in keys:
        pool.put_many([k], [value(k)])
    assert where(pool, keys) == ["ssd", "ssd", "dram", "dram"]
    out = np.zeros(OBJ, np.uint8)
    assert pool.get_many_into([keys[0]], [out]) == 1 and np.array_equal(out, value(keys[0]))
    # keys[0] moved up; DRAM's coldest (keys[2]) moved down to make room.
    assert where(pool, keys) == ["dram", "ssd", "ssd", "dram"]
    s = pool.stats()
    # The hit counts where it was found (SSD), not where the promotion put it.
    assert (s["promotions"], s["demotions"], s["hit_keys_by_tier"]["ssd"], s["hit_keys_by_tier"]["dram"]) == (1, 3, 1, 0)
    assert pool.get_many_into([keys[2]], [out]) == 1 and np.array_equal(out, value(keys[2]))


def test_no_promotion_when_disabled(make):
    pool = make(dram_objects=2, ssd_objects=4, promote_on_hit=False)
    keys = [key(i) for i in range(3)]
    for k in keys:
        pool.put_many([k], [value(k)])
    assert pool.get_many_into([keys[0]], [np.zeros(OBJ, np.uint8)]) == 1
    assert where(pool, keys) == ["ssd", "dram", "dram"] and pool.stats()["promotions"] == 0


@pytest.mark.parametrize("promote", [True, False])
def test_corrupted_ssd_object_is_a_counted_miss(make, promote):
    pool = make(dram_objects=1, ssd_objects=4, promote_on_hit=promote)
    keys = [key(i) for i in range(3)]
    for k in keys:
        pool.put_many([k], [value(k)])
    assert where(pool, keys) == ["ssd", "ssd", "dram"]
    record = pool.master.inspect([keys[1]])[0]
    with open(pool.node.ssd.path, "r+b") as f:  # flip one payload byte of keys[1] behind the pool's back
        f.seek(record.offset + OBJ + 100)
        byte = f.read(1)
        f.seek(record.offset + OBJ + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    out = [np.zeros(OBJ, np.uint8) for _ in keys]
    assert pool.get_many_into(keys, out) == 1  # the prefix ends at the corrupt object
    assert np.array_equal(out[0], value(keys[0]))
    s = pool.stats()
    assert (s["ssd_corrupt"], s["ssd_corrupt_reads"]) == (1, 1)
    assert pool.contains_many(keys) == [True, False, True]
    assert pool.lookup_prefix(keys) == 1


def test_a_prefix_of_ssd_hits_is_verified_and_stops_at_a_corrupt_record(make):
    pool = make(dram_objects=0, ssd_objects=6, promote_on_hit=False)
    keys = [key(i) for i in range(5)]
    assert pool.put_many(keys, [value(k) for k in keys]) == ["stored"] * 5
    records = pool.master.inspect(keys)
    assert [r.tier.label for r in records] == ["ssd"] * 5             # no DRAM tier: every get reads SSD
    out = [np.zeros(OBJ, np.uint8) for _ in keys]
    tiers: list[str] = []
    assert pool.get_many_into(keys, out, tiers_out=tiers) == 5 and tiers == ["ssd"] * 5
    assert all(np.array_equal(o, value(k)) for o, k in zip(out, keys))
    with open(pool.node.ssd.path, "r+b") as f:  # flip one payload byte of keys[3]
        f.seek(records[3].offset + OBJ + 7)
        byte = f.read(1)
        f.seek(records[3].offset + OBJ + 7)
        f.write(bytes([byte[0] ^ 0x01]))
    out = [np.zeros(OBJ, np.uint8) for _ in keys]
    tiers = []
    assert pool.get_many_into(keys, out, tiers_out=tiers) == 3 and tiers == ["ssd"] * 3
    assert all(np.array_equal(o, value(k)) for o, k in zip(out[:3], keys))
    s = pool.stats()
    assert (s["ssd_corrupt"], s["ssd_corrupt_reads"]) == (1, 1)
    assert pool.contains_many(keys) == [True, True, True, False, True]


def test_lookup_prefix_stops_at_first_missing_key(make):
    pool = make(dram_objects=8)
    ns = Namespace(model="m", fingerprint="f", kv_dtype="float32", block_tokens=4, num_layers=1, num_kv_heads=1,
                   head_dim=4)
    keys = block_keys(ns, list(range(20)))
    pool.put_many([keys[i] for i in (0, 1, 3, 4)], [value(keys[i]) for i in (0, 1, 3, 4)], namespace=ns)
    assert pool.lookup_prefix(keys, namespace=ns) == 2
    assert pool.lookup_prefix(keys[3:], namespace=ns) == 2
    assert pool.contains_many(keys) == [True, True, False, True, True]
    out = [np.zeros(OBJ, np.uint8) for _ in keys]
    assert pool.get_many_into(keys, out, namespace=ns) == 2
    assert not out[3].any()  # nothing past the miss was touched
    s = pool.stats()
    assert s["namespaces"]["m/default"] == {"requested_tokens": 48, "hit_tokens": 24,
                                            "hit_tokens_by_tier": {"hbm": 0, "dram": 24, "ssd": 0},
                                            "prefill_seconds_saved": 0.0}


def test_remove_many(make):
    pool = make(dram_objects=2)
    pool.put_many([key(1), key(2)], [value(key(1)), value(key(2))])
    assert pool.remove_many([key(1), key(3)]) == 1
    assert pool.contains_many([key(1), key(2)]) == [False, True]
    assert pool.stats()["tiers"]["dram"]["objects"] == 1


def test_numpy_float_and_torch_buffers(make):
    torch = pytest.importorskip("torch")
    pool = make(dram_objects=3)
    src = torch.arange(OBJ // 2, dtype=torch.bfloat16)
    arr = np.arange(OBJ // 4, dtype=np.float32).reshape(4, -1)
    assert pool.put_many([key(1), key(2)], [src, arr]) == ["stored", "stored"]
    dst = torch.zeros(OBJ // 2, dtype=torch.bfloat16)
    arr_out = np.zeros_like(arr)
    assert pool.get_many_into([key(1), key(2)], [dst, arr_out]) == 2
    assert torch.equal(dst, src) and np.array_equal(arr_out, arr)


def test_bad_input_raises_naming_the_argument_and_changes_nothing(make):
    pool = make(dram_objects=2, max_object_bytes=2 * OBJ)
    pool.put_many([key(1)], [value(key(1))])
    before = pool.stats()
    cases = [
        (lambda: pool.put_many([key(2), b"short"], [value(key(2))] * 2), r"keys\[1\] must be a 16-byte key, got 5"),
        (lambda: pool.put_many([key(2)], [value(key(2))] * 2), "buffers has 2 entries, keys has 1"),
        (lambda: pool.put_many([key(2)], [np.zeros(3 * OBJ, np.uint8)]),
         r"buffers\[0\] has 12288 bytes, over max_object_bytes=8192"),
        (lambda: pool.put_many([key(2)], [b""]), r"buffers\[0\] is empty"),
        (lambda: pool.put_many([key(2)], [object()]), r"buffers\[0\] must be bytes-like"),
        (lambda: pool.put_many([key(2)], [np.zeros((64, 64), np.uint8)[:, ::2]]), r"buffers\[0\] must be C-contig"),
        (lambda: pool.get_many_into([key(1)], [bytearray(100)]), r"buffers\[0\] has 100 bytes, object has 4096"),
        (lambda: pool.get_many_into([key(1)], [bytes(OBJ)]), r"buffers\[0\] is read-only"),
        (lambda: pool.get_many_into([key(1), key(2)], [bytearray(OBJ)]), "buffers has 1 entries, keys has 2"),
        (lambda: pool.lookup_prefix([b"x" * 17]), r"keys\[0\] must be a 16-byte key, got 17"),
        (lambda: pool.contains_many(["a" * 16]), r"keys\[0\] must be a 16-byte key, got str"),
        (lambda: pool.remove_many([1]), r"keys\[0\] must be a 16-byte key, got int"),
        (lambda: pool.lookup_prefix([key(1)], namespace="m"), "namespace must be a kvpool.Namespace"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert pool.stats() == before
    assert pool.contains_many([key(1), key(2)]) == [True, False]


@pytest.mark.parametrize("field", ["dram_bytes", "ssd_bytes", "max_object_bytes"])
def test_negative_capacity_in_kwargs_file_and_env_names_the_field(tmp_path, monkeypatch, field):
    with pytest.raises(ValueError, match=field):
        EmbeddedPool(**{field: -1}, shm_dir=str(tmp_path))
    cfg = tmp_path / "pool.yaml"
    cfg.write_text(f"{field}: -4096\n")
    with pytest.raises(ValueError, match=field):
        EmbeddedPool.from_config(cfg, shm_dir=str(tmp_path))
    toml = tmp_path / "pool.toml"
    toml.write_text(f"{field} = -4096\n")
    with pytest.raises(ValueError, match=field):
        EmbeddedPool(config_path=toml, shm_dir=str(tmp_path))
    monkeypatch.setenv(f"KVPOOL_{field.upper()}", "-4096")
    with pytest.raises(ValueError, match=field):
        EmbeddedPool(shm_dir=str(tmp_path))


def test_config_from_file_env_and_kwargs(tmp_path, monkeypatch):
    cfg = tmp_path / "pool.yaml"
    cfg.write_text(f"dram_bytes: 16KiB\nshm_dir: {tmp_path}\npromote_on_hit: false\n")
    monkeypatch.setenv("KVPOOL_MAX_OBJECT_BYTES", "8KiB")
    with EmbeddedPool.from_config(cfg, promote_on_hit=True) as pool:
        assert (pool.config.dram_bytes, pool.config.max_object_bytes, pool.config.promote_on_hit) == (
            16384, 8192, True)
        assert pool.stats()["tiers"]["dram"]["capacity"] == 16384
    with pytest.raises(ValueError, match="unknown field 'dram'"):
        EmbeddedPool(dram=1)
    with pytest.raises(ValueError, match="ssd_bytes must be > 0 when ssd_path is set"):
        EmbeddedPool(ssd_path=str(tmp_path / "s"), shm_dir=str(tmp_path))


def test_closed_pool_refuses_calls(tmp_path):
    pool = EmbeddedPool(dram_bytes=OBJ, shm_dir=str(tmp_path))
    pool.close()
    pool.close()
    with pytest.raises(ValueError, match="pool is closed"):
        pool.lookup_prefix([key(1)])
    assert not [f for f in os.listdir(tmp_path) if f.startswith("kvpool")]


def test_a_read_continued_past_its_staging_rows_is_counted_once(make):
    """A load reading a long SSD hit one ring of rows at a time: the first acquire_many asks for the whole chain and
    stops at max_staged; the reads after it say `continued`, and the pool's lookup counters count the chain once.
    Without it every later read counted its keys again."""
    pool = make(dram_objects=1, ssd_objects=8, promote_on_hit=False)
    keys = [key(i) for i in range(6)]
    for k in keys:
        assert pool.put_many([k], [value(k)]) == ["stored"]
    on_ssd = where(pool, keys).count("ssd")
    assert on_ssd == 5

    def load(continued: bool) -> tuple[dict, list[bytes]]:
        before = pool.stats()
        got, s = [], 0
        while s < len(keys):
            read = pool.acquire_many(keys[s:], [OBJ] * (len(keys) - s), max_staged=2, continued=continued and s > 0)
            with read:
                got += [bytes(b) for b in read.buffers[:read.count]]
                s += read.count
                assert read.count and (read.staging_full or s == len(keys))
        after = pool.stats()
        return {name: after[name] - before[name] for name in ("lookups", "requested_keys", "hit_keys")}, got

    counted, got = load(continued=True)
    assert got == [value(k).tobytes() for k in keys]
    assert counted == {"lookups": 1, "requested_keys": 6, "hit_keys": 6}
    counted, got = load(continued=False)     # each read counted its keys again: 6 + 4 + 2
    assert got == [value(k).tobytes() for k in keys]
    assert counted["lookups"] == 3 and counted["requested_keys"] == counted["hit_keys"] == 6 + 4 + 2
    assert pool.stats()["leases_open"] == 0
    with pytest.raises(ValueError, match="continued must be a bool"):
        pool.acquire_many(keys, [OBJ] * 6, continued=1)


def test_a_read_goes_on_under_its_lease_with_rest(make):
    """ExtentRead.rest: a read that stopped at its staging rows goes on from there under the same lease, with no
    second lookup: the chain is counted once, one lease is open however many rests are held, and it ends when the
    last of them is released. Misuse is refused by name and changes nothing."""
    pool = make(dram_objects=1, ssd_objects=8, promote_on_hit=False)
    keys = [key(i) for i in range(6)]
    for k in keys:
        assert pool.put_many([k], [value(k)]) == ["stored"]
    assert where(pool, keys).count("ssd") == 5
    before = pool.stats()
    reads = [pool.acquire_many(keys, [OBJ] * 6, max_staged=2)]
    while reads[-1].staging_full:
        reads.append(reads[-1].rest(max_staged=2))
        assert pool.stats()["leases_open"] == 1          # every rest rides on the first read's lease
    got = [bytes(b) for r in reads for b in r.buffers[:r.count]]
    assert got == [value(k).tobytes() for k in keys]
    assert [r.direct.count(False) for r in reads] == [2, 2, 1]
    after = pool.stats()
    assert {n: after[n] - before[n] for n in ("lookups", "requested_keys", "hit_keys")} == \
        {"lookups": 1, "requested_keys": 6, "hit_keys": 6}
    # the last read's hit ends with it; a released read cannot go on; bad arguments name themselves
    with pytest.raises(ValueError, match="did not end at staging_full"):
        reads[-1].rest()
    with pytest.raises(ValueError, match="max_staged must be None or an int >= 0, got -1"):
        reads[0].rest(max_staged=-1)
    with pytest.raises(ValueError, match="staging must be a callable"):
        reads[0].rest(staging=3)
    assert pool.stats()["leases_open"] == 1
    reads[0].release()
    with pytest.raises(ValueError, match="was released"):
        reads[0].rest()
    for r in reads[1:-1]:
        r.release()
        r.release()                                      # idempotent: one release per read, whatever the count
        assert pool.stats()["leases_open"] == 1
    reads[-1].release()
    assert pool.stats()["leases_open"] == 0


def test_rest_close_to_the_lease_s_end_looks_the_rest_up_again(make):
    """A lease with less than REST_MARGIN_S to run is not read on: the rest is looked up under a lease of its own
    (said to be `continued`: the chain is still counted once). The bytes are the same."""
    from kvpool.extents import REST_MARGIN_S

    pool = make(dram_objects=1, ssd_objects=8, promote_on_hit=False, lease_ttl_s=REST_MARGIN_S / 2)
    keys = [key(i) for i in range(6)]
    for k in keys:
        assert pool.put_many([k], [value(k)]) == ["stored"]
    before = pool.stats()
    with pool.acquire_many(keys, [OBJ] * 6, max_staged=2) as first:
        with first.rest(max_staged=8) as rest:
            assert pool.stats()["leases_open"] == 2
            got = [bytes(b) for r in (first, rest) for b in r.buffers[:r.count]]
    assert got == [value(k).tobytes() for k in keys]
    after = pool.stats()
    assert {n: after[n] - before[n] for n in ("lookups", "requested_keys", "hit_keys")} == \
        {"lookups": 1, "requested_keys": 6, "hit_keys": 6}
    assert pool.stats()["leases_open"] == 0
