"""KVPages and WorkerTransfer (no vLLM): byte-exact gather/scatter over a KV cache laid out like vLLM's CPU backend,
a save by one "instance" loaded by another, and every pool fault turned into recompute with the right block ids."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
import pytest
import torch
import xxhash

from kvpool import PoolClient, block_keys
from kvpool.connector.stats import ConnectorStats
from kvpool.connector.vllm_layout import KVPages
from kvpool.connector.vllm_plan import LoadSpec, SaveSpec
from kvpool.connector.vllm_worker import WorkerTransfer
from kvpool.embedded import EmbeddedPool
from kvpool.errors import PoolDataError, PoolTimeout, PoolUnavailable
from kvpool.launcher import free_port
from kvpool.store.config import UpConfig
from kvpool.store.local_cluster import LocalCluster

from tests.connector.vllm_fakes import BT, LAYERS, LAYOUT, NS, FaultyPool, config, handle, kv_cache

TOKENS = list(range(500, 500 + 6 * BT))
KEYS = block_keys(NS, TOKENS)


@pytest.fixture
def pool():
    with EmbeddedPool(dram_bytes=16 << 20) as p:
        yield p


@pytest.fixture
def ssd_pool(tmp_path):
    """No DRAM tier: every object an SSD record, so every read stages its entries (at most a buffer's rows)."""
    with EmbeddedPool(dram_bytes=0, ssd_path=str(tmp_path / "ssd"), ssd_bytes=16 << 20, promote_on_hit=False) as p:
        yield p


class ReadSpy:
    """A real pool that records each read of a load as (keys asked, entries read, staging_full, max_staged):
    acquire_many's, and each ExtentRead.rest (keys asked None: it goes on under the first read's lease), and whether
    each acquire_many said `continued`."""

    def __init__(self, pool) -> None:
        self.pool, self.reads, self.continued = pool, [], []

    def acquire_many(self, keys, sizes, **kwargs):
        self.continued.append(kwargs.get("continued", False))
        return self._record(len(keys), kwargs, self.pool.acquire_many(keys, sizes, **kwargs))

    def _record(self, asked, kwargs, read):
        self.reads.append((asked, read.count, read.staging_full, kwargs.get("max_staged")))
        return _SpiedRead(read, self)

    def __getattr__(self, name):
        return getattr(self.pool, name)


class _SpiedRead:
    def __init__(self, read, spy: ReadSpy) -> None:
        self.read, self.spy = read, spy

    def rest(self, **kwargs):
        return self.spy._record(None, kwargs, self.read.rest(**kwargs))

    def __getattr__(self, name):
        return getattr(self.read, name)


def worker(pool, cache, **kw):
    stats = ConnectorStats()
    t = WorkerTransfer(config(**kw), NS, KVPages(cache), handle(pool, stats), stats)
    return t, stats


def page(cache, layer, block) -> bytes:
    return list(cache.values())[layer][block].numpy().tobytes()


def test_object_is_the_layer_pages_of_one_block_in_layer_order():
    cache = kv_cache(8)
    pages = KVPages(cache)
    pages.check(LAYOUT)
    assert pages.object_bytes == NS.block_bytes == LAYERS * LAYOUT.page_bytes
    buf = pages.new_buffer(2)
    pages.gather([5, 2], buf)
    assert buf[0].numpy().tobytes() == b"".join(page(cache, l, 5) for l in range(LAYERS))
    assert buf[1].numpy().tobytes() == b"".join(page(cache, l, 2) for l in range(LAYERS))
    other = kv_cache(8, seed=1)
    KVPages(other).scatter([0, 7], buf)
    assert [page(other, l, 0) for l in range(LAYERS)] == [page(cache, l, 5) for l in range(LAYERS)]
    assert [page(other, l, 7) for l in range(LAYERS)] == [page(cache, l, 2) for l in range(LAYERS)]
    assert page(other, 0, 1) == page(kv_cache(8, seed=1), 0, 1)   # untouched blocks stay


def _three_objects():
    """A cache, blocks 5, 2, 4 of it gathered as three objects, and another cache to scatter them into."""
    cache = kv_cache(8)
    pages = KVPages(cache)
    buf = pages.new_buffer(3)
    pages.gather([5, 2, 4], buf)
    return cache, buf, kv_cache(8, seed=1)


def test_scatter_views_checks_each_object_after_it_landed_and_stops_at_a_refusal(copy_path):
    cache, buf, other = _three_objects()
    before = [page(other, l, 3) for l in range(LAYERS)]
    seen = []

    def after(i, digest):
        dst = [6, 0, 3][i]
        assert [page(other, l, dst) for l in range(LAYERS)] == [page(cache, l, [5, 2, 4][i]) for l in range(LAYERS)]
        seen.append((i, digest))
        return i == 0

    # Objects as numpy rows, a memoryview and a tensor: host buffers of any kind. Only object 1 is hashed as it lands.
    objects = [buf[0].numpy(), memoryview(buf[1].numpy()), buf[2]]
    assert KVPages(other).scatter_views([6, 0, 3], objects, after=after, hash_landed=lambda i: i == 1) == 1
    assert seen == [(0, None), (1, xxhash.xxh3_64_intdigest(buf[1].numpy()))]
    assert [page(other, l, 3) for l in range(LAYERS)] == before   # never copied
    with pytest.raises(ValueError, match="objects must be"):        # checked before anything is copied
        KVPages(other).scatter_views([1, 2], [buf[0].numpy(), bytearray(3)])
    assert page(other, 0, 1) == page(kv_cache(8, seed=1), 0, 1)


def test_pipelined_scatter_hashes_on_the_helper_and_judges_in_order_after_the_last_copy(two_pass):
    """The two-pass copy only: with the one-pass copy on, each object is judged as it lands (the test above)."""
    cache, buf, other = _three_objects()
    seen = []

    def after(i, digest):
        # every object has landed before the first verdict
        assert all(page(other, l, d) == page(cache, l, s) for l in range(LAYERS) for s, d in ((5, 6), (2, 0), (4, 3)))
        seen.append((i, digest))
        return i == 0

    got = KVPages(other).scatter_views([6, 0, 3], [b.numpy() for b in buf], after=after,
                                       hash_landed=lambda i: i != 2, pipeline=True)
    assert got == 1 and seen == [(0, xxhash.xxh3_64_intdigest(buf[0].numpy())),
                                 (1, xxhash.xxh3_64_intdigest(buf[1].numpy()))]
    with pytest.raises(ValueError, match="only host KV tensors"):
        KVPages({k: v.to("meta") for k, v in cache.items()}).scatter_views([0], [buf[0]], pipeline=True)


def test_scatter_views_hashes_pages_of_any_dtype_as_bytes(copy_path):
    cache = {k: v.to(torch.bfloat16) for k, v in kv_cache(4).items()}    # numpy has no bfloat16: copied as bytes
    pages = KVPages(cache)
    buf = pages.new_buffer(2)
    pages.gather([1, 3], buf)
    other = {k: torch.zeros_like(v) for k, v in cache.items()}
    digests = []
    assert KVPages(other).scatter_views([0, 2], [buf[0], buf[1]], after=lambda i, d: digests.append(d) or True,
                                        hash_landed=lambda i: True) == 2
    assert digests == [xxhash.xxh3_64_intdigest(buf[i].numpy()) for i in range(2)]
    assert all(torch.equal(other[k][0], cache[k][1]) and torch.equal(other[k][2], cache[k][3]) for k in cache)


def test_pages_refuse_foreign_layouts():
    cache = kv_cache(4)
    with pytest.raises(ValueError, match="kv_caches\\[1\\]"):
        KVPages([cache["model.layers.0.self_attn.attn"], torch.zeros(4, 2, BT, 8)])
    with pytest.raises(ValueError, match="not contiguous pages"):
        KVPages([t.transpose(1, 2) for t in cache.values()])
    with pytest.raises(RuntimeError, match="differ from its KV cache spec"):
        KVPages({k: v.to(torch.float16) for k, v in cache.items()}).check(LAYOUT)
    with pytest.raises(ValueError, match="block_ids must be in"):
        KVPages(cache).gather([4], KVPages(cache).new_buffer(1))


def test_a_saves_b_loads_byte_exact_into_other_blocks(pool):
    cache_a, cache_b = kv_cache(10, seed=1), kv_cache(10, seed=2)
    a, stats_a = worker(pool, cache_a)
    a.begin_step()
    a.save([SaveSpec("r", KEYS[:4], [3, 1, 4, 0])], num_scheduled_tokens=4 * BT)
    assert a.flush(10) and stats_a.saved_blocks == 4
    spy = ReadSpy(pool)
    b, stats_b = worker(spy, cache_b, load_chunk_blocks=3)        # 3 staging rows, 4 blocks: all direct, one read
    b.begin_step()
    b.load([LoadSpec("q", KEYS[:4], [9, 8, 7, 6])])
    assert b.take_invalid_block_ids() == set() and spy.reads == [(4, 4, False, 3)]
    for src, dst in zip([3, 1, 4, 0], [9, 8, 7, 6]):
        assert [page(cache_b, l, dst) for l in range(LAYERS)] == [page(cache_a, l, src) for l in range(LAYERS)]
    assert stats_b.pool_hit_tokens == {"dram": 4 * BT} and stats_b.loads == 1 and stats_b.fallbacks == {}
    load_bytes, _, _, _ = b.take_rates()
    assert load_bytes == 4 * NS.block_bytes
    a.close(), b.close()


class AddressSpy:
    """A real pool that records where the first row of each put lived (the worker's copy-out buffer)."""

    def __init__(self, pool) -> None:
        self.pool, self.addresses = pool, []

    def put_many(self, keys, buffers, **kwargs):
        self.addresses.append(np.asarray(buffers[0]).__array_interface__["data"][0])
        return self.pool.put_many(keys, buffers, **kwargs)

    def __getattr__(self, name):
        return getattr(self.pool, name)


def test_save_reuses_its_copy_out_buffer_once_the_put_is_done(pool):
    cache = kv_cache(10, seed=5)
    spy = AddressSpy(pool)
    w, stats = worker(spy, cache)
    for keys, blocks in ((KEYS[:2], [1, 2]), (KEYS[2:4], [3, 4]), (KEYS[4:5], [5])):
        w.begin_step()
        w.save([SaveSpec("r", keys, blocks)])
        assert w.flush(10)
    assert stats.saved_blocks == 5 and len(set(spy.addresses)) == 1     # one buffer, paged in once
    w.close()
    cache_b = kv_cache(10, seed=6)
    b, _ = worker(pool, cache_b)
    b.begin_step()
    b.load([LoadSpec("q", KEYS[:5], [9, 8, 7, 6, 0])])                # each save's bytes, not a later one's
    assert b.take_invalid_block_ids() == set()
    for src, dst in zip([1, 2, 3, 4, 5], [9, 8, 7, 6, 0]):
        assert [page(cache_b, l, dst) for l in range(LAYERS)] == [page(cache, l, src) for l in range(LAYERS)]
    b.close()


def _saved(pool, n=5):
    cache = kv_cache(10, seed=3)
    a, _ = worker(pool, cache)
    a.save([SaveSpec("r", KEYS[:n], list(range(n)))])
    assert a.flush(10)
    a.close()
    return cache


def test_block_evicted_between_lookup_and_load_reports_the_rest(pool):
    src = _saved(pool)
    pool.remove_many([KEYS[2]])
    cache = kv_cache(10, seed=4)
    w, stats = worker(pool, cache)
    w.begin_step()
    w.load([LoadSpec("r", KEYS[:5], [5, 6, 7, 8, 9])])
    assert w.take_invalid_block_ids() == {7, 8, 9}
    assert w.take_invalid_block_ids() == set()                  # reported once
    assert page(cache, 0, 5) == page(src, 0, 0) and page(cache, 2, 6) == page(src, 2, 1)
    assert stats.fallbacks == {"partial_load": 1} and stats.pool_hit_tokens == {"dram": 2 * BT}


@pytest.mark.parametrize("exc, at, reason, backs_off", [
    (PoolTimeout("get: deadline exceeded"), 2, "timeout", True),        # the second chunk times out
    (PoolUnavailable("node gone"), 1, "unreachable", True),
    (PoolDataError("checksum mismatch"), 2, "checksum", False),         # one bad block says nothing of the pool
    (RuntimeError("bug"), 1, "error", True),
])
def test_load_fault_recomputes_from_the_failed_read(ssd_pool, exc, at, reason, backs_off):
    _saved(ssd_pool)
    spy = ReadSpy(ssd_pool)
    faulty = FaultyPool(spy, "acquire_many", exc, at=at)
    stats = ConnectorStats()
    h = handle(faulty, stats)
    w = WorkerTransfer(config(load_chunk_blocks=2), NS, KVPages(kv_cache(10)), h, stats)
    w.begin_step()
    w.load([LoadSpec("r", KEYS[:5], [5, 6, 7, 8, 9])])        # reads [5,6] (of all 5 asked) [7,8] [9]
    loaded = 2 * (at - 1)
    assert w.take_invalid_block_ids() == set([5, 6, 7, 8, 9][loaded:])
    assert spy.reads == [(5, 2, True, 2)][:at - 1]              # the first read stopped at the 2 rows; then the fault
    assert ssd_pool.stats()["leases_open"] == 0
    assert stats.fallbacks == {reason: 1} and stats.pool_hit_tokens == ({"ssd": loaded * BT} if loaded else {})
    assert h.backing_off is backs_off
    # Saves of that request in the same step are dropped: its new KV was computed over the failed blocks.
    w.save([SaveSpec("r", KEYS[5:6], [0]), SaveSpec("other", KEYS[5:6], [1])])
    assert w.flush(10) and stats.saved_blocks == (0 if backs_off else 1)


def test_an_ssd_hit_is_read_a_buffer_of_rows_at_a_time_byte_exact(ssd_pool):
    """The first read asks for the whole hit and ends at the staging buffer's rows; each next read is the rest of
    the one before, under the same lease: one lookup for the whole load."""
    src = _saved(ssd_pool)
    spy = ReadSpy(ssd_pool)
    cache = kv_cache(10, seed=7)
    w, stats = worker(spy, cache, load_chunk_blocks=2)
    w.begin_step()
    before = ssd_pool.stats()
    w.load([LoadSpec("r", KEYS[:5], [5, 6, 7, 8, 9])])
    assert w.take_invalid_block_ids() == set() and stats.fallbacks == {}
    assert spy.reads == [(5, 2, True, 2), (None, 2, True, 2), (None, 1, False, 2)]
    # the reads after the first go on under its lease: the pool counts the 5 hits once, not 5 + 3 + 1
    assert spy.continued == [False]
    assert [ssd_pool.stats()[n] - before[n] for n in ("lookups", "requested_keys", "hit_keys")] == [1, 5, 5]
    assert ssd_pool.stats()["leases_open"] == 0
    for s, d in zip(range(5), [5, 6, 7, 8, 9]):
        assert [page(cache, l, d) for l in range(LAYERS)] == [page(src, l, s) for l in range(LAYERS)]
    assert stats.pool_hit_tokens == {"ssd": 5 * BT} and stats.loads == 1
    w.close()


def test_a_fault_on_an_all_dram_hit_s_one_read_loads_nothing(pool):
    _saved(pool)
    spy = ReadSpy(pool)
    stats = ConnectorStats()
    h = handle(FaultyPool(spy, "acquire_many", PoolTimeout("get: deadline exceeded"), at=1), stats)
    w = WorkerTransfer(config(load_chunk_blocks=2), NS, KVPages(kv_cache(10)), h, stats)
    w.begin_step()
    w.load([LoadSpec("r", KEYS[:5], [5, 6, 7, 8, 9])])
    assert w.take_invalid_block_ids() == {5, 6, 7, 8, 9} and spy.reads == []
    assert stats.fallbacks == {"timeout": 1} and stats.pool_hit_tokens == {}
    w.close()


def test_pool_down_at_start_recomputes_everything_and_saves_nothing():
    stats = ConnectorStats()
    address = f"127.0.0.1:{free_port()}"
    h = handle(lambda: PoolClient(address, timeout=0.2, connect_timeout=0.2), stats)
    w = WorkerTransfer(config(), NS, KVPages(kv_cache(8)), h, stats)
    w.begin_step()
    w.load([LoadSpec("r", KEYS[:3], [0, 1, 2])])
    assert w.take_invalid_block_ids() == {0, 1, 2}
    w.save([SaveSpec("s", KEYS[:2], [3, 4])])
    assert stats.fallbacks == {"unreachable": 2} and stats.save_dropped_blocks == 2
    w.close()


def test_save_fault_in_the_background_is_counted_not_raised(pool):
    stats = ConnectorStats()
    faulty = FaultyPool(pool, "put_many", PoolUnavailable("master gone"))
    w = WorkerTransfer(config(), NS, KVPages(kv_cache(8)), handle(faulty, stats), stats)
    w.save([SaveSpec("r", KEYS[:2], [0, 1])])
    assert w.flush(10)
    assert stats.fallbacks == {"save_unreachable": 1} and stats.saved_blocks == 0
    w.close()


def test_compute_rate_is_measured_between_bind_and_save(pool):
    now = [0.0]
    stats = ConnectorStats()
    w = WorkerTransfer(config(), NS, KVPages(kv_cache(8)), handle(pool, stats), stats, clock=lambda: now[0])
    w.begin_step()
    now[0] = 0.5
    w.save([], num_scheduled_tokens=10 * BT)
    w.begin_step()
    now[0] = 0.6
    w.save([], num_scheduled_tokens=1)           # decode-sized steps are not a prefill rate
    assert w.take_rates() == (0, 0.0, 10 * BT, 0.5)
    w.close()


def test_fail_reports_every_block_and_drops_the_request_s_saves(pool):
    w, stats = worker(pool, kv_cache(8))
    w.begin_step()
    w.fail([LoadSpec("r", KEYS[:2], [4, 6]), LoadSpec("q", KEYS[2:3], [1])])
    assert w.take_invalid_block_ids() == {1, 4, 6}
    w.save([SaveSpec("r", KEYS[3:4], [0])])
    assert w.flush(10) and stats.saved_blocks == 0
    w.close()


# ---------------------------------------------------------------- against a real master + node (same-host arena)


@pytest.fixture
def up(port):
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    cluster = LocalCluster(UpConfig(listen=f"127.0.0.1:{port}", http_listen="", shm_dir=shm,
                                    dram_bytes=16 * NS.block_bytes, ssd_path="", node_id="n1",
                                    promote_on_hit=False, write_behind=False)).start()
    yield cluster
    cluster.stop()
    shutil.rmtree(shm, ignore_errors=True)


class LateWriter(ReadSpy):
    """A PoolClient whose acquired extent `victim` is overwritten in place as the lease is handed out: what a
    stalled peer's late write does to bytes a reader copies straight out of the mapped arena."""

    def __init__(self, client: PoolClient, victim: int) -> None:
        super().__init__(client)
        self.victim, self.direct = victim, []

    def _record(self, asked, kwargs, read):
        self.direct += read.direct
        if self.victim < read.count:
            np.frombuffer(read.buffers[self.victim], np.uint8)[:8] ^= 0xFF
        return super()._record(asked, kwargs, read)


@pytest.mark.parametrize("transport, direct", [("auto", True), ("tcp", False)])
def test_load_is_byte_exact_from_the_arena_or_through_staging_rows(up, transport, direct):
    cache_a, cache_b = kv_cache(10, seed=1), kv_cache(10, seed=2)
    with PoolClient(up.address) as client, PoolClient(up.address, transport=transport) as reader:
        a, _ = worker(client, cache_a)
        a.save([SaveSpec("r", KEYS[:5], [3, 1, 4, 0, 2])])
        assert a.flush(10)
        spy = LateWriter(reader, victim=99)
        b, stats = worker(spy, cache_b, load_chunk_blocks=2)   # 2 staging rows
        b.begin_step()
        b.load([LoadSpec("q", KEYS[:5], [9, 8, 7, 6, 5])])
        assert b.take_invalid_block_ids() == set() and spy.direct == [direct] * 5
        # same host: one read straight from the arena; TCP: the rows' worth at a time, the first asking for all 5
        rows = [(5, 2, True, 2), (None, 2, True, 2), (None, 1, False, 2)]      # the first, then its rests
        assert spy.reads == ([(5, 5, False, 2)] if direct else rows)
        for src, dst in zip([3, 1, 4, 0, 2], [9, 8, 7, 6, 5]):
            assert [page(cache_b, l, dst) for l in range(LAYERS)] == [page(cache_a, l, src) for l in range(LAYERS)]
        assert stats.pool_hit_tokens == {"dram": 5 * BT} and stats.fallbacks == {}
        a.close(), b.close()


def test_extent_changed_under_the_copy_is_reported_not_loaded(up):
    with PoolClient(up.address) as client:
        a, _ = worker(client, kv_cache(10, seed=1))
        a.save([SaveSpec("r", KEYS[:4], [0, 1, 2, 3])])
        assert a.flush(10)
        b, stats = worker(LateWriter(client, victim=2), kv_cache(10, seed=2))
        b.begin_step()
        b.load([LoadSpec("q", KEYS[:4], [9, 8, 7, 6])])
        # The fence runs after the copy: block 7 holds the changed bytes, so it and the blocks after it recompute.
        assert b.take_invalid_block_ids() == {7, 6}
        assert stats.fallbacks == {"partial_load": 1} and stats.pool_hit_tokens == {"dram": 2 * BT}
        assert client.checksum_failures == 1
        a.close(), b.close()
    with PoolClient(up.address) as other:     # the release named the bad key: the pool forgot it
        assert other.contains_many(KEYS[:4]) == [True, True, False, True]


def test_which_entries_the_fence_covers(up, pool):
    """needs_check: a same-host arena's extents with verify "all"; not TCP-staged rows (checked as they arrived),
    not a client that verifies nothing, not an EmbeddedPool's in-process extents."""
    with PoolClient(up.address) as client:
        a, _ = worker(client, kv_cache(10, seed=1))
        a.save([SaveSpec("r", KEYS[:2], [0, 1])])
        assert a.flush(10)
        a.close()
        sizes = [NS.block_bytes] * 2
        cases = (({}, [True, True]), ({"transport": "tcp"}, [False, False]), ({"verify": "none"}, [False, False]))
        for kw, want in cases:
            with PoolClient(up.address, **kw) as reader, reader.acquire_many(KEYS[:2], sizes) as read:
                assert read.count == 2 and [read.needs_check(i) for i in range(2)] == want, kw
    _saved(pool, 2)
    with pool.acquire_many(KEYS[:2], [NS.block_bytes] * 2) as read:
        assert read.count == 2 and read.direct == [True, True] and not read.needs_check(0)


def test_a_change_undone_after_the_copy_is_caught_by_the_hash_of_what_landed(up):
    """A peer changes an extent just before it is copied and restores it before the fence runs. Hashing the extent
    after the copy sees the committed bytes again; the hash of the pages as they landed does not. Leased reads (no
    host index): the release names the key. (A read from the host index re-reads a mismatched key under a lease at
    release, which finds the restored bytes: tests/kvpool/test_host_index_reads.py.)"""
    src = kv_cache(10, seed=1)
    with PoolClient(up.address, host_index_reads=False) as client:
        a, _ = worker(client, src)
        a.save([SaveSpec("r", KEYS[:3], [0, 1, 2])])
        assert a.flush(10)
        a.close()
        for judge, accepted in (("extent", 3), ("landed", 1)):
            dst = kv_cache(10, seed=2)
            with client.acquire_many(KEYS[:3], [NS.block_bytes] * 3) as read:
                victim = np.frombuffer(read.buffers[1], np.uint8)

                def after(i, digest, victim=victim, judge=judge, read=read):
                    if i == 0:
                        victim[:8] ^= 0xFF       # lands in block 5 with the copy of object 1
                    if i == 1:
                        victim[:8] ^= 0xFF       # undone before the check
                    return read.verify_entry(i) if judge == "extent" else read.verify_landed(i, digest)

                hash_landed = read.needs_check if judge == "landed" else None
                assert KVPages(dst).scatter_views([4, 5, 6], read.buffers, after=after,
                                                  hash_landed=hash_landed) == accepted, judge
            wrong = page(dst, 0, 5) != page(src, 0, 1)
            assert wrong                                 # block 5 holds the changed bytes either way
        assert client.checksum_failures == 1           # only the landed hash saw them
    with PoolClient(up.address) as other:             # and that release named the key: the pool forgot it
        assert other.contains_many(KEYS[:3]) == [True, False, True]


def test_warm_opens_the_pool_and_maps_the_arena_or_counts_the_fault(up):
    stats = ConnectorStats()
    h = handle(lambda: PoolClient(up.address), stats)
    assert h.warm() == {"n1": f"mapped, {16 * NS.block_bytes} bytes prefaulted"}
    assert h.get().transfers.mapped_nodes() == ("n1",) and stats.fallbacks == {}
    h.close()
    # The master answers but Hello fails: counted as a fault, the client dropped, nothing raised.
    faulty = handle(lambda: FaultyPool(PoolClient(up.address), "warm", PoolUnavailable("master gone")), stats)
    assert faulty.warm() == {} and stats.fallbacks == {"unreachable": 1} and faulty.backing_off
    dead = handle(lambda: PoolClient(f"127.0.0.1:{free_port()}", timeout=0.2, connect_timeout=0.2), stats)
    assert dead.warm() == {} and stats.fallbacks == {"unreachable": 2} and dead.backing_off
