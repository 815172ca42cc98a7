"""The location cache over TCP (kvpool/locations.py TcpLocation, store/data_channel.py READ_DATED): a client that
reads a node through its data channel learns the node's removal stamp at its first get, remembers the locations at
its second, and from the third on reads them as dated reads with no master round trip. Every byte is hashed against
the committed checksum as it lands, and the node refuses any read dated before a removal it was told of. Real
`kvpool up` pool in this process (LocalCluster: master + node with DRAM and SSD on 127.0.0.1), exact per-method
call counts at the master."""

from __future__ import annotations

from kvpool import PoolClient
from kvpool.admin import AdminClient
from kvpool.locations import TOKEN_MARGIN_S, LocationCache, TcpLocation
from kvpool.store import tokens
from kvpool.store.data_channel import Extent
from kvpool.tiers.types import Tier
from tests.conftest import SMALL_UP_OBJ as OBJ
from tests.store.test_control_channel import wait_until

KEYS = [(0xCB << 120 | i).to_bytes(16, "big") for i in range(8)]
DATAS = [bytes([i + 1]) * OBJ for i in range(8)]
OTHER = [bytes([0xF0 + i]) * OBJ for i in range(8)]


def bufs(n: int) -> list[bytearray]:
    return [bytearray(OBJ) for _ in range(n)]


def report(c: PoolClient) -> dict:
    s = c.stats()
    return {**s["client_location_cache"], **{f"dated {k}": v for k, v in s["client_dated_reads"].items()}}


def tcp(address: str, **kw) -> PoolClient:
    return PoolClient(address, transport="tcp", location_cache_s=60, **kw)


def test_the_third_get_on_takes_no_master_round_trip_and_every_get_is_still_counted(small_up):
    calls = small_up.master.control.calls
    with tcp(small_up.address) as writer:
        assert writer.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4
    base = calls["Lookup"]
    # release_linger_s=60: the timer sends nothing, so the counts below are exact; close() sends the report
    with tcp(small_up.address, release_linger_s=60) as c:
        for expect_lookups, expect_entries in ((1, 0), (2, 4)):   # 1st: the stamp learnt; 2nd: dated, remembered
            out, tiers = bufs(4), []
            assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4
            assert out == [bytearray(d) for d in DATAS[:4]] and tiers == ["dram"] * 4
            assert calls["Lookup"] == base + expect_lookups and len(c.locations) == expect_entries
        for _ in range(5):
            out, tiers = bufs(4), []
            assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4
            assert out == [bytearray(d) for d in DATAS[:4]] and tiers == ["dram"] * 4
        assert calls["Lookup"] == base + 2              # five gets, no round trip to the master
        assert c.transfers.dated_reads == 20 and c.transfers.stamp_refusals == 0
        assert c.locations.report() == {"entries": 4, "gets": 5, "objects": 20, "stale": 0, "removed": 0}
        assert c.checksum_failures == 0
    assert calls["Lookup"] == base + 3                  # close() sent the report: one Lookup with uses=5
    with PoolClient(small_up.address) as admin:
        s = admin.stats()
        assert s["lookups"] == 7 and s["hit_keys"] == 7 * 4 and s["leases_open"] == 0   # as if every get had asked


def test_an_object_removed_by_another_client_is_refused_by_the_node_once_remove_returned(small_up):
    """Its extent still holds its bytes, and the reader has heard of no removal: the node itself refuses the read,
    dated before its stamp moved. The get asks the master, which has nothing; no byte of it reaches the buffer."""
    calls = small_up.master.control.calls
    with tcp(small_up.address) as a, PoolClient(small_up.address) as b:
        assert b.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4
        for _ in range(2):
            assert a.get_many_into(KEYS[:4], bufs(4)) == 4
        assert len(a.locations) == 4
        wait_until(lambda: b.stats()["leases_open"] == 0, "the gets' leases ending")
        assert b.remove_many(KEYS[:1]) == 1
        base = calls["Lookup"]
        out = bufs(1)
        assert a.get_many_into(KEYS[:1], out) == 0 and out == bufs(1)
        assert calls["Lookup"] == base + 1                  # refused at the node, then the master: nothing
        assert (a.transfers.dated_reads, a.transfers.stamp_refusals) == (1, 1)
        # the other three, dated by the same old stamp, are dropped unread and located again (not refused again)
        out = bufs(3)
        assert a.get_many_into(KEYS[1:4], out) == 3 and out == [bytearray(d) for d in DATAS[1:4]]
        assert (a.transfers.dated_reads, a.transfers.stamp_refusals) == (1, 1)
        r = report(a)
        assert (r["removed"], r["stale"], r["gets"]) == (2, 0, 0)


def test_an_admin_evict_moves_the_stamp_too(small_up):
    with tcp(small_up.address) as a:
        assert a.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        for _ in range(2):
            assert a.get_many_into(KEYS[:2], bufs(2)) == 2
        wait_until(lambda: a.stats()["leases_open"] == 0, "the gets' leases ending")
        with AdminClient(small_up.address) as admin:
            assert admin.evict(everything=True) == 2            # `kvpool evict --all`
        out = bufs(2)
        assert a.get_many_into(KEYS[:2], out) == 0 and out == bufs(2)
        assert a.transfers.stamp_refusals == 2             # one window of two dated reads, each refused


def test_the_clients_own_remove_forgets_the_stamps_so_nothing_is_sent_to_be_refused(small_up):
    with tcp(small_up.address) as a:
        assert a.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        for _ in range(3):
            assert a.get_many_into(KEYS[:2], bufs(2)) == 2
        assert a.remove_many(KEYS[:1]) == 1
        assert len(a.locations) == 0
        for _ in range(3):          # stamp learnt again, remembered again, then served from the cache
            out = bufs(1)
            assert a.get_many_into(KEYS[1:2], out) == 1 and out == [bytearray(DATAS[1])]
        assert a.transfers.stamp_refusals == 0 and report(a)["gets"] == 2


def test_an_extent_reused_by_other_objects_is_stale_never_returned_never_corrupt(small_up):
    """No removal, so the stamp stays: DRAM holds exactly four objects, the next four reuse their extents and push
    them to SSD. The dated read is served, hashes to another checksum, and is dropped; the master finds them on SSD,
    where the next gets read them (as dated reads of SSD records, checked by the node as any record read)."""
    with tcp(small_up.address) as a, PoolClient(small_up.address) as b:
        assert b.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4
        for _ in range(2):
            assert a.get_many_into(KEYS[:4], bufs(4)) == 4
        wait_until(lambda: b.stats()["leases_open"] == 0, "the gets' leases ending")
        assert b.put_many(KEYS[4:], OTHER[4:]) == ["stored"] * 4
        out, tiers = bufs(4), []
        assert a.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4
        assert out == [bytearray(d) for d in DATAS[:4]] and tiers == ["ssd"] * 4
        r = report(a)
        assert (r["stale"], r["removed"], r["gets"], r["dated refused"]) == (1, 0, 0, 0)
        assert a.checksum_failures == 0 and b.stats()["dram_corrupt"] == 0    # stale is not corrupt
        for _ in range(2):
            out, tiers = bufs(4), []
            assert a.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4
            assert out == [bytearray(d) for d in DATAS[:4]] and tiers == ["ssd"] * 4
        assert report(a)["gets"] == 2       # the SSD records, remembered by the get that found them (stamp known)
        got = bufs(4)
        assert a.get_many_into(KEYS[4:], got) == 4 and got == [bytearray(d) for d in OTHER[4:]]


def test_a_dead_node_fails_the_cached_read_and_the_get_asks_the_master(small_up):
    calls = small_up.master.control.calls
    with tcp(small_up.address, timeout=5) as a:
        assert a.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        for _ in range(2):
            assert a.get_many_into(KEYS[:2], bufs(2)) == 2
        small_up.node.stop(0)
        base = calls["Lookup"]
        out = bufs(2)
        assert a.get_many_into(KEYS[:2], out) == 0 and out == bufs(2)   # the only node is gone: a miss
        assert calls["Lookup"] >= base + 1 and a.locations.gets == 0 and a.transfers.dated_reads == 2


class _Node:
    """A NodeStamp stand-in for the cache's own rules (no reads happen here)."""

    generation = b"s" * 16

    def owner_alive(self) -> bool:
        return True


def _loc(node, expires_ms: int, size: int = 8, tier: int = Tier.DRAM) -> TcpLocation:
    return TcpLocation(node, Extent(1, tier, 0, size, expires_ms, bytes(16), b"k" * 16, node.generation))


def test_an_entry_is_not_used_within_the_margin_of_its_read_tokens_expiry():
    cache = LocationCache(60)
    node = _Node()
    now = tokens.now_ms()
    late, fine = b"a" * 16, b"b" * 16
    cache.remember(b"", [late, fine], [node, node],
                   [_loc(node, now + int(TOKEN_MARGIN_S * 1000) - 500), _loc(node, now + 60_000)], [1, 2],
                   [node.generation] * 2)
    assert cache.run(b"", [late], [8]) == [] and len(cache) == 1       # dropped: the node would refuse the token
    assert [e.checksum for e in cache.run(b"", [fine], [8])] == [2]


def test_a_forgotten_stamp_drops_its_entries_unread_and_a_tier_change_forgets_one():
    cache = LocationCache(60)
    node = _Node()
    far = tokens.now_ms() + 60_000
    a, b = b"a" * 16, b"b" * 16
    cache.remember(b"", [a, b], [node, node], [_loc(node, far), _loc(node, far, tier=Tier.SSD)], [1, 2],
                   [node.generation] * 2)
    cache.refresh(b"", [a, b], [Tier.DRAM, Tier.DRAM])     # b was remembered on SSD: promoted, forgotten
    assert [e.checksum for e in cache.run(b"", [a], [8])] == [1] and cache.run(b"", [b], [8]) == []
    node.generation = None                                  # a refused date (transfer.NodeStamp.refused)
    assert cache.run(b"", [a], [8]) == [] and cache.removed == 1 and len(cache) == 0


def test_location_cache_s_0_remembers_nothing_over_tcp_either(small_up):
    calls = small_up.master.control.calls
    with PoolClient(small_up.address, transport="tcp", location_cache_s=0) as c:
        assert c.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        base = calls["Lookup"]
        for _ in range(3):
            assert c.get_many_into(KEYS[:2], bufs(2)) == 2
        assert calls["Lookup"] == base + 3 and c.locations is None and c.transfers.dated_reads == 0


def test_a_node_from_before_dated_reads_is_asked_once_per_retry_period_and_nothing_of_it_is_dated():
    """A node from before 2026-11-29 answers any frame but READ / WRITE with INVALID_ARGUMENT "magic/op" and closes
    the connection (its serve loop). A real socket server that does exactly that: the client's stamp stays unknown,
    it does not ask again within STAMP_RETRY_S, and so no lookup dates anything of that node."""
    import socket
    import threading

    from kvpool.proto import kvpool_pb2 as pb
    from kvpool.store.data_channel import BAD_REQUEST, REP, REQ
    from kvpool.store.wire import ExtentBatch
    from kvpool.transfer import STAMP_RETRY_S, Transfers

    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def old_node() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                accepted.append(1)
                header = conn.recv(REQ.size, socket.MSG_WAITALL)
                assert REQ.unpack(header)[1] == 4               # the client's STAMP frame
                msg = b"magic/op: not a kvpool data frame"
                conn.sendall(REP.pack(BAD_REQUEST, len(msg), 0) + msg)

    thread = threading.Thread(target=old_node, daemon=True)
    thread.start()
    transfers = Transfers("this-host", transport="tcp", timeout=5)
    try:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        ep = pb.NodeEndpoint(node_id="old", host_id="elsewhere", data_address=address)
        batch = ExtentBatch(nodes=[ep], node_index=[], tiers=[], offsets=[], sizes=[], ids=[], tokens=[],
                            checksums=[], expires_ms=0)
        transfers.learn_stamps(batch)
        assert len(accepted) == 1 and transfers.generations() == {}     # asked, not known: nothing is dated
        transfers.learn_stamps(batch)       # within STAMP_RETRY_S (30 s) of the refusal: not asked again
        assert len(accepted) == 1 and transfers.generations() == {} and STAMP_RETRY_S == 30.0
    finally:
        transfers.close()
        listener.close()
