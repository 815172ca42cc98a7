"""A node leaving the pool (an admin's `kvpool drain --no-migrate`, a node silent past node_ttl_s, a node restarting as
a new process) is taken out in one short hold of the master's lock: from then on its objects are misses for every
caller (they turn LEAVING, which no reader takes for committed). They are then forgotten `queries.REMOVAL_CHUNK` per
hold, the other clients answered between chunks, all of them before the call returns. A key put again, or reported
by a restarted node, before its turn is forgotten first. Real master and nodes in this process
(tests/store/test_node_calls.py's Pool); the chunk size is made small so that 12 objects are 3 chunks."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import queries
from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.index import COMMITTED, DOOMED, LEAVING
from kvpool.store.master import Master
from kvpool.store.master_server import MasterServer, MasterServerConfig
from kvpool.store.metadata import MemoryMetadata
from kvpool.store.node import StorageNode
from kvpool.store.records import PutStatus
from kvpool.store.registry import DisconnectedOps
from kvpool.store.tenants import Quota
from kvpool.tiers.types import Tier
from tests.store.test_node_calls import Counted, Pool, chain_key, payload

KEYS = [chain_key(0, i) for i in range(12)]     # on n1, the node that leaves
OTHER = [chain_key(1, i) for i in range(4)]     # on n2, which stays


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(queries, "REMOVAL_CHUNK", 4)


def _pool(tmp_path, **cfg) -> Pool:
    pool = Pool(tmp_path, "a", [("n1", 16, 16), ("n2", 16, 0)], batched=True, **cfg)
    assert pool.put(KEYS, prefer="n1") == [PutStatus.STORED] * 12
    assert pool.put(OTHER, prefer="n2") == [PutStatus.STORED] * 4
    assert {r.node_id for r in pool.master.inspect(KEYS)} == {"n1"}
    return pool


def _between_chunks(pool: Pool, probe) -> list:
    """Call `probe()` each time the removal lets the lock go between two chunks; returns its answers."""
    seen: list = []
    pool.master.between_chunks = lambda: seen.append(probe())
    return seen


def _states(pool: Pool, number: int) -> list[int]:
    index = pool.master.index
    slots = index.slots()
    return sorted(int(s) for s in index.state[slots[index.node[slots] == number]])


def test_a_removed_node_s_objects_are_misses_at_once_and_forgotten_chunk_by_chunk(tmp_path):
    pool = _pool(tmp_path)
    master = pool.master
    removed = master.placement.node("n1")
    number = removed.number
    where = master.inspect(KEYS)

    def probe():
        master.index.check_invariants()             # LEAVING objects no longer counted as bytes held
        return (master.contains(KEYS), master.lookup(KEYS, lease=False).hits, master.inspect(KEYS[:2]),
                [r.key for r in master.list_objects()[0]], master.lookup(OTHER, lease=False).hits,
                _states(pool, number), master.stats()["objects"], master.stats()["leaving_objects"])

    seen = _between_chunks(pool, probe)
    assert master.remove_node("n1") == 12
    # between the chunks: every object of n1 a miss for every reader, those not forgotten yet still LEAVING; n2's
    # objects served as before
    listed = sorted(OTHER)
    assert seen == [([False] * 12, 0, [None, None], listed, 4, [LEAVING] * 8, 4, 8),
                    ([False] * 12, 0, [None, None], listed, 4, [LEAVING] * 4, 4, 4)]
    assert _states(pool, number) == [] and master.placement.by_number[number] is None
    assert master.placement.leaving == 0 and len(master.index) == 4
    master.index.check_invariants()
    # nothing reaches the process that left (a call still queued for it goes nowhere), and nothing was erased or moved
    # there: each object's bytes are where they were
    assert isinstance(removed.ops, DisconnectedOps) and removed.leaving
    for r in where:
        out = bytearray(r.size)
        assert pool.nodes["n1"].read_into(r.tier, r.offset, r.key, r.size, out)
        assert bytes(out) == payload(r.key, r.size).tobytes()


def test_a_key_put_again_during_the_removal_is_stored_and_kept(tmp_path):
    pool = _pool(tmp_path)
    master = pool.master
    again = KEYS[10:]      # in the last chunk: still LEAVING when they are put again

    def probe():
        if not master.contains(again[:1])[0]:
            assert pool.put(again) == [PutStatus.STORED] * 2        # granted afresh (on n2), not EXISTS
        return master.contains(KEYS)

    seen = _between_chunks(pool, probe)
    assert master.remove_node("n1") == 12
    assert seen == [[False] * 10 + [True] * 2] * 2
    assert master.contains(KEYS) == [False] * 10 + [True] * 2       # the last chunk passed them by
    assert [r.node_id for r in master.inspect(again)] == ["n2", "n2"]
    assert pool.check_bytes(again) == 2
    master.index.check_invariants()


def test_an_object_read_while_its_node_leaves_is_freed_by_its_last_release(tmp_path):
    pool = _pool(tmp_path)
    master = pool.master
    number = master.placement.node("n1").number
    lease = master.lookup(KEYS[5:6])
    assert lease.hits == 1
    assert master.remove_node("n1") == 12
    assert _states(pool, number) == [DOOMED]                        # the reader's lease still names it
    master.index.check_invariants()                                 # its bytes held (counted) until the release
    assert master.contains(KEYS[5:6]) == [False]
    assert master.release([lease.lease_id]) == 1
    assert _states(pool, number) == [] and len(master.index) == 4
    master.index.check_invariants()


def test_a_restarted_node_s_old_objects_are_gone_before_it_reports_its_ssd_records(tmp_path):
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True)        # SSD only: its records outlive the process
    master = pool.master
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    old = master.placement.node("n1").number
    pool.nodes["n1"].close()
    node = StorageNode(pool.nodes["n1"].config)                     # the same SSD file, a new incarnation
    pool.nodes["n1"], pool.ops["n1"] = node, Counted(node)
    seen = _between_chunks(pool, lambda: (master.contains(KEYS), _states(pool, old),
                                          master.placement.node("n1").number != old))
    master.register_node(node.info(), pool.ops["n1"], expires=False)
    # the new process was registered from the first hold; the old objects were misses meanwhile
    assert seen == [([False] * 12, [LEAVING] * 8, True), ([False] * 12, [LEAVING] * 4, True)]
    # the register returned once they were all forgotten (the chunks above ran inside it): the report adopts them all
    result = master.report_objects("n1", node.scan_ssd())
    assert (result.adopted, result.known, result.dropped_keys) == (12, 0, [])
    assert master.contains(KEYS) == [True] * 12 and pool.check_bytes(KEYS) == 12
    assert {r.tier for r in master.inspect(KEYS)} == {Tier.SSD}
    master.index.check_invariants()


def test_a_silent_node_is_a_miss_from_the_reap_that_drops_it_and_forgotten_by_the_next_reap(tmp_path):
    pool = _pool(tmp_path, node_ttl_s=10.0)
    master = pool.master
    node = StorageNode(NodeConfig(node_id="n3", dram_bytes=16 * 4096, shm_dir=str(tmp_path / "a")))
    pool.nodes["n3"], pool.ops["n3"] = node, Counted(node)
    master.register_node(node.info(), pool.ops["n3"])                # expires: dropped when silent
    keys = [chain_key(2, i) for i in range(6)]
    assert pool.put(keys, prefer="n3") == [PutStatus.STORED] * 6
    number = master.placement.node("n3").number
    master.heartbeat("n1"), master.heartbeat("n2")
    pool.clock.now += 11
    # a lookup's own reap drops n3 (the lock is held for that call): its objects are misses in that same answer
    assert master.lookup(keys, lease=False).hits == 0
    assert "n3" not in master.stats()["nodes"] and _states(pool, number) == [LEAVING] * 6
    assert master.reap()["nodes"] == 0                               # the reaper's next round forgets them
    assert _states(pool, number) == [] and master.placement.by_number[number] is None
    master.index.check_invariants()


def test_a_tenant_s_objects_on_a_removed_node_leave_its_quota_at_once(tmp_path):
    pool = Pool(tmp_path, "a", [("n1", 16, 16), ("n2", 16, 0)], batched=True,
                quotas={"acme": Quota(total_bytes=16 * 4096)})
    master = pool.master
    assert pool.put(KEYS, prefer="n1", tenant="acme") == [PutStatus.STORED] * 12
    assert pool.put(OTHER, prefer="n2", tenant="acme") == [PutStatus.STORED] * 4     # at its quota
    lists = master.placement.track
    assert len(lists) == 16
    more = [chain_key(3, i) for i in range(4)]

    def probe():
        if not master.contains(more[:1], tenant="acme")[0]:
            # the 12 leaving no longer count: these fit without evicting any of acme's other objects
            assert pool.put(more, prefer="n2", tenant="acme") == [PutStatus.STORED] * 4
        tenant = master.stats()["tenants"]["acme"]
        return tenant["objects"], tenant["quota_evictions"]

    seen = _between_chunks(pool, probe)
    assert master.remove_node("n1") == 12
    assert seen == [(8, 0), (8, 0)]
    assert master.contains(OTHER + more, tenant="acme") == [True] * 8
    assert len(lists) == 8 and master.stats()["tenants"]["acme"]["objects"] == 8
    tid = master.tenants.id_of("acme")
    others = sorted(master.index.find(k) for k in pool.stored(OTHER + more, "acme"))
    assert sorted(lists.victims(tid, int(Tier.DRAM))) == others
    assert all(master.index.state[s] == COMMITTED for s in others)
    master.index.check_invariants()


def test_a_node_dropped_by_a_lookup_s_reap_and_restarted_re_adopts_its_ssd_records(tmp_path):
    pool = Pool(tmp_path, "a", [], batched=True, node_ttl_s=10.0)
    master = pool.master
    config = NodeConfig(node_id="n3", dram_bytes=0, ssd_path=str(tmp_path / "a" / "ssd-n3"), ssd_bytes=32 * 4096)
    node = StorageNode(config)
    pool.nodes["n3"], pool.ops["n3"] = node, Counted(node)
    master.register_node(node.info(), pool.ops["n3"])
    keys = [chain_key(2, i) for i in range(6)]
    assert pool.put(keys, prefer="n3") == [PutStatus.STORED] * 6
    pool.clock.now += 11
    assert master.lookup(keys, lease=False).hits == 0               # its reap dropped n3: LEAVING, not forgotten yet
    node.close()
    node = StorageNode(config)                                      # the node restarts before the reaper's round
    pool.nodes["n3"], pool.ops["n3"] = node, Counted(node)
    master.register_node(node.info(), pool.ops["n3"])
    result = master.report_objects("n3", node.scan_ssd())           # its records: no conflict with the LEAVING ones
    assert (result.adopted, result.dropped_keys) == (6, [])
    assert master.contains(keys) == [True] * 6 and pool.check_bytes(keys) == 6
    master.reap()
    assert master.contains(keys) == [True] * 6 and master.placement.leaving == 0
    master.index.check_invariants()


def _served(server, incarnation: str) -> pb.NodeEndpoint:
    """Register node n1 (an endpoint of `incarnation` nobody listens at: the master only indexes here) through
    `server`'s RegisterNode and index KEYS on it; returns its endpoint."""
    ep = pb.NodeEndpoint(node_id="n1", host_id="h", data_address="127.0.0.1:9", control_address="127.0.0.1:9",
                         alignment=4096, incarnation=incarnation,
                         tiers=[pb.TierCapacity(tier=pb.DRAM, capacity_bytes=64 * 4096)])
    with grpc.insecure_channel(server.address) as ch:
        pbg.MasterServiceStub(ch).RegisterNode(pb.RegisterNodeRequest(node=ep), timeout=5)
    grants = server.master.put_start(KEYS, [4096] * 12)
    assert server.master.put_commit([r.grant.grant_id for r in grants], [7] * 12) == [True] * 12
    return ep


def _register_during(server, master, stub, ep) -> tuple[list, list, threading.Thread]:
    """At the removal's first pause between chunks (the master's lock free), send RegisterNode(ep) from another
    thread (a heartbeat told the process to register again, or a new process of the node starts) and give it a second
    to be answered; returns (its answer once it comes, what had come by then, the thread)."""
    answer: list = []
    by_pause: list = []

    def register():
        try:
            answer.append(stub.RegisterNode(pb.RegisterNodeRequest(node=ep), timeout=30).epoch)
        except grpc.RpcError as err:
            answer.append((err.code().name, err.details()))

    thread = threading.Thread(target=register, daemon=True)

    def pause():
        if thread.ident is None:
            thread.start()
            thread.join(1.0)                # bounded: the answer must NOT come while the removal runs
            by_pause.append(list(answer))

    master.between_chunks = pause
    return answer, by_pause, thread


@pytest.mark.parametrize("incarnation", ["one", "two"])
def test_a_registration_during_a_drain_s_removal_waits_for_it(incarnation):
    """`kvpool drain NODE --no-migrate` (DrainNode) with RegisterNode of the same node id sent during the removal
    (the drained process told by a heartbeat to register again, or a new process of the node): it is answered once
    the removal ends, not before (else the removal's end would close the channel of a node the master serves). The
    drained process ("one") is refused; a new one ("two") is registered as a new node, routed to and placed on."""
    server = MasterServer(MasterServerConfig(listen="127.0.0.1:0")).start()
    try:
        ep = pb.NodeEndpoint()
        ep.CopyFrom(_served(server, "one"))
        ep.incarnation = incarnation
        master = server.master
        with grpc.insecure_channel(server.address) as ch:
            stub = pbg.MasterServiceStub(ch)
            answer, by_pause, thread = _register_during(server, master, stub, ep)
            assert stub.DrainNode(pb.DrainNodeRequest(node_id="n1"), timeout=30).objects_dropped == 12
            thread.join(30)
            assert by_pause == [[]]                 # not answered while the removal ran
            assert master.contains(KEYS) == [False] * 12
            if incarnation == "one":
                assert answer == [("FAILED_PRECONDITION",
                                   "node_id 'n1' was drained; restart the node process to rejoin")]
                assert master.node_ids() == []
            else:
                assert len(answer) == 1 and isinstance(answer[0], int) and master.node_ids() == ["n1"]
                assert server.stats()["endpoints"]["n1"]["connected"] is True   # routed to (Hello lists it)
                grants = master.put_start(KEYS[:1], [4096])                 # placed on the new process
                assert grants[0].grant.location.node_id == "n1"
    finally:
        server.stop(0)


def test_a_restarted_node_s_old_records_leave_the_journal_at_once(tmp_path):
    """A master started on the same journal while the old objects are being forgotten (the first one died) must not
    take them for the new process's."""
    meta = MemoryMetadata(persistent=True)
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, metadata=meta)
    master = pool.master
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    pool.nodes["n1"].close()
    node = StorageNode(pool.nodes["n1"].config)                     # the same SSD file, a new incarnation
    pool.nodes["n1"], pool.ops["n1"] = node, Counted(node)
    seen = _between_chunks(pool, lambda: Master(MasterConfig(), meta, clock=pool.clock).contains(KEYS))
    master.register_node(node.info(), pool.ops["n1"], expires=False)
    assert seen == [[False] * 12] * 2
    assert [n.incarnation for n in meta.load_nodes()] == [node.incarnation]


def test_a_silent_node_s_records_leave_the_journal_with_it(tmp_path):
    meta = MemoryMetadata(persistent=True)
    pool = Pool(tmp_path, "a", [], batched=True, metadata=meta, node_ttl_s=10.0)
    master = pool.master
    node = StorageNode(NodeConfig(node_id="n3", dram_bytes=16 * 4096, shm_dir=str(tmp_path / "a")))
    pool.nodes["n3"], pool.ops["n3"] = node, Counted(node)
    master.register_node(node.info(), pool.ops["n3"])
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    assert Master(MasterConfig(), meta, clock=pool.clock).contains(KEYS) == [True] * 12
    pool.clock.now += 11
    # a lookup's own reap drops n3 (it writes nothing to the journal) and wakes the server's reaper
    assert master.lookup(KEYS, lease=False).hits == 0 and master.leaving_wanted.is_set()
    # the reaper's round deletes n3's records in one call before it forgets the objects a chunk at a time: a master
    # started on the journal between two chunks finds none of them (n3 itself it still knows, as before: it gets a
    # grace period to register again)
    seen = _between_chunks(pool, lambda: Master(MasterConfig(), meta, clock=pool.clock).contains(KEYS))
    master.reap()
    assert seen == [[False] * 12] * 2
    assert [n.node_id for n in meta.load_nodes()] == ["n3"]
    assert not master.leaving_wanted.is_set() and master.placement.leaving == 0


def test_a_stopping_master_leaves_a_removal_s_remaining_chunks_and_joins_its_reaper():
    """The reaper is forgetting a silent node's objects a chunk at a time when the server stops: `stop()` ends the
    RPCs, then the removal stops at its next chunk and the reaper thread has ended before the journal is closed
    (it used to run on, and log "reap failed" writing to a closed Redis client)."""
    before = {t for t in threading.enumerate() if t.name == "kvpool-reaper"}
    server = MasterServer(MasterServerConfig(listen="127.0.0.1:0", node_ttl_s=0.4, heartbeat_s=0.1)).start()
    (reaper,) = {t for t in threading.enumerate() if t.name == "kvpool-reaper"} - before
    master = server.master
    entered, left, alive_at_close = threading.Event(), [], []

    def pause():                                    # between two chunks, in the reaper thread
        entered.set()
        left.append(master.closing.wait(30))
        time.sleep(0.2)                             # the reaper still busy a little after the stop began

    stop_recording = master.stop_recording

    def closing_down():                             # what stop() closes once the threads have ended
        alive_at_close.append(reaper.is_alive())
        return stop_recording()

    master.between_chunks = pause
    master.stop_recording = closing_down
    _served(server, "one")                          # a node that never heartbeats
    assert entered.wait(30)                         # silent past node_ttl_s: dropped, 4 of 12 forgotten
    server.stop(0)
    assert alive_at_close == [False] and left == [True] and not reaper.is_alive()
    assert master.placement.leaving == 8            # the rest left to the process's end
