"""SchedulerPlanner (no vLLM): the lookup cap, load plans, save plans for chunked prefill, decode, preemption and
truncation after a failed load, bypassed requests, faults, policies. A real EmbeddedPool answers the lookups."""

from __future__ import annotations

import logging

import pytest

from kvpool import PoolClient, block_keys
from kvpool.connector.pool_handle import PoolHandle
from kvpool.connector.stats import ConnectorStats
from kvpool.connector.vllm_plan import ScheduledRequest, SchedulerPlanner
from kvpool.embedded import EmbeddedPool
from kvpool.errors import PoolTimeout
from kvpool.launcher import free_port

from tests.connector.vllm_fakes import BT, NS, FakeRequest, FaultyPool, config, handle


@pytest.fixture
def pool():
    with EmbeddedPool(dram_bytes=16 << 20) as p:
        yield p


def store(pool, tokens, n_blocks, extra=b""):
    keys = block_keys(NS, tokens, extra)[:n_blocks]
    assert pool.put_many(keys, [bytes(NS.block_bytes)] * len(keys), namespace=NS) == ["stored"] * len(keys)
    return keys


def planner(pool, **kw):
    stats = ConnectorStats()
    return SchedulerPlanner(config(**kw), NS, handle(pool, stats), stats), stats


def step(rid, computed, scheduled):
    return ScheduledRequest(rid, computed, scheduled)


@pytest.mark.parametrize("num_tokens, stored, local, want", [
    (16, 4, 0, 15),   # whole prompt in the pool: all 4 blocks load, capped at 15 tokens so one is left to compute
    (16, 4, 12, 3),   # vLLM's own hit stops at block 3 (it leaves the whole last block): the pool adds 3 tokens
    (16, 3, 0, 12),   # the pool lacks the last block: vLLM computes it, as after its own local hit
    (17, 4, 0, 16),   # one token past the last full block: all 4 blocks load
    (17, 2, 0, 8),    # the pool has only 2 leading blocks
    (17, 4, 8, 8),    # vLLM's local prefix hit covers blocks 0-1: only blocks 2-3 are asked for
    (17, 4, 16, 0),   # local hit already at the cap
    (3, 4, 0, 0),     # shorter than a block
    (4, 4, 0, 3),     # exactly one block: 3 of its tokens come from the pool
])
def test_lookup_is_capped_and_starts_after_the_local_hit(pool, num_tokens, stored, local, want):
    tokens = list(range(100, 100 + num_tokens))
    store(pool, list(range(100, 120)), stored)
    p, stats = planner(pool)
    assert p.lookup(FakeRequest("r", tokens), local) == want
    assert stats.requested_tokens == num_tokens // BT * BT        # whole blocks, as the hit counters
    assert stats.local_hit_tokens == min(local, num_tokens // BT * BT)


def test_whole_block_prompt_loads_its_last_block_and_saves_nothing_again(pool):
    tokens = list(range(16))            # exactly 4 blocks
    keys = store(pool, tokens, 4)
    p, _ = planner(pool)
    r = FakeRequest("r", tokens)
    assert p.lookup(r, 0) == 15
    blocks = [8, 6, 4, 2]
    p.allocated(r, blocks, 15)          # 15 tokens counted as computed: the 4th block is partly counted
    plan = p.build([step("r", 15, 1)], lambda rid: blocks)
    assert [(l.keys, l.block_ids) for l in plan.loads] == [(keys, blocks)]    # loaded whole
    assert plan.saves == []             # the step computes token 15 into block 2: it is in the pool already
    r.all_token_ids.append(7)
    assert p.build([step("r", 16, 1)], lambda rid: blocks + [1]).saves == []


def test_whole_block_prompt_after_vllm_s_local_hit_loads_only_the_last_block(pool):
    tokens = list(range(16))
    keys = store(pool, tokens, 4)
    p, _ = planner(pool)
    r = FakeRequest("r", tokens)
    assert p.lookup(r, 12) == 3
    p.allocated(r, [5, 6, 7, 9], 3)
    plan = p.build([step("r", 15, 1)], lambda rid: [5, 6, 7, 9])
    assert [(l.keys, l.block_ids) for l in plan.loads] == [(keys[3:], [9])] and plan.saves == []


def test_failed_load_of_the_partly_counted_block_is_saved_once_recomputed(pool):
    tokens = list(range(16))
    keys = store(pool, tokens, 4)
    p, _ = planner(pool)
    r = FakeRequest("r", tokens)
    assert p.lookup(r, 0) == 15
    blocks = [8, 6, 4, 2]
    p.allocated(r, blocks, 15)
    p.build([step("r", 15, 1)], lambda rid: blocks)
    # Block 2 (index 3) failed to load: vLLM truncates to 12 computed tokens and recomputes tokens 12..15.
    plan = p.build([step("r", 12, 4)], lambda rid: blocks)
    assert [(s.keys, s.block_ids) for s in plan.saves] == [(keys[3:], [2])]


def test_lookup_is_counted_once_per_request_and_min_hit_tokens_applies(pool):
    tokens = list(range(17))
    store(pool, tokens, 2)
    p, stats = planner(pool, min_hit_tokens=12)
    r = FakeRequest("r", tokens)
    assert p.lookup(r, 0) == 0          # 8 hit tokens < 12
    assert p.lookup(r, 0) == 0          # asked again (did not fit this step): not counted twice
    assert stats.requests == 1 and stats.requested_tokens == 16 and stats.lookups == 2


def test_load_plan_targets_the_allocated_blocks_after_the_local_hit(pool):
    tokens = list(range(21))
    keys = store(pool, tokens, 5)
    p, _ = planner(pool)
    r = FakeRequest("r", tokens)
    assert p.lookup(r, 4) == 16         # local hit block 0, pool blocks 1..4
    p.allocated(r, [7, 3, 9, 2, 5, 6], 16)
    plan = p.build([step("r", 20, 1)], lambda rid: [7, 3, 9, 2, 5, 6])
    assert [(l.req_id, l.keys, l.block_ids) for l in plan.loads] == [("r", keys[1:5], [3, 9, 2, 5])]
    assert plan.saves == [] and plan.num_scheduled_tokens == 1
    assert p.build([step("r", 21, 1)], lambda rid: [7, 3, 9, 2, 5, 6]).loads == []   # planned once


def test_allocated_with_fewer_tokens_than_the_hit_loads_only_those(pool):
    tokens = list(range(21))
    keys = store(pool, tokens, 5)
    p, _ = planner(pool)
    r = FakeRequest("r", tokens)
    assert p.lookup(r, 0) == 20
    p.allocated(r, list(range(10, 16)), 8)     # vLLM may take less than offered
    plan = p.build([step("r", 8, 13)], lambda rid: list(range(10, 16)))
    assert plan.loads[0].keys == keys[:2] and plan.loads[0].block_ids == [10, 11]
    # The rest is computed in this step and saved: blocks 2..4 (block 5 holds only token 20).
    assert [(s.keys, s.block_ids) for s in plan.saves] == [(keys[2:5], [12, 13, 14])]


def test_chunked_prefill_saves_each_block_once_as_it_becomes_full(pool):
    tokens = list(range(1000, 1042))   # 10 full blocks + 2 tokens
    p, _ = planner(pool)
    r = FakeRequest("r", tokens)
    assert p.lookup(r, 0) == 0
    blocks = list(range(20, 31))
    keys = block_keys(NS, tokens)
    saved = []
    computed = 0
    for chunk in (6, 14, 16, 6):       # chunk boundaries inside blocks
        plan = p.build([step("r", computed, chunk)], lambda rid: blocks)
        computed += chunk
        saved.append([(s.keys, s.block_ids) for s in plan.saves])
    assert saved == [
        [(keys[0:1], [20])],           # 6 tokens: block 0 full
        [(keys[1:5], [21, 22, 23, 24])],   # 20 tokens: blocks 1-4
        [(keys[5:9], [25, 26, 27, 28])],   # 36 tokens
        [(keys[9:10], [29])],          # 42 tokens: block 9 full, block 10 partial
    ]


def test_decode_blocks_are_saved_when_generated_tokens_fill_them(pool):
    tokens = list(range(2000, 2010))   # 2 blocks + 2 tokens
    p, _ = planner(pool)
    r = FakeRequest("r", tokens)
    p.lookup(r, 0)
    blocks = [5, 6, 7, 8]
    assert [s.block_ids for s in p.build([step("r", 0, 10)], lambda rid: blocks).saves] == [[5, 6]]
    saved = []
    for new_token in (1, 2, 3):        # decode: each step's input is the token sampled in the step before
        r.all_token_ids.append(new_token)
        plan = p.build([step("r", len(r.all_token_ids) - 1, 1)], lambda rid: blocks)
        saved.append([(s.keys, s.block_ids) for s in plan.saves])
    # Token 11 (the 2nd generated) completes block 2 in the second decode step.
    assert saved == [[], [([block_keys(NS, r.all_token_ids)[2]], [7])], []]


def test_decode_block_key_covers_the_generated_tokens(pool):
    r = FakeRequest("r", list(range(7)))
    p, _ = planner(pool)
    p.lookup(r, 0)
    p.build([step("r", 0, 7)], lambda rid: [0, 1])
    r.all_token_ids.append(99)          # token 7 sampled; its KV is computed in the next step
    plan = p.build([step("r", 7, 1)], lambda rid: [0, 1])
    assert plan.saves[0].keys == [block_keys(NS, list(range(7)) + [99])[1]]


def test_failed_load_truncation_rewinds_the_save_pointer(pool):
    tokens = list(range(25))
    keys = store(pool, tokens, 6)
    p, _ = planner(pool)
    r = FakeRequest("r", tokens)
    assert p.lookup(r, 0) == 24
    blocks = list(range(40, 47))
    p.allocated(r, blocks, 24)
    assert p.build([step("r", 24, 1)], lambda rid: blocks).saves == []   # loaded blocks are in the pool already
    # The worker reported block 42 (index 2) as failed: vLLM truncated the request to 2 blocks and recomputes.
    plan = p.build([step("r", 8, 17)], lambda rid: blocks)
    assert [(s.keys, s.block_ids) for s in plan.saves] == [(keys[2:6], [42, 43, 44, 45])]


def test_preempted_request_resumes_with_a_new_load_and_saves_only_what_is_new(pool):
    tokens = list(range(3000, 3018))
    p, _ = planner(pool)
    r = FakeRequest("r", tokens)
    p.lookup(r, 0)
    plan = p.build([step("r", 0, 12)], lambda rid: [0, 1, 2, 3, 4])
    assert [s.block_ids for s in plan.saves] == [[0, 1, 2]]
    for s in plan.saves:
        pool.put_many(s.keys, [bytes(NS.block_bytes)] * len(s.keys), namespace=NS)
    # Preempted: blocks freed, computed tokens back to 0; rescheduled, it finds its own 3 blocks in the pool.
    assert p.lookup(r, 0) == 12
    p.allocated(r, [9, 8, 7, 6, 5], 12)
    plan = p.build([step("r", 12, 6)], lambda rid: [9, 8, 7, 6, 5])
    assert [l.block_ids for l in plan.loads] == [[9, 8, 7]]
    assert [s.block_ids for s in plan.saves] == [[6]]     # block 3 is new; block 4 holds 2 tokens


def test_cache_salt_separates_chains(pool):
    tokens = list(range(13))
    store(pool, tokens, 3, extra=b"tenant-a-salt")
    p, _ = planner(pool)
    assert p.lookup(FakeRequest("a", tokens, cache_salt="tenant-a-salt"), 0) == 12
    assert p.lookup(FakeRequest("b", tokens, cache_salt="other"), 0) == 0
    assert p.lookup(FakeRequest("c", tokens), 0) == 0


@pytest.mark.parametrize("kw, reason", [
    ({"lora_request": object()}, "lora"), ({"mm_features": [object()]}, "multimodal"),
    ({"prompt_embeds": object()}, "prompt embeds"),
])
def test_lora_multimodal_and_embeds_bypass_the_pool_logged_once(pool, caplog, kw, reason):
    tokens = list(range(13))
    store(pool, tokens, 3)
    p, stats = planner(pool)
    with caplog.at_level(logging.WARNING, logger="kvpool.connector.vllm_plan"):
        for rid in ("a", "b"):
            r = FakeRequest(rid, tokens, **kw)
            assert p.lookup(r, 0) == 0
            p.allocated(r, [0, 1, 2, 3], 12)
            plan = p.build([step(rid, 0, 13)], lambda _: [0, 1, 2, 3])
            assert plan.loads == [] and plan.saves == []
    assert [m for m in caplog.messages if reason in m and "bypass" in m] and len(caplog.messages) == 1
    assert stats.lookups == 0 and p.num_tracked == 0


def test_skip_reading_prefix_cache_asks_nothing_but_still_saves(pool):
    tokens = list(range(9))
    store(pool, tokens, 2)
    p, stats = planner(pool)
    r = FakeRequest("r", tokens, skip_reading_prefix_cache=True)
    assert p.lookup(r, 0) == 0 and stats.lookups == 0
    assert [s.block_ids for s in p.build([step("r", 0, 9)], lambda _: [4, 5, 6]).saves] == [[4, 5]]


def test_pool_down_is_a_miss_counted_once_then_backed_off():
    stats = ConnectorStats()
    address = f"127.0.0.1:{free_port()}"
    opened = []

    def opener():
        opened.append(1)
        return PoolClient(address, timeout=0.2, connect_timeout=0.2)

    p = SchedulerPlanner(config(), NS, handle(opener, stats), stats)
    for rid in ("a", "b", "c"):
        assert p.lookup(FakeRequest(rid, list(range(13))), 0) == 0
    assert stats.fallbacks == {"unreachable": 1} and len(opened) == 1   # b and c did not wait on the dead pool


def test_slow_pool_lookup_is_a_miss_and_backs_off(pool):
    stats = ConnectorStats()
    tokens = list(range(13))
    store(pool, tokens, 3)
    faulty = FaultyPool(pool, "lookup_prefix", PoolTimeout("lookup: deadline exceeded"))
    p = SchedulerPlanner(config(), NS, handle(faulty, stats), stats)
    assert p.lookup(FakeRequest("a", tokens), 0) == 0
    assert p.lookup(FakeRequest("b", tokens), 0) == 0     # backing off: the pool is not asked
    assert stats.fallbacks == {"timeout": 1} and faulty.calls == {"lookup_prefix": 1}


def test_save_policies(pool):
    tokens = list(range(9))
    p, _ = planner(pool, save_policy="off")
    p.lookup(FakeRequest("r", tokens), 0)
    assert p.build([step("r", 0, 9)], lambda _: [0, 1, 2]).saves == []
    p, _ = planner(pool, save_policy="after_n_hits", save_after_hits=2)
    for rid, want in (("a", []), ("b", [[0, 1]])):     # saved once the prefix was asked for twice
        p.lookup(FakeRequest(rid, tokens), 0)
        assert [s.block_ids for s in p.build([step(rid, 0, 9)], lambda _: [0, 1, 2]).saves] == want


def test_auto_load_policy_skips_hits_slower_than_recompute(pool):
    tokens = list(range(13))
    store(pool, tokens, 3)
    p, stats = planner(pool, load_policy="auto")
    assert p.lookup(FakeRequest("a", tokens), 0) == 12      # priors favour loading
    p.observe_load(NS.block_bytes, 10.0)                      # the worker measured a very slow load...
    p.observe_compute(10_000, 0.1)                            # ...and a fast forward
    assert p.lookup(FakeRequest("b", tokens), 0) == 0
    assert stats.fallbacks == {"slower_than_recompute": 1}


def test_finished_forgets_the_request(pool):
    p, _ = planner(pool)
    r = FakeRequest("r", list(range(9)))
    p.lookup(r, 0)
    p.finished("r")
    assert p.num_tracked == 0
    assert p.build([step("r", 0, 9)], lambda _: [0, 1, 2]).saves == []


def test_a_failing_save_plan_never_loses_the_step_s_loads(pool):
    tokens = list(range(13))
    keys = store(pool, tokens, 3)
    p, _ = planner(pool)
    r = FakeRequest("r", tokens)
    assert p.lookup(r, 0) == 12
    p.allocated(r, [1, 2, 3, 4], 12)

    def broken(rid):
        raise KeyError(rid)

    plan = p.build([step("r", 12, 1)], broken)
    assert [(l.keys, l.block_ids) for l in plan.loads] == [(keys, [1, 2, 3])] and plan.saves == []


def test_a_warm_planner_answers_lookups_from_the_host_index(small_up):
    """The vLLM scheduler's planner over a PoolClient warmed with `prefault=False` (what the connector starts in
    the scheduler role, engine_adapter/vllm/connector.py): the same-host node's arena is mapped, so a lookup of a
    chain the node published asks the master nothing; the Lookup goes afterwards (here: when the client closes)."""
    tokens = list(range(100, 117))
    with PoolClient(small_up.address, host_index_reads=False) as writer:
        store(writer, tokens, 4)
    assert small_up.master.master.host_feed.flush(10)
    calls = small_up.master.control.calls
    stats = ConnectorStats()
    h = PoolHandle(lambda: PoolClient(small_up.address, release_linger_s=60), address=small_up.address,
                   retry_after_s=60.0, on_fault=lambda reason, where: None)
    try:
        assert h.warm(prefault=False)                       # {node id: what was done}: the arena is mapped
        p = SchedulerPlanner(config(pool=small_up.address), NS, h, stats)
        base = calls["Lookup"]
        assert p.lookup(FakeRequest("r", tokens), 0) == 16
        assert calls["Lookup"] == base and h.get().host_index_lookups == 1
    finally:
        h.close()
    assert calls["Lookup"] == base + 1                      # the client's close sent the lookup's report
