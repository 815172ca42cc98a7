"""Recorded traffic round-trips: a live pool driven by a known prefix-chain workload (with evictions) records its
traffic, kvpool/trace.py reads the real Parquet files back, and the planner's replay at the live pool's capacity
and policy gets exactly the live run's hits, per call and in total. Then the operator's paths: `kvpool trace record`
against a real `kvpool up` process (detached + `trace stop`, and waiting for its duration) writes files that
`kvpool simulate --trace DIR` reads; `kvpool up --record-directory` records from the start; bad arguments are named
and start nothing."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest

from kvpool import EmbeddedPool, Namespace, PoolClient, block_keys
from kvpool.cli import main
from kvpool.launcher import free_port, spawn, wait_grpc_serving
from kvpool.planner import replay
from kvpool.store.traffic import key_ids
from kvpool.tiers.policy import POLICY_NAMES
from kvpool.trace import LOOKUP, PROBE, PUT, load_trace

NS = Namespace(model="rec", fingerprint="f", kv_dtype="float32", block_tokens=16, num_layers=1, num_kv_heads=1,
               head_dim=32)        # 4096-byte blocks: one allocator unit each, as in the planner
BLOCK = NS.block_bytes
CAPACITY_BLOCKS = 24


def documents(n: int, seed: int) -> list[list[int]]:
    """Token sequences sharing prefixes: 4 system prompts x n user turns of 1-5 blocks, some extended later."""
    rng = random.Random(seed)
    systems = [[rng.randrange(50000) for _ in range(16 * rng.randint(2, 4))] for _ in range(4)]
    return [systems[i % 4] + [rng.randrange(50000) for _ in range(16 * rng.randint(1, 5))] for i in range(n)]


def drive(pool, requests: int, seed: int, namespace: Namespace = NS) -> list[tuple[int, list[bytes], int]]:
    """As a connector drives the pool: probe the chain (lookup_prefix), load the hit prefix (get_many_into, a
    leased lookup without a namespace), save the missed tail (put_many); now and then a whole chain is re-put.
    Returns every master call that is recorded: (op, keys, live hits) in call order (puts: keys granted)."""
    rng = random.Random(seed)
    docs = documents(40, seed)
    calls = []
    for _ in range(requests):
        doc = docs[min(int(rng.paretovariate(1.0)) - 1, len(docs) - 1)] if rng.random() < 0.7 else rng.choice(docs)
        chain = block_keys(namespace, doc[:16 * rng.randint(1, len(doc) // 16)])
        hits = pool.lookup_prefix(chain, namespace=namespace)
        calls.append((PROBE, chain, hits))
        if hits:
            bufs = [bytearray(BLOCK) for _ in range(hits)]
            got = pool.get_many_into(chain[:hits], bufs)
            calls.append((LOOKUP, chain[:hits], got))
        tail = chain if rng.random() < 0.2 else chain[hits:]
        if tail:
            statuses = pool.put_many(tail, [bytes([len(tail) % 251]) * BLOCK] * len(tail), namespace=namespace)
            calls.append((PUT, tail, statuses.count("stored")))
    return calls


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_recorded_run_replays_to_exactly_its_live_hits(tmp_path, policy):
    out = tmp_path / "traffic"
    with EmbeddedPool(dram_bytes=CAPACITY_BLOCKS * BLOCK, ssd_path=None, policy=policy, write_behind=False,
                      record_directory=str(out)) as pool:
        calls = drive(pool, 400, seed=7)
        stats = pool.stats()
    evictions = sum(stats["evictions"].values())
    assert evictions > 100                                 # the pool was under pressure the whole time
    trace = load_trace(out)
    live_hits = np.array([h for _, _, h in calls])
    assert trace.op.tolist() == [op for op, _, _ in calls]
    assert [trace.chain(i).tolist() for i in range(len(trace))] == [key_ids(ks).tolist() for _, ks, _ in calls]
    recorded = np.concatenate([pq.read_table(f, columns=["time", "hits"]).sort_by("time").column("hits")
                               .to_numpy() for f in sorted(out.glob("*.parquet"))])
    assert recorded.tolist() == live_hits.tolist()         # files are in time order, rows in call order

    result, hits = replay(trace, CAPACITY_BLOCKS, policy)
    looked = trace.op != PUT
    assert hits[looked].tolist() == live_hits[looked].tolist()          # per lookup, exactly
    assert result.hit_blocks == int(live_hits[looked].sum()) > 0        # and in total
    assert result.evictions == evictions
    probes = trace.op == PROBE
    assert result.hit_tokens == int(live_hits[probes].sum()) * NS.block_tokens  # loads carry no namespace: 0 tokens
    assert result.tokens == sum(len(ks) for op, ks, _ in calls if op == PROBE) * NS.block_tokens


def test_a_smaller_replay_gets_fewer_hits_so_equality_above_is_not_trivial(tmp_path):
    with EmbeddedPool(dram_bytes=CAPACITY_BLOCKS * BLOCK, ssd_path=None, write_behind=False,
                      record_directory=str(tmp_path)) as pool:
        calls = drive(pool, 200, seed=3)
    trace = load_trace(tmp_path)
    live = sum(h for op, _, h in calls if op != PUT)
    assert replay(trace, CAPACITY_BLOCKS, "lru")[0].hit_blocks == live
    assert replay(trace, CAPACITY_BLOCKS // 2, "lru")[0].hit_blocks < live
    assert replay(trace, CAPACITY_BLOCKS * 4, "lru")[0].hit_blocks > live


# ---------------------------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    work = tmp_path_factory.mktemp("trace-up")
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    address = f"127.0.0.1:{free_port()}"
    proc = spawn("up", ["up", "--listen", address, "--node-id", "rec-node", "--http-listen", "", "--ssd-path",
                        "none", "--dram-bytes", "4MiB", "--shm-dir", shm], work)
    try:
        wait_grpc_serving(address, deadline_s=30, proc=proc)
        yield address
    finally:
        proc.stop()
        shutil.rmtree(shm, ignore_errors=True)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_trace_record_detached_then_stop_gives_files_simulate_reads(up, tmp_path, capsys):
    out = tmp_path / "rec"
    code, text, err = run(capsys, "trace", "record", "--master", up, "--out", str(out), "--duration", "10m",
                          "--detach", "--json")
    assert (code, err) == (0, "")
    started = json.loads(text)
    assert (started["recording"], started["directory"], started["duration_s"], started["files"]) == \
        (True, str(out), 600.0, [])
    code, _, err = run(capsys, "trace", "record", "--master", up, "--out", str(tmp_path / "x"), "--duration", "5")
    assert (code, err.strip()) == (1, f"kvpool trace record: StartRecording at {up} failed: FAILED_PRECONDITION: "
                                      f"already recording to {out}: stop that first")
    with PoolClient(up, timeout=10) as client:
        calls = drive(client, 60, seed=11)
    code, text, _ = run(capsys, "status", "--master", up)
    assert code == 0 and f"\nrecording traffic to {out} for 600s: " in text
    code, text, err = run(capsys, "trace", "stop", "--master", up, "--json")
    assert (code, err) == (0, "")
    stopped = json.loads(text)
    assert not stopped["recording"] and stopped["rows"] == len(calls) and stopped["dropped"] == 0
    assert stopped["files"] == [str(f) for f in sorted(out.glob("*.parquet"))] and stopped["files"]
    code, text, err = run(capsys, "simulate", "--trace", str(out), "--capacity-blocks", "100000", "--policy", "lru",
                          "--block-bytes", "4KiB", "--no-progress", "--json")
    assert code == 0, err
    plan = json.loads(text)
    lookups = [c for c in calls if c[0] != PUT]
    assert (plan["events"], plan["lookups"]) == (len(calls), len(lookups))
    # 4 MiB of DRAM holds the whole workload (nothing evicted live), so a large replay hits exactly as live did
    assert plan["results"][0]["hit_blocks"] == sum(h for _, _, h in lookups)
    code, text, _ = run(capsys, "trace", "stop", "--master", up)          # idempotent: the last recording
    assert code == 0 and text.startswith(f"recorded {len(calls)} row(s) in {len(stopped['files'])} file(s) under {out}")
    code, text, _ = run(capsys, "status", "--master", up, "--json")
    assert code == 0 and "recording" not in json.loads(text)              # only while one runs


def test_trace_record_waits_for_its_duration_then_prints_the_files(up, tmp_path, capsys):
    stop = threading.Event()

    def traffic():       # runs from before the recording starts until after it ended
        with PoolClient(up, timeout=10) as client:
            while not stop.is_set():
                drive(client, 5, seed=5)

    t = threading.Thread(target=traffic)
    t.start()
    try:
        code, text, err = run(capsys, "trace", "record", "--master", up, "--out", str(tmp_path), "--duration",
                              "1.5s", "--no-progress", "--json")
    finally:
        stop.set()
        t.join(30)
    assert (code, err) == (0, "")
    status = json.loads(text)
    assert not status["recording"] and status["elapsed_s"] >= 1.5 and status["rows"] > 0
    assert len(load_trace(tmp_path)) == status["rows"]


def test_trace_record_bad_arguments_are_named_and_start_nothing(up, tmp_path, capsys):
    afile = tmp_path / "file"
    afile.write_text("x")
    cases = [(["--duration", "-5"], "--duration '-5' is not a duration"),
             (["--duration", "0"], "--duration '0' must be longer than 0"),
             (["--duration", "5", "--max-file-bytes", "0"], "--max-file-bytes '0' must be at least 1 byte"),
             (["--duration", "5", "--max-files", "-1"], "--max-files -1 must be >= 0")]
    for extra, message in cases:
        code, text, err = run(capsys, "trace", "record", "--master", up, "--out", str(tmp_path / "d"), *extra)
        assert (code, text) == (2, "") and err.startswith(f"kvpool trace record: {message}"), err
    code, text, err = run(capsys, "trace", "record", "--master", up, "--out", str(afile / "sub"), "--duration", "5")
    assert (code, text) == (2, "")
    assert err.strip() == f"kvpool trace record: --out {str(afile / 'sub')!r} is not writable by the master: " \
                          "Not a directory"
    code, text, _ = run(capsys, "trace", "stop", "--master", up, "--json")
    assert code == 0 and json.loads(text)["directory"] != str(afile / "sub")   # nothing was started
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_up_records_from_the_start_with_record_directory(tmp_path):
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    address = f"127.0.0.1:{free_port()}"
    out = tmp_path / "traffic"
    proc = spawn("up", ["up", "--listen", address, "--http-listen", "", "--ssd-path", "none", "--dram-bytes", "4MiB",
                        "--shm-dir", shm, "--record-directory", str(out), "--record-max-file-bytes", "8KiB"], tmp_path)
    try:
        wait_grpc_serving(address, deadline_s=30, proc=proc)
        with PoolClient(address, timeout=10) as client:
            calls = drive(client, 80, seed=2)
    finally:
        assert proc.stop() == 0          # a clean stop closes the last file
        shutil.rmtree(shm, ignore_errors=True)
    trace = load_trace(out)
    assert trace.op.tolist() == [op for op, _, _ in calls]
    assert list(out.glob("*.parquet")) and not list(out.glob("*.part"))


def test_up_refuses_an_unwritable_record_directory_naming_the_field(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "kvpool.cli", "up", "--listen", f"127.0.0.1:{free_port()}",
                           "--http-listen", "", "--ssd-path", "none", "--dram-bytes", "4MiB",
                           "--record-directory", str(afile / "x")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout.strip() == f"kvpool up: record_directory {str(afile / 'x')!r} is not writable by the " \
                                  "master: Not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_embedded_pool_refuses_an_unwritable_record_directory_before_taking_memory(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(ValueError, match=r"^record_directory '.*/file/x' is not writable by the master: Not a "):
        EmbeddedPool(dram_bytes=1 << 20, ssd_path=None, record_directory=str(afile / "x"))
    with pytest.raises(ValueError, match=r"^record_duration_s must be a number of seconds >= 0"):
        EmbeddedPool(dram_bytes=1 << 20, ssd_path=None, record_directory=str(tmp_path / "d"), record_duration_s=-1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
