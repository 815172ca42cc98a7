"""BlockManager: reference counts, prefix-cache hits with pool keys, exact LRU reuse order."""

from __future__ import annotations

import pytest

from kvpool.keys import Namespace, block_keys
from kvpool.engine_adapter.block_manager import BlockManager
from kvpool.engine_adapter.request import Request
from kvpool.engine_adapter.sampling import SamplingParams

NS = Namespace(model="m", fingerprint="f", kv_dtype="float32", block_tokens=4, num_layers=1, num_kv_heads=1,
               head_dim=2)


def req(tokens, rid="r"):
    return Request(rid, list(tokens), SamplingParams(), 0, 0.0, 1000)


def computed(bm, tokens, rid="r"):
    """A request whose whole token list is allocated and computed (keys registered)."""
    r = req(tokens, rid)
    bm.allocate(r, bm.match_prefix(r), len(tokens))
    r.num_computed_tokens = len(tokens)
    bm.commit(r, len(tokens))
    return r


def test_keys_are_the_pool_keys_and_hits_share_blocks():
    bm = BlockManager(8, 4, NS)
    a = computed(bm, range(10), "a")                       # blocks 0,1 full (keyed), 2 partial
    assert a.block_ids == [0, 1, 2]
    keys = block_keys(NS, list(range(10)))
    assert bm.cached == {keys[0]: 0, keys[1]: 1}
    b = req([0, 1, 2, 3, 4, 5, 6, 7, 99, 98], "b")
    hits = bm.match_prefix(b)
    assert hits == [0, 1]
    bm.allocate(b, hits, 10)
    assert b.block_ids == [0, 1, 3]
    assert [bm.blocks[i].ref_count for i in range(4)] == [2, 2, 1, 1]
    assert bm.num_free_blocks == 4


def test_fully_cached_prompt_leaves_its_last_block_to_compute():
    bm = BlockManager(8, 4, NS)
    computed(bm, range(8), "a")
    assert bm.match_prefix(req(range(8), "b")) == [0]
    assert bm.match_prefix(req(range(9), "c")) == [0, 1]


def test_freed_blocks_are_reused_keyless_first_then_chain_tails_first():
    bm = BlockManager(6, 4, NS)
    a = computed(bm, range(12), "a")                        # blocks 0,1,2 keyed
    b = req([50] * 6, "b")
    bm.allocate(b, [], 6)                                    # blocks 3,4 (not computed: no keys)
    bm.free_request(a)
    bm.free_request(b)
    # head of the free queue: keyless 3,4 (pushed to the front), never-used 5 ... then a's chain tail-first: 2, 1, 0
    assert list(bm.free) == [3, 4, 5, 2, 1, 0]
    keys = block_keys(NS, list(range(12)))
    c = req([7] * 16, "c")
    bm.allocate(c, [], 16)
    assert c.block_ids == [3, 4, 5, 2]
    assert keys[2] not in bm.cached and bm.blocks[2].key is None       # LRU reuse dropped the tail's key
    assert bm.match_prefix(req(range(12), "d")) == [0, 1]               # parents still hit


def test_hit_on_a_free_cached_block_revives_it_and_counts_against_capacity():
    bm = BlockManager(3, 4, NS)
    a = computed(bm, range(8), "a")
    bm.free_request(a)
    r = req(list(range(8)) + [1, 2], "r")
    hits = bm.match_prefix(r)
    assert hits == [0, 1]
    assert bm.can_allocate(hits, 10)          # 2 revived + 1 fresh = 3 free
    assert not bm.can_allocate(hits, 13)
    bm.allocate(r, hits, 10)
    assert r.block_ids == [0, 1, 2] and bm.num_free_blocks == 0
    assert not bm.can_append(r, 13)
    with pytest.raises(RuntimeError, match="append called without a successful can_append"):
        bm.append(r, 13)


def test_duplicate_content_keeps_one_cached_copy():
    bm = BlockManager(8, 4, NS)
    a = req(range(4), "a")
    b = req(range(4), "b")
    bm.allocate(a, [], 4)
    bm.allocate(b, [], 4)                     # both computed the same block before either was cached
    bm.commit(a, 4)
    bm.commit(b, 4)
    key = block_keys(NS, [0, 1, 2, 3])[0]
    assert bm.cached == {key: 0} and bm.blocks[1].key is None


def test_prefix_caching_off_never_hits():
    bm = BlockManager(4, 4, NS, enable_prefix_caching=False)
    computed(bm, range(8), "a")
    assert bm.cached == {} and bm.match_prefix(req(range(9), "b")) == []
