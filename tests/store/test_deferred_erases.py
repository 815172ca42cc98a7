"""A put's erases after the master's lock (Placement.batched_ops(defer_erases=True), Master.put_start): on a full
pool with the inclusive SSD tier, a put's one node call is a Drop of the SSD victims whose extents it hands out
again as its objects' copies. That call is made once the lock is let go and before the put answers, so lookups and
other puts go on meanwhile, and the put's client (or the copy round after its commit) writes those extents only
after the erase. A drop of an extent still free, a call with a move, or a batch whose body raised, is sent inside
the lock as before."""

from __future__ import annotations

import threading
import time

import pytest

from kvpool.store.records import PutStatus
from kvpool.tiers.types import Tier
from tests.store.test_node_calls import K, Pool, chain_key


def _full(a: Pool) -> None:
    """n1 (DRAM 8 objects, SSD 16 two-page records): 8 objects in DRAM with clean copies, 8 on the SSD tier alone."""
    for chain in range(2):
        assert a.put([chain_key(chain, i) for i in range(8)]) == [PutStatus.STORED] * 8
        assert a.master.copy_pending() == 8
    tiers = [r.tier for r in a.master.inspect([chain_key(c, i) for c in range(2) for i in range(8)])]
    assert tiers == [Tier.SSD] * 8 + [Tier.DRAM] * 8


def test_a_full_pool_put_erases_without_the_lock_and_before_it_answers(tmp_path):
    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=True)
    try:
        _full(a)
        seen: list = []
        answered = threading.Event()

        def during_drop(drops):
            # another client's call, on another thread, while the put's Drop call is being made
            probe = threading.Thread(target=lambda: seen.append(a.master.contains([chain_key(1, 0)])), daemon=True)
            probe.start()
            probe.join(30)
            seen.append((answered.is_set(), sorted(d.offset for d in drops)))

        a.ops["n1"].on_drop = during_drop
        before = a.calls()
        new = [chain_key(9, i) for i in range(8)]
        assert a.put(new) == [PutStatus.STORED] * 8
        answered.set()
        a.ops["n1"].on_drop = None
        # the lookup was answered during the Drop call: the lock was free; the put had not answered yet
        assert seen[0] == [True]
        put_answered, dropped = seen[1]
        assert put_answered is False
        # the one call of the put: a Drop of the 8 SSD victims, whose extents are the new objects' copies now
        assert tuple(x - y for x, y in zip(a.calls(), before)) == (0, 1, 0)
        index, copies = a.master.index, a.master.placement.copies
        assert dropped == sorted(copies.offset(index.slot_of(k)) for k in new)
        assert [None if r is None else r.tier for r in a.master.inspect([chain_key(0, i) for i in range(8)])] == \
            [None] * 8
        assert a.master.copy_pending() == 8         # the copies land where the erased records were, and read back
        assert sorted(r.key for r in a.nodes["n1"].scan_ssd()) == sorted([chain_key(1, i) for i in range(8)] + new)
        assert a.check_bytes([chain_key(c, i) for c in (1, 9) for i in range(8)]) == 16
        a.master.index.check_invariants()
    finally:
        a.close()


def test_a_put_that_fails_after_its_batch_still_sends_its_erases(tmp_path):
    """The traffic recorder raising after the put's batch (anything after it, under the lock): the put fails, and
    its deferred Drop is still made, once, after the lock: the extents were freed and handed out all the same."""

    class Broken:
        def put(self, *args):
            raise RuntimeError("the recorder failed")

    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=True)
    try:
        _full(a)
        a.master.recorder = Broken()
        with pytest.raises(RuntimeError, match="the recorder failed"):
            a.master.put_start([chain_key(9, i) for i in range(8)], [K] * 8)
        assert (a.ops["n1"].drop_calls, a.ops["n1"].dropped) == (1, 8)
        assert sorted(r.key for r in a.nodes["n1"].scan_ssd()) == sorted(chain_key(1, i) for i in range(8))
    finally:
        a.master.recorder = None
        a.close()


def _ssd_object(a: Pool, i: int = 0) -> tuple[int, int]:
    """Block i of chain 0, a committed object on n1's SSD tier: (slot, offset)."""
    index = a.master.index
    slot = index.slot_of(chain_key(0, i))
    assert index.tier[slot] == Tier.SSD
    return slot, int(index.offset[slot])


def test_only_drops_of_extents_the_batch_handed_out_again_wait_for_the_caller(tmp_path):
    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=True)
    try:
        _full(a)
        placement, ops = a.master.placement, a.ops["n1"]
        node = placement.node("n1")
        slot, offset = _ssd_object(a)
        # its extent taken again in the batch: the erase is left to the caller
        with placement.batched_ops(defer_erases=True) as erases:
            placement.forget(slot)
            assert placement.allocate(node, Tier.SSD, K) == offset
        assert ops.drop_calls == 0 and [(n.node_id, [d.offset for d in drops]) for n, drops in erases.calls] == \
            [("n1", [offset])]
        placement.send_erases(erases)
        assert (ops.drop_calls, ops.dropped) == (1, 1)
        assert chain_key(0, 0) not in [r.key for r in a.nodes["n1"].scan_ssd()]
        # its extent still free when the batch ends: sent inside it, nothing left to the caller
        slot, offset = _ssd_object(a, 1)
        with placement.batched_ops(defer_erases=True) as erases:
            placement.forget(slot)
        assert (ops.drop_calls, ops.dropped, erases.calls) == (2, 2, [])
        assert placement.allocate(node, Tier.SSD, K) == offset      # (taken again, for the next case)
        # the same batch without defer_erases: sent inside it
        slot, offset = _ssd_object(a, 2)
        with placement.batched_ops() as erases:
            placement.forget(slot)
            assert placement.allocate(node, Tier.SSD, K) == offset
        assert (ops.drop_calls, erases.calls) == (3, [])
    finally:
        a.close()


def test_a_batch_whose_body_raises_sends_its_erases_inside_it(tmp_path):
    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=True)
    try:
        _full(a)
        placement, ops = a.master.placement, a.ops["n1"]
        slot, offset = _ssd_object(a)
        with pytest.raises(RuntimeError, match="the body failed"), placement.batched_ops(defer_erases=True) as erases:
            placement.forget(slot)
            assert placement.allocate(placement.node("n1"), Tier.SSD, K) == offset
            raise RuntimeError("the body failed")
        assert (ops.drop_calls, ops.dropped, erases.calls) == (1, 1, [])
    finally:
        a.close()


def test_the_writer_thread_copies_its_backlog_in_rounds_of_round_bytes(tmp_path, monkeypatch):
    """A round's start holds the master's lock per object it takes, so the writer thread takes ROUND_BYTES at a time
    (here 16 objects' worth) and goes on until the backlog is empty: 40 dirty objects, every one copied, no Demote
    call with more than 16."""
    from kvpool.store import writebehind

    monkeypatch.setattr(writebehind, "ROUND_BYTES", 16 * K)
    a = Pool(tmp_path, "a", [("n1", 64, 128)], batched=True, write_behind=True, write_behind_s=0.01)
    stop = threading.Event()
    writer = threading.Thread(target=writebehind.write_behind_loop, args=(a.master, stop), daemon=True)
    try:
        keys = [chain_key(1, i) for i in range(40)]
        assert a.put(keys) == [PutStatus.STORED] * 40
        writer.start()
        end = time.monotonic() + 30
        while a.master.stats()["write_behind"]["pending"] and time.monotonic() < end:
            time.sleep(0.01)        # polling for the event (the backlog empty), bounded
        stop.set()
        writer.join(10)
        calls = a.ops["n1"].per_call
        assert sum(calls) == 40 and max(calls) == 16 and len(calls) == 3, calls
        assert sorted(r.key for r in a.nodes["n1"].scan_ssd()) == sorted(keys)
    finally:
        stop.set()
        a.close()
