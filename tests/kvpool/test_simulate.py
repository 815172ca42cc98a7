"""`kvpool simulate`: hit counts equal an independent LRU reference (written here, not the pool's) at several
capacities, with a row's partial last block dropped (the default: connectors store full blocks only) or kept; JSON,
table, plot; bad arguments exit 2 naming the argument."""

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
    """What the pool must do, written independently: LRU over blocks, except that blocks no prefix lookup can reach
    (orphans: a block above them left the pool) are evicted first.

    - A lookup hits the leading stored blocks, makes the first a root, links each next hit under the one before it,
      and refreshes them (the parent ends up the most recent).
    - The missed tail is stored block by block. A block already present is left alone (not refreshed), but the
      next new block is linked under it. A new block, when full, takes the coldest committed block's place (blocks
      of the put under way cannot go, nor the blocks of its tail already present; none other committed: no space,
      and the blocks after that hole are orphans). The tail's first block is a root; a block whose parent is an
      orphan is one.
    - An evicted block's descendants become orphans, unlinked, and go to the cold end in breadth-first prefix
      order (the deepest last, so first out). Stored blocks enter as the most recent, parent most recent, then the
      orphans among them go to the cold end in chain order.
    """
    recency: OrderedDict[int, None] = OrderedDict()          # committed blocks; first = coldest
    parent: dict[int, int | None] = {}                        # block -> parent block, None (root) or ORPHAN
    children: dict[int, dict[int, None]] = {}                 # block -> children in link order
    orphan = -1

    def unlink(block: int) -> None:
        up = parent.get(block)
        if up is not None and up != orphan:
            children[up].pop(block, None)

    def link(child: int, up: int | None) -> None:
        if parent.get(child) == up:
            return
        unlink(child)
        if up is None or parent.get(up) == orphan:
            parent[child] = orphan
        else:
            parent[child] = up
            children.setdefault(up, {})[child] = None

    def evict(block: int) -> None:
        del recency[block]
        unlink(block)
        parent.pop(block, None)
        frontier = list(children.pop(block, {}))
        while frontier:
            nxt = []
            for c in frontier:
                parent[c] = orphan
                if c in recency:
                    recency.move_to_end(c, last=False)
                nxt.extend(children.pop(c, {}))
            frontier = nxt

    hits = []
    for chain in chains:
        h = 0
        while h < len(chain) and chain[h] in recency:
            h += 1
        hits.append(h)
        if h:
            if parent.get(chain[0]) == orphan:
                parent[chain[0]] = None
            for i in range(1, h):
                link(chain[i], chain[i - 1])
        for block in reversed(chain[:h]):
            recency.move_to_end(block)
        stored: list[int] = []
        prev: int | None = None                               # None: nothing before the tail's first block
        hole = False
        own = {block for block in chain[h:] if block in recency}     # the put's EXISTS keys: never its victims
        for block in chain[h:]:
            if block in recency or block in stored:
                prev, hole = block, False
                continue
            victim = None
            if len(recency) + len(stored) >= capacity:
                victim = next((b for b in recency if b not in own), None)
                if victim is None:
                    prev, hole = None, True                   # no space: everything held is being written or its own
                    continue
                evict(victim)
            parent[block] = None
            if hole or (prev is not None and prev == victim):
                parent[block] = orphan
            elif prev is not None:
                link(block, prev)
            stored.append(block)
            prev, hole = block, False
        for block in reversed(stored):
            recency[block] = None
        for block in stored:
            if parent.get(block) == orphan:
                recency.move_to_end(block, last=False)
    return hits


@pytest.fixture
def trace_file(tmp_path):
    rows = synthetic_rows(seed=3)
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def replayed_chains(rows: list[dict], partial_blocks: str) -> list[list[int]]:
    """The chains a pool sees: full blocks only ("drop", what kvpool's connectors store), or every hash id."""
    if partial_blocks == "keep":
        return [r["hash_ids"] for r in rows]
    return [r["hash_ids"][:r["input_length"] // 512] for r in rows]


@pytest.mark.parametrize("partial_blocks", [None, "drop", "keep"])      # None: the default (drop)
def test_hit_counts_equal_an_independent_lru_at_several_capacities(trace_file, capsys, partial_blocks):
    path, rows = trace_file
    assert sum(r["input_length"] % 512 != 0 for r in rows) > 300      # most rows end in a partial block
    capacities = [3, 10, 40, 150]
    extra = [] if partial_blocks is None else ["--partial-blocks", partial_blocks]
    assert main(["simulate", "--trace", str(path), "--capacity-blocks", ",".join(map(str, capacities)),
                 "--policy", "lru", "--json", "--no-progress", "--prefill-tokens-per-s", "1000", *extra]) == 0
    out = json.loads(capsys.readouterr().out)
    chains = replayed_chains(rows, partial_blocks or "drop")
    refs = sum(len(c) for c in chains)
    input_tokens = sum(r["input_length"] for r in rows)
    assert [r["capacity_blocks"] for r in out["results"]] == capacities
    assert out["block_refs"] == refs and out["lookups"] == len(rows)
    assert out["unique_blocks"] == len({b for c in chains for b in c})
    assert (out["input_tokens"], out["token_hit_rate_of"], out["partial_blocks"]) == \
        (input_tokens, "input_tokens", partial_blocks or "drop")
    dropped = sum(len(r["hash_ids"]) for r in rows) - refs
    assert out["dropped_partial_blocks"] == (0 if partial_blocks == "keep" else dropped)
    for result in out["results"]:
        hits = reference_lru(chains, result["capacity_blocks"])
        hit_tokens = sum(min(h * 512, r["input_length"]) for h, r in zip(hits, rows))
        assert (result["hit_blocks"], result["blocks"]) == (sum(hits), refs)
        assert (result["hit_tokens"], result["tokens"]) == (hit_tokens, input_tokens)
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


# Rows ending in partial blocks: [1, 2 | 3] is 2 full blocks + a partial one. Dropped, a pool stores 1, 2 only; kept,
# the partial block 3 takes room and hits when the same prompt comes back. [7] of 300 tokens has no full block.
PARTIAL_ROWS = [{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2, 3]},
                {"timestamp": 10, "input_length": 1300, "output_length": 1, "hash_ids": [1, 2, 4]},
                {"timestamp": 20, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2, 3]},
                {"timestamp": 30, "input_length": 300, "output_length": 1, "hash_ids": [7]},
                {"timestamp": 40, "input_length": 300, "output_length": 1, "hash_ids": [7]}]


@pytest.mark.parametrize("partial_blocks, capacity, hits, hit_tokens", [
    ("drop", 2, [0, 2, 2, 0, 0], [0, 1024, 1024, 0, 0]),
    ("drop", 1, [0, 1, 0, 0, 0], [0, 512, 0, 0, 0]),             # 2 evicts 1, then 1 evicts 2
    ("keep", 3, [0, 2, 2, 0, 1], [0, 1024, 1024, 0, 300]),       # 4 evicts 3, 3 evicts 4, 7 evicts 2
    ("keep", 5, [0, 2, 3, 0, 1], [0, 1024, 1100, 0, 300]),
])
def test_rows_ending_in_a_partial_block_match_the_reference(tmp_path, capsys, partial_blocks, capacity, hits,
                                                            hit_tokens):
    path = tmp_path / "partial.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PARTIAL_ROWS))
    chains = replayed_chains(PARTIAL_ROWS, partial_blocks)
    assert reference_lru(chains, capacity) == hits                    # the hand count is the reference's
    assert main(["simulate", "--trace", str(path), "--capacity-blocks", str(capacity), "--policy", "lru", "--json",
                 "--no-progress", "--partial-blocks", partial_blocks]) == 0
    out = json.loads(capsys.readouterr().out)
    (result,) = out["results"]
    refs = {"drop": 6, "keep": 11}[partial_blocks]
    assert (out["block_refs"], out["unique_blocks"], out["input_tokens"]) == \
        (refs, {"drop": 2, "keep": 5}[partial_blocks], 4100)
    assert (out["dropped_partial_blocks"], out["dropped_partial_tokens"]) == \
        ((5, 4100 - 3 * 1024) if partial_blocks == "drop" else (0, 0))
    assert (result["lookups"], result["blocks"], result["hit_blocks"]) == (5, refs, sum(hits))
    assert (result["tokens"], result["hit_tokens"]) == (4100, sum(hit_tokens))


def test_table_byte_capacities_and_plot(trace_file, capsys, tmp_path):
    path, _ = trace_file
    png = tmp_path / "hit.png"
    assert main(["simulate", "--trace", str(path), "--capacity", "1MiB,4MiB", "--block-bytes", "64KiB",
                 "--policy", "lru,wlru,s3fifo", "--plot", str(png), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "16 blk" in out and "64 blk" in out and out.count("wlru") >= 3
    assert "smallest capacity reaching 90% of the ceiling" in out and "give --prefill-tokens-per-s" in out
    assert "token hit rate = hit tokens / " in out and "input tokens (whole prompts)" in out
    assert "partial last blocks dropped" in out
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
    (["--partial-blocks", "trim"], "--partial-blocks: 'trim' must be drop or keep"),
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
