"""The removal generation (tiers/dram.py tail page, kvpool/locations.py): the master has every node bump it
after a Remove or an admin Evict, before it answers; a node bumps it when it registers with a master. Real
EmbeddedPool (Master + StorageNode in this process) and a real `kvpool up` pool (LocalCluster, over gRPC)."""

from __future__ import annotations

import logging

from kvpool import EmbeddedPool, PoolClient
from kvpool.store.node import NodeUnavailable
from kvpool.store.records import NodeInfo
from tests.conftest import SMALL_UP_OBJ as OBJ

KEYS = [(0xCB << 120 | i).to_bytes(16, "big") for i in range(4)]


def test_remove_and_evict_bump_every_dram_node_and_nothing_else_does():
    with EmbeddedPool(dram_bytes=1 << 20, ssd_path=None, write_behind=False) as pool:
        arena = pool.node.dram
        assert pool.put_many(KEYS, [bytes([i]) * 4096 for i in range(4)]) == ["stored"] * 4
        gen = arena.generation
        assert pool.get_many_into(KEYS[:1], [bytearray(4096)]) == 1 and arena.generation == gen   # reads: no
        assert pool.remove_many(KEYS[:1]) == 1 and arena.generation == gen + 1
        assert pool.remove_many(KEYS[:1]) == 0 and arena.generation == gen + 1        # nothing removed: no
        assert pool.master.evict(older_than_s=0) == 3 and arena.generation == gen + 2
        assert pool.master.evict(older_than_s=0) == 0 and arena.generation == gen + 2


class _Deaf:
    """A DRAM node that cannot be told (its RPC fails)."""

    def __init__(self) -> None:
        self.asked = 0

    def demote(self, moves, drops=()):
        return [False] * len(moves)

    def promote(self, moves):
        raise NodeUnavailable("deaf")

    def drop(self, drops):
        return 0

    def objects_removed(self, keys=None):
        self.asked += 1
        raise NodeUnavailable("node deaf:1: UNAVAILABLE")


def test_a_node_that_cannot_be_told_is_logged_and_the_removal_stands(caplog):
    with EmbeddedPool(dram_bytes=1 << 20, ssd_path=None, write_behind=False) as pool:
        deaf = _Deaf()
        pool.master.register_node(NodeInfo(node_id="deaf", dram_bytes=1 << 20), deaf, expires=False)
        assert pool.put_many(KEYS[:2], [b"x" * 4096] * 2) == ["stored"] * 2
        gen = pool.node.dram.generation
        with caplog.at_level(logging.WARNING, logger="kvpool.store.master"):
            assert pool.remove_many(KEYS[:2]) == 2
        assert deaf.asked == 1 and pool.node.dram.generation == gen + 1      # the other node was still told
        assert pool.contains_many(KEYS[:2]) == [False, False]
        assert any("node deaf not told of a removal" in r.getMessage() for r in caplog.records)


def test_a_node_registering_again_bumps_it_so_cached_entries_are_asked_again(small_up):
    calls = small_up.master.control.calls
    # host_index_reads=False: after the registration the master re-publishes the node's objects in its host index,
    # and a get served from there would ask nothing (tests/kvpool/test_host_index_reads.py)
    with PoolClient(small_up.address, location_cache_s=60, host_index_reads=False) as c:
        c.warm(prefault=False)
        assert c.put_many(KEYS[:2], [b"a" * OBJ, b"b" * OBJ]) == ["stored"] * 2
        assert c.get_many_into(KEYS[:2], [bytearray(OBJ), bytearray(OBJ)]) == 2      # from the cache (its put)
        assert c.stats()["client_location_cache"]["gets"] == 1
        small_up.node.register()            # what it does when a restarted master asks it to register again
        base = calls["Lookup"]
        out = [bytearray(OBJ), bytearray(OBJ)]
        assert c.get_many_into(KEYS[:2], out) == 2 and out == [bytearray(b"a" * OBJ), bytearray(b"b" * OBJ)]
        assert calls["Lookup"] == base + 1
        assert c.stats()["client_location_cache"]["removed"] == 1
        c.remove_many(KEYS[:2])
