"""Reads through a node's host index (tiers/host_index.py, store/host_feed.py, PoolClient(host_index_reads=True)): a
same-host client's first get of objects another client put needs no Lookup, every byte is still checked against the
committed checksum, removals are never served, and the master still counts every get. Real `kvpool up` pool in this
process (LocalCluster on 127.0.0.1), exact per-method call counts at the master."""

from __future__ import annotations

import grpc
import pytest
import xxhash

from kvpool import Namespace, PoolClient
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store.node import Publication
from kvpool.tiers.host_index import DRAM_ROW, SSD_ROW
from tests.conftest import SMALL_UP_OBJ as OBJ
from tests.store.test_control_channel import wait_until

KEYS = [(0xD1 << 120 | i).to_bytes(16, "big") for i in range(8)]
DATAS = [bytes([i + 1]) * OBJ for i in range(8)]
OTHER_KEYS = [(0xD2 << 120 | i).to_bytes(16, "big") for i in range(4)]
OTHER = [bytes([0xF0 + i]) * OBJ for i in range(4)]
MISSING = (0xD3 << 120).to_bytes(16, "big")      # never put


def bufs(n: int) -> list[bytearray]:
    return [bytearray(OBJ) for _ in range(n)]


def put_and_publish(up, keys, datas) -> None:
    with PoolClient(up.address, host_index_reads=False) as writer:
        assert writer.put_many(keys, datas) == ["stored"] * len(keys)
    assert up.master.master.host_feed.flush(10)


def test_another_clients_first_get_needs_no_lookup_and_is_still_counted(small_up):
    calls = small_up.master.control.calls
    put_and_publish(small_up, KEYS[:4], DATAS[:4])
    assert len(small_up.node.node.host_index) == 4
    base = calls["Lookup"]
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        out, tiers = bufs(4), []
        assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4
        assert out == [bytearray(d) for d in DATAS[:4]] and tiers == ["dram"] * 4
        assert calls["Lookup"] == base and c.host_index_gets == 1 and c.checksum_failures == 0
        # stats() sends the use report first
        assert c.stats()["client_host_index"] == {"gets": 1, "acquires": 0, "lookups": 0, "stale": 0}
        assert calls["Lookup"] == base + 1
    with PoolClient(small_up.address) as admin:
        s = admin.stats()
        assert s["lookups"] == 1 and s["hit_keys"] == 4 and s["leases_open"] == 0
        assert s["host_index"] == {"published": 4, "gone": 0, "failed": 0, "dropped": 0}


def test_without_host_index_reads_the_first_get_asks_the_master(small_up):
    calls = small_up.master.control.calls
    put_and_publish(small_up, KEYS[:4], DATAS[:4])
    base = calls["Lookup"]
    with PoolClient(small_up.address, host_index_reads=False, release_linger_s=60) as c:
        c.warm(prefault=False)
        out = bufs(4)
        assert c.get_many_into(KEYS[:4], out) == 4 and out == [bytearray(d) for d in DATAS[:4]]
        assert calls["Lookup"] == base + 1 and c.host_index_gets == 0


def test_a_removed_object_is_never_served_and_what_stays_stays_published(small_up):
    index = small_up.node.node.host_index
    put_and_publish(small_up, KEYS[:3], DATAS[:3])
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        assert c.remove_many(KEYS[1:2]) == 1
        assert index.find(KEYS[1:2]) == ([], [], [], [])       # its row went before `remove` returned
        out = bufs(2)
        assert c.get_many_into(KEYS[:2], out) == 1 and out[0] == bytearray(DATAS[0])
        assert c.host_index_gets == 0
    assert small_up.master.master.host_feed.flush(10)      # the objects that stayed are still published
    assert len(index) == 2 and index.find([KEYS[0], KEYS[2]])[1] == [OBJ, OBJ]
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        out = bufs(1)
        assert c.get_many_into(KEYS[2:3], out) == 1 and out == [bytearray(DATAS[2])] and c.host_index_gets == 1


def test_demoted_objects_rows_name_their_ssd_records(small_up):
    """small_up's DRAM holds exactly four objects: four more push the first four to SSD and take their extents. The
    master publishes each demotion, so another client's first get reads the first four from the node's data file
    with no Lookup and no stale read of the reused extents."""
    put_and_publish(small_up, KEYS[:4], DATAS[:4])
    index = small_up.node.node.host_index
    dram_offsets = index.find(KEYS[:4])[0]
    put_and_publish(small_up, OTHER_KEYS, OTHER)
    assert sorted(index.find(OTHER_KEYS)[0]) == sorted(dram_offsets)            # the same extents, reused
    assert index.find(KEYS[:4])[3] == [SSD_ROW] * 4 and index.find(OTHER_KEYS)[3] == [DRAM_ROW] * 4
    calls = small_up.master.control.calls
    base = calls["Lookup"]
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        out, tiers = bufs(4), []
        assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4 and out == [bytearray(d) for d in DATAS[:4]]
        assert tiers == ["ssd"] * 4 and calls["Lookup"] == base     # read from the node's data file, no Lookup
        assert c.host_index_stale == 0 and c.host_index_gets == 1 and c.transfers.direct_ssd_reads == 4


def test_an_extent_reused_since_it_was_published_is_stale_and_the_get_asks_the_master(small_up):
    """A row that outlived its extent's reuse (its demotion's publication lost, as when the node did not answer):
    the copy fails the fence, the get asks the master, and the master has the node's row name the SSD record."""
    put_and_publish(small_up, KEYS[:4], DATAS[:4])
    index, node = small_up.node.node.host_index, small_up.node.node
    first = index.find(KEYS[:4])
    put_and_publish(small_up, OTHER_KEYS, OTHER)
    node.publish(Publication(tuple(KEYS[:4]), tuple(first[0]), tuple(first[1]), tuple(first[2])))   # the old rows
    assert index.find(KEYS[:4]) == first and sorted(first[0]) == sorted(index.find(OTHER_KEYS)[0])
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        out, tiers = bufs(4), []
        assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4
        assert out == [bytearray(d) for d in DATAS[:4]] and tiers == ["ssd"] * 4
        assert c.host_index_stale == 1 and c.host_index_gets == 0 and c.checksum_failures == 0
    # that lookup said the index was stale: the node's index names the chain's SSD records again
    assert small_up.master.master.host_feed.flush(10)
    assert index.find(KEYS[:4])[3] == [SSD_ROW] * 4 and index.find(OTHER_KEYS)[3] == [DRAM_ROW] * 4


def test_a_use_report_that_finds_keys_gone_has_the_node_forget_them(small_up):
    """An object the master dropped while its extent still holds its bytes: the report of a get that found it in
    the index tells the master, whose feed has the node forget the key."""
    node, master = small_up.node.node, small_up.master.master
    gone = (0xD3 << 120).to_bytes(16, "big")
    node.publish(Publication((gone,), (0,), (OBJ,), (123,)))
    assert node.host_index.find([gone])[0] == [0]
    master.lookup([gone], lease=True, mapped_nodes={node.node_id}, uses=1, unpublish_misses=True)
    assert master.host_feed.flush(10)
    assert node.host_index.find([gone]) == ([], [], [], [])      # flush returns once the node answered
    assert master.host_feed.gone_sent == 1


def test_publish_checks_every_entry_against_the_arena_before_changing_anything(small_up):
    node = small_up.node.node
    with grpc.insecure_channel(small_up.node.address) as ch:
        stub = pbg.NodeServiceStub(ch)
        bad = pb.PublishRequest(keys=KEYS[:2], offsets=[0, 4 * OBJ], sizes=[OBJ, OBJ], checksums=[1, 2])
        with pytest.raises(grpc.RpcError) as err:
            stub.Publish(bad, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "offsets[1]" in err.value.details()
        short = pb.PublishRequest(keys=KEYS[:2], offsets=[0], sizes=[OBJ, OBJ], checksums=[1, 2])
        with pytest.raises(grpc.RpcError) as err:
            stub.Publish(short, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "offsets" in err.value.details()
        unaligned = pb.PublishRequest(keys=KEYS[:2], offsets=[0, 100], sizes=[OBJ, OBJ], checksums=[1, 2],
                                      tiers=[pb.DRAM, pb.SSD])
        with pytest.raises(grpc.RpcError) as err:
            stub.Publish(unaligned, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "offsets[1]" in err.value.details()
        hbm = pb.PublishRequest(keys=KEYS[:2], offsets=[0, 0], sizes=[OBJ, OBJ], checksums=[1, 2],
                                tiers=[pb.SSD, pb.HBM])
        with pytest.raises(grpc.RpcError) as err:
            stub.Publish(hbm, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "tiers[1]" in err.value.details()
    assert len(node.host_index) == 0


def test_a_dead_nodes_index_is_not_read(small_up):
    """Its arena's lock went with it: nothing the index names is served, whatever the master says next."""
    put_and_publish(small_up, KEYS[:2], DATAS[:2])
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        small_up.node.stop(0)
        c.get_many_into(KEYS[:2], bufs(2))
        assert c.host_index_gets == 0 and c.host_index_stale == 0


def test_a_node_registering_again_starts_an_empty_index_and_the_master_fills_it_with_what_it_holds(small_up):
    """What a restarted master's request to register again does: the node clears its index before it registers,
    and the master queues every DRAM object it still has there for it."""
    index = small_up.node.node.host_index
    put_and_publish(small_up, KEYS[:3], DATAS[:3])
    small_up.node.register()
    assert small_up.master.master.host_feed.flush(10)
    assert len(index) == 3 and index.find(KEYS[:3])[1] == [OBJ] * 3
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        out = bufs(3)
        assert c.get_many_into(KEYS[:3], out) == 3 and out == [bytearray(d) for d in DATAS[:3]]
        assert c.host_index_gets == 1


def test_a_lookup_that_found_a_stale_row_gets_the_node_the_current_location(small_up):
    """A row that names the wrong extent for a DRAM object (it moved, or the row outlived a reuse): the lookup the
    reader sends next carries index_stale, and the node's row is set to where the object is now."""
    node, master = small_up.node.node, small_up.master.master
    put_and_publish(small_up, KEYS[:2], DATAS[:2])
    right = node.host_index.find(KEYS[:2])
    wrong = 3 * OBJ if right[0][0] != 3 * OBJ else 2 * OBJ
    node.publish(Publication((KEYS[0],), (wrong,), (OBJ,), (right[2][0],)))
    assert node.host_index.find(KEYS[:1])[0] == [wrong]
    master.lookup(KEYS[:2], lease=True, mapped_nodes={node.node_id}, optimistic=True, index_stale=True)
    assert master.host_feed.flush(10)
    assert node.host_index.find(KEYS[:2]) == right


def test_a_promoted_objects_row_names_its_dram_extent_again(tmp_path, shm_path):
    """With promotion on hit: objects pushed to SSD (their rows name their SSD records) are read from the index,
    the reader's use report has the master promote them, and the master publishes their new DRAM extents, so another
    client's first get reads them from DRAM, not from the SSD copy."""
    from kvpool.store.config import UpConfig
    from kvpool.store.local_cluster import LocalCluster
    from tests.conftest import free_port
    from tests.store.test_control_channel import wait_until

    cfg = UpConfig(listen=f"127.0.0.1:{free_port()}", http_listen="", shm_dir=str(shm_path), dram_bytes=4 * OBJ,
                   ssd_path=str(tmp_path / "ssd"), ssd_bytes=64 * OBJ, promote_on_hit=True)
    up = LocalCluster(cfg).start()
    try:
        index = up.node.node.host_index
        put_and_publish(up, KEYS[:4], DATAS[:4])
        put_and_publish(up, OTHER_KEYS, OTHER)          # DRAM holds four: the first four go to SSD
        assert index.find(KEYS[:2])[3] == [SSD_ROW] * 2
        with PoolClient(up.address, location_cache_s=0) as reader:
            reader.warm(prefault=False)
            out, tiers = bufs(2), []
            assert reader.get_many_into(KEYS[:2], out, tiers_out=tiers) == 2 and tiers == ["ssd"] * 2
            assert out == [bytearray(d) for d in DATAS[:2]] and reader.host_index_gets == 1
        # close() sent the get's use report: the master counted it, saw SSD hits and queued their promotion
        wait_until(lambda: up.master.master.host_feed.flush(1) and index.find(KEYS[:2])[3] == [DRAM_ROW] * 2,
                   "the promoted objects' DRAM rows")
        with PoolClient(up.address, release_linger_s=60) as c:
            c.warm(prefault=False)
            out, tiers = bufs(2), []
            assert c.get_many_into(KEYS[:2], out, tiers_out=tiers) == 2 and tiers == ["dram"] * 2
            assert out == [bytearray(d) for d in DATAS[:2]] and c.host_index_gets == 1
    finally:
        up.stop()


def test_dram_objects_evicted_for_room_leave_the_index_at_once(shm_path):
    """No SSD tier: four more objects evict the first four (their extents reused). The master has the node's index
    forget them as it evicts them, so another client's get asks the master at once, with no stale copy first."""
    from kvpool.store.config import UpConfig
    from kvpool.store.local_cluster import LocalCluster
    from tests.conftest import free_port

    cfg = UpConfig(listen=f"127.0.0.1:{free_port()}", http_listen="", shm_dir=str(shm_path), dram_bytes=4 * OBJ,
                   ssd_path=None)
    up = LocalCluster(cfg).start()
    try:
        index, calls = up.node.node.host_index, up.master.control.calls
        put_and_publish(up, KEYS[:4], DATAS[:4])
        put_and_publish(up, OTHER_KEYS, OTHER)
        assert index.find(KEYS[:1]) == ([], [], [], []) and index.find(OTHER_KEYS)[3] == [DRAM_ROW] * 4
        assert up.master.master.host_feed.gone_sent == 4
        base = calls["Lookup"]
        with PoolClient(up.address, release_linger_s=60) as c:
            c.warm(prefault=False)
            assert c.get_many_into(KEYS[:4], bufs(4)) == 0 and calls["Lookup"] == base + 1
            assert c.host_index_stale == 0 and c.host_index_gets == 0
    finally:
        up.stop()


def test_an_acquire_of_a_published_chain_needs_no_lookup_and_no_lease(small_up):
    """acquire_many(lease=False) (the connectors' load: they check every block after its copy) of a chain the host
    index holds: the DRAM extents handed out as they are, covered by the fence, the SSD records read here and staged
    (`max_staged` at a time, `rest` going on), with no Lookup and no lease; the master still counts the read once,
    from the use report. The default (lease=True) still takes a lease: a caller may check before it copies."""
    put_and_publish(small_up, KEYS[:4], DATAS[:4])
    put_and_publish(small_up, OTHER_KEYS, OTHER)        # the first four go to SSD: 4 SSD rows, then 4 DRAM rows
    chain, datas = KEYS[:4] + OTHER_KEYS, DATAS[:4] + OTHER
    calls, master = small_up.master.control.calls, small_up.master.master
    base, before = calls["Lookup"], master.stats()
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        first = c.acquire_many(chain, [OBJ] * 8, max_staged=3, lease=False)
        reads = [first, first.rest(max_staged=3)]
        assert [(r.count, r.staging_full) for r in reads] == [(3, True), (5, False)]
        assert reads[0].direct == [False] * 3 and reads[1].direct == [False] + [True] * 4
        assert reads[0].tiers == ["ssd"] * 3 and reads[1].tiers == ["ssd"] + ["dram"] * 4
        assert [bytes(b) for r in reads for b in r.buffers] == datas
        # the DRAM extents are the caller's to copy and hash: the fence covers them, not the staged records
        assert [reads[1].needs_check(i) for i in range(5)] == [False] + [True] * 4
        assert all(reads[1].verify_landed(i, xxhash.xxh3_64_intdigest(datas[3 + i])) for i in range(1, 5))
        assert reads[1].verify() == 5
        assert calls["Lookup"] == base and master.stats()["leases_open"] == 0
        for r in reads:
            r.release()
        assert c.host_index_acquires == 1 and c.host_index_stale == 0 and c.checksum_failures == 0
        # stats() sends the report first
        assert c.stats()["client_host_index"] == {"gets": 0, "acquires": 1, "lookups": 0, "stale": 0}
    after = master.stats()
    assert [after[n] - before[n] for n in ("lookups", "requested_keys", "hit_keys")] == [1, 8, 8]
    assert calls["Lookup"] == base + 1                  # the use report (a count-only Lookup), not a leased one
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        with c.acquire_many(chain, [OBJ] * 8) as leased:
            assert leased.count == 8 and master.stats()["leases_open"] == 1 and calls["Lookup"] == base + 2
        assert c.host_index_acquires == 0
    with PoolClient(small_up.address) as c, pytest.raises(ValueError, match="lease must be a bool, got 0"):
        c.acquire_many(chain, [OBJ] * 8, lease=0)


def test_an_unleased_acquire_reports_its_use_only_once_every_read_of_it_is_released(small_up):
    """The use report of an acquire served from the host index waits for the caller's copies: it may have the master
    promote the chain's SSD entries, and the room for them is made by moving DRAM objects, whose extents nothing
    pins for this read (reported at acquire, an engine's own report had a promotion reuse the DRAM extents it was
    still copying: a shorter hit). A lookup flushes the reports pending before it, so the count shows when it was
    queued: none while the reads (the first and its `rest`) are held, one after the last is released. (A key no
    host index holds: a lookup the index answers sends nothing before its own report.)"""
    put_and_publish(small_up, KEYS[:4], DATAS[:4])
    put_and_publish(small_up, OTHER_KEYS, OTHER)        # 4 SSD rows, then 4 DRAM rows
    chain = KEYS[:4] + OTHER_KEYS
    calls = small_up.master.control.calls
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        base = calls["Lookup"]
        first = c.acquire_many(chain, [OBJ] * 8, max_staged=3, lease=False)
        second = first.rest(max_staged=3)
        assert (first.count, second.count, calls["Lookup"]) == (3, 5, base)
        first.release()
        assert c.lookup_prefix([MISSING]) == 0 and calls["Lookup"] == base + 1         # no report queued yet
        second.release()
        assert c.lookup_prefix([MISSING]) == 0 and calls["Lookup"] == base + 3         # the report, then the lookup
        second.release()                                                                # idempotent: no second one
        assert c.lookup_prefix([MISSING]) == 0 and calls["Lookup"] == base + 4


def test_an_acquire_that_finds_a_published_extent_changed_asks_the_master_at_release(small_up):
    """A DRAM extent of the published chain whose bytes changed (a stalled writer, as the fence sees it): the
    caller's hash of its copy fails, the read ends before that entry, and its release reads the key again under a
    lease with `index_stale`: the corrupt object is reported and forgotten, and the next acquire asks the master.
    The master counts each acquire's keys once: the use report sent when the read was made counted the key that
    is re-read (`continued`)."""
    put_and_publish(small_up, KEYS[:4], DATAS[:4])
    calls = small_up.master.control.calls
    before = small_up.master.master.stats()
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        base = calls["Lookup"]
        read = c.acquire_many(KEYS[:4], [OBJ] * 4, lease=False)
        assert read.count == 4 and read.direct == [True] * 4 and calls["Lookup"] == base
        read.buffers[2][:1] = b"\xee"                                    # the object's bytes, in the node's arena
        landed = [read.verify_landed(i, xxhash.xxh3_64_intdigest(bytes(read.buffers[i]))) for i in range(3)]
        assert landed == [True, True, False] and read.count == 2
        read.release()
        assert c.host_index_stale == 1 and c.checksum_failures == 1
        # at once, though the client lingers 60 s over its releases: the master forgets the object
        wait_until(lambda: small_up.master.master.stats()["dram_corrupt"] == 1, "the corrupt object's report", 5.0)
        assert c.contains_many(KEYS[:4]) == [True, True, False, True]
        # the leased re-read, and the use report the corrupt one woke: the releaser sends that report after the
        # corrupt one, so it is waited for too (asserting it at once failed once in CI, on a loaded box)
        wait_until(lambda: calls["Lookup"] == base + 2, "the use report after the corrupt report", 5.0)
        # the stale row sent this one to the master
        with c.acquire_many(KEYS[:4], [OBJ] * 4, lease=False) as again:
            assert calls["Lookup"] == base + 3 and again.count == 2
            assert [bytes(b) for b in again.buffers] == DATAS[:2]
        # and the one after reads the index again
        with c.acquire_many(KEYS[:2], [OBJ] * 2, lease=False) as third:
            assert third.count == 2 and calls["Lookup"] == base + 3 and c.host_index_acquires == 2
    # closed: every report was sent. Counted: the first acquire's report (4 keys), the second's leased lookup (4),
    # the third's report (2); the re-read of the changed key is not counted again
    after = small_up.master.master.stats()
    assert after["lookups"] - before["lookups"] == 3
    assert after["requested_keys"] - before["requested_keys"] == 10


def test_a_lookup_of_a_published_chain_needs_no_round_trip_and_is_still_counted(small_up):
    """lookup_prefix of a chain one same-host node's host index holds whole: answered there, its Lookup sent after
    (within the linger, or first thing at the next call that must find the master knowing of it: stats here), so
    the master counts it as before: one lookup, its hit keys, its prefill seconds saved (a namespace)."""
    calls = small_up.master.control.calls
    put_and_publish(small_up, KEYS[:4], DATAS[:4])
    ns = Namespace(model="m", fingerprint="f", kv_dtype="float32", block_tokens=16, num_layers=1, num_kv_heads=1,
                   head_dim=32)
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        base = calls["Lookup"]
        assert c.lookup_prefix(KEYS[:4], namespace=ns, prefill_s_per_token=0.001) == 4
        assert calls["Lookup"] == base and c.host_index_lookups == 1
        assert c.stats()["client_host_index"] == {"gets": 0, "acquires": 0, "lookups": 1, "stale": 0}
        assert calls["Lookup"] == base + 1                              # the report went before Stats
    with PoolClient(small_up.address, host_index_reads=False) as admin:
        s = admin.stats()
    assert (s["lookups"], s["hit_keys"], s["requested_keys"]) == (1, 4, 4)
    assert s["prefill_seconds_saved"] == pytest.approx(4 * 16 * 0.001)


def test_a_lookup_the_index_cannot_answer_whole_asks_the_master_at_once(small_up):
    """A chain only partly published (its tail may be on another node) or an index that is not mapped here: the
    Lookup goes as before, and it finds the master's answer."""
    calls = small_up.master.control.calls
    put_and_publish(small_up, KEYS[:4], DATAS[:4])
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        base = calls["Lookup"]
        assert c.lookup_prefix(KEYS[:4] + [MISSING]) == 4 and calls["Lookup"] == base + 1
        assert c.lookup_prefix([MISSING] + KEYS[:4]) == 0 and calls["Lookup"] == base + 2
        assert c.host_index_lookups == 0
    with PoolClient(small_up.address, release_linger_s=60) as cold:   # never warmed: no arena, no index
        base = calls["Lookup"]
        assert cold.lookup_prefix(KEYS[:4]) == 4 and calls["Lookup"] == base + 1 and cold.host_index_lookups == 0
    with PoolClient(small_up.address, host_index_reads=False) as off:
        off.warm(prefault=False)
        base = calls["Lookup"]
        assert off.lookup_prefix(KEYS[:4]) == 4 and calls["Lookup"] == base + 1 and off.host_index_lookups == 0


def test_a_get_that_asks_the_master_sends_the_lookups_answered_before_it_first(small_up):
    """The master hears of a client's calls in the order they were made (its stats, policy and traffic recorder):
    a get that must ask it sends the pending lookup reports first; one served from the index queues its use report
    after them. Past MAX_LOOKUPS waiting reports a lookup asks the master itself."""
    calls = small_up.master.control.calls
    put_and_publish(small_up, KEYS[:4], DATAS[:4])
    with PoolClient(small_up.address, release_linger_s=60) as c:
        c.warm(prefault=False)
        base = calls["Lookup"]
        assert c.lookup_prefix(KEYS[:2]) == 2 and c.lookup_prefix(KEYS[:4]) == 4 and calls["Lookup"] == base
        assert c.get_many_into([MISSING], bufs(1)) == 0                 # not published: asks the master
        assert calls["Lookup"] == base + 3                              # the two reports, then its own
        c._releaser.MAX_LOOKUPS = 2
        base = calls["Lookup"]
        assert c.lookup_prefix(KEYS[:1]) == 1 and c.lookup_prefix(KEYS[:1]) == 1 and calls["Lookup"] == base
        assert c.lookup_prefix(KEYS[:3]) == 3 and calls["Lookup"] == base + 3       # 2 reports, then its own
        assert c.host_index_lookups == 4
    with PoolClient(small_up.address, host_index_reads=False) as admin:
        assert admin.stats()["lookups"] == 5 + 1                       # the 5 lookups and the get, each once
