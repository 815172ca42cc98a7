"""PoolConnector on a real engine and a real EmbeddedPool (in one process; the multi-process story is in
test_cross_instance.py): reuse with identical output, SSD reads, namespaces, faults, policies."""

from __future__ import annotations

import threading

import pytest

from kvpool.connector.connector import PoolConnector
from kvpool.connector.config import ConnectorConfig
from kvpool.embedded import EmbeddedPool
from kvpool.keys import block_keys

from tests.connector.engines import GREEDY, PREFIX, QUESTION_A, QUESTION_B, make_engine


def run(engine, question):
    out = engine.generate([PREFIX + question], GREEDY)[0]
    engine.engine.connector.flush()
    return out


def prefix_blocks(engine) -> int:
    return len(engine.engine.tokenizer.encode(PREFIX + QUESTION_A)) // 16


def test_b_reuses_what_a_saved_with_identical_output(reference_b):
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        a = make_engine(pool)
        out_a = run(a, QUESTION_A)
        assert out_a.num_cached_tokens_external == 0
        saved = a.engine.connector.stats.saved_blocks
        assert saved >= prefix_blocks(a) - 1 and pool.stats()["objects"] == saved
        b = make_engine(pool)
        out_b = run(b, QUESTION_B)
        shared = len(b.engine.tokenizer.encode(PREFIX)) // 16 * 16
        assert out_b.num_cached_tokens_external >= shared - 16
        assert out_b.token_ids == reference_b
        stats = b.engine.connector.stats
        assert stats.pool_hit_tokens == {"dram": out_b.num_cached_tokens_external}
        assert stats.fallbacks == {}
        assert pool.stats()["hit_tokens_by_tier"]["dram"] == out_b.num_cached_tokens_external


def test_closing_an_engine_ends_its_connectors_threads_and_leaves_a_pool_passed_in_open(reference_b):
    """LLM.close(): the connector's threads (saver, load copies, prefetch) are gone when it returns, so nothing
    keeps the engine's KV cache alive; closing again is a no-op; the closed engine refuses requests by name; the
    pool the caller passed in stays open and serves the next engine every block saved before."""
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        for question in (QUESTION_A, QUESTION_B):   # a save, then a load: the pool's own threads start at its first
            with make_engine(pool) as warm:         # use of each, and are not counted below
                run(warm, question)
        before = set(threading.enumerate())         # Thread objects, not idents (the OS reuses those)
        a = make_engine(pool)
        run(a, QUESTION_A)
        b = make_engine(pool)
        out_b = run(b, QUESTION_B)                  # a load: b's load threads run too
        assert out_b.num_cached_tokens_external > 0 and out_b.token_ids == reference_b
        assert set(threading.enumerate()) - before  # the connectors' threads
        for engine in (a, b):
            engine.close()
        b.close()
        assert set(threading.enumerate()) - before == set()
        with pytest.raises(RuntimeError, match="^add_request: the engine is closed$"):
            b.generate([PREFIX + QUESTION_B], GREEDY)
        with make_engine(pool) as c:
            out_c = run(c, QUESTION_B)
            whole = (len(c.engine.tokenizer.encode(PREFIX + QUESTION_B)) - 1) // 16 * 16
        assert out_c.num_cached_tokens_external == whole      # every full block of the prompt, still in the pool
        assert out_c.token_ids == reference_b


def test_b_reads_from_ssd_when_dram_is_too_small(tmp_path, reference_b):
    # DRAM holds 4 blocks (~720 KiB each); the prefix has ~10, so most of it is demoted to SSD.
    with EmbeddedPool(dram_bytes=3 << 20, ssd_path=str(tmp_path), ssd_bytes=64 << 20,
                      promote_on_hit=False) as pool:
        run(make_engine(pool), QUESTION_A)
        assert pool.stats()["tiers"]["ssd"]["objects"] > 0
        b = make_engine(pool)
        out_b = run(b, QUESTION_B)
        assert out_b.num_cached_tokens_external > 0
        assert pool.stats()["hit_tokens_by_tier"]["ssd"] > 0
        assert b.engine.connector.stats.pool_hit_tokens.get("ssd", 0) > 0
        assert sum(b.engine.connector.stats.pool_hit_tokens.values()) == out_b.num_cached_tokens_external
        assert out_b.token_ids == reference_b


def test_two_namespaces_never_hit_each_other():
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        run(make_engine(pool, tenant="team-a"), QUESTION_A)
        b = make_engine(pool, tenant="team-b")
        out_b = run(b, QUESTION_B)
        assert out_b.num_cached_tokens_external == 0
        assert b.engine.connector.stats.pool_hit_tokens == {}
        # Same tenant again: now it hits.
        c = make_engine(pool, tenant="team-a")
        assert run(c, QUESTION_B).num_cached_tokens_external > 0


def test_unreachable_pool_recomputes_with_identical_output(port, reference_b):
    connector = PoolConnector(ConnectorConfig(pool=f"127.0.0.1:{port}", load_timeout_s=0.5, retry_after_s=3600))
    from kvpool.engine_adapter.llm import LLM
    from tests.connector.engines import ENGINE_ARGS

    b = LLM(connector=connector, **ENGINE_ARGS)
    out = run(b, QUESTION_B)
    assert out.token_ids == reference_b
    assert out.num_cached_tokens_external == 0
    assert connector.stats.fallbacks.get("unreachable", 0) >= 1
    assert connector.stats.fallbacks == {"unreachable": 1}   # one connect attempt, then backed off
    # Backed off: a second request neither tries the pool again nor copies blocks out for a save.
    run(b, QUESTION_A)
    assert connector.stats.fallbacks == {"unreachable": 1}
    assert connector.stats.saved_blocks == 0 and connector.stats.save_dropped_blocks > 0


def test_corrupted_ssd_block_is_recomputed(tmp_path, reference_b):
    # Exclusive tiers: the first record is an object that lives on SSD (with the write-behind it would be the copy
    # of a DRAM object, read from DRAM, and written at a time of the writer thread's choosing).
    with EmbeddedPool(dram_bytes=1 << 20, ssd_path=str(tmp_path), ssd_bytes=64 << 20,
                      promote_on_hit=False, write_behind=False) as pool:
        run(make_engine(pool), QUESTION_A)
        data = tmp_path / "kvpool.data"
        raw = bytearray(data.read_bytes())
        # Flip one byte in the middle of the first record's payload (header is the first 4 KiB page).
        raw[4096 + 1000] ^= 0xFF
        data.write_bytes(bytes(raw))
        b = make_engine(pool)
        out_b = run(b, QUESTION_B)
        assert out_b.token_ids == reference_b
        assert b.engine.connector.stats.fallbacks == {"partial_load": 1}
        assert pool.stats()["ssd_corrupt_reads"] == 1


def test_min_hit_tokens_and_slow_pool_skip_loading(reference_b):
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        run(make_engine(pool), QUESTION_A)
        b = make_engine(pool, min_hit_tokens=100_000)
        assert run(b, QUESTION_B).num_cached_tokens_external == 0
        # A pool measured as slower than prefill is not used in auto mode...
        c = make_engine(pool)
        c.engine.connector.cost.observe_load(1_000, 10.0)       # 100 B/s measured
        out = run(c, QUESTION_B)
        assert out.num_cached_tokens_external == 0 and out.token_ids == reference_b
        assert c.engine.connector.stats.fallbacks == {"slower_than_recompute": 1}
        # ...but is with load_policy=always.
        d = make_engine(pool, load_policy="always")
        d.engine.connector.cost.observe_load(1_000, 10.0)
        assert run(d, QUESTION_B).num_cached_tokens_external > 0


def test_save_policies():
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        run(make_engine(pool, save_policy="off"), QUESTION_A)
        assert pool.stats()["objects"] == 0
        e = make_engine(pool, save_policy="after_n_hits", save_after_hits=2)
        run(e, QUESTION_A)
        assert pool.stats()["objects"] == 0          # first sighting of the prefix: not saved
        run(e, QUESTION_B)                            # second: the shared prefix blocks are saved
        saved = pool.stats()["objects"]
        assert saved > 0
        ns = e.engine.connector.namespace
        keys = block_keys(ns, e.engine.tokenizer.encode(PREFIX + QUESTION_B))
        assert pool.lookup_prefix(keys) == saved


def test_full_save_queue_drops_without_blocking():
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        e = make_engine(pool, save_queue_blocks=1)
        run(e, QUESTION_A)
        stats = e.engine.connector.stats
        assert stats.save_dropped_blocks > 0
        assert stats.saved_blocks + stats.save_dropped_blocks + stats.save_skipped_blocks >= prefix_blocks(e)


def test_block_tokens_mismatch_is_a_clear_error():
    from kvpool.engine_adapter.llm import LLM

    from tests.connector.engines import ENGINE_ARGS

    with pytest.raises(ValueError, match="block_tokens"):
        LLM(connector=PoolConnector(ConnectorConfig(block_tokens=32), pool=None), **ENGINE_ARGS)


def test_connector_metrics_match_its_stats(reference_b):
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        a = make_engine(pool)
        a.engine.connector.register_metrics(reg)
        run(a, QUESTION_A)
        b = make_engine(pool)
        b.engine.connector.register_metrics(reg2 := CollectorRegistry())
        out = run(b, QUESTION_B)
    label = {"namespace": "smollm2-135m/default"}
    sa = a.engine.connector.stats
    assert reg.get_sample_value("kvpool_connector_requested_tokens_total", label) == sa.requested_tokens
    assert reg.get_sample_value("kvpool_connector_saved_blocks_total") == sa.saved_blocks > 0
    assert reg2.get_sample_value("kvpool_connector_hit_tokens_total", {**label, "tier": "dram"}) == \
        out.num_cached_tokens_external > 0
    assert out.token_ids == reference_b


def test_load_in_chunks_of_the_staging_buffer(reference_b):
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        run(make_engine(pool), QUESTION_A)
        b = make_engine(pool, load_chunk_blocks=3, transfer="staged")
        assert b.engine.connector._staging.shape[0] == 3
        out = run(b, QUESTION_B)
        assert out.num_cached_tokens_external >= 6 * 16      # several chunks' worth
        assert out.token_ids == reference_b
        assert b.engine.connector.stats.pool_hit_tokens == {"dram": out.num_cached_tokens_external}
        assert b.engine.connector.stats.fallbacks == {}
