"""A restarted node reports the records it finds on its SSD after it registers. Until the report's last batch the
master does not know which of its SSD extents hold them, so it places nothing there (store/registry.py
`reporting`): a put given such an extent overwrote a record about to be adopted, and the report then dropped it, so
the restart lost objects it had kept. A node says it will report (`NodeInfo.reports_ssd`, set by
store/node_server.py) and marks its last batch (`ReportObjectsRequest.last`); a node that never does is placed on
again after `MasterConfig.grace_s`, and a node from before 2026-12-06 (it does not say it) at once, as before.
The same process registering again (its master restarted on the journal) adopts no key the master does not know:
such a record's erase was lost, and reviving it would bring a removed object back."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.admin import AdminClient
from kvpool.store.config import MasterConfig, NodeConfig, NodeServerConfig
from kvpool.store.master import Master
from kvpool.store.master_server import MasterServer, MasterServerConfig
from kvpool.store.metadata import MemoryMetadata
from kvpool.store.node import Drop, StorageNode
from kvpool.store.node_server import NodeServer
from kvpool.store.records import PutStatus
from kvpool.tiers.types import Tier
from tests.store.test_node_calls import K, Counted, Pool, chain_key

KEYS = [chain_key(0, i) for i in range(12)]     # on n1's SSD when it restarts
MORE = [chain_key(1, i) for i in range(4)]      # put while it reports


def _restart(pool: Pool, name: str, *, reports: bool) -> StorageNode:
    """n1's process restarts (a new incarnation, the same SSD file) and registers."""
    pool.nodes[name].close()
    node = StorageNode(pool.nodes[name].config)
    pool.nodes[name], pool.ops[name] = node, Counted(node)
    info = dataclasses.replace(node.info(), reports_ssd=reports)
    pool.master.register_node(info, pool.ops[name], expires=False)
    return node


def test_nothing_is_placed_on_a_restarted_node_until_its_report_s_last_batch(tmp_path):
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False)
    master = pool.master
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    n2 = StorageNode(NodeConfig(node_id="n2", dram_bytes=0, ssd_path=str(tmp_path / "a" / "ssd-n2"),
                                ssd_bytes=32 * K))
    pool.nodes["n2"], pool.ops["n2"] = n2, Counted(n2)
    master.register_node(n2.info(), pool.ops["n2"], expires=False)
    node = _restart(pool, "n1", reports=True)
    assert master.contains(KEYS) == [False] * 12 and master.stats()["reporting"] == ["n1"]
    records = node.scan_ssd()
    assert len(records) == 12
    # a put that prefers n1 (the emptier node as far as the master knows) lands on n2, before and between batches
    where = []
    for batch, last in ((records[:6], False), (records[6:], True)):
        where += [r.grant.location.node_id for r in master.put_start(MORE[:2] if not where else MORE[2:], [K] * 2,
                                                                     prefer_node="n1")]
        result = master.report_objects("n1", batch, last=last)
        assert (result.adopted, result.dropped_keys) == (6, [])
    assert where == ["n2"] * 4
    assert master.contains(KEYS) == [True] * 12 and pool.check_bytes(pool.stored(KEYS, "")) == 12
    assert master.stats()["reporting"] == []        # placed on again
    master.index.check_invariants()


def test_a_node_that_never_ends_its_report_is_placed_on_after_grace_s(tmp_path):
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False, reload_grace_s=40.0)
    master = pool.master
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    node = _restart(pool, "n1", reports=True)
    with pytest.raises(ValueError, match="last must be a bool, got 1"):    # checked before anything is adopted
        master.report_objects("n1", node.scan_ssd(), last=1)
    assert master.contains(KEYS) == [False] * 12 and master.stats()["reporting"] == ["n1"]
    master.report_objects("n1", node.scan_ssd()[:5])                  # and nothing more
    assert [r.status for r in master.put_start(MORE, [K] * 4)] == [PutStatus.NO_SPACE] * 4
    pool.clock.now += 39.0
    assert [r.status for r in master.put_start(MORE, [K] * 4)] == [PutStatus.NO_SPACE] * 4
    pool.clock.now += 1.0
    assert [r.status for r in master.put_start(MORE, [K] * 4)] == [PutStatus.STORED] * 4


def test_a_node_that_does_not_say_it_reports_is_placed_on_at_once(tmp_path):
    """A node from before 2026-12-06: as before, a put may take the extent of a record it has not reported yet; the
    report then drops that record (the new object's bytes are there now), and nothing wrong is served."""
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False)
    master = pool.master
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    node = _restart(pool, "n1", reports=False)
    records = node.scan_ssd()
    assert pool.put(MORE) == [PutStatus.STORED] * 4                    # on n1, over 4 of its unreported records
    result = master.report_objects("n1", records, last=True)
    assert (result.adopted, len(result.dropped_keys)) == (8, 4)
    assert pool.check_bytes(pool.stored(KEYS + MORE, "")) == 12


def test_the_node_process_says_it_reports_and_marks_its_last_batch(tmp_path):
    """A real NodeServer against a real MasterServer (both in this process): registered with `reports_ssd`, it
    reports its 12 records with the last batch marked; a put made while the report is on its way finds no room on
    it (the only node), one made after it is placed there; `kvpool nodes` shows it `reporting` meanwhile."""
    ssd = str(tmp_path / "ssd")
    seed = StorageNode(NodeConfig(node_id="n1", dram_bytes=0, ssd_path=ssd, ssd_bytes=64 * K))
    for i, key in enumerate(KEYS):      # what an earlier process of n1 left on its SSD
        seed.write(Tier.SSD, i * 2 * K, key, b"\0" * 16, bytes([i]) * K, None)
    seed.close()
    server = MasterServer(MasterServerConfig(listen="127.0.0.1:0")).start()
    master = server.master
    calls: list[tuple[int, bool, str, str]] = []
    report = master.report_objects
    admin = AdminClient(server.address)

    def spy(node_id, records, corrupt=0, *, last=False):
        # while the report is on its way: a put, and what `kvpool nodes` says
        status = master.put_start(MORE[:1], [K])[0].status.value
        calls.append((len(records), last, status, admin.nodes()[0]["state"]))
        return report(node_id, records, corrupt, last=last)

    master.report_objects = spy
    node = NodeServer(NodeServerConfig(node_id="n1", master=server.address, listen="127.0.0.1:0", dram_bytes=0,
                                       ssd_path=ssd, ssd_bytes=64 * K, shm_dir=str(tmp_path)))
    try:
        node.start()
        assert node.registered.wait(30)
        assert calls == [(12, True, "no_space", "reporting")]
        assert master.contains(KEYS) == [True] * 12 and admin.nodes()[0]["state"] == "alive"
        grant = master.put_start(MORE[:1], [K])[0].grant
        assert grant is not None and grant.location.node_id == "n1"
    finally:
        node.stop(0)
        server.stop(0)


def test_a_re_attached_node_s_report_does_not_revive_a_removed_object_whose_erase_was_lost(tmp_path):
    """An object removed while a reader held it is erased at its last release; a master that goes down before that
    never erases its record. The master restarted on its journal (which no longer has the object) and the same node
    process registers again and reports its records: that one is dropped (the node erases it), the others are
    known. A new process of the node (after it erased the record) finds nothing to revive either."""
    meta = MemoryMetadata(persistent=True)
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False, metadata=meta)
    master = pool.master
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    lease = master.lookup(KEYS[:1]).lease_id                       # a reader holds KEYS[0] ...
    assert master.remove(KEYS[:1]) == 1                            # ... when an admin removes it
    node = pool.nodes["n1"]
    assert KEYS[0] in {r.key for r in node.scan_ssd()}              # its record waits for the release ...
    del lease                                                       # ... which never comes: the master goes down
    restarted = Master(MasterConfig(write_behind=False), meta, clock=pool.clock, token_secret=b"s" * 32)
    restarted.register_node(dataclasses.replace(node.info(), reports_ssd=True), pool.ops["n1"], expires=False)
    records = node.scan_ssd()
    result = restarted.report_objects("n1", records, last=True)
    assert (result.known, result.adopted, result.dropped_keys) == (11, 0, [KEYS[0]])
    node.drop([Drop(r.key, Tier.SSD, r.offset, r.size) for r in records if r.key in result.dropped_keys])
    assert restarted.contains(KEYS) == [False] + [True] * 11
    # a new process of the node: its records are all adopted, and the removed one is not among them any more
    node.close()
    node = StorageNode(node.config)
    restarted.register_node(dataclasses.replace(node.info(), reports_ssd=True), Counted(node), expires=False)
    result = restarted.report_objects("n1", node.scan_ssd(), last=True)
    assert (result.known, result.adopted, result.dropped_keys) == (0, 11, [])
    assert restarted.contains(KEYS) == [False] + [True] * 11
    node.close()
