"""The connector's retention hints (ConnectorConfig.pin_s, a request's kv_transfer_params["pin_s"]) reach the pool on
the staged and the direct save path of the bundled engine, and on the vLLM planner's saves; and its measured prefill
seconds per token reach the master: after a connector hit, the pool's stats and /metrics show hit tokens x that."""

from __future__ import annotations

import shutil
import tempfile
import urllib.request

import pytest

from kvpool import PoolClient
from kvpool.connector.config import ConnectorConfig, request_pin_s
from kvpool.connector.connector import PoolConnector
from kvpool.connector.cost import prefill_s_per_token
from kvpool.embedded import EmbeddedPool
from kvpool.engine_adapter.llm import LLM
from kvpool.launcher import free_port, spawn, wait_grpc_serving, wait_http_ok
from tests.connector.engines import ENGINE_ARGS, GREEDY, PREFIX, QUESTION_A, QUESTION_B, make_engine


def run(llm, prompt, kv_transfer_params=None):
    engine = llm.engine
    rid = engine.add_request(prompt, GREEDY, kv_transfer_params=kv_transfer_params)
    out = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id == rid and o.finished:
                out = o
    engine.connector.flush()
    return out


@pytest.mark.parametrize("transfer", ["staged", "direct"])
def test_a_request_pin_reaches_the_pool_and_others_stay_unpinned(transfer):
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        a = make_engine(pool, transfer=transfer)
        run(a, PREFIX + QUESTION_A, {"pin_s": 600})
        saved_a = a.engine.connector.stats.saved_blocks
        s = pool.stats()
        assert saved_a > 0 and (s["pinned_objects"], s["objects"]) == (saved_a, saved_a)
        assert s["pinned_bytes"] == saved_a * a.engine.connector.namespace.block_bytes
        b = make_engine(pool, transfer=transfer)
        run(b, "Once upon a time a fox walked into a library and asked for a book about hens. " * 3)
        assert b.engine.connector.stats.saved_blocks > 0
        assert pool.stats()["pinned_objects"] == saved_a          # b's request carried no pin


def test_config_pin_is_the_default_and_a_bad_request_pin_falls_back_to_it():
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        a = make_engine(pool, pin_s=300)
        out = run(a, PREFIX + QUESTION_A, {"pin_s": -5})     # a bad hint costs the request nothing
        assert out is not None and len(out.token_ids) == GREEDY.max_tokens
        assert pool.stats()["pinned_objects"] == a.engine.connector.stats.saved_blocks > 0
    with EmbeddedPool(dram_bytes=128 << 20) as pool:
        a = make_engine(pool, pin_s=300)
        run(a, PREFIX + QUESTION_A, {"pin_s": 0})             # a request may opt out
        assert pool.stats()["pinned_objects"] == 0 and a.engine.connector.stats.saved_blocks > 0


def test_request_pin_s_reads_kv_transfer_params():
    class R:
        kv_transfer_params = None

    r, logged = R(), set()
    assert request_pin_s(r, 7.0, logged) == 7.0
    r.kv_transfer_params = {"pin_s": 60}
    assert request_pin_s(r, 7.0, logged) == 60.0
    for bad in (True, float("nan"), -1, "60", 1e9):
        r.kv_transfer_params = {"pin_s": bad}
        assert request_pin_s(r, 7.0, logged) == 7.0
    assert logged == {"pin_s"}
    with pytest.raises(ValueError, match="pin_s"):
        ConnectorConfig(pin_s=-1)
    with pytest.raises(ValueError, match="pin_s"):
        ConnectorConfig(pin_s=float("nan"))


def test_vllm_planner_saves_carry_the_request_pin():
    from kvpool.connector.stats import ConnectorStats
    from kvpool.connector.vllm_plan import ScheduledRequest, SchedulerPlanner
    from kvpool.keys import Namespace

    ns = Namespace(model="m", fingerprint="f", kv_dtype="float32", block_tokens=4, num_layers=1, num_kv_heads=1,
                   head_dim=1)

    class Handle:
        def get(self):
            return None

    class Req:
        def __init__(self, rid, params):
            self.request_id, self.all_token_ids, self.kv_transfer_params = rid, list(range(12)), params
            self.num_tokens = 12

    planner = SchedulerPlanner(ConnectorConfig(block_tokens=4, pin_s=5), ns, Handle(), ConnectorStats())
    for rid, params in (("a", {"pin_s": 90}), ("b", None)):
        planner.lookup(Req(rid, params), 0)
    plan = planner.build([ScheduledRequest("a", 0, 12), ScheduledRequest("b", 0, 12)], lambda rid: [0, 1, 2])
    assert [(s.req_id, s.pin_s, len(s.keys)) for s in plan.saves] == [("a", 90.0, 3), ("b", 5.0, 3)]


def remote_engine(address: str) -> LLM:
    return LLM(connector=PoolConnector(ConnectorConfig(pool=address)), **ENGINE_ARGS)


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    work = tmp_path_factory.mktemp("up-saved")
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    address, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = spawn("up", ["up", "--listen", address, "--http-listen", http, "--ssd-path", "none", "--dram-bytes", "64MiB",
                        "--shm-dir", shm], work)
    try:
        wait_grpc_serving(address, 30, proc)
        wait_http_ok(f"http://{http}/health", 30, proc)
        yield {"address": address, "http": http}
    finally:
        proc.stop()
        shutil.rmtree(shm, ignore_errors=True)


@pytest.mark.slow
def test_seconds_saved_after_a_connector_hit_equal_hit_tokens_times_the_reported_rate(up):
    a = remote_engine(up["address"])
    run(a, PREFIX + QUESTION_A)                       # cold: saves the prefix, times its prefill
    b = remote_engine(up["address"])
    # b times a prefill of its own first (nothing to hit: another text), so its lookups report a measured rate
    run(b, "Once upon a time a fox walked into a library and asked for a book about hens. " * 3)
    with PoolClient(up["address"]) as admin:
        before = admin.stats()
    assert before["prefill_seconds_saved"] == 0.0      # no lookup before had a measured rate AND a hit
    rate = prefill_s_per_token(b.engine.connector.cost)
    assert rate > 0
    out = run(b, PREFIX + QUESTION_B)
    assert out.num_cached_tokens_external > 0
    with PoolClient(up["address"]) as admin:
        after = admin.stats()
    hit_tokens = after["hit_tokens"] - before["hit_tokens"]
    assert hit_tokens == out.num_cached_tokens_external
    label = f"{b.engine.connector.namespace.model}/{b.engine.connector.namespace.tenant}"
    assert after["prefill_seconds_saved"] == hit_tokens * rate
    assert after["namespaces"][label]["prefill_seconds_saved"] == hit_tokens * rate
    text = urllib.request.urlopen(f"http://{up['http']}/metrics", timeout=10).read().decode()
    line = next(x for x in text.splitlines()
                if x.startswith(f'kvpool_prefill_seconds_saved_total{{namespace="{label}"}}'))
    assert float(line.split()[-1]) == hit_tokens * rate
    for llm in (a, b):
        llm.engine.connector.close()
