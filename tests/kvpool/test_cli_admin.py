"""The admin CLI (status, nodes, ls, inspect, stats, evict, rm) against ONE real `kvpool up` process per module.

The fixture puts known objects (two namespaces, known sizes and bytes) with PoolClient and performs two prefix
lookups with a known outcome, so every number the commands print is known exactly: 6 objects, 128 requested tokens,
96 hit in DRAM (75%). Commands run in-process through `kvpool.cli.main` (fast); exit codes and the stdout/stderr
split are also checked through real `python -m kvpool.cli` processes. Tests that add objects remove them again, so
object counts hold in any order; the status test runs first in file order because evictions are cumulative.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading

import pytest
import xxhash

from kvpool import Namespace, PoolClient, block_keys
from kvpool.cli import main
from kvpool.launcher import free_port, spawn, wait_grpc_serving
from kvpool.tiers.dram import page_kind

NS_A = Namespace(model="cli-a", fingerprint="f", kv_dtype="float16", block_tokens=16, num_layers=1,
                 num_kv_heads=1, head_dim=8)    # 512-byte blocks
NS_B = Namespace(model="cli-b", fingerprint="f", kv_dtype="float16", block_tokens=16, num_layers=2,
                 num_kv_heads=1, head_dim=16)   # 2048-byte blocks
KEYS_A = block_keys(NS_A, list(range(64)))      # 4 blocks, all stored
CHAIN_B = block_keys(NS_B, list(range(64)))     # 4 blocks, the first 2 stored
KEYS_B = CHAIN_B[:2]
DRAM, SSD = 8 << 20, 64 << 20
UNREACHABLE_HINT = "(start one with `kvpool up`, or point --master / KVPOOL_MASTER at it)"


def block(i: int, size: int) -> bytes:
    return bytes((i * 31 + j) % 251 for j in range(size))


BLOCKS = [block(i, NS_A.block_bytes) for i in range(4)] + [block(10 + i, NS_B.block_bytes) for i in range(2)]
ROWS = {}  # key hex -> the row `ls/inspect --json` must print; offsets: one 4 KiB extent each, in put order
for i, (key, data, ns) in enumerate(zip(KEYS_A + KEYS_B, BLOCKS, [NS_A] * 4 + [NS_B] * 2)):
    ROWS[key.hex()] = {"key": key.hex(), "namespace": ns.digest.hex(), "node": "cli-node", "tier": "dram",
                       "offset": 4096 * i, "size": len(data), "checksum": f"{xxhash.xxh3_64_intdigest(data):016x}"}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    work = tmp_path_factory.mktemp("cli-admin")
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    address, node_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = spawn("up", ["up", "--listen", address, "--node-listen", node_address, "--node-id", "cli-node",
                        "--http-listen", "", "--ssd-path", str(work / "ssd"), "--ssd-bytes", "64MiB",
                        "--dram-bytes", "8MiB", "--shm-dir", shm], work)
    try:
        wait_grpc_serving(address, deadline_s=30, proc=proc)
        with PoolClient(address, timeout=10) as client:
            assert client.put_many(KEYS_A, BLOCKS[:4], namespace=NS_A) == ["stored"] * 4
            assert client.put_many(KEYS_B, BLOCKS[4:], namespace=NS_B) == ["stored"] * 2
            assert client.lookup_prefix(KEYS_A, namespace=NS_A) == 4      # 64 of 64 tokens
            assert client.lookup_prefix(CHAIN_B, namespace=NS_B) == 2     # 32 of 64 tokens
        yield address, node_address
    finally:
        proc.stop()
        shutil.rmtree(shm, ignore_errors=True)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv: str):
    code, out, err = run(capsys, *argv, "--json")
    assert (code, err) == (0, ""), err
    return json.loads(out)


def json_lines(capsys, *argv: str) -> list:
    code, out, err = run(capsys, *argv, "--json")
    assert (code, err) == (0, ""), err
    return [json.loads(line) for line in out.splitlines()]


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvpool.cli", *argv], capture_output=True, text=True, timeout=60)


EXPECTED_TIERS = {"hbm": {"objects": 0, "bytes": 0, "capacity": 0},
                  "dram": {"objects": 6, "bytes": 6 * 4096, "capacity": DRAM},
                  # inclusive SSD tier: each DRAM object's SSD copy (header page + payload) is reserved at its put
                  "ssd": {"objects": 6, "bytes": 6 * 2 * 4096, "capacity": SSD}}


# ---------------------------------------------------------------------- status / stats / nodes

def test_status_reports_the_token_hit_rate_by_tier(pool, capsys):
    address, node_address = pool
    stats = run_json(capsys, "status", "--master", address)
    assert {k: stats[k] for k in ("objects", "nodes_alive", "lookups", "requested_tokens", "hit_tokens",
                                  "hit_tokens_by_tier", "hit_rate", "hit_rate_by_tier", "tiers", "namespaces",
                                  "requested_keys", "hit_keys", "evictions", "demotions", "promotions")} == {
        "objects": 6, "nodes_alive": 1, "lookups": 2, "requested_tokens": 128, "hit_tokens": 96,
        "hit_tokens_by_tier": {"hbm": 0, "dram": 96, "ssd": 0}, "hit_rate": 0.75,
        "hit_rate_by_tier": {"dram": 0.75, "hbm": 0.0, "ssd": 0.0}, "tiers": EXPECTED_TIERS,
        "namespaces": {"cli-a/default": {"requested_tokens": 64, "hit_tokens": 64,
                                         "hit_tokens_by_tier": {"hbm": 0, "dram": 64, "ssd": 0},
                                         "prefill_seconds_saved": 0.0},
                       "cli-b/default": {"requested_tokens": 64, "hit_tokens": 32,
                                         "hit_tokens_by_tier": {"hbm": 0, "dram": 32, "ssd": 0},
                                         "prefill_seconds_saved": 0.0}},
        "requested_keys": 8, "hit_keys": 6, "evictions": {"dram": 0, "ssd": 0}, "demotions": 0, "promotions": 0}
    code, out, err = run(capsys, "status", "--master", address)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"master {address}: 6 objects, 1 node(s) alive",
        "  tier   objects       used   capacity   full",
        "  dram         6   24.0 KiB    8.0 MiB   0.3%",
        "  ssd          6   48.0 KiB   64.0 MiB   0.1%",
        "token hit rate 75.0% (96 of 128 requested tokens): dram 75.0%, ssd 0.0%",
        "prefill seconds saved 0.000 (hit tokens x the prefill s/token connectors measured)",
        "lookups 2, evictions 0, demotions 0, promotions 0"]


def test_stats_json_is_the_status_dict_and_watch_takes_count_samples(pool, capsys):
    address, _ = pool

    def quiet(sample: dict) -> dict:
        """The sample without its heartbeat counts: the node's heartbeats go on in the background (one a second)."""
        beats = sample.pop("heartbeats")
        assert list(beats) == ["cli-node"] and isinstance(beats["cli-node"], int)
        return sample

    stats = quiet(run_json(capsys, "stats", "--master", address))
    assert stats == quiet(run_json(capsys, "status", "--master", address))
    assert stats["active_tiers"] == ["dram", "ssd"] and stats["grants_open"] == stats["leases_open"] == 0
    samples = json_lines(capsys, "stats", "--master", address, "--watch", "--count", "3", "--interval", "0.01")
    assert [quiet(s) for s in samples] == [stats] * 3  # no traffic in between: three equal samples, one per line

    code, out, err = run(capsys, "stats", "--master", address)
    assert (code, err) == (0, "")
    table = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    assert {k: table[k] for k in ("objects", "requested_tokens", "hit_tokens", "hit_rate", "hit_rate_by_tier.dram",
                                  "nodes.cli-node.dram.bytes", "namespaces.cli-b/default.requested_tokens",
                                  "active_tiers")} == {
        "objects": "6", "requested_tokens": "128", "hit_tokens": "96", "hit_rate": "75.0%",
        "hit_rate_by_tier.dram": "75.0%", "nodes.cli-node.dram.bytes": "24576",
        "namespaces.cli-b/default.requested_tokens": "64", "active_tiers": "dram, ssd"}

    code, out, err = run(capsys, "stats", "--master", address, "--watch", "--count", "2", "--interval", "0.01")
    frames = out.split("kvpool stats  ")[1:]  # not a terminal: frames follow each other, each with its header
    assert (code, err, len(frames)) == (0, "", 2)
    assert [f.splitlines()[0].split("  ")[0] for f in frames] == [address] * 2
    assert [re.search(r"sample (\d+)", f).group(1) for f in frames] == ["1", "2"]


def test_nodes_lists_each_node_with_per_tier_usage(pool, capsys):
    address, node_address = pool
    rows = run_json(capsys, "nodes", "--master", address)
    data_address = rows[0]["data_address"]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", data_address)
    # the node's arena is in a /dev/shm directory: its pages as the node found them (base pages on a default mount)
    pages = page_kind("/dev/shm")
    assert rows == [{"node": "cli-node", "address": node_address, "data_address": data_address, "state": "alive",
                     "dram_pages": pages, "tiers": {"dram": EXPECTED_TIERS["dram"], "ssd": EXPECTED_TIERS["ssd"]}}]
    code, out, err = run(capsys, "nodes", "--master", address)
    assert (code, err) == (0, "")
    pad = " " * (len(node_address) - len("ADDRESS"))
    assert out.splitlines() == [
        f"NODE      ADDRESS{pad}  STATE     TIERS (objects, used / capacity)",
        f"cli-node  {node_address}  alive     dram 6 obj, 24.0 KiB / 8.0 MiB on {pages}   "
        f"ssd 6 obj, 48.0 KiB / 64.0 MiB"]


# ---------------------------------------------------------------------- ls / inspect

def test_ls_lists_objects_in_key_order_with_namespace_and_limit(pool, capsys):
    address, _ = pool
    assert json_lines(capsys, "ls", "--master", address) == [ROWS[k] for k in sorted(ROWS)]
    only_b = sorted(k.hex() for k in KEYS_B)
    assert json_lines(capsys, "ls", "--master", address, "--namespace", NS_B.digest.hex()) == [ROWS[k] for k in only_b]
    assert json_lines(capsys, "ls", "--master", address, "--limit", "2") == [ROWS[k] for k in sorted(ROWS)[:2]]
    assert json_lines(capsys, "ls", "--master", address, "--namespace", "00" * 16) == []
    code, out, err = run(capsys, "ls", "--master", address, "--namespace", NS_B.digest.hex())
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"{k}  {NS_B.digest.hex()[:12]}  cli-node   dram       2048" for k in only_b]


def test_inspect_prints_where_an_object_lives(pool, capsys):
    address, _ = pool
    key = KEYS_B[1].hex()
    assert json_lines(capsys, "inspect", "--master", address, key) == [ROWS[key]]
    code, out, err = run(capsys, "inspect", "--master", address, key)
    assert (code, err) == (0, "")
    row = ROWS[key]
    assert out.splitlines() == [f"key        {key}", f"namespace  {NS_B.digest.hex()}", "node       cli-node",
                                "tier       dram", "offset     20480", "size       2048",
                                f"checksum   {row['checksum']}"]
    assert row["offset"] == 20480  # the 6th object put: 5 extents of 4 KiB before it


def test_inspect_unknown_key_exits_1_and_malformed_key_exits_2(pool, capsys):
    address, _ = pool
    known, unknown = KEYS_A[0].hex(), "ab" * 16
    code, out, err = run(capsys, "inspect", "--master", address, known, unknown, "--json")
    assert (code, [json.loads(x) for x in out.splitlines()]) == (1, [ROWS[known]])  # found ones still printed
    assert err == f"kvpool inspect: KEY {unknown}: not found\n"
    assert run(capsys, "inspect", "--master", address, "xyz") == (
        2, "", "kvpool inspect: KEY 'xyz' is not hex: expected 32 hex digits\n")
    assert run(capsys, "inspect", "--master", address, "abcd") == (
        2, "", "kvpool inspect: KEY 'abcd' has 4 hex digits, expected 32\n")
    assert run(capsys, "ls", "--master", address, "--namespace", "12") == (
        2, "", "kvpool ls: --namespace '12' has 2 hex digits, expected 32\n")
    assert run(capsys, "ls", "--master", address, "--limit", "-1") == (
        2, "", "kvpool ls: --limit -1 must be an integer >= 0 (0 = all)\n")


# ---------------------------------------------------------------------- rm / evict (each removes what it adds)

NS_C = Namespace(model="cli-c", fingerprint="f", kv_dtype="float16", block_tokens=16, num_layers=1,
                 num_kv_heads=1, head_dim=8)


def put_c(address: str, n: int, start: int = 0) -> list[bytes]:
    keys = block_keys(NS_C, list(range(16 * (start + n))))[start:]
    with PoolClient(address, timeout=10) as client:
        assert client.put_many(keys, [block(100 + start + i, NS_C.block_bytes) for i in range(n)],
                               namespace=NS_C) == ["stored"] * n
    return keys


def objects(capsys, address: str) -> int:
    return run_json(capsys, "status", "--master", address)["objects"]


def test_rm_removes_keys_and_namespaces(pool, capsys):
    address, _ = pool
    keys = put_c(address, 3)
    assert objects(capsys, address) == 9
    assert run_json(capsys, "rm", "--master", address, keys[0].hex(), "ab" * 16) == {"removed": 1}  # unknown: skipped
    assert run(capsys, "rm", "--master", address, keys[1].hex()) == (0, "removed 1 object(s)\n", "")
    assert run_json(capsys, "rm", "--master", address, "--namespace", NS_C.digest.hex()) == {"removed": 1}
    assert objects(capsys, address) == 6
    assert run(capsys, "rm", "--master", address) == (
        2, "", "kvpool rm: give KEY..., or --namespace HEX, or --all (exactly one)\n")
    assert run(capsys, "rm", "--master", address, KEYS_A[0].hex(), "zz") == (
        2, "", "kvpool rm: KEY 'zz' is not hex: expected 32 hex digits\n")
    assert objects(capsys, address) == 6  # a bad argument anywhere: nothing removed


def test_evict_by_namespace_prints_the_count(pool, capsys):
    address, _ = pool
    put_c(address, 3)
    ns = NS_C.digest.hex()
    assert run_json(capsys, "evict", "--master", address, "--namespace", ns) == {
        "evicted": 3, "namespace": ns, "older_than_s": None}
    assert run(capsys, "evict", "--master", address, "--namespace", ns) == (
        0, f"evicted 0 object(s) (namespace {ns})\n", "")
    assert objects(capsys, address) == 6
    assert run(capsys, "evict", "--master", address) == (
        2, "", "kvpool evict: give --namespace HEX and/or --older-than DURATION, or --all to evict everything\n")
    assert run(capsys, "evict", "--master", address, "--all", "--older-than", "1h") == (
        2, "", "kvpool evict: --all evicts everything: give it without --namespace or --older-than\n")
    for bad, message in [("10x", "'10x' is not a duration: use a number with a unit, e.g. 30s, 10m, 2h, 1d"),
                         ("0s", "'0s' must be longer than 0")]:
        assert run(capsys, "evict", "--master", address, "--older-than", bad) == (
            2, "", f"kvpool evict: --older-than {message}\n")


def test_evict_by_age_drops_only_idle_objects(pool, capsys):
    """Objects put before a pause are older than it; objects put after are not. Namespace-scoped so the fixture's
    objects (also older) stay; `--older-than 1h` alone touches nothing."""
    address, _ = pool
    old = put_c(address, 2)
    assert run_json(capsys, "evict", "--master", address, "--older-than", "1h") == {
        "evicted": 0, "namespace": None, "older_than_s": 3600.0}
    threading.Event().wait(1.5)  # the idle age the eviction below tells apart (not a timing assertion)
    new = put_c(address, 1, start=2)
    ns = NS_C.digest.hex()
    assert run_json(capsys, "evict", "--master", address, "--namespace", ns, "--older-than", "1s") == {
        "evicted": 2, "namespace": ns, "older_than_s": 1.0}
    assert [r["key"] for r in json_lines(capsys, "ls", "--master", address, "--namespace", ns)] == [new[0].hex()]
    assert run(capsys, "inspect", "--master", address, old[1].hex()) == (
        1, "", f"kvpool inspect: KEY {old[1].hex()}: not found\n")
    assert run_json(capsys, "rm", "--master", address, new[0].hex()) == {"removed": 1}
    assert objects(capsys, address) == 6


# ---------------------------------------------------------------------- errors, env, help

COMMANDS = [["status"], ["nodes"], ["ls"], ["inspect", "ab" * 16], ["stats"], ["evict", "--namespace", "ab" * 16],
            ["rm", "ab" * 16]]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_unreachable_master_exits_1_with_one_line(argv, capsys):
    address = f"127.0.0.1:{free_port()}"
    code, out, err = run(capsys, *argv, "--master", address, "--timeout", "3")
    assert (code, out, err) == (1, "", f"kvpool {argv[0]}: no kvpool master answering at {address} "
                                       f"{UNREACHABLE_HINT}\n")


def test_a_silent_listener_is_a_timeout_not_a_hang(capsys):
    """Something accepts TCP at the address but never answers gRPC: the deadline ends the call."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        assert run(capsys, "stats", "--master", address, "--timeout", "0.5") == (
            1, "", f"kvpool stats: no kvpool master answering at {address}: Stats got no answer in 0.5s (--timeout)\n")


def test_exit_codes_of_real_processes(pool):
    address, _ = pool
    nobody = f"127.0.0.1:{free_port()}"
    down = cli("status", "--master", nobody, "--timeout", "3")
    assert (down.returncode, down.stdout, down.stderr) == (
        1, "", f"kvpool status: no kvpool master answering at {nobody} {UNREACHABLE_HINT}\n")
    unknown = cli("inspect", "--master", address, "cd" * 16)
    assert (unknown.returncode, unknown.stdout, unknown.stderr) == (
        1, "", f"kvpool inspect: KEY {'cd' * 16}: not found\n")
    bad = cli("inspect", "--master", address, "nothex")
    assert (bad.returncode, bad.stderr) == (2, "kvpool inspect: KEY 'nothex' is not hex: expected 32 hex digits\n")
    typo = cli("ls", "--master", address, "--limit", "many")
    assert typo.returncode == 2 and typo.stderr.splitlines()[-1] == \
        "kvpool ls: error: argument --limit: invalid int value: 'many'"
    ok = cli("ls", "--master", address, "--limit", "1", "--json")
    assert (ok.returncode, ok.stderr, json.loads(ok.stdout)) == (0, "", ROWS[sorted(ROWS)[0]])


def test_master_defaults_to_kvpool_master_env(pool, capsys, monkeypatch):
    address, _ = pool
    monkeypatch.setenv("KVPOOL_MASTER", address)
    assert run_json(capsys, "status")["objects"] == 6


@pytest.mark.parametrize("name", ["status", "nodes", "ls", "inspect", "stats", "evict", "rm"])
def test_help_has_examples_and_exit_codes(name, capsys):
    with pytest.raises(SystemExit) as exited:
        main([name, "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert "--master HOST:PORT" in out and "--json" in out and "examples:" in out and "exit codes:" in out
    assert f"kvpool {name}" in out.split("examples:", 1)[1]
