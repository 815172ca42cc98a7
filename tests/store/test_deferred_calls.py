"""A put's node calls after the master's lock (Placement.batched_ops(defer=True), Master.put_start).

On a full pool with the inclusive SSD tier, a put's one node call is a Drop of the SSD victims whose extents it hands
out again as its objects' copies; on a full DRAM tier whose victims' copies are not written yet, a Demote that copies
each victim into its copy, whose DRAM extent the put hands out as a grant. Either call is made once the lock is let
go and before the put answers, so lookups and other puts go on meanwhile, and the put's client (or the copy round
after its commit) writes those extents only after the call. A deferred move's objects are in flight until the put
settles them under the lock again: a lookup misses them, a drain passes them by, a removal meanwhile frees them once
they land, a refused or failed move evicts them. A drop of an extent still free, a move whose source extent is not
wholly taken again, or a batch whose body raised, is sent inside the lock as before."""

from __future__ import annotations

import threading
import time

import pytest
import xxhash

from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.index import State
from kvpool.store.master import Master
from kvpool.store.migration import MigrateStatus
from kvpool.store.node import StorageNode
from kvpool.store.records import PutStatus
from kvpool.tiers.types import Tier
from tests.store.test_node_calls import K, Counted, Pool, chain_key


def _full(a: Pool) -> None:
    """n1 (DRAM 8 objects, SSD 16 two-page records): 8 objects in DRAM with clean copies, 8 on the SSD tier alone."""
    for chain in range(2):
        assert a.put([chain_key(chain, i) for i in range(8)]) == [PutStatus.STORED] * 8
        assert a.master.copy_pending() == 8
    tiers = [r.tier for r in a.master.inspect([chain_key(c, i) for c in range(2) for i in range(8)])]
    assert tiers == [Tier.SSD] * 8 + [Tier.DRAM] * 8


def _put_during_call(a: Pool, keys: list[bytes], hook: str, probe, describe) -> tuple[list, tuple]:
    """Put `keys` while another client's calls (`probe()`, on another thread) are made during n1's `hook` call
    ("on_drop", "on_demote"). Returns what was seen during that call (probe()'s answers, then whether the put had
    answered and `describe` of the call's argument) and the call counts before the put."""
    seen: list = []
    answered = threading.Event()

    def during(arg):
        thread = threading.Thread(target=lambda: seen.extend(probe()), daemon=True)
        thread.start()
        thread.join(30)
        seen.append((answered.is_set(), describe(arg)))

    setattr(a.ops["n1"], hook, during)
    before = a.calls()
    try:
        assert a.put(keys) == [PutStatus.STORED] * len(keys)
    finally:
        setattr(a.ops["n1"], hook, None)
    answered.set()
    return seen, before


def test_a_full_pool_put_erases_without_the_lock_and_before_it_answers(tmp_path):
    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=True)
    try:
        _full(a)
        new = [chain_key(9, i) for i in range(8)]
        seen, before = _put_during_call(a, new, "on_drop", lambda: [a.master.contains([chain_key(1, 0)])],
                                        lambda drops: sorted(d.offset for d in drops))
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
        with placement.batched_ops(defer=True, pin=a.master.leases.pin) as erases:
            placement.forget(slot)
            assert placement.allocate(node, Tier.SSD, K) == offset
        assert ops.drop_calls == 0 and [(n.node_id, [d.offset for d in drops]) for n, drops in erases.erases] == \
            [("n1", [offset])]
        placement.send_deferred(erases)
        assert (ops.drop_calls, ops.dropped) == (1, 1)
        assert chain_key(0, 0) not in [r.key for r in a.nodes["n1"].scan_ssd()]
        # its extent still free when the batch ends: sent inside it, nothing left to the caller
        slot, offset = _ssd_object(a, 1)
        with placement.batched_ops(defer=True, pin=a.master.leases.pin) as erases:
            placement.forget(slot)
        assert (ops.drop_calls, ops.dropped, erases.erases) == (2, 2, [])
        assert placement.allocate(node, Tier.SSD, K) == offset      # (taken again, for the next case)
        # the same batch without defer: sent inside it
        slot, offset = _ssd_object(a, 2)
        with placement.batched_ops() as erases:
            placement.forget(slot)
            assert placement.allocate(node, Tier.SSD, K) == offset
        assert (ops.drop_calls, erases.erases) == (3, [])
    finally:
        a.close()


def test_a_batch_whose_body_raises_sends_its_erases_inside_it(tmp_path):
    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=True)
    try:
        _full(a)
        placement, ops = a.master.placement, a.ops["n1"]
        slot, offset = _ssd_object(a)
        with pytest.raises(RuntimeError, match="the body failed"), \
                placement.batched_ops(defer=True, pin=a.master.leases.pin) as erases:
            placement.forget(slot)
            assert placement.allocate(placement.node("n1"), Tier.SSD, K) == offset
            raise RuntimeError("the body failed")
        assert (ops.drop_calls, ops.dropped, erases.erases) == (1, 1, [])
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


def _dirty(a: Pool, chain: int = 0, size: int = K, n: int = 8) -> list[bytes]:
    """n1's DRAM filled by one chain whose SSD copies are reserved and not written yet."""
    keys = [chain_key(chain, i) for i in range(n)]
    assert a.put(keys, size) == [PutStatus.STORED] * n
    assert a.master.stats()["write_behind"]["pending"] == n
    return keys


def _settled(a: Pool) -> None:
    """Nothing in flight, nothing pinned, the index consistent."""
    index = a.master.index
    assert a.master.placement.landed(list(index.slots())) == len(list(index.slots()))
    assert int(index.leases.sum()) == 0
    index.check_invariants()


def test_a_put_on_a_full_dram_tier_copies_its_dirty_victims_without_the_lock(tmp_path):
    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=True)
    try:
        old = _dirty(a)
        new = [chain_key(9, i) for i in range(8)]
        # the victims are in flight meanwhile: a lookup misses them (not on the SSD yet), the index still has them
        seen, before = _put_during_call(a, new, "on_demote",
                                        lambda: [a.master.lookup(old, lease=False).hits, a.master.contains(old[:1])],
                                        lambda moves: sorted(m.key for m in moves))
        assert seen == [0, [True], (False, sorted(old))]
        # the put's one call: a Demote of its 8 victims into their own copies, no drop
        assert tuple(x - y for x, y in zip(a.calls(), before)) == (1, 0, 8)
        hit = a.master.lookup(old)
        assert (hit.hits, hit.tiers) == (8, [Tier.SSD] * 8)
        a.master.release([hit.lease_id])
        assert a.master.stats()["demotions"] == 8
        assert sorted(r.key for r in a.nodes["n1"].scan_ssd()) == sorted(old)
        assert a.check_bytes(old + new) == 16
        _settled(a)
    finally:
        a.close()


def test_a_deferred_move_refused_evicts_and_one_removed_meanwhile_is_freed_once_it_lands(tmp_path):
    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=True,
             refuse=lambda key: key == chain_key(0, 5))
    try:
        old = _dirty(a)
        removed: list = []

        def during_demote(moves):
            thread = threading.Thread(target=lambda: removed.append(a.master.remove([old[3]])), daemon=True)
            thread.start()
            thread.join(30)

        a.ops["n1"].on_demote = during_demote
        new = [chain_key(9, i) for i in range(8)]
        assert a.put(new) == [PutStatus.STORED] * 8
        a.ops["n1"].on_demote = None
        assert removed == [1]
        kept = [k for k in old if k not in (old[3], old[5])]
        assert [r is not None for r in a.master.inspect(old)] == [k in kept for k in old]
        assert a.master.stats()["evictions"]["dram"] == 1
        # the removed object's record, written by its move, is erased once the move landed
        assert sorted(r.key for r in a.nodes["n1"].scan_ssd()) == sorted(kept)
        assert a.master.copy_pending() == 8
        assert sorted(r.key for r in a.nodes["n1"].scan_ssd()) == sorted(kept + new)
        assert a.check_bytes(old + new) == 14
        _settled(a)
    finally:
        a.close()


def test_a_deferred_move_whose_node_call_fails_evicts_its_objects_and_the_put_goes_on(tmp_path):
    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=True)
    try:
        old = _dirty(a)
        a.ops["n1"].broken = True
        out = a.master.put_start([chain_key(9, i) for i in range(8)], [K] * 8)
        a.ops["n1"].broken = False
        assert [r.status for r in out] == [PutStatus.STORED] * 8
        assert a.master.inspect(old) == [None] * 8
        assert a.master.stats()["evictions"]["dram"] == 8
        assert a.master.put_abort([r.grant.grant_id for r in out]) == 8
        _settled(a)
    finally:
        a.close()


def _defer_one(a: Pool) -> tuple:
    """A batch that allocates one 2K extent on n1's full DRAM tier (its objects 2K each, copies dirty): the coldest
    object is moved out in a deferred call. Returns (the Deferred, the victim's slot, its key, the extent given)."""
    placement = a.master.placement
    with placement.batched_ops(defer=True, pin=a.master.leases.pin) as deferred:
        offset = placement.allocate(placement.node("n1"), Tier.DRAM, 2 * K)
    (victim,) = deferred.slots()
    return deferred, victim, a.master.index.key_at(victim), offset


def test_a_move_is_deferred_only_when_its_whole_source_extent_is_taken_again(tmp_path):
    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=True)
    try:
        old = _dirty(a, size=2 * K, n=4)
        master, placement, ops = a.master, a.master.placement, a.ops["n1"]
        node = placement.node("n1")
        where = {k: r.offset for k, r in zip(old, master.inspect(old))}
        # the victim's whole extent taken again: deferred, in flight (pinned by its caller) until settled
        deferred, victim, key, offset = _defer_one(a)
        assert ops.demote_calls == 0 and offset == where[key] and placement.in_flight(victim)
        assert int(master.index.leases[victim]) == 1                         # pinned as it was deferred
        assert master.lookup(old, lease=False).hits == old.index(key)       # the hits end before it
        master.begin_drain("n1")
        other = next(k for k in old if k != key)
        assert [m.status for m in master.migrate_start([key, other]).moves] == \
            [MigrateStatus.BUSY, MigrateStatus.NO_SPACE]
        placement.send_deferred(deferred)
        assert ops.demote_calls == 1
        placement.settle_deferred(deferred, master.leases.unpin)
        assert not placement.in_flight(victim) and int(master.index.leases[victim]) == 0
        assert master.lookup(old, lease=False).hits == 4 and master.inspect([key])[0].tier == Tier.SSD
        # a smaller extent where the victim was: the rest of its source is free to anyone, so the move is sent here
        with placement.batched_ops(defer=True, pin=master.leases.pin) as deferred:
            assert placement.allocate(node, Tier.DRAM, K) is not None
        assert (deferred.moves, ops.demote_calls) == ([], 2)
        assert sorted(r.tier for r in master.inspect(old)) == [Tier.DRAM, Tier.DRAM, Tier.SSD, Tier.SSD]
        assert a.check_bytes(old) == 4
    finally:
        a.close()


def test_a_deferred_move_removed_meanwhile_and_still_held_elsewhere_is_freed_by_its_last_holder(tmp_path):
    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=True)
    try:
        _dirty(a, size=2 * K, n=4)
        master, placement, ops = a.master, a.master.placement, a.ops["n1"]
        deferred, victim, key, _ = _defer_one(a)
        master.leases.pin(victim)                   # another holder (a copy round, a reader)
        assert master.remove([key]) == 1
        ops.broken = True                           # the move fails: settled as a refusal
        placement.send_deferred(deferred)
        ops.broken = False
        placement.settle_deferred(deferred, master.leases.unpin)
        # still held: unlinked, not freed, not evicted twice
        assert (int(master.index.state[victim]), int(master.index.leases[victim])) == (State.DOOMED, 1)
        assert not placement.in_flight(victim) and master.stats()["evictions"]["dram"] == 0
        assert master.leases.unpin(victim)
        placement.forget(victim)                    # what the last holder does
        assert master.inspect([key]) == [None] and int(master.index.state[victim]) == State.FREE
        master.index.check_invariants()
    finally:
        a.close()


def test_a_copy_round_during_a_deferred_move_leaves_its_object_alone(tmp_path):
    """A node with HBM (host memory standing in for it: tests/store/test_hbm_tier.py), DRAM and the inclusive SSD
    tier. A put on a full HBM tier moves its coldest object to DRAM (a byte copy, after the lock: its HBM extent is
    the put's grant), and that object keeps its SSD copy, not written yet. A copy round meanwhile must not write the
    copy from its DRAM extent, which the move has not filled: it would mark a copy of wrong bytes clean."""
    from tests.store.test_hbm_tier import OBJ, HostHbm, payload
    from tests.store.test_hbm_tier import key as hkey

    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=2 * OBJ, shm_dir=str(tmp_path),
                                  ssd_path=str(tmp_path / "ssd"), ssd_bytes=16 * 2 * OBJ), hbm=HostHbm(2 * OBJ))
    ops = Counted(node)
    master = Master(MasterConfig(write_behind=True))
    master.register_node(node.info(), ops, expires=False)
    try:
        def put(i: int) -> None:
            (r,) = master.put_start([hkey(i)], [OBJ])
            data = payload(i)
            loc = r.grant.location
            node.write(loc.tier, loc.offset, hkey(i), b"\0" * 16, data, xxhash.xxh3_64_intdigest(data))
            assert master.put_commit([r.grant.grant_id], [xxhash.xxh3_64_intdigest(data)]) == [True]

        put(1)
        put(2)
        copied: list[int] = []

        def during_demote(moves):
            ops.on_demote = None
            assert [(m.key, m.src_tier, m.dst_tier) for m in moves] == [(hkey(1), Tier.HBM, Tier.DRAM)]
            thread = threading.Thread(target=lambda: copied.append(master.copy_pending()), daemon=True)
            thread.start()
            thread.join(30)

        ops.on_demote = during_demote
        put(3)
        assert copied == [1]                            # 2's copy only: 1 was in flight
        assert [r.tier for r in master.inspect([hkey(i) for i in (1, 2, 3)])] == [Tier.DRAM, Tier.HBM, Tier.HBM]
        assert master.copy_pending() == 2               # 1's copy, from the bytes its move put in DRAM, and 3's
        slot = master.index.slot_of(hkey(1))
        out = bytearray(OBJ)
        assert node.read_into(Tier.SSD, master.placement.copies.offset(slot), hkey(1), OBJ, out)
        assert bytes(out) == payload(1).tobytes()
        assert int(master.index.leases.sum()) == 0
        master.index.check_invariants()
    finally:
        node.close()
