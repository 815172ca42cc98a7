"""A put's SSD erases sent after its answer (store/erasures.py): in a master process a put on a full pool answers
without waiting for its Drop call, and every call that writes the freed extents sends the queued erases first: the
write-behind round's copies, a Demote, the put's own client on an SSD grant. Real StorageNodes in this process
(tests/store/test_node_calls.py's Pool); tests/store/test_master_model.py runs the same rule under random steps."""

from __future__ import annotations

import threading

import pytest

from kvpool.store.config import MasterServerConfig
from kvpool.store.master_server import MasterServer
from kvpool.store.records import PutStatus
from kvpool.store.tenants import Quota
from kvpool.tiers.types import Tier
from tests.store.test_node_calls import K, Pool, chain_key, payload

KEYS = [chain_key(i, 0) for i in range(12)]


def _records(pool: Pool, name: str = "n1") -> list[tuple[bytes, int]]:
    return sorted((r.key, r.offset) for r in pool.nodes[name].scan_ssd())


@pytest.fixture
def full(tmp_path):
    """One node, 4 objects of DRAM over 8 of SSD, write-behind on, erases queued: 8 objects put one at a time, each
    copy written (KEYS[0..3] on SSD, KEYS[4..7] in DRAM with clean copies). Both tiers are full."""
    pool = Pool(tmp_path, "p", [("n1", 4, 8)], batched=True, write_behind=True)
    pool.master.erase_in_background()
    for key in KEYS[:8]:
        pool.put([key])
        pool.master.copy_pending()
    assert [r.tier for r in pool.master.inspect(KEYS[:8])] == [Tier.SSD] * 4 + [Tier.DRAM] * 4
    yield pool
    pool.close()


def test_a_full_put_answers_before_its_erase_and_the_erase_follows(full):
    master, ops = full.master, full.ops["n1"]
    before = _records(full)
    calls = (ops.drop_calls, ops.demote_calls)           # (0, 8): the 8 copy rounds
    out = master.put_start([KEYS[8]], [K])
    # KEYS[0], the coldest SSD object, was evicted for the new object's copy; its record is still on the node
    assert master.inspect([KEYS[0]]) == [None]
    assert master.stats()["evictions"] == {"dram": 0, "ssd": 1}
    assert (ops.drop_calls, ops.demote_calls) == calls == (0, 8)    # the put made no node call
    assert master.placement.erasures.pending() == 1
    assert _records(full) == before
    assert out[0].grant.location.tier == Tier.DRAM
    assert master.stats()["erasures"] == {"pending": 1, "sent": 0, "calls": 0}
    master.erase_pending()
    assert (ops.drop_calls, ops.dropped) == (1, 1)
    assert master.stats()["erasures"] == {"pending": 0, "sent": 1, "calls": 1}
    assert _records(full) == [r for r in before if r[0] != KEYS[0]]


def test_the_copy_round_sends_queued_erases_before_it_writes(full):
    master, ops = full.master, full.ops["n1"]
    full.put([KEYS[8]])                                   # its copy's extent is KEYS[0]'s record, erase queued
    seen = []
    ops.on_demote = lambda moves: seen.append((ops.drop_calls, master.placement.erasures.pending(),
                                               [m.dst_offset for m in moves]))
    evicted_at = 0                                        # KEYS[0]'s record (`_records` before the put)
    assert master.copy_pending() == 1
    assert seen == [(1, 0, [evicted_at])]                 # the Drop came first, then the copy over the same page
    master.erase_pending()                                # nothing left: a late erase would wipe the copy
    assert ops.drop_calls == 1
    slot = master.index.find(KEYS[8])
    assert master.placement.copies.offset(slot) == evicted_at
    out = bytearray(K)
    assert full.nodes["n1"].read_into(Tier.SSD, evicted_at, KEYS[8], K, out)
    assert (KEYS[8], evicted_at) in _records(full)


def test_a_put_given_an_ssd_grant_sends_the_queued_erases_before_it_answers(tmp_path):
    pool = Pool(tmp_path, "s", [("n1", 0, 4)], batched=True)     # an SSD-only node: every grant is on SSD
    master, ops = pool.master, pool.ops["n1"]
    master.erase_in_background()
    try:
        for key in KEYS[:4]:
            pool.put([key])
        assert ops.drop_calls == 0
        out = master.put_start([KEYS[4]], [K])
        loc = out[0].grant.location
        assert master.inspect([KEYS[0]]) == [None]
        # KEYS[0]'s extent is the grant: its erase was sent before the answer, so the client's write cannot be wiped
        assert (loc.tier, loc.offset) == (Tier.SSD, 0)
        assert (ops.drop_calls, master.placement.erasures.pending()) == (1, 0)
        assert [k for k, _ in _records(pool)] == sorted(KEYS[1:4])
    finally:
        pool.close()


@pytest.mark.parametrize("call", ["migrate_next", "migrate_start"])
def test_a_drain_given_an_ssd_destination_sends_the_queued_erases_before_it_answers(tmp_path, call):
    """A tenant at its total quota evicts its own coldest object on n1's SSD for a put that lands in n2's DRAM: the
    erase is queued (no SSD grant flushed it). Draining n2 then moves that object onto the freed extent, and the
    drainer writes it after the answer: the answer waits for the erase."""
    pool = Pool(tmp_path, "d", [("n1", 0, 4), ("n2", 1, 0)], batched=True, quotas={"t": Quota(total_bytes=4 * K)})
    master, ops = pool.master, pool.ops["n1"]
    master.erase_in_background()
    try:
        other = chain_key(99, 0)
        assert pool.put([other]) == [PutStatus.STORED]            # fills n2's DRAM: t's next 4 land on n1's SSD
        for key in KEYS[:4]:
            pool.put([key], tenant="t")
        stored = pool.stored(KEYS[:5], "t")
        assert [(r.node_id, r.tier, r.offset) for r in master.inspect(stored[:4])] == \
            [("n1", Tier.SSD, o) for o in (0, 8192, 16384, 24576)]
        assert master.remove([other]) == 1
        pool.put([KEYS[4]], tenant="t")                             # evicts t's KEYS[0] (n1, offset 0)
        assert master.inspect(stored[:1]) == [None]
        assert (master.inspect(stored[4:])[0].node_id, master.placement.erasures.pending(), ops.drop_calls) == \
            ("n2", 1, 0)
        assert master.begin_drain("n2") == (1, 0)
        result = master.migrate_next("n2") if call == "migrate_next" else master.migrate_start([stored[4]])
        (move,) = result.moves
        assert (move.dest.node_id, move.dest.tier, move.dest.offset) == ("n1", Tier.SSD, 0)
        assert (master.placement.erasures.pending(), ops.drop_calls) == (0, 1)     # sent before the answer
        data = payload(stored[4], K)
        pool.nodes["n1"].write(Tier.SSD, 0, stored[4], b"\0" * 16, data, None)     # the drainer's copy
        assert master.migrate_commit([move.move_id], [move.checksum]) == [True]
        master.erase_pending()
        assert ops.drop_calls == 1
        assert pool.check_bytes(stored) == 4
        assert (stored[4], 0) in _records(pool)
    finally:
        pool.close()


def test_a_node_that_leaves_takes_its_queued_erases_with_it(full):
    master, ops = full.master, full.ops["n1"]
    full.put([KEYS[8]])
    assert master.placement.erasures.pending() == 1
    master.remove_node("n1")
    assert master.placement.erasures.pending() == 0
    master.erase_pending()
    assert ops.drop_calls == 0


def test_without_a_master_process_a_put_erases_before_it_answers(tmp_path):
    pool = Pool(tmp_path, "e", [("n1", 4, 8)], batched=True, write_behind=True)    # erase_in_background not called
    try:
        for key in KEYS[:8]:
            pool.put([key])
            pool.master.copy_pending()
        pool.master.put_start([KEYS[8]], [K])
        assert (pool.ops["n1"].drop_calls, pool.master.placement.erasures.pending()) == (1, 0)
        assert KEYS[0] not in [k for k, _ in _records(pool)]
    finally:
        pool.close()


def test_a_master_process_queues_its_erases_and_runs_the_eraser():
    server = MasterServer(MasterServerConfig(listen="127.0.0.1:0"))
    try:
        assert server.master.placement.erasures.background
        server.start()
        assert "kvpool-eraser" in [t.name for t in threading.enumerate()]
    finally:
        server.stop(0)
    assert "kvpool-eraser" not in [t.name for t in threading.enumerate()]
