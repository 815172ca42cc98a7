"""The connector's direct path (connector/direct.py) on the CPU engine: the code a CUDA engine runs, with CPU tensors.

Layer-wise loading on CPU defers each layer's copy until the engine's `wait_for_layer_load(layer)` hook, which is
all a CUDA stream + event would promise: so these tests see wrong output if a hook came late or not at all, and can
check at each layer's compute that exactly the layers waited for have arrived. Real engines, a real EmbeddedPool,
and a real master + node (LocalCluster) for the same-host mapped arena and its read fence.
"""

from __future__ import annotations

import shutil
import tempfile
import threading

import numpy as np
import pytest
import torch

from kvpool.client import PoolClient
from kvpool.connector.config import ConnectorConfig
from kvpool.connector.connector import PoolConnector
from kvpool.embedded import EmbeddedPool
from kvpool.engine_adapter.config import EngineConfig
from kvpool.engine_adapter.llm import LLM
from kvpool.errors import PoolUnavailable
from kvpool.kernels.kv_transfer import as_byte_tensor
from kvpool.keys import block_keys
from kvpool.store.config import UpConfig
from kvpool.store.local_cluster import LocalCluster

from tests.connector.engines import ENGINE_ARGS, GREEDY, PREFIX, QUESTION_A, QUESTION_B, make_engine

DIRECT = dict(transfer="direct", load_policy="always")


def run(engine, question):
    out = engine.generate([PREFIX + question], GREEDY)[0]
    engine.engine.connector.flush()
    return out


def damage_block(up, engine, block: int, byte: int) -> None:
    """Flip one byte of QUESTION_B's prompt block `block` in the node's arena (what a stalled writer does)."""
    namespace = engine.engine.connector.namespace
    keys = block_keys(namespace, engine.engine.tokenizer.encode(PREFIX + QUESTION_B))
    with PoolClient(up.address) as probe:
        read = probe.acquire_many(keys[block:block + 1], [namespace.block_bytes])
        assert read.direct == [True]
        np.frombuffer(read.buffers[0], np.uint8)[byte] ^= 0xFF
        read.release()


def shared_tokens(engine) -> int:
    return len(engine.engine.tokenizer.encode(PREFIX)) // 16 * 16


@pytest.mark.parametrize("layerwise", ["on", "off"])
def test_direct_load_and_save_give_identical_output(layerwise, reference_b):
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        a = make_engine(pool, layerwise_load=layerwise, **DIRECT)
        assert a.engine.connector.direct and a.engine.connector._staging is None
        out_a = run(a, QUESTION_A)
        saved = a.engine.connector.stats.saved_blocks
        assert saved >= shared_tokens(a) // 16 and pool.stats()["objects"] == saved
        # The saved objects are the cache's blocks, byte for byte (gathered straight into the arena extents).
        conn = a.engine.connector
        keys = block_keys(conn.namespace, out_a.prompt_token_ids)[:saved]
        objects = torch.zeros((saved, *conn._shape))
        assert pool.get_many_into(keys, list(objects.view(saved, -1).view(torch.uint8).numpy())) == saved
        b = make_engine(pool, layerwise_load=layerwise, **DIRECT)
        out_b = run(b, QUESTION_B)
        assert out_b.num_cached_tokens_external >= shared_tokens(b) - 16
        assert out_b.token_ids == reference_b
        assert b.engine.connector.stats.pool_hit_tokens == {"dram": out_b.num_cached_tokens_external}
        assert b.engine.connector.stats.fallbacks == {}
        b.engine.connector.close()                      # every load finished, every lease released
        assert pool.stats()["leases_open"] == 0
        cached = a.engine.block_manager.cached                     # key -> block id in A's local prefix cache
        for i, k in enumerate(keys):
            assert torch.equal(objects[i], a.engine.runner.kv_cache[:, :, cached[k]]), i


def test_each_layer_arrives_exactly_when_its_hook_runs(reference_b):
    """At layer i's compute, layers <= i of the loaded blocks hold the pool's bytes and layers > i do not yet."""
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        run(make_engine(pool, **DIRECT), QUESTION_A)
        b = make_engine(pool, layerwise_load="on", **DIRECT)
        engine = b.engine
        cache = engine.runner.kv_cache
        conn = engine.connector
        keys = block_keys(conn.namespace, engine.tokenizer.encode(PREFIX + QUESTION_B))
        hit = pool.lookup_prefix(keys)
        expected = torch.zeros((hit, *conn._shape))
        assert pool.get_many_into(keys[:hit], list(expected.view(hit, -1).view(torch.uint8).numpy())) == hit
        seen: list[tuple[str, int]] = []
        checks: list[tuple[int, list[bool]]] = []
        hook = engine.runner.before_layer

        def before_layer(i):
            seen.append(("wait", i))
            hook(i)

        def at_compute(layer_index):
            def pre(module, args):
                seen.append(("compute", layer_index))
                if len(checks) < len(cache):                              # the first forward: the loading step
                    first_block = engine.scheduler.running[0].block_ids[0]    # loaded from the pool (B has no local hit)
                    arrived = [bool(torch.equal(cache[l, :, first_block], expected[0, l])) for l in range(len(cache))]
                    checks.append((layer_index, arrived))
            return pre

        engine.runner.before_layer = before_layer
        handles = [layer.register_forward_pre_hook(at_compute(i)) for i, layer in enumerate(engine.runner.model.layers)]
        try:
            out = run(b, QUESTION_B)
        finally:
            for h in handles:
                h.remove()
        layers = len(cache)
        assert out.num_cached_tokens_external == hit * 16 and out.token_ids == reference_b
        assert seen[:2 * layers] == [e for i in range(layers) for e in (("wait", i), ("compute", i))]
        assert len(checks) == layers
        for layer_index, arrived in checks:                       # the first step, the one that loaded
            assert arrived == [l <= layer_index for l in range(layers)], layer_index


def test_a_missing_hook_is_caught_on_cpu(reference_b):
    """The deferred CPU copies are a real probe: an engine that never waits for its layers computes on stale KV."""
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        run(make_engine(pool, **DIRECT), QUESTION_A)
        b = make_engine(pool, layerwise_load="on", **DIRECT)
        b.engine.runner.before_layer = None                       # the hook never runs
        out = run(b, QUESTION_B)
        assert out.num_cached_tokens_external > 0
        assert out.token_ids != reference_b
        b.engine.connector.close()
        assert pool.stats()["leases_open"] == 0                   # the copies still finished before the release


@pytest.fixture
def up(port):
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    cluster = LocalCluster(UpConfig(listen=f"127.0.0.1:{port}", http_listen="", shm_dir=shm, dram_bytes=64 << 20,
                                    ssd_path=None, node_id="n1")).start()
    yield cluster
    cluster.stop()
    shutil.rmtree(shm, ignore_errors=True)


# off: copies run at once, each block verified after its copy; with 1-block chunks block 3's chunk is already leased
# on the prefetch thread when block 2 fails its check, and that lease is given back, not left to expire
@pytest.mark.parametrize("layerwise, chunk", [("on", 64), ("off", 64), ("off", 1)])
def test_same_host_pool_mapped_arena_and_its_read_fence(up, reference_b, layerwise, chunk):
    config = dict(pool=up.address, layerwise_load=layerwise, load_chunk_blocks=chunk, **DIRECT)
    a = LLM(connector=PoolConnector(ConnectorConfig(**config)), **ENGINE_ARGS)
    run(a, QUESTION_A)
    saved = a.engine.connector.stats.saved_blocks
    b = LLM(connector=PoolConnector(ConnectorConfig(**config)), **ENGINE_ARGS)
    out_b = run(b, QUESTION_B)
    assert out_b.token_ids == reference_b and out_b.num_cached_tokens_external >= shared_tokens(b) - 16
    assert b.engine.connector.stats.fallbacks == {}
    # Damage the 3rd block in the node's arena: the next direct load verifies, stops there, recomputes the rest.
    damage_block(up, a, 2, 123)
    c = LLM(connector=PoolConnector(ConnectorConfig(**config)), **ENGINE_ARGS)
    out_c = run(c, QUESTION_B)
    assert out_c.num_cached_tokens_external == 2 * 16
    assert out_c.token_ids == reference_b
    assert c.engine.connector.stats.fallbacks == {"partial_load": 1}
    assert saved > 2
    for engine in (a, b, c):
        engine.engine.connector.close()
    assert up.master.master.stats_record().extra["leases_open"] == 0


def late_write(real_scatter, events):
    """scatter_blocks after a stalled writer's byte landed in block 2's extent (after the lookup, before the copy:
    nothing a lease can stop). A check before the copy would pass it."""
    def scatter(kv_cache, block_ids, objects, **kwargs):
        if not events:
            u8 = as_byte_tensor(objects[2])     # the extent itself (the loader hands over the pool's buffers)
            assert u8.is_contiguous()
            u8[123] ^= 0xFF
            events.append(block_ids[2])
        return real_scatter(kv_cache, block_ids, objects, **kwargs)
    return scatter


def change_and_undo(real_scatter, events):
    """scatter_blocks while a peer flips a byte of block 2's extent just before block 2 is copied and flips it back
    right after, before the fence judges block 2. Hashing the extent after the copy (`after=read.verify_copy`
    without `hash_landed`) would see the committed bytes again and keep the wrong byte in the cache."""
    def scatter(kv_cache, block_ids, objects, **kwargs):
        judge = kwargs["after"]
        victim = as_byte_tensor(objects[2])

        def hook(i, digest):
            if i == 2 and not events:
                victim[123] ^= 0xFF              # undone: the extent holds the committed bytes again
                events.append(block_ids[2])
            ok = judge(i, digest)
            if i == 1 and not events:
                victim[123] ^= 0xFF              # lands in the cache with the copy of block 2
            return ok

        return real_scatter(kv_cache, block_ids, objects, **{**kwargs, "after": hook})
    return scatter


@pytest.mark.parametrize("fault", [late_write, change_and_undo])
def test_a_cpu_direct_load_checks_the_bytes_that_landed_in_the_cache(up, reference_b, monkeypatch, fault):
    """The fence judges each block as it landed in the cache, right after its copy: a stalled writer's byte in block
    2's extent is caught whether it was there before the copy or came and went during it. The load stops at block 2
    and the engine recomputes the rest, so the output is exact."""
    from kvpool.connector import direct as direct_module

    config = dict(pool=up.address, layerwise_load="off", **DIRECT)
    a = LLM(connector=PoolConnector(ConnectorConfig(**config)), **ENGINE_ARGS)
    run(a, QUESTION_A)
    assert a.engine.connector.stats.saved_blocks > 3
    events = []
    monkeypatch.setattr(direct_module, "scatter_blocks", fault(direct_module.scatter_blocks, events))
    b = LLM(connector=PoolConnector(ConnectorConfig(**config)), **ENGINE_ARGS)
    out_b = run(b, QUESTION_B)
    assert len(events) == 1
    assert out_b.num_cached_tokens_external == 2 * 16
    assert out_b.token_ids == reference_b
    assert b.engine.connector.stats.fallbacks == {"partial_load": 1}
    for engine in (a, b):
        engine.engine.connector.close()


def test_a_cpu_direct_load_over_tcp_reuses_the_staging_rings_across_chunks(up, reference_b):
    """transport tcp: no entry is reachable directly, every one lands in a load ring; chunks of 3 blocks alternate
    between the two rings (chunk j + 1 read into one while chunk j is copied out of the other), each reused every
    other chunk: a chunk is copied into the cache before the chunk after next overwrites its rows."""
    config = dict(pool=up.address, layerwise_load="off", transport="tcp", load_chunk_blocks=3, **DIRECT)
    a = LLM(connector=PoolConnector(ConnectorConfig(**config)), **ENGINE_ARGS)
    run(a, QUESTION_A)
    b = LLM(connector=PoolConnector(ConnectorConfig(**config)), **ENGINE_ARGS)
    out_b = run(b, QUESTION_B)
    assert out_b.num_cached_tokens_external >= shared_tokens(b) - 16 > 3 * 16    # several chunks
    assert out_b.token_ids == reference_b
    assert b.engine.connector.stats.fallbacks == {}
    for engine in (a, b):
        engine.engine.connector.close()


@pytest.mark.parametrize("transfer", ["staged", "direct"])
def test_warm_start_maps_the_arena_before_the_first_request(up, reference_b, transfer):
    a = LLM(connector=PoolConnector(ConnectorConfig(pool=up.address, transfer=transfer)), **ENGINE_ARGS)
    run(a, QUESTION_A)
    b = LLM(connector=PoolConnector(ConnectorConfig(pool=up.address, transfer=transfer)), **ENGINE_ARGS)
    conn = b.engine.connector
    assert conn.wait_warm(30)
    assert conn.warm_report == {"n1": f"mapped, {64 << 20} bytes prefaulted"}
    out_b = run(b, QUESTION_B)
    assert out_b.token_ids == reference_b and out_b.num_cached_tokens_external >= shared_tokens(b) - 16
    assert conn.stats.fallbacks == {}
    off = LLM(connector=PoolConnector(ConnectorConfig(pool=up.address, transfer=transfer, warm_start=False)),
              **ENGINE_ARGS)
    assert off.engine.connector.wait_warm(0) and off.engine.connector.warm_report == {}
    assert run(off, QUESTION_B).token_ids == reference_b
    assert off.engine.connector.warm_report == {}          # nothing mapped ahead: the first get mapped the arena
    for engine in (a, b, off):
        engine.engine.connector.close()


class FaultAfter:
    """A real pool whose reads fail from the `n`-th on (a node dying mid-load, as the caller sees it): acquire_many
    and the reads a load goes on with under the same lease (ExtentRead.rest) alike."""

    def __init__(self, pool, n):
        self.pool, self.n, self.calls = pool, n, 0

    def acquire_many(self, *args, **kwargs):
        read = self._read(lambda: self.pool.acquire_many(*args, **kwargs))
        self.first = (read.count, read.direct.count(False), read.staging_full)
        return read

    def _read(self, fn):
        self.calls += 1
        if self.calls >= self.n:
            raise PoolUnavailable("node n1 (127.0.0.1:1): connection reset")
        return _FlakyRead(fn(), self)

    def __getattr__(self, name):
        return getattr(self.pool, name)


class _FlakyRead:
    """An ExtentRead whose `rest` counts as one of its FaultAfter's reads."""

    def __init__(self, read, owner):
        self.read, self.owner = read, owner

    def rest(self, **kwargs):
        return self.owner._read(lambda: self.read.rest(**kwargs))

    def __getattr__(self, name):
        return getattr(self.read, name)


@pytest.mark.parametrize("layerwise", ["on", "off"])
def test_a_fault_during_a_direct_load_recomputes_the_rest(reference_b, layerwise, tmp_path):
    """Layer-wise: the second chunk's acquire fails after the first was queued. Off (CPU copies at once): the hit
    lies on SSD, so the first read ends at its ring's 3 rows and the next read (its rest, under the same lease)
    fails (on the prefetch thread while the first copies, or on the engine thread after it); the load ends there
    and no lease stays open."""
    ssd = dict(dram_bytes=1 << 20, ssd_path=str(tmp_path / "ssd"), ssd_bytes=64 << 20, promote_on_hit=False)
    with EmbeddedPool(**(ssd if layerwise == "off" else dict(dram_bytes=128 << 20))) as pool:
        run(make_engine(pool, **DIRECT), QUESTION_A)
        flaky = FaultAfter(pool, 2)
        b = make_engine(flaky, layerwise_load=layerwise, load_chunk_blocks=3, **DIRECT)
        out = run(b, QUESTION_B)
        if layerwise == "on":
            assert out.num_cached_tokens_external == 3 * 16          # the first chunk, then the fault
        else:                                                       # the first read: DRAM hits, then 3 SSD ones
            count, staged, full = flaky.first
            assert staged == 3 and full and out.num_cached_tokens_external == count * 16
        assert out.token_ids == reference_b
        assert b.engine.connector.stats.fallbacks == {"unreachable": 1}
        b.engine.connector.close()
        assert pool.stats()["leases_open"] == 0


def test_a_fault_during_an_all_direct_cpu_load_recomputes_it_all(reference_b):
    """Same-host DRAM on CPU: the whole hit is one read, so a fault at its acquire leaves nothing loaded."""
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        run(make_engine(pool, **DIRECT), QUESTION_A)
        flaky = FaultAfter(pool, 1)
        b = make_engine(flaky, layerwise_load="off", load_chunk_blocks=3, **DIRECT)
        out = run(b, QUESTION_B)
        assert out.num_cached_tokens_external == 0 and out.token_ids == reference_b
        assert b.engine.connector.stats.fallbacks == {"unreachable": 1}
        b.engine.connector.close()
        assert pool.stats()["leases_open"] == 0


class ThreadSpy:
    """A real pool that records each read a load makes (acquire_many, and ExtentRead.rest under its lease): which
    thread ran it, what it asked for (keys, max_staged: keys None for a rest) and what it got."""

    def __init__(self, pool):
        self.pool, self.threads, self.asked, self.got, self.continued = pool, [], [], [], []

    def acquire_many(self, keys, *args, **kwargs):
        self.continued.append(kwargs.get("continued", False))
        return self._read(len(keys), kwargs.get("max_staged"), lambda: self.pool.acquire_many(keys, *args, **kwargs))

    def _read(self, keys, max_staged, fn):
        self.threads.append(threading.current_thread().name)
        self.asked.append((keys, max_staged))
        read = fn()
        self.got.append((read.count, read.direct.count(False), read.staging_full))
        return _SpiedRead(read, self)

    def __getattr__(self, name):
        return getattr(self.pool, name)


class _SpiedRead:
    def __init__(self, read, spy):
        self.read, self.spy = read, spy

    def rest(self, **kwargs):
        return self.spy._read(None, kwargs.get("max_staged"), lambda: self.read.rest(**kwargs))

    def __getattr__(self, name):
        return getattr(self.read, name)


def test_a_cpu_direct_load_acquires_the_next_chunk_while_it_copies_this_one(reference_b, tmp_path, copy_path):
    """SSD records, rings of 2 rows: the first read asks for the whole hit and ends at its ring's 2 rows; every read
    after it is that read's rest, under its lease (no lookup), 2 records at a time. The first is acquired on the
    engine thread; every later one, where the copy runs on one core (the one-pass copy), on the prefetch thread
    while the one before is copied, into the other ring; with torch's copy, on both cores, on the engine thread once
    the copy is done. Same-host DRAM: the whole hit is one read on the engine thread. The output is exact either
    way."""
    with EmbeddedPool(dram_bytes=1 << 20, ssd_path=str(tmp_path / "ssd"), ssd_bytes=64 << 20,
                      promote_on_hit=False) as pool:
        run(make_engine(pool, **DIRECT), QUESTION_A)
        spy = ThreadSpy(pool)
        b = make_engine(spy, layerwise_load="off", load_chunk_blocks=2, **DIRECT)
        before = pool.stats()
        out = run(b, QUESTION_B)
        counted = {n: pool.stats()[n] - before[n] for n in ("lookups", "hit_keys")}
        hit = out.num_cached_tokens_external // 16
        # three reads or more: ring 0, ring 1, then ring 0 again
        assert hit >= 6 and out.token_ids == reference_b
        assert spy.threads[0] == threading.current_thread().name and len(spy.threads) >= 3
        # the first read: the hit's DRAM blocks (a leading one may still be there), then 2 SSD records
        assert spy.asked[0] == (hit, 2) and spy.got[0][1:] == (2, True)
        first = spy.got[0][0]
        # every read after the first is the rest of the one before (keys None): 2 SSD records each, the last ones
        # what is left; one lookup for the whole load, so the pool counts the hit once in the load (and once in
        # the scheduler's lookup before it), not once more per ring of rows
        assert spy.asked[1:] == [(None, 2)] * (len(spy.asked) - 1) and spy.continued == [False]
        assert [got[:2] for got in spy.got[1:]] == [(min(2, hit - first - 2 * i),) * 2 for i in range(len(spy.got) - 1)]
        assert counted == {"lookups": 2, "hit_keys": 2 * hit}, counted
        if copy_path == "one pass":
            assert all(t.startswith("kvpool-load-prefetch") for t in spy.threads[1:])
        else:
            assert set(spy.threads) == {threading.current_thread().name}
        b.engine.connector.close()
        assert pool.stats()["leases_open"] == 0
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        run(make_engine(pool, **DIRECT), QUESTION_A)
        spy = ThreadSpy(pool)
        b = make_engine(spy, layerwise_load="off", load_chunk_blocks=3, **DIRECT)
        out = run(b, QUESTION_B)
        loaded = out.num_cached_tokens_external // 16
        assert loaded >= 6 and out.token_ids == reference_b           # more than two rings' worth
        assert spy.threads == [threading.current_thread().name]
        assert spy.asked == [(loaded, 3)] and spy.got == [(loaded, 0, False)] and spy.continued == [False]
        b.engine.connector.close()
        assert pool.stats()["leases_open"] == 0


class CopySpy:
    """A real pool whose reads record, per chunk, which thread asked whether each entry is to be hashed as it
    lands: the thread that copied it (kernels/kv_transfer.py scatter_blocks)."""

    def __init__(self, pool):
        self.pool, self.chunks = pool, []

    def acquire_many(self, *args, **kwargs):
        read = self.pool.acquire_many(*args, **kwargs)
        copied_on = {}
        self.chunks.append(copied_on)

        class Read:
            def needs_check(self, i):
                copied_on[i] = threading.current_thread().name
                return read.needs_check(i)

            def __getattr__(self, name):
                return getattr(read, name)

        return Read()

    def __getattr__(self, name):
        return getattr(self.pool, name)


def test_a_cpu_direct_load_copies_a_chunk_on_two_threads(reference_b, copy_path):
    """Same-host DRAM: the hit of 6 blocks is one read; with the one-pass copy, entries 0-2 are copied on the
    engine thread while entries 3-5 are copied on the copy helper; with torch's copy (its own threads already), all
    on the engine thread. The output is exact either way."""
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        run(make_engine(pool, **DIRECT), QUESTION_A)
        spy = CopySpy(pool)
        b = make_engine(spy, layerwise_load="off", load_chunk_blocks=3, **DIRECT)
        out = run(b, QUESTION_B)
        assert out.num_cached_tokens_external == 6 * 16 and out.token_ids == reference_b
        here = threading.current_thread().name
        assert [sorted(c) for c in spy.chunks] == [[0, 1, 2, 3, 4, 5]]
        copied_on = spy.chunks[0]
        assert copied_on[0] == copied_on[1] == copied_on[2] == here
        for i in (3, 4, 5):
            assert copied_on[i].startswith("kvpool-load-copy") == (copy_path == "one pass")
            assert copied_on[i] == here or copy_path == "one pass"
        b.engine.connector.close()
        assert pool.stats()["leases_open"] == 0


def test_cpu_engine_takes_the_direct_path_by_default_and_staged_when_asked():
    with EmbeddedPool(dram_bytes=16 << 20) as pool:
        engine = make_engine(pool)
        conn = engine.engine.connector
        assert conn.direct and conn._staging is None
        assert conn.pin_report == {} and conn.pinned_memory() == {}
        staged = make_engine(pool, transfer="staged").engine.connector
        assert not staged.direct and staged._staging is not None and not staged._staging.is_pinned()


def test_verify_threads_reaches_the_pool_client(up, monkeypatch):
    """KVPOOL_VERIFY_THREADS=0 through the environment, then open_pool: the client hashes on the calling thread."""
    from kvpool.connector.pool_factory import open_pool

    monkeypatch.setenv("KVPOOL_VERIFY_THREADS", "0")
    config = ConnectorConfig.load(None, pool=up.address)
    assert config.verify_threads == 0
    monkeypatch.delenv("KVPOOL_VERIFY_THREADS")
    for cfg, want in ((config, 0), (ConnectorConfig(pool=up.address), 1)):
        client = open_pool(cfg)
        try:
            assert client.transfers.verify_threads == want
        finally:
            client.close()


def test_config_errors_name_the_field():
    cases = [
        (dict(transfer="dma"), "transfer must be one of auto, staged, direct, got 'dma'"),
        (dict(layerwise_load="sometimes"), "layerwise_load must be one of auto, on, off, got 'sometimes'"),
        (dict(layerwise_load="on", transfer="staged"), "layerwise_load=on needs transfer=direct or auto"),
        (dict(pin_host_memory="yes"), "pin_host_memory must be true or false"),
        (dict(warm_start=1), "warm_start must be true or false, got 1"),
        (dict(verify_threads=2), r"^verify_threads must be 0 or 1 \(a helper thread .*\), got 2$"),
        (dict(verify_threads=True), r"^verify_threads must be 0 or 1 .*, got True$"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            ConnectorConfig(**kwargs)
    with pytest.raises(ValueError, match=r"^EngineConfig.device must be auto, cpu, cuda or cuda:N, got 'tpu'$"):
        EngineConfig(device="tpu")
    if not torch.cuda.is_available():
        for device in ("cuda", "cuda:1"):
            with pytest.raises(ValueError, match=rf"^EngineConfig.device='{device}' asks for a GPU but torch sees no "
                                                 r"CUDA device \(torch .*\); set device='cpu' or 'auto'$"):
                EngineConfig(device=device)
        assert EngineConfig().torch_device == "cpu" and EngineConfig(device="auto").torch_device == "cpu"


def test_gpu_bench_says_why_it_measures_nothing_on_a_cpu_machine():
    import pathlib
    import subprocess
    import sys

    from kvpool.tiers.gpu import unavailable_reason

    if unavailable_reason() is None and torch.cuda.is_available():
        pytest.skip("a CUDA device is present: bench/gpu_path.py measures")
    script = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu_path.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    reason = f"CuPy: {unavailable_reason()}" if unavailable_reason() else "torch"
    assert out.stdout.startswith(f"bench/gpu_path.py: skipped, no CUDA device: {reason}")
