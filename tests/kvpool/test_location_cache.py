"""The client's location cache (kvpool/locations.py, PoolClient(location_cache_s=...)): repeat same-host gets with no
master round trip, every byte still checked against the committed checksum, and every get still reported to the
master (statistics, eviction order). Real `kvpool up` pool in this process (LocalCluster: master + node with DRAM and
SSD on 127.0.0.1), exact per-method call counts at the master."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kvpool import PoolClient
from kvpool.admin import AdminClient
from kvpool.locations import LocationCache
from kvpool.proto import kvpool_pb2 as pb
from kvpool.tiers.host_index import SSD_ROW
from tests.conftest import SMALL_UP_OBJ as OBJ
from tests.store.test_control_channel import wait_until

KEYS = [(0xCA << 120 | i).to_bytes(16, "big") for i in range(8)]
DATAS = [bytes([i + 1]) * OBJ for i in range(8)]
OTHER = [bytes([0xF0 + i]) * OBJ for i in range(8)]


def bufs(n: int) -> list[bytearray]:
    return [bytearray(OBJ) for _ in range(n)]


def cache_report(c: PoolClient) -> dict:
    return c.stats()["client_location_cache"]


def test_repeat_gets_skip_the_master_and_each_get_is_still_counted(small_up):
    calls = small_up.master.control.calls
    with PoolClient(small_up.address) as writer:
        assert writer.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4
    base = calls["Lookup"]
    # release_linger_s=60: nothing is sent by the timer, so the counts below are exact; close() sends the report.
    # host_index_reads=False: the first get asks the master (reads through the node's index: test_host_index_reads)
    with PoolClient(small_up.address, location_cache_s=60, release_linger_s=60, host_index_reads=False) as c:
        c.warm(prefault=False)      # the arena mapped before the first lookup: its answer can be dated and kept
        out = bufs(4)
        tiers: list[str] = []
        assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4 and out == [bytearray(d) for d in DATAS[:4]]
        assert calls["Lookup"] == base + 1 and tiers == ["dram"] * 4
        for _ in range(5):
            out = bufs(4)
            tiers = []
            assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4
            assert out == [bytearray(d) for d in DATAS[:4]] and tiers == ["dram"] * 4
        assert calls["Lookup"] == base + 1          # five gets, no round trip
        out = bufs(2)
        assert c.get_many_into(KEYS[:2], out) == 2 and out == [bytearray(d) for d in DATAS[:2]]   # a prefix: cached
        assert calls["Lookup"] == base + 1
        assert cache_report(c) == {"entries": 4, "gets": 6, "objects": 22, "stale": 0, "removed": 0}
        assert c.checksum_failures == 0
    # close() sent the two chains' reports: one leased Lookup each (uses 5 and 1) and the last lease's Release
    assert calls["Lookup"] == base + 3
    with PoolClient(small_up.address) as admin:
        s = admin.stats()
        assert s["lookups"] == 7 and s["hit_keys"] == 4 + 5 * 4 + 2    # as if every get had asked
        assert s["leases_open"] == 0


def test_a_get_reaching_past_the_cached_run_asks_the_master_for_all_of_it(small_up):
    """All or nothing: the master hears of a get as one chain (one lookup, one recorded row), never a cached prefix
    reported apart from a looked-up rest."""
    calls = small_up.master.control.calls
    # host_index_reads=False: every get the cache cannot serve asks (whether the node's index has the put yet or not)
    with PoolClient(small_up.address, location_cache_s=60, release_linger_s=60, host_index_reads=False) as c:
        assert c.put_many(KEYS[:3], DATAS[:3]) == ["stored"] * 3
        assert c.get_many_into(KEYS[:2], bufs(2)) == 2
        base = calls["Lookup"]
        out = bufs(4)
        # the put mapped the node's arena (nothing dates its answer): only the get's two are remembered
        assert cache_report(c)["entries"] == 2
        assert c.get_many_into(KEYS[:4], out) == 3           # KEYS[2:] are not remembered: one lookup of all four
        assert out[:3] == [bytearray(d) for d in DATAS[:3]] and out[3] == bytearray(OBJ)
        assert calls["Lookup"] == base + 1 and cache_report(c)["gets"] == 0


def test_an_extent_reused_by_other_objects_is_stale_never_returned_never_corrupt(small_up):
    """No removal: the four objects are demoted to SSD to make room (no generation bump), and the next four reuse
    their DRAM extents under the cached entries. The cached read fails the fence, and the get asks the master,
    which finds them on SSD."""
    with PoolClient(small_up.address, location_cache_s=60) as a, PoolClient(small_up.address) as b:
        a.warm(prefault=False)
        assert b.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4
        assert a.get_many_into(KEYS[:4], bufs(4)) == 4            # a remembers the four DRAM extents
        wait_until(lambda: b.stats()["leases_open"] == 0, "the get's lease ending")   # else no extent can move
        # DRAM holds exactly four objects: the next four reuse the same four extents, the first four go to SSD
        assert b.put_many(KEYS[4:], OTHER[4:]) == ["stored"] * 4
        feed, index = small_up.master.master.host_feed, small_up.node.node.host_index
        assert feed.flush(10) and index.find(KEYS[:4])[3] == [SSD_ROW] * 4   # the index names their SSD records
        out = bufs(4)
        tiers: list[str] = []
        assert a.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4
        assert out == [bytearray(d) for d in DATAS[:4]] and tiers == ["ssd"] * 4
        # the stale entry sent the get to the master without a second copy from the index's stale rows; the lookup
        # said so (index_stale), and the node's index names their SSD records now
        assert a.host_index_stale == 0 and feed.flush(10) and index.find(KEYS[:4])[3] == [SSD_ROW] * 4
        report = cache_report(a)
        # the first stale entry sends the get to the master whole; its answer puts all four on SSD, in the node's
        # data file that this client reads itself: those are the entries now
        assert report["stale"] == 1 and report["removed"] == 0 and report["gets"] == 0 and report["entries"] == 4
        assert a.checksum_failures == 0                           # stale is not corrupt: nothing reported
        assert b.stats()["dram_corrupt"] == 0
        got = bufs(4)
        assert a.get_many_into(KEYS[4:], got) == 4 and got == [bytearray(d) for d in OTHER[4:]]


def test_an_object_removed_by_another_client_is_never_served_once_remove_returned(small_up):
    """Its extent is intact, but the node's removal generation moved before `remove` returned: the cached entries
    are dropped unread and the get asks the master, which has nothing."""
    calls = small_up.master.control.calls
    with PoolClient(small_up.address, location_cache_s=60, host_index_reads=False) as a, \
            PoolClient(small_up.address) as b:
        a.warm(prefault=False)
        assert b.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert a.get_many_into(KEYS[:2], bufs(2)) == 2
        assert cache_report(a)["entries"] == 2
        wait_until(lambda: b.stats()["leases_open"] == 0, "the get's lease ending")
        assert b.remove_many(KEYS[:2]) == 2
        base = calls["Lookup"]
        out = bufs(2)
        assert a.get_many_into(KEYS[:2], out) == 0 and out == bufs(2)
        assert calls["Lookup"] == base + 1
        report = cache_report(a)
        assert report["removed"] == 1 and report["gets"] == 0 and report["stale"] == 0


def test_an_admin_evict_is_a_removal_too(small_up):
    with PoolClient(small_up.address, location_cache_s=60) as a:
        a.warm(prefault=False)
        assert a.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert a.get_many_into(KEYS[:2], bufs(2)) == 2
        wait_until(lambda: a.stats()["leases_open"] == 0, "the get's lease ending")
        with AdminClient(small_up.address) as admin:
            assert admin.evict(everything=True) == 2                # `kvpool evict --all`
        assert a.get_many_into(KEYS[:2], bufs(2)) == 0
        assert cache_report(a)["removed"] == 1


def test_remove_through_the_same_client_forgets_at_once(small_up):
    calls = small_up.master.control.calls
    with PoolClient(small_up.address, location_cache_s=60, release_linger_s=60) as a:
        assert a.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert a.get_many_into(KEYS[:2], bufs(2)) == 2
        assert a.remove_many(KEYS[1:2]) == 1
        assert cache_report(a)["entries"] == 0
        base = calls["Lookup"]
        out = bufs(2)
        assert a.get_many_into(KEYS[:2], out) == 1 and out[0] == bytearray(DATAS[0])
        assert calls["Lookup"] == base + 1


def test_bytes_changed_under_a_cached_entry_are_never_returned(small_up):
    """A late writer's bytes in a committed object's extent: the cached read fails the fence, the get asks the master,
    whose location is the same extent: that read fails too and is reported corrupt, as without the cache."""
    with PoolClient(small_up.address, location_cache_s=60) as a:
        assert a.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert a.get_many_into(KEYS[:2], bufs(2)) == 2
        entry = a.locations.run(b"", KEYS[1:2], [OBJ])[0]
        entry.extent[100:101] = b"\xee"
        out = bufs(2)
        assert a.get_many_into(KEYS[:2], out) == 1 and out[0] == bytearray(DATAS[0])
        assert cache_report(a)["stale"] == 1 and a.checksum_failures == 1
        wait_until(lambda: a.stats()["dram_corrupt"] == 1, "the corrupt report")
        assert a.get_many_into(KEYS[1:2], bufs(1)) == 0


def test_a_dead_nodes_arena_is_not_read_from_the_cache(small_up):
    calls = small_up.master.control.calls
    with PoolClient(small_up.address, location_cache_s=60, release_linger_s=60) as a:
        assert a.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        assert a.get_many_into(KEYS[:2], bufs(2)) == 2
        assert cache_report(a)["entries"] == 2
        small_up.node.stop(0)                    # the node's arena lock goes with it
        base = calls["Lookup"]
        a.get_many_into(KEYS[:2], bufs(2))      # whatever the master says now, the cache was not used
        # nor was the dead arena read for the optimistic lookup's answer: that lookup, then a leased one
        assert calls["Lookup"] == base + 2 and a.optimistic_retries == 1
        assert cache_report(a)["gets"] == 0


def test_cached_uses_keep_a_chain_warm_in_the_eviction_order(small_up):
    """DRAM holds four objects under LRU. K0 is first read by the cached client, then K1..K3 by another; then K0 is
    read again from the cache. Its report reaches the master, so the fifth put demotes K1 (least recently used), not
    K0, whose only master-visible use would otherwise be the oldest."""
    calls = small_up.master.control.calls
    with PoolClient(small_up.address, location_cache_s=60, host_index_reads=False) as a, \
            PoolClient(small_up.address, host_index_reads=False) as b:      # every first get a Lookup, in order
        assert b.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4
        assert a.get_many_into(KEYS[:1], bufs(1)) == 1
        for k in KEYS[1:4]:
            assert b.get_many_into([k], bufs(1)) == 1
        before = calls["Lookup"]
        assert a.get_many_into(KEYS[:1], bufs(1)) == 1                 # from the cache
        wait_until(lambda: calls["Lookup"] == before + 1, "the cached get's report")
        assert b.put_many(KEYS[4:5], DATAS[4:5]) == ["stored"]
        tiers: list[str] = []
        for k in KEYS[:5]:
            assert b.get_many_into([k], bufs(1), tiers_out=tiers) == 1
        assert tiers == ["dram", "ssd", "dram", "dram", "dram"]


def test_a_stats_call_or_a_put_first_sends_the_pending_reports(small_up):
    """release_linger_s=60: the background thread would not send the reports for a minute; stats() and put_many
    send them first, so this client's hit counts and eviction order are as without the cache."""
    calls = small_up.master.control.calls
    with PoolClient(small_up.address, location_cache_s=60, release_linger_s=60) as c:
        c.warm(prefault=False)
        assert c.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2       # remembered by the put
        base = c.stats()["lookups"]
        for _ in range(3):
            assert c.get_many_into(KEYS[:2], bufs(2)) == 2
        assert c.stats()["lookups"] == base + 3 and cache_report(c)["gets"] == 3
        assert c.get_many_into(KEYS[:1], bufs(1)) == 1
        before = calls["Lookup"]
        assert c.put_many(KEYS[2:3], DATAS[2:3]) == ["stored"]
        assert calls["Lookup"] == before + 1                             # the report, sent before the PutStart


def test_location_cache_s_is_checked_before_anything_starts(small_up):
    for bad in (-1, 3601, True, "1s"):
        with pytest.raises(ValueError, match=r"^location_cache_s must be seconds in \[0, 3600\] \(0 = off\), got "):
            PoolClient(small_up.address, location_cache_s=bad)
    with pytest.raises(ValueError, match=r"^location_cache_s needs verify='all' .* got verify='remote'"):
        PoolClient(small_up.address, location_cache_s=1, verify="remote")


def test_a_lookups_uses_must_be_in_range(small_up):
    with PoolClient(small_up.address) as c:
        assert c.put_many(KEYS[:1], DATAS[:1]) == ["stored"]
        with pytest.raises(ValueError, match=r"uses must be an int in \[1, 65536\]"):
            c.rpc.call("Lookup", pb.LookupRequest(keys=KEYS[:1], lease=False, uses=65537), what="lookup")
        before = c.stats()["lookups"]
        c.rpc.call("Lookup", pb.LookupRequest(keys=KEYS[:1], lease=False, uses=3), what="lookup")
        assert c.stats()["lookups"] == before + 3


# ---------------------------------------------------------------- LocationCache alone

class _Arena:
    generation = 0


def test_the_cache_is_bounded_oldest_first_and_a_run_stops_at_the_first_unusable_entry():
    cache = LocationCache(60, max_entries=3)
    arena = _Arena()
    mem = memoryview(np.zeros(64, np.uint8)).cast("B")
    keys = [bytes([i]) * 16 for i in range(4)]
    cache.remember(b"", keys[:3], [arena] * 3, [mem[0:8], mem[8:16], mem[16:32]], [1, 2, 3], [0] * 3)
    assert [e.checksum for e in cache.run(b"", keys[:3], [8, 8, 16])] == [1, 2, 3]
    assert [e.checksum for e in cache.run(b"", keys[:3], [8, 9, 16])] == [1]        # size differs: stop
    assert cache.run(b"ns", keys[:3], [8, 8, 16]) == []                             # another namespace
    cache.remember(b"", keys[0:1], [arena], [mem[0:8]], [11], [0])                   # refreshed: now the newest
    cache.remember(b"", keys[3:4], [arena], [mem[32:40]], [4], [0])                  # over the bound: keys[1] goes
    assert len(cache) == 3 and cache.run(b"", keys[1:2], [8]) == []
    assert [e.checksum for e in cache.run(b"", [keys[0], keys[2], keys[3]], [8, 16, 8])] == [11, 3, 4]
    arena.generation = 1                                                            # a removal: dropped unread
    assert cache.run(b"", keys[:1], [8]) == [] and cache.removed == 1 and len(cache) == 2
    cache.remember(b"", keys[0:1], [arena], [mem[0:8]], [11], [1])
    cache.forget_arena(_Arena())
    assert len(cache) == 3
    cache.forget_arena(arena)
    assert len(cache) == 0


def test_an_expired_entry_is_not_used():
    cache = LocationCache(0.05)
    mem = memoryview(bytearray(8))
    cache.remember(b"", [b"k" * 16], [_Arena()], [mem], [7], [0])
    assert len(cache.run(b"", [b"k" * 16], [8])) == 1
    deadline = time.monotonic() + 0.05
    while time.monotonic() <= deadline:       # the clock, not an event: the entry's lifetime is the subject
        time.sleep(0.01)
    assert cache.run(b"", [b"k" * 16], [8]) == []


def test_refresh_extends_the_remembered_ones_and_moves_them_last_in_the_drop_order():
    """What a use report's reply does to the hits: the same locations and generations, a new lifetime, and the
    back of the drop order; keys not remembered stay unknown."""
    cache = LocationCache(60, max_entries=2)
    arena = _Arena()
    mem = memoryview(bytearray(16))
    a, b, c = (bytes([i]) * 16 for i in range(3))
    cache.remember(b"", [a, b], [arena] * 2, [mem[0:8], mem[8:16]], [1, 2], [0, 0])
    old = cache.run(b"", [a], [8])[0].expires
    cache.refresh(b"", [a, c])
    entry = cache.run(b"", [a], [8])[0]
    assert entry.expires > old and (entry.checksum, entry.generation, entry.extent.obj) == (1, 0, mem.obj)
    assert len(cache) == 2 and cache.run(b"", [c], [8]) == []
    cache.remember(b"", [c], [arena], [mem[0:8]], [3], [0])      # over the bound: b goes, not the refreshed a
    assert cache.run(b"", [b], [8]) == [] and [e.checksum for e in cache.run(b"", [a], [8])] == [1]
    cache.refresh(b"", [a, c], [1, 2])      # a is still in DRAM; c, remembered in DRAM, is on SSD now: forgotten
    assert [e.checksum for e in cache.run(b"", [a], [8])] == [1] and cache.run(b"", [c], [8]) == []
    assert cache.stale == 0 and cache.removed == 0


def test_a_report_is_counted_and_recorded_once_per_get_it_stands_for(tmp_path):
    """The master's side of a report: one lookup with uses=3 counts three lookups in the stats and writes three
    rows to the traffic recording, as the three gets it stands for would have."""
    from kvpool import EmbeddedPool
    from kvpool.store.records import NsRef
    from kvpool.trace import LOOKUP, load_trace

    with EmbeddedPool(dram_bytes=1 << 20, ssd_path=None, write_behind=False, record_directory=str(tmp_path)) as pool:
        assert pool.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        before = pool.stats()
        ns = NsRef(b"\x07" * 16, "m/t", 16)       # 16 tokens per block: the token figures are counted too
        result = pool.master.lookup(KEYS[:2], ns, lease=True, uses=3, s_per_token=0.001)
        assert result.hits == 2
        pool.master.release([result.lease_id])
        after = pool.stats()
        assert after["lookups"] - before["lookups"] == 3
        assert after["hit_keys"] - before["hit_keys"] == 6
        assert after["requested_keys"] - before["requested_keys"] == 6
        assert after["hit_tokens_by_tier"]["dram"] - before["hit_tokens_by_tier"]["dram"] == 3 * 2 * 16
        assert after["prefill_seconds_saved"] - before["prefill_seconds_saved"] == pytest.approx(3 * 2 * 16 * 0.001)
        with pytest.raises(ValueError, match=r"^uses must be an int in \[1, 65536\] .*got 0"):
            pool.master.lookup(KEYS[:2], uses=0)
    trace = load_trace(tmp_path)
    lookups = [i for i in range(len(trace)) if trace.op[i] == LOOKUP]
    assert len(lookups) == 3 and all(len(trace.chain(i)) == 2 for i in lookups)


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_readers_under_churn_only_ever_get_committed_bytes(small_up, transport):
    """Three reader threads get through one cached client while a writer keeps removing keys and putting new
    versions, so extents are freed and reused under remembered entries with no lease held (and, over TCP, the
    node's removal stamp moves under dated reads). Every filled buffer must be a version that was committed under
    its key; stale entries are met and fall back (counted)."""
    import threading

    def version(k: int, v: int) -> bytes:
        return bytes([k, v % 256]) * (OBJ // 2)

    keys = KEYS[:3]
    committed: dict[int, set[bytes]] = {k: set() for k in range(3)}
    lock = threading.Lock()
    done = threading.Event()
    errors: list[str] = []
    with PoolClient(small_up.address, transport=transport, location_cache_s=60) as reader, \
            PoolClient(small_up.address) as writer:
        for k in range(3):
            committed[k].add(version(k, 0))
        assert writer.put_many(keys, [version(k, 0) for k in range(3)]) == ["stored"] * 3
        if transport == "tcp":      # the stamp learnt, the locations remembered, then a dated read: before the churn
            for _ in range(3):
                assert reader.get_many_into(keys, bufs(3)) == 3
            assert reader.transfers.dated_reads == 3

        def write() -> None:
            try:
                for v in range(1, 61):
                    k = v % 3
                    writer.remove_many([keys[k]])
                    with lock:
                        committed[k].add(version(k, v))      # before the put: a reader may see it at once
                    writer.put_many([keys[k]], [version(k, v)])
            finally:
                done.set()

        def read() -> None:
            deadline = time.monotonic() + 60
            while not done.is_set() and time.monotonic() < deadline:
                time.sleep(0)       # a cached get holds the GIL throughout: let the writer's calls run between gets
                out = bufs(3)
                n = reader.get_many_into(keys, out)
                with lock:
                    for k in range(n):
                        if bytes(out[k]) not in committed[k]:
                            errors.append(f"key {k}: bytes of no committed version")

        threads = [threading.Thread(target=read) for _ in range(3)] + [threading.Thread(target=write)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        report = cache_report(reader)
        assert report["gets"] > 0 and reader.checksum_failures == 0   # no committed object was ever read back wrong
        if transport == "auto":
            # both paths were taken under the churn: gets from the cache, and entries the writer's removals dropped
            assert report["stale"] + report["removed"] > 0
