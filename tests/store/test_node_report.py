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
import time

import pytest

from kvpool import PoolClient
from kvpool.admin import AdminClient
from kvpool.store.config import MasterConfig, NodeConfig, NodeServerConfig
from kvpool.store.master import Master
from kvpool.store.master_server import MasterServer, MasterServerConfig
from kvpool.store.metadata import MemoryMetadata
from kvpool.store.node import Drop, StorageNode
from kvpool.store.node_server import NodeServer
from kvpool.store.records import PutStatus
from kvpool.tiers.types import Tier
from tests.store.cluster import redis_server  # noqa: F401 - fixture
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


# ---------------------------------------------------------------- removal tombstones (store/tombstones.py)

def _away_and_back(pool: Pool, purge) -> tuple[StorageNode, list[bytes]]:
    """n1 holds KEYS on its SSD and leaves the pool (removed, its records kept); `purge(master)` runs while it is
    away; a new process of n1 registers and reports. Returns the node and the keys its report had dropped (the node
    erases them)."""
    master = pool.master
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    assert master.remove_node("n1") == 12                   # away: its objects are misses, its file keeps them
    purge(master)
    node = _restart(pool, "n1", reports=True)
    records = node.scan_ssd()
    assert len(records) == 12
    result = master.report_objects("n1", records, last=True)
    node.drop([Drop(r.key, Tier.SSD, r.offset, r.size) for r in records if r.key in result.dropped_keys])
    assert result.adopted == 12 - len(result.dropped_keys)
    return node, sorted(result.dropped_keys)


def test_a_report_with_a_bad_write_time_is_refused_naming_it_before_anything_is_adopted(tmp_path):
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False)
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    node = _restart(pool, "n1", reports=True)
    records = node.scan_ssd()
    for bad in (-1, 2**64, True, 1.0):
        with pytest.raises(ValueError, match=r"^written_us\[3\] must be an int in \[0, 2\*\*64\)"):
            pool.master.report_objects("n1", records[:3] + [dataclasses.replace(records[3], written_us=bad)])
    assert pool.master.contains(KEYS) == [False] * 12


def test_a_key_removed_while_its_node_was_away_stays_removed_when_the_node_comes_back(tmp_path):
    """Before tombstones the master, which no longer knew the key, adopted the returning node's record: the removed
    key was a hit again."""
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False)
    removed = []
    node, dropped = _away_and_back(pool, lambda m: removed.append(m.remove(KEYS[:3])))
    assert removed == [0]                                   # unknown to the master, tombstoned all the same
    assert dropped == sorted(KEYS[:3])
    assert pool.master.contains(KEYS) == [False] * 3 + [True] * 9
    assert pool.check_bytes(KEYS[3:]) == 9
    assert sorted(r.key for r in node.scan_ssd()) == sorted(KEYS[3:])   # the stale records are erased
    stats = pool.master.stats()
    assert (stats["tombstones"], stats["tombstones_folded"], stats["records_refused"]) == (3, 0, 3)


def _tenants_away_and_back(pool: Pool, purge) -> tuple[StorageNode, list[bytes]]:
    """As `_away_and_back`, with KEYS[:4] tenant acme's, KEYS[4:8] beta's and KEYS[8:] unscoped (an admin's)."""
    master = pool.master
    for keys, tenant in ((KEYS[:4], "acme"), (KEYS[4:8], "beta"), (KEYS[8:], "")):
        assert pool.put(keys, tenant=tenant) == [PutStatus.STORED] * 4
    assert master.remove_node("n1") == 12
    purge(master)
    node = _restart(pool, "n1", reports=True)
    result = master.report_objects("n1", node.scan_ssd(), last=True)
    assert result.adopted == 12 - len(result.dropped_keys)
    return node, sorted(result.dropped_keys)


def _contains(pool: Pool) -> list[bool]:
    master = pool.master
    return (master.contains(KEYS[:4], tenant="acme") + master.contains(KEYS[4:8], tenant="beta")
            + master.contains(KEYS[8:]))


def test_a_tenant_s_key_removed_while_its_node_was_away_stays_removed(tmp_path):
    """A tenant's removal tombstones every key it names in its own key space, known to the master or not (before:
    only the objects it removed, so its keys held only by a node that was away came back)."""
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False)
    removed = []
    _, dropped = _tenants_away_and_back(pool, lambda m: removed.extend([
        m.remove(KEYS[:2] + MORE, tenant="acme"), m.remove(KEYS[5:6], tenant="beta")]))
    assert removed == [0, 0]                                # unknown to the master, tombstoned all the same
    assert dropped == sorted(pool.stored(KEYS[:2], "acme") + pool.stored(KEYS[5:6], "beta"))
    assert _contains(pool) == [False, False, True, True, True, False, True, True] + [True] * 4
    stats = pool.master.stats()
    assert (stats["tombstones"], stats["tombstones_folded"], stats["records_refused"]) == (7, 0, 3)


def test_a_tenant_that_names_many_keys_folds_them_into_its_own_key_space(tmp_path):
    """Past `max_tenant_tombstones` a tenant's oldest tombstones fold into its own key space's slots: its removed
    keys stay removed, and its other records, another tenant's and the pool's are kept; the pool's own limit is
    untouched."""
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False, max_tombstones=4,
                max_tenant_tombstones=4)
    never_stored = [[chain_key(5 + i, j) for j in range(5)] for i in range(3)]
    _, dropped = _tenants_away_and_back(pool, lambda m: [m.remove(KEYS[9:10]), m.remove(KEYS[:2], tenant="acme")] + [
        m.remove(keys, tenant="acme") for keys in never_stored])
    assert dropped == sorted(pool.stored(KEYS[:2], "acme") + KEYS[9:10])
    assert _contains(pool) == [False, False, True, True] + [True] * 4 + [True, False, True, True]
    stats = pool.master.stats()
    # each call of 5 went past 4: acme's 2 and then every 5 folded (17); the admin's one tombstone kept
    assert (stats["tombstones"], stats["tombstones_folded"], stats["records_refused"]) == (1, 17, 3)


def test_an_admin_s_folded_tombstones_refuse_their_keys_records_not_every_record_from_before(tmp_path):
    """Past `max_tombstones` the oldest fold into slots by key: a restarted node keeps its records of keys never
    removed (until 2026-12-06 the fold raised one floor, and every record written before it was refused)."""
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False, max_tombstones=4)
    never_stored = [chain_key(7, j) for j in range(5)]
    _, dropped = _away_and_back(pool, lambda m: [m.remove(KEYS[:1]), m.remove(never_stored)])
    assert dropped == KEYS[:1]
    assert pool.master.contains(KEYS) == [False] + [True] * 11
    assert pool.check_bytes(KEYS[1:]) == 11
    stats = pool.master.stats()
    assert (stats["tombstones"], stats["tombstones_folded"], stats["records_refused"]) == (0, 6, 1)


def test_an_admin_tombstones_every_key_it_names(tmp_path):
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False)
    master = pool.master
    assert master.remove(MORE) == 0
    assert master.stats()["tombstones"] == 4


@pytest.mark.parametrize("purge", ["namespace", "everything"])
def test_a_namespace_or_everything_evicted_while_its_node_was_away_stays_evicted(tmp_path, purge):
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False)
    if purge == "namespace":
        _, dropped = _away_and_back(pool, lambda m: m.evict(ns_digest=b"\0" * 16))  # the records' namespace
    else:
        _, dropped = _away_and_back(pool, lambda m: m.evict(older_than_s=0))
    assert dropped == sorted(KEYS)
    assert pool.master.contains(KEYS) == [False] * 12


def test_an_idle_evict_is_not_a_purge_and_leaves_no_tombstone(tmp_path):
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False)
    _, dropped = _away_and_back(pool, lambda m: m.evict(ns_digest=b"\0" * 16, older_than_s=1.0))
    assert dropped == [] and pool.master.contains(KEYS) == [True] * 12


def test_a_key_put_again_after_its_removal_is_adopted_from_a_restarted_node(tmp_path):
    """The rule refuses records written before the removal, not the key: one written after it comes back."""
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False)
    master = pool.master
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    assert master.remove(KEYS[:3]) == 3
    assert pool.put(KEYS[:2]) == [PutStatus.STORED] * 2     # its node has heard a time after the removal
    node = _restart(pool, "n1", reports=True)
    result = master.report_objects("n1", node.scan_ssd(), last=True)
    assert (result.adopted, result.dropped_keys) == (11, [])
    assert master.contains(KEYS) == [True, True, False] + [True] * 9


def test_a_removed_key_whose_drop_failed_is_not_revived_by_a_new_process_of_its_node(tmp_path):
    """The node was in the pool but its Drop failed (unreachable for a moment): its record stayed. Its next process
    reports it; the master had forgotten the key, and only the tombstone tells it the record is stale."""
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False)
    master = pool.master
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    pool.ops["n1"].broken = True
    assert master.remove(KEYS[:2]) == 2
    pool.ops["n1"].broken = False
    node = _restart(pool, "n1", reports=True)
    records = node.scan_ssd()
    assert len(records) == 12                                # the two records the Drop did not erase are there
    result = master.report_objects("n1", records, last=True)
    assert (result.adopted, sorted(result.dropped_keys)) == (10, sorted(KEYS[:2]))
    assert master.contains(KEYS) == [False] * 2 + [True] * 10


@pytest.mark.parametrize("backend", ["memory-journal", "redis"])
def test_tombstones_survive_a_master_restart_on_its_journal(tmp_path, backend, request):
    if backend == "redis":
        from kvpool.store.redis_metadata import RedisMetadata
        meta = RedisMetadata(request.getfixturevalue("redis_server").url, prefix="tomb")
    else:
        meta = MemoryMetadata(persistent=True)
    pool = Pool(tmp_path, "a", [("n1", 0, 16)], batched=True, write_behind=False, metadata=meta)
    assert pool.put(KEYS) == [PutStatus.STORED] * 12
    assert pool.master.remove_node("n1") == 12
    assert pool.master.remove(KEYS[:3]) == 0
    restarted = Master(MasterConfig(write_behind=False), meta, clock=pool.clock, token_secret=b"s" * 32)
    assert restarted.stats()["tombstones"] == 3
    pool.nodes["n1"].close()
    node = StorageNode(pool.nodes["n1"].config)
    node.heard_master_time(restarted.time_us())
    restarted.register_node(dataclasses.replace(node.info(), reports_ssd=True), Counted(node), expires=False)
    result = restarted.report_objects("n1", node.scan_ssd(), last=True)
    assert (result.adopted, sorted(result.dropped_keys)) == (9, sorted(KEYS[:3]))
    assert restarted.contains(KEYS) == [False] * 3 + [True] * 9
    node.close()


def test_the_node_process_stamps_its_ssd_records_with_the_master_time_it_heard(tmp_path):
    """Registration and every heartbeat reply carry the master's time; a record written after carries the last one
    heard: never later than the write (the rule's premise), and later than the registration's."""
    server = MasterServer(MasterServerConfig(listen="127.0.0.1:0")).start()
    before = server.master.time_us()
    node = NodeServer(NodeServerConfig(node_id="n1", master=server.address, listen="127.0.0.1:0", dram_bytes=0,
                                       ssd_path=str(tmp_path / "ssd"), ssd_bytes=64 * K, shm_dir=str(tmp_path),
                                       heartbeat_s=0.05))
    try:
        node.start()
        assert node.registered.wait(30)
        registered = node.node.master_time_us
        assert registered > before
        deadline = time.monotonic() + 30
        while node.node.master_time_us == registered and time.monotonic() < deadline:   # the next heartbeat
            time.sleep(0.01)
        heard = node.node.master_time_us
        assert heard > registered
        with PoolClient(server.address, timeout=10) as client:
            assert client.put_many(MORE[:1], [b"x" * K]) == ["stored"]
        after = server.master.time_us()
        [record] = node.node.scan_ssd()
        assert heard <= record.written_us < after
    finally:
        node.stop(0)
        server.stop(0)
