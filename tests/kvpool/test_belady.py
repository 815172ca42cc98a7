"""kvpool.belady: OPT's hits on hand-counted tiny traces, equal to an exhaustive search over every store a pool could
hold on random prefix-tree traces, never below any real policy's replay; bad arguments named."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest
from kvpool.tiers.policy import POLICY_NAMES

from kvpool.belady import next_use, opt_hits
from kvpool.planner import replay
from kvpool.trace import PUT, load_trace


def trace_of(tmp_path, chains: list[list[int]]):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": 512 * len(c), "output_length": 1,
                                        "hash_ids": c}) + "\n" for i, c in enumerate(chains)))
    return load_trace(path)


def test_next_use():
    assert next_use(np.array([1, 2, 3, 1, 2, 3, 1], dtype=np.uint64)).tolist() == [3, 4, 5, 6, 11, 12, 13]


def test_hand_counted_trace(tmp_path):
    # refs (step: block): 0:1 1:2 | 2:3 | 3:1 4:2 | 5:3 | 6:1, capacity 2.
    # 0, 1: stored in free room. 2: block 3 (next use 5) vs the furthest stored, 2 (next use 4): bypassed.
    # 3, 4: hits (2 hits). 5: block 3 (never again) vs 2 (never again, but an earlier step): bypassed. 6: hit.
    # LRU for comparison: [1,2] | 3 evicts 2 | 1 hits, then its stored tail 2 evicts 3 and is the most recent | 3
    # evicts 1 | 1 misses = 1 hit.
    t = trace_of(tmp_path, [[1, 2], [3], [1, 2], [3], [1]])
    r = opt_hits(t, 2)
    assert r.hits.tolist() == [0, 0, 2, 0, 1]
    assert (r.hit_blocks, r.block_hits, r.evictions, r.bypassed) == (3, 3, 0, 2)
    assert replay(t, 2, "lru")[1].tolist() == [0, 0, 1, 0, 0]
    # capacity 1: 1 stored; 2 (next 4) vs 1 (next 3): bypassed; 3 (next 5) bypassed; 1 hits, next use 6;
    # 2 (never again) bypassed; 3 bypassed; 1 hits.
    r = opt_hits(t, 1)
    assert r.hits.tolist() == [0, 0, 1, 0, 1] and (r.evictions, r.bypassed) == (0, 4)
    # capacity 3: everything fits
    assert opt_hits(t, 3).hits.tolist() == [0, 0, 2, 1, 1]


def test_eviction_picks_the_furthest_next_use(tmp_path):
    # capacity 2: [1] [2] [3] [2] [1]: at 3 (next use: never), stored 1 (next use 4) and 2 (next use 3): bypass.
    # [1] [2] [3] [3] [2]: 3 (next use 3) evicts 1 (never again); then 3 and 2 hit.
    t = trace_of(tmp_path, [[1], [2], [3], [2], [1]])
    assert opt_hits(t, 2).hits.tolist() == [0, 0, 0, 1, 1]
    r = opt_hits(trace_of(tmp_path, [[1], [2], [3], [3], [2]]), 2)
    assert r.hits.tolist() == [0, 0, 0, 1, 1] and (r.evictions, r.bypassed) == (1, 0)


def test_chains_that_disagree_about_a_parent_count_block_hits_apart(tmp_path):
    # block 2 under 1, then under 3. Capacity 2: 1 and 2 stored; 3 (never again) bypassed; 2 is stored but the
    # lookup stopped at 3: a block hit, not a prefix hit.
    r = opt_hits(trace_of(tmp_path, [[1, 2], [3, 2]]), 2)
    assert r.hits.tolist() == [0, 0] and (r.block_hits, r.hit_blocks) == (1, 0)


def tree_chains(rng: random.Random, blocks: int, requests: int) -> list[list[int]]:
    """Root-to-node paths of a random tree: every occurrence of a block has the same parent (chained ids)."""
    parent = {0: None}
    for b in range(1, blocks):
        parent[b] = rng.choice([None, *range(b)])
    chains = []
    for _ in range(requests):
        b = rng.randrange(blocks)
        chain = []
        while b is not None:
            chain.append(b)
            b = parent[b]
        chains.append(chain[::-1])
    return chains


def exhaustive_best(chains: list[list[int]], capacity: int) -> int:
    """The most prefix hits over every sequence of stores: after each request the pool may hold ANY subset of (what
    it held + the request's chain) of at most `capacity` blocks (a superset of what eviction + admission can do)."""
    best = {frozenset(): 0}
    for chain in chains:
        nxt: dict[frozenset, int] = {}
        for held, total in best.items():
            h = 0
            while h < len(chain) and chain[h] in held:
                h += 1
            pool = sorted(held | set(chain))
            for k in range(min(capacity, len(pool)) + 1):
                for keep in itertools.combinations(pool, k):
                    s = frozenset(keep)
                    if nxt.get(s, -1) < total + h:
                        nxt[s] = total + h
        best = nxt
    return max(best.values())


@pytest.mark.parametrize("seed", range(12))
def test_equals_an_exhaustive_search_on_prefix_tree_traces(tmp_path, seed):
    rng = random.Random(seed)
    chains = tree_chains(rng, blocks=7, requests=9)
    t = trace_of(tmp_path, chains)
    for capacity in (1, 2, 3):
        r = opt_hits(t, capacity)
        assert r.hit_blocks == r.block_hits == exhaustive_best(chains, capacity)
        for policy in POLICY_NAMES:
            assert replay(t, capacity, policy)[0].hit_blocks <= r.hit_blocks


def test_bad_arguments(tmp_path):
    t = trace_of(tmp_path, [[1]])
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="capacity_blocks"):
            opt_hits(t, bad)
    t.op[0] = PUT
    with pytest.raises(ValueError, match="REQUEST"):
        opt_hits(t, 1)
