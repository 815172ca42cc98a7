"""The location cache for SSD records (kvpool/locations.py SsdLocation): a same-host client that reads a node's SSD
records from its data file itself remembers where they are, so a repeat get needs no master round trip. Each read
still checks the record (key, size, header and payload checksums) and the committed checksum; an entry is dated by
the node's removal generation (an SSD-only node keeps a one-page arena for it, store/node.py) and vouched for by its
lock. Real `kvpool up` pools in this process (LocalCluster on 127.0.0.1), exact per-method call counts at the
master."""

from __future__ import annotations

import os

import pytest

from kvpool import PoolClient
from kvpool.proto import kvpool_pb2 as pb
from kvpool.store.node import Publication
from kvpool.tiers.host_index import SSD_ROW
from kvpool.tiers.ssd import HEADER_BYTES
from kvpool.tiers.types import Tier
from tests.conftest import free_port
from tests.store.test_control_channel import wait_until

OBJ = 8 << 10
KEYS = [(0x5D << 120 | i).to_bytes(16, "big") for i in range(8)]
DATAS = [bytes([i + 1]) * OBJ for i in range(8)]


def bufs(n: int) -> list[bytearray]:
    return [bytearray(OBJ) for _ in range(n)]


def cache_report(c: PoolClient) -> dict:
    return c.stats()["client_location_cache"]


@pytest.fixture
def ssd_up(tmp_path, shm_path):
    """`kvpool up` with no DRAM tier: an SSD file of eight OBJ-byte records, no promotion on hit."""
    from kvpool.store.config import UpConfig
    from kvpool.store.local_cluster import LocalCluster

    cfg = UpConfig(listen=f"127.0.0.1:{free_port()}", http_listen="", shm_dir=str(shm_path), dram_bytes=0,
                   ssd_path=str(tmp_path / "ssd"), ssd_bytes=8 * (OBJ + HEADER_BYTES), promote_on_hit=False)
    cluster = LocalCluster(cfg).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_an_ssd_only_node_shares_a_generation_only_arena_and_no_dram(ssd_up, shm_path):
    node = ssd_up.node.node
    info = node.info()
    assert info.dram_bytes == 0 and node.dram is None
    assert os.path.dirname(info.dram_path) == str(shm_path) and os.path.getsize(info.dram_path) == 2 * 4096 + 256 * 64
    with PoolClient(ssd_up.address) as c:
        tiers: list[str] = []
        assert c.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert c.get_many_into(KEYS[:2], bufs(2), tiers_out=tiers) == 2 and tiers == ["ssd"] * 2
        assert [tiers.keys() for tiers in c.stats()["nodes"].values()] == [{"ssd"}]    # no DRAM tier listed
    ssd_up.stop()
    assert os.listdir(shm_path) == []                       # unlinked with the node


def test_repeat_ssd_gets_read_the_nodes_file_with_no_round_trip(ssd_up):
    calls = ssd_up.master.control.calls
    with PoolClient(ssd_up.address) as writer:
        assert writer.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4
    base = calls["Lookup"]
    # release_linger_s=60: no report is sent by the timer, so the counts below are exact; close() sends them
    # host_index_reads=False: the first get asks the master (the node's host index would name them too, below)
    with PoolClient(ssd_up.address, location_cache_s=60, release_linger_s=60, host_index_reads=False) as c:
        c.warm(prefault=False)          # the node's arena mapped before the first lookup: its answer is dated
        tiers: list[str] = []
        out = bufs(4)
        assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4 and out == [bytearray(d) for d in DATAS[:4]]
        assert calls["Lookup"] == base + 1 and tiers == ["ssd"] * 4
        assert c.transfers.direct_ssd_reads == 4
        for _ in range(3):
            out, tiers = bufs(4), []
            assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4
            assert out == [bytearray(d) for d in DATAS[:4]] and tiers == ["ssd"] * 4
        assert calls["Lookup"] == base + 1              # three gets, no round trip
        assert c.transfers.direct_ssd_reads == 16 and c.transfers.direct_ssd_retries == 0
        assert cache_report(c) == {"entries": 4, "gets": 3, "objects": 12, "stale": 0, "removed": 0}
    assert calls["Lookup"] == base + 2                  # close() sent the chain's report (uses 3)
    with PoolClient(ssd_up.address) as admin:
        s = admin.stats()
        assert s["hit_keys"] == 4 * 4 and s["leases_open"] == 0


def test_an_ssd_object_removed_by_another_client_is_never_served_once_remove_returned(ssd_up):
    """The node's generation-only arena moved before `remove` returned: the entries are dropped unread (counted
    `removed`, not `stale`), and the get asks the master, which has nothing."""
    calls = ssd_up.master.control.calls
    with PoolClient(ssd_up.address, location_cache_s=60) as a, PoolClient(ssd_up.address) as b:
        a.warm(prefault=False)
        assert b.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert a.get_many_into(KEYS[:2], bufs(2)) == 2 and cache_report(a)["entries"] == 2
        wait_until(lambda: b.stats()["leases_open"] == 0, "the get's lease ending")
        assert b.remove_many(KEYS[:2]) == 2
        base, reads = calls["Lookup"], a.transfers.direct_ssd_reads
        out = bufs(2)
        assert a.get_many_into(KEYS[:2], out) == 0 and out == bufs(2)
        assert calls["Lookup"] == base + 1 and a.transfers.direct_ssd_reads == reads
        report = cache_report(a)
        assert report["removed"] == 1 and report["stale"] == 0 and report["gets"] == 0


def test_a_damaged_record_under_a_cached_entry_is_never_returned(ssd_up):
    """A byte of the record's payload changed on disk: the cached read fails the record's check (stale, unreported),
    the get asks the master, whose location is the same record: the direct read and the node's fail too, and it is
    reported corrupt, as without the cache. The good key before it is still served."""
    with PoolClient(ssd_up.address, location_cache_s=60) as a:
        a.warm(prefault=False)
        assert a.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert a.get_many_into(KEYS[:2], bufs(2)) == 2
        entry = a.locations.run(b"", KEYS[1:2], [OBJ])[0]
        fd = os.open(ssd_up.node.node.ssd.path, os.O_WRONLY)
        try:
            os.pwrite(fd, b"\xee", entry.extent.offset + HEADER_BYTES + 100)
        finally:
            os.close(fd)
        out = bufs(2)
        assert a.get_many_into(KEYS[:2], out) == 1 and out[0] == bytearray(DATAS[0])
        report = cache_report(a)
        assert report["stale"] == 1 and report["gets"] == 0 and a.checksum_failures == 1
        assert a.get_many_into(KEYS[1:2], bufs(1)) == 0          # the master forgot it


def test_a_record_evicted_for_room_and_its_space_reused_is_stale_never_another_objects_bytes(ssd_up):
    """No removal, so no generation bump: the SSD holds eight records, and eight more objects push the first ones
    out and reuse their space. The cached entries of the first keys then name records of other keys: each read
    fails the record's key check, and the get asks the master (a miss)."""
    with PoolClient(ssd_up.address, location_cache_s=60) as a, PoolClient(ssd_up.address) as b:
        a.warm(prefault=False)
        assert b.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert a.get_many_into(KEYS[:2], bufs(2)) == 2 and cache_report(a)["entries"] == 2
        wait_until(lambda: b.stats()["leases_open"] == 0, "the get's lease ending")
        others = [(0x6E << 120 | i).to_bytes(16, "big") for i in range(8)]
        assert b.put_many(others, [bytes([0xA0 + i]) * OBJ for i in range(8)]) == ["stored"] * 8
        assert b.contains_many(KEYS[:2]) == [False, False]            # both pushed out
        tiers: list[str] = []
        # 0 filled (a buffer past the count holds whatever a refused read left there: the count is the answer)
        assert a.get_many_into(KEYS[:2], bufs(2), tiers_out=tiers) == 0 and tiers == []
        report = cache_report(a)
        assert report["stale"] == 1 and report["removed"] == 0 and report["gets"] == 0
        assert a.checksum_failures == 0                            # stale is not corrupt


def test_another_clients_first_get_of_ssd_records_is_found_in_the_nodes_host_index(ssd_up):
    """The master publishes SSD commits to the node's host index (in its generation-only arena): a same-host client
    that never read these keys reads the records from the node's data file with no Lookup, and remembers them."""
    calls = ssd_up.master.control.calls
    index = ssd_up.node.node.host_index
    with PoolClient(ssd_up.address, host_index_reads=False) as writer:
        assert writer.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4
    assert ssd_up.master.master.host_feed.flush(10)
    assert index.find(KEYS[:4])[3] == [SSD_ROW] * 4 and len(index) == 4
    base = calls["Lookup"]
    with PoolClient(ssd_up.address, location_cache_s=60, release_linger_s=60) as c:
        c.warm(prefault=False)
        out, tiers = bufs(4), []
        assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4 and out == [bytearray(d) for d in DATAS[:4]]
        assert tiers == ["ssd"] * 4 and calls["Lookup"] == base
        assert c.host_index_gets == 1 and c.transfers.direct_ssd_reads == 4 and c.transfers.direct_ssd_retries == 0
        out = bufs(2)
        assert c.get_many_into(KEYS[:2], out) == 2 and out == [bytearray(d) for d in DATAS[:2]]
        assert calls["Lookup"] == base and cache_report(c)["gets"] == 1     # the repeat get: from its cache
    assert calls["Lookup"] == base + 2              # close() sent both chains' reports: the master counted the gets
    with PoolClient(ssd_up.address) as admin:
        assert admin.stats()["hit_keys"] == 6


def test_records_evicted_for_room_leave_the_nodes_host_index(ssd_up):
    """The SSD holds eight records; eight more objects push the first two out. The master has the node's index
    forget them as it evicts them, so a reader asks the master at once instead of reading the reused space first."""
    calls = ssd_up.master.control.calls
    index = ssd_up.node.node.host_index
    others = [(0x6F << 120 | i).to_bytes(16, "big") for i in range(8)]
    with PoolClient(ssd_up.address, host_index_reads=False) as writer:
        assert writer.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert writer.put_many(others, [bytes([0xB0 + i]) * OBJ for i in range(8)]) == ["stored"] * 8
        assert writer.contains_many(KEYS[:2]) == [False, False]
    assert ssd_up.master.master.host_feed.flush(10)
    assert index.find(KEYS[:1]) == ([], [], [], []) and index.find(others)[3] == [SSD_ROW] * 8
    base = calls["Lookup"]
    with PoolClient(ssd_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        assert c.get_many_into(KEYS[:2], bufs(2)) == 0 and calls["Lookup"] == base + 1
        assert c.host_index_stale == 0 and c.transfers.direct_ssd_reads == 0


def test_an_ssd_row_whose_record_space_holds_another_object_is_stale_and_the_node_forgets_it(ssd_up):
    """A row that outlived its record (the eviction's `gone` lost, as when the node did not answer), whose space now
    holds another object: the read fails the record's key check, a miss after the master's answer, never the other
    object's bytes, never a corruption, and the node's index forgets the keys."""
    index, node = ssd_up.node.node.host_index, ssd_up.node.node
    others = [(0x6F << 120 | i).to_bytes(16, "big") for i in range(8)]
    with PoolClient(ssd_up.address, host_index_reads=False) as writer:
        assert writer.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert ssd_up.master.master.host_feed.flush(10) and len(index.find(KEYS[:2])[0]) == 2
        old = index.find(KEYS[:2])
        assert writer.put_many(others, [bytes([0xB0 + i]) * OBJ for i in range(8)]) == ["stored"] * 8
        assert writer.contains_many(KEYS[:2]) == [False, False]
    assert ssd_up.master.master.host_feed.flush(10)
    node.publish(Publication(tuple(KEYS[:2]), tuple(old[0]), tuple(old[1]), tuple(old[2]), (), (Tier.SSD,) * 2))
    assert index.find(KEYS[:2]) == old and set(old[0]) <= set(index.find(others)[0])   # their space, reused
    with PoolClient(ssd_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        out, tiers = bufs(2), []
        assert c.get_many_into(KEYS[:2], out, tiers_out=tiers) == 0 and tiers == []
        # 0 filled: the count is the answer (a buffer past it holds whatever the refused read left there)
        assert c.host_index_stale == 1 and c.host_index_gets == 0 and c.checksum_failures == 0
    assert ssd_up.master.master.host_feed.flush(10)
    assert index.find(KEYS[:1]) == ([], [], [], []) and len(index.find(others)[0]) == 8


def test_a_stopped_ssd_nodes_records_are_not_read_from_the_cache(ssd_up):
    calls = ssd_up.master.control.calls
    with PoolClient(ssd_up.address, location_cache_s=60, release_linger_s=60) as a:
        a.warm(prefault=False)
        assert a.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert a.get_many_into(KEYS[:2], bufs(2)) == 2 and cache_report(a)["entries"] == 2
        ssd_up.node.stop(0)                         # its arena's lock goes with it; the data file stays
        base = calls["Lookup"]
        a.get_many_into(KEYS[:2], bufs(2))          # whatever the master says now, the cache was not used
        assert calls["Lookup"] == base + 1 and cache_report(a)["gets"] == 0


def test_a_use_report_is_counted_with_no_lease_and_no_locations(ssd_up):
    """LookupRequest.count_only (what the releaser sends for cached gets): the master counts the gets it stands for
    and answers the hit count and the hits' tiers alone: no lease to release, no tokens, no locations."""
    with PoolClient(ssd_up.address) as c:
        assert c.put_many(KEYS[:3], DATAS[:3]) == ["stored"] * 3
        before = c.stats()
        req = pb.LookupRequest(keys=KEYS[:4], lease=True, optimistic=True, count_only=True, uses=2)
        reply = c.rpc.call("Lookup", req, what="lookup")
        assert (reply.hits, reply.lease_id, list(reply.tiers)) == (3, 0, [pb.SSD] * 3)
        assert (len(reply.offsets), len(reply.checksums), len(reply.tokens), len(reply.nodes)) == (0, 0, 0, 0)
        after = c.stats()
        assert after["leases_open"] == 0 and after["lookups"] == before["lookups"] + 2
        assert after["hit_keys"] == before["hit_keys"] + 2 * 3
        reply = c.rpc.call("Lookup", pb.LookupRequest(keys=KEYS[:3], lease=True), what="lookup")
        assert reply.lease_id != 0 and list(reply.tiers) == [pb.SSD] * 3      # without it: a lease, as before
        assert c.stats()["leases_open"] == 1
