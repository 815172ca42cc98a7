"""A put batch is placed in one step (Placement.place_many / place_new): the same nodes, tiers and offsets as
placing its objects one by one, with several nodes that tie, a preferred node, excluded nodes, SSD-only nodes,
holes of every size, and room running out mid-batch."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import xxhash

from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.master import Master
from kvpool.store.node import StorageNode
from kvpool.store.records import PutStatus
from tests.store.fakes import Clock

K = 4096


@pytest.fixture
def twins(tmp_path):
    """Two masters over the same six nodes (four DRAM nodes and two SSD-only ones; a and b, d and f of equal
    size, so they tie): what one does with place_many, the other does with place."""
    nodes = []

    def master(tag: str) -> Master:
        m = Master(MasterConfig(), None, clock=Clock())
        for name, dram, ssd in (("a", 64, 0), ("b", 64, 0), ("c", 40, 0), ("d", 0, 80), ("e", 24, 0), ("f", 0, 80)):
            node = StorageNode(NodeConfig(node_id=name, dram_bytes=dram * K, shm_dir=str(tmp_path / tag),
                                          ssd_path=str(tmp_path / tag / f"ssd-{name}") if ssd else None,
                                          ssd_bytes=ssd * K))
            nodes.append(node)
            m.register_node(node.info(), node, expires=False)
        return m

    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    yield master("x"), master("y")
    for node in nodes:
        node.close()


def where(placed) -> tuple:
    node, tier, offset = placed
    return node.node_id, tier, offset


def first_choice_free(placement, size: int, exclude: set[int]) -> bool:
    """Would `place` find free room (its rule 1) anywhere?"""
    for node in placement.nodes.values():
        tier = placement.fastest_tier(node)
        if node.number in exclude or tier is None or tier.label == "ssd":
            continue
        space = node.spaces[tier]
        if space.allocator.can_allocate(space.extent_size(size)):
            return True
    return False


def test_place_many_gives_exactly_the_placements_of_place_one_by_one(twins):
    many, one = (m.placement for m in twins)
    rng = random.Random(7)
    live: list[tuple] = []
    numbers = sorted(n.number for n in many.nodes.values())
    short = rivals = on_ssd = 0
    for step in range(600):
        if live and rng.random() < 0.4:
            for item in rng.sample(live, min(len(live), rng.randint(1, 10))):
                live.remove(item)
                name, tier, offset = item
                for p in (many, one):
                    p.node(name).spaces[tier].allocator.free(offset)
            continue
        size = rng.choice([K, K, 3000, 2 * K, 3 * K])
        count = rng.randint(1, 24)
        prefer = rng.choice([None, "a", "b", "c", "d", "f", "zz"])
        exclude = set(rng.sample(numbers, rng.choice([0, 0, 1, 2])))
        rivals += prefer not in ("a", "b") and not exclude & {many.node("a").number, many.node("b").number}
        got = [where(p) for p in many.place_many(size, count, prefer, exclude)]
        want = [where(one.place(size, prefer, exclude)) for _ in got]
        assert got == want, step
        if len(got) < count:
            short += 1
            assert not first_choice_free(one, size, exclude)     # the next one would have had to make room
        on_ssd += any(name in ("d", "f") for name, _, _ in got)
        live.extend(got)
    assert short > 30 and rivals > 100 and on_ssd > 30


def put(master: Master, keys: list[bytes], size: int = K, prefer: str | None = None) -> list:
    results = master.put_start(keys, [size] * len(keys), prefer_node=prefer)
    data = np.zeros(size, np.uint8)
    ids = [r.grant.grant_id for r in results if r.grant is not None]
    master.put_commit(ids, [xxhash.xxh3_64_intdigest(data)] * len(ids))
    return results


def test_a_batch_lands_where_its_keys_put_one_at_a_time_land(twins):
    """Existing keys, a key repeated within the batch and a batch larger than the free DRAM (the rest goes where
    room is made): statuses and locations equal those of single-key puts, and the chain links are the batch's."""
    batched, single = twins
    old = [bytes([1, i]) * 8 for i in range(20)]
    for m in twins:
        put(m, old[:10])
    keys = old[5:15] + [old[12]] + [bytes([2, i]) * 8 for i in range(200)]
    got = put(batched, keys, prefer="c")
    want = [r for k in keys for r in put(single, [k], prefer="c")]
    assert [r.status for r in got] == [r.status for r in want]
    assert got[10].status is PutStatus.EXISTS and got[0].status is PutStatus.EXISTS
    assert sum(r.status is PutStatus.STORED for r in got) == 205
    loc = [None if r.grant is None else r.grant.location for r in got]
    assert loc == [None if r.grant is None else r.grant.location for r in want]
    # free DRAM first (a and b tie: they alternate), then rule 2: the SSD-only nodes' free room (d and f tie:
    # they alternate too), nothing evicted
    assert Counter((x.node_id, x.tier.label) for x in loc if x is not None) == \
        {("a", "dram"): 59, ("b", "dram"): 59, ("c", "dram"): 40, ("e", "dram"): 24, ("d", "ssd"): 12, ("f", "ssd"): 11}
    assert [x.node_id for x in loc[11:15]] == ["c", "c", "c", "c"]        # the preferred node while it has room
    assert [batched.index.parent[batched.index.find(k)] for k in keys[15:20]] == \
        [batched.index.find(k) for k in keys[14:19]]
