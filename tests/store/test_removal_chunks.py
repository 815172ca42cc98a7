"""A removal takes its objects `queries.REMOVAL_CHUNK` at a time, each chunk under one hold of the master's lock, and
tells the nodes after each chunk: a client's `remove` (Master.remove, `remove_many`, `kvpool rm`) and an admin evict
(Master.evict, `kvpool evict`). Other clients are answered between chunks; an object the evict chose that is leased
or hit meanwhile is checked again and kept. Real master and nodes in this process (tests/store/test_node_calls.py's
Pool); the chunk size is made small so that 12 objects are 3 chunks."""

from __future__ import annotations

import threading

import pytest

from kvpool.store import queries
from kvpool.store.records import PutStatus
from tests.store.test_node_calls import Pool, chain_key

KEYS = [chain_key(0, i) for i in range(12)]


@pytest.fixture
def pool(tmp_path, monkeypatch):
    monkeypatch.setattr(queries, "REMOVAL_CHUNK", 4)
    a = Pool(tmp_path, "a", [("n1", 16, 0)], batched=True)
    assert a.put(KEYS) == [PutStatus.STORED] * 12
    try:
        yield a
    finally:
        a.close()


def _during_first_tell(a: Pool, probe) -> list:
    """Run `probe()` on another thread while n1 is told of the first chunk; returns [probe()'s answer]."""
    seen: list = []

    def on_removed(keys):
        if not seen:
            t = threading.Thread(target=lambda: seen.append(probe()), daemon=True)
            t.start()
            t.join(30)                      # the probe's answer, or nothing if it never got the lock

    a.ops["n1"].on_removed = on_removed
    return seen


def test_an_evict_is_made_chunk_by_chunk_and_others_are_answered_between_chunks(pool):
    told: list = []
    seen = _during_first_tell(pool, lambda: pool.master.contains(KEYS))
    on_removed = pool.ops["n1"].on_removed
    pool.ops["n1"].on_removed = lambda keys: (told.append(keys), on_removed(keys))
    assert pool.master.evict(older_than_s=0) == 12
    # between the first chunk and the second, another client saw the first 4 gone and the other 8 still there
    assert seen == [[False] * 4 + [True] * 8]
    # the node was told after each chunk, with that chunk's keys (its host index forgets those rows only)
    assert told == [KEYS[0:4], KEYS[4:8], KEYS[8:12]]
    assert pool.master.contains(KEYS) == [False] * 12
    assert pool.master.stats()["evictions"] == {"dram": 12, "ssd": 0}


def test_objects_leased_or_hit_between_chunks_are_kept(pool):
    pool.clock.now += 10                                # every object idle for 10 s
    lease: list = []

    def probe():
        lease.append(pool.master.lookup([KEYS[9]]))     # leased (the third chunk's)
        return pool.master.lookup([KEYS[5]], lease=False).hits   # hit: no longer idle (the second chunk's)

    seen = _during_first_tell(pool, probe)
    assert pool.master.evict(older_than_s=5) == 10
    assert seen == [1] and lease[0].hits == 1
    assert pool.master.contains(KEYS) == [i in (5, 9) for i in range(12)]
    pool.master.release([lease[0].lease_id])
    assert pool.master.contains(KEYS) == [i in (5, 9) for i in range(12)]
    assert pool.master.stats()["evictions"] == {"dram": 10, "ssd": 0}


def test_a_remove_is_made_chunk_by_chunk_and_others_are_answered_between_chunks(pool):
    told: list = []
    master = pool.master
    seen = _during_first_tell(pool, lambda: (master.contains(KEYS), master.lookup(KEYS[4:], lease=False).hits))
    on_removed = pool.ops["n1"].on_removed
    pool.ops["n1"].on_removed = lambda keys: (told.append(keys), on_removed(keys))
    assert pool.master.remove(KEYS[::-1] + [chain_key(7, 0)]) == 12     # one key not in the pool
    # between the first chunk (the last 4 keys) and the second, another client saw those 4 gone and the rest there
    assert seen == [([True] * 8 + [False] * 4, 4)]
    assert told == [KEYS[11:7:-1], KEYS[7:3:-1], KEYS[3::-1]]
    assert pool.master.contains(KEYS) == [False] * 12
    assert pool.master.stats()["evictions"] == {"dram": 0, "ssd": 0}
