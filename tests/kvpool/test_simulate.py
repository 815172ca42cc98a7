"""`kvpool simulate`: hit counts equal an independent LRU reference (written here, not the pool's) at several
capacities; JSON, table, plot; bad arguments exit 2 naming the argument."""

from __future__ import annotations

import json
import random
import sys
from collections import OrderedDict

import pytest

from kvpool.cli import main


def synthetic_rows(seed: int, n: int = 400) -> list[dict]:
    """Chained Mooncake rows: conversations that grow turn by turn, shared prompts, one-offs; last block partial."""
    rng = random.Random(seed)
    next_id = 0
    open_chains: list[list[int]] = []
    rows = []
    for r in range(n):
        if open_chains and rng.random() < 0.5:
            chain = open_chains.pop(rng.randrange(len(open_chains)))
        elif rng.random() < 0.3:
            chain = list(range(0, rng.randint(1, 4)))                  # a shared prompt: ids 0..3
        else:
            chain = []
        chain = chain + list(range(next_id + 10, next_id + 10 + rng.randint(1, 6)))
        next_id += 16
        if rng.random() < 0.7:
            open_chains.append(chain)
        rows.append({"timestamp": 100 * r, "input_length": 512 * len(chain) - rng.randint(0, 511),
                     "output_length": 3, "hash_ids": chain})
    return rows


def reference_lru(chains: list[list[int]], capacity: int) -> list[int]:
    """What the pool must do, written independently: a prefix lookup refreshes the hit blocks (the parent ends up
    the most recent); the missed tail is stored block by block, each taking the least recently used committed
    block's place when full (blocks of the put under way cannot go); stored blocks count as used just now, parent
    most recent; a block already present past the first miss is left alone."""
    recency: OrderedDict[int, None] = OrderedDict()          # first = least recently used
    hits = []
    for chain in chains:
        h = 0
        while h < len(chain) and chain[h] in recency:
            h += 1
        hits.append(h)
        for block in reversed(chain[:h]):
            recency.move_to_end(block)
        stored: list[int] = []
        for block in chain[h:]:
            if block in recency or block in stored:
                continue
            if len(recency) + len(stored) >= capacity:
                if not recency:
                    continue                                  # no space: everything held is being written
                recency.popitem(last=False)
            stored.append(block)
        for block in reversed(stored):
            recency[block] = None
    return hits


@pytest.fixture
def trace_file(tmp_path):
    rows = synthetic_rows(seed=3)
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def test_hit_counts_equal_an_independent_lru_at_several_capacities(trace_file, capsys):
    path, rows = trace_file
    capacities = [3, 10, 40, 150]
    assert main(["simulate", "--trace", str(path), "--capacity-blocks", ",".join(map(str, capacities)),
                 "--policy", "lru", "--json", "--no-progress", "--prefill-tokens-per-s", "1000"]) == 0
    out = json.loads(capsys.readouterr().out)
    chains = [r["hash_ids"] for r in rows]
    refs = sum(len(c) for c in chains)
    assert [r["capacity_blocks"] for r in out["results"]] == capacities
    assert out["block_refs"] == refs and out["lookups"] == len(rows)
    for result in out["results"]:
        hits = reference_lru(chains, result["capacity_blocks"])
        hit_tokens = sum(min(h * 512, r["input_length"]) for h, r in zip(hits, rows))
        assert (result["hit_blocks"], result["blocks"]) == (sum(hits), refs)
        assert (result["hit_tokens"], result["tokens"]) == (hit_tokens, sum(r["input_length"] for r in rows))
        assert result["prefill_s_saved"] == hit_tokens / 1000
    seen: set[int] = set()
    ceiling = 0
    for chain in chains:
        h = 0
        while h < len(chain) and chain[h] in seen:
            h += 1
        ceiling += h
        seen.update(chain)
    assert out["ceiling"]["block_hit_rate"] == ceiling / refs
    assert sum(reference_lru(chains, 10_000)) == ceiling       # an infinite pool is the ceiling
    rates = [r["token_hit_rate"] for r in out["results"]]
    goal = 0.9 * out["ceiling"]["token_hit_rate"]
    first = next((c for c, rate in zip(capacities, rates) if rate >= goal), None)
    assert out["smallest_capacity"]["lru"] == (None if first is None else
                                               {"capacity_blocks": first, "capacity_bytes": first * (64 << 20)})


def test_table_byte_capacities_and_plot(trace_file, capsys, tmp_path):
    path, _ = trace_file
    png = tmp_path / "hit.png"
    assert main(["simulate", "--trace", str(path), "--capacity", "1MiB,4MiB", "--block-bytes", "64KiB",
                 "--policy", "lru,wlru,s3fifo", "--plot", str(png), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "16 blk" in out and "64 blk" in out and out.count("wlru") >= 3
    assert "smallest capacity reaching 90% of the ceiling" in out and "give --prefill-tokens-per-s" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, message", [
    (["--trace", "/nonexistent/t.jsonl"], "--trace: trace file '/nonexistent/t.jsonl' does not exist"),
    (["--capacity-blocks", "0"], "--capacity-blocks: '0' must be > 0"),
    (["--capacity-blocks", "-5"], "--capacity-blocks: '-5' must be > 0"),
    (["--capacity-blocks", "ten"], "--capacity-blocks: 'ten' is not a block count"),
    (["--capacity", "0GiB"], "--capacity: '0GiB' must be > 0 bytes"),
    (["--capacity=-1GiB"], "--capacity: expected a size"),
    (["--capacity", "1KiB"], "--capacity: '1KiB' holds no block of --block-bytes"),
    (["--policy", "lru,lfu"], "--policy: 'lfu' is not a policy"),
    (["--block-bytes", "0"], "--block-bytes: '0' must be > 0"),
    (["--ceiling-share", "1.5"], "--ceiling-share: 1.5 must be in (0, 1]"),
    (["--prefill-tokens-per-s", "-2"], "--prefill-tokens-per-s: -2.0 must be > 0"),
])
def test_bad_arguments_exit_2_naming_the_argument(trace_file, capsys, argv, message):
    path, _ = trace_file
    args = ["simulate", "--trace", str(path), "--no-progress"]
    args = args + argv if argv[0] != "--trace" else ["simulate", *argv, "--no-progress"]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err and captured.err.startswith("kvpool simulate: ")


def test_malformed_rows_exit_2_naming_the_trace(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "hash_ids": [1]}\n{"timestamp": 1, "hash_ids": [1, -2]}\n')
    assert main(["simulate", "--trace", str(path), "--no-progress"]) == 2
    assert f"--trace: {path}: row 2: hash_ids must be >= 0" in capsys.readouterr().err


def test_plot_without_matplotlib_names_plot(trace_file, capsys, monkeypatch, tmp_path):
    path, _ = trace_file
    monkeypatch.setitem(sys.modules, "matplotlib", None)       # import matplotlib -> ImportError
    assert main(["simulate", "--trace", str(path), "--plot", str(tmp_path / "x.png"), "--no-progress"]) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
