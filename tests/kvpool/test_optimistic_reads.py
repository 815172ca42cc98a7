"""Optimistic same-host reads (PoolClient(optimistic_reads=True), the default; LookupRequest.optimistic): a get whose
hits all sit in arenas this client maps takes them with no lease, and the read fence (the copy hashed against the
committed checksum) is the only guard. So what must hold: no lease, no Release; an extent reused between the lookup
and the copy is never returned and is not reported corrupt; the keys from there on are read again under a lease,
which finds an object that moved. Real `kvpool up` pool in this process (LocalCluster: master + node with DRAM for
four objects and SSD below, on 127.0.0.1); the interference runs at the one point a race can hit, right after the
master answered the lookup, through a wrapper around the client's public `rpc.call`."""

from __future__ import annotations

import pytest

from kvpool import PoolClient
from kvpool.proto import kvpool_pb2 as pb
from tests.conftest import SMALL_UP_OBJ as OBJ

KEYS = [(0x0B << 120 | i).to_bytes(16, "big") for i in range(8)]
DATAS = [bytes([i + 1]) * OBJ for i in range(8)]
OTHER = [bytes([0xE0 + i]) * OBJ for i in range(8)]


def bufs(n: int) -> list[bytearray]:
    return [bytearray(OBJ) for _ in range(n)]


def after_lookups(c: PoolClient, monkeypatch, action) -> list[pb.LookupResponse]:
    """Run `action()` once, right after the first Lookup reply without a lease reaches `c` (before it copies);
    returns every Lookup reply `c` got from then on."""
    call = c.rpc.call
    replies: list[pb.LookupResponse] = []
    done = []

    def wrapped(method, request, **kw):
        reply = call(method, request, **kw)
        if method == "Lookup":
            if not done and reply.hits and not reply.lease_id:
                done.append(True)
                action()
            if done:
                replies.append(reply)
        return reply

    monkeypatch.setattr(c.rpc, "call", wrapped)
    return replies


def stats(small_up) -> dict:
    with PoolClient(small_up.address) as admin:
        return admin.stats()


def test_a_same_host_get_takes_no_lease_and_sends_no_release(small_up):
    calls = small_up.master.control.calls
    with PoolClient(small_up.address) as w:
        assert w.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4
    base = (calls["Lookup"], calls["Release"])
    with PoolClient(small_up.address, release_linger_s=60) as c:
        for n in range(4):
            out, tiers = bufs(4), []
            assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4
            assert out == [bytearray(d) for d in DATAS[:4]] and tiers == ["dram"] * 4
            # a fresh client's first lookup names no mapped arena (it maps the node's arena to read): a lease,
            # ended by the second get's lookup, which takes none
            assert c.stats()["leases_open"] == (1 if n == 0 else 0)
        assert c.optimistic_retries == 0 and c.checksum_failures == 0
    assert (calls["Lookup"], calls["Release"]) == (base[0] + 4, base[1])     # close() had nothing to release
    s = stats(small_up)
    assert s["lookups"] == 4 and s["hit_keys"] == 16 and s["leases_open"] == 0
    # the same gets with optimistic_reads=False: a lease each, the last one still open until close()
    with PoolClient(small_up.address, release_linger_s=60, optimistic_reads=False) as c:
        out = bufs(4)
        assert c.get_many_into(KEYS[:4], out) == 4 and out == [bytearray(d) for d in DATAS[:4]]
        assert c.stats()["leases_open"] == 1


def test_extents_reused_after_the_lookup_are_misses_not_corruption(small_up, monkeypatch):
    with PoolClient(small_up.address) as w, PoolClient(small_up.address, host_index_reads=False) as c:
        assert w.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4

        def reuse_all() -> None:      # nothing pins an optimistic read: the four extents go to other objects
            assert w.remove_many(KEYS[:4]) == 4
            assert w.put_many(KEYS[4:8], OTHER[:4]) == ["stored"] * 4

        c.warm(prefault=False)      # its arena mapped: the first get's lookup is optimistic
        replies = after_lookups(c, monkeypatch, reuse_all)
        assert c.get_many_into(KEYS[:4], bufs(4)) == 0
        # the optimistic lookup, then one leased lookup from the first key that did not hash right: gone
        assert [(r.hits, r.lease_id != 0) for r in replies] == [(4, False), (0, False)]
        assert c.optimistic_retries == 1 and c.checksum_failures == 0
        out = bufs(4)
        assert c.get_many_into(KEYS[4:8], out) == 4 and out == [bytearray(d) for d in OTHER[:4]]
    s = stats(small_up)
    assert s["dram_corrupt"] == 0 and s["ssd_corrupt"] == 0


def test_an_object_moved_mid_read_is_read_again_from_its_new_place(small_up, monkeypatch):
    with PoolClient(small_up.address) as w, PoolClient(small_up.address, host_index_reads=False) as c:
        assert w.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4

        def push_one_down() -> None:  # DRAM holds four: a fifth object demotes the least recently used to SSD
            assert w.put_many(KEYS[4:5], OTHER[:1]) == ["stored"]

        c.warm(prefault=False)
        replies = after_lookups(c, monkeypatch, push_one_down)
        out, tiers = bufs(4), []
        assert c.get_many_into(KEYS[:4], out, tiers_out=tiers) == 4
        assert out == [bytearray(d) for d in DATAS[:4]]      # every byte the committed object's
        # the lookup touched the chain tail last-used-first: K3 went down and K4 took its extent. K0-K2 copied
        # and checked; K3's copy failed the fence, so K3 came again under a lease, from SSD
        assert tiers == ["dram", "dram", "dram", "ssd"]
        assert [(r.hits, r.lease_id != 0) for r in replies] == [(4, False), (1, True)]
        assert c.optimistic_retries == 1 and c.checksum_failures == 0
    s = stats(small_up)
    assert s["dram_corrupt"] == 0 and s["ssd_corrupt"] == 0 and s["leases_open"] == 0


def test_hits_on_another_tier_or_node_take_a_lease(small_up):
    with PoolClient(small_up.address) as c, PoolClient(small_up.address, transport="tcp") as t:
        assert c.put_many(KEYS, DATAS) == ["stored"] * 8        # DRAM holds four: the last four went to SSD
        node = small_up.node.node.info().node_id
        for keys, mapped, leased in ((KEYS[:4], [node], False), (KEYS, [node], True), (KEYS[:4], [], True),
                                     (KEYS[:4], ["another-node"], True)):
            req = pb.LookupRequest(lease=True, keys=keys, mapped_nodes=mapped, optimistic=True)
            reply = c.rpc.call("Lookup", req, retry=True, what="lookup")
            assert (reply.hits, reply.lease_id != 0) == (len(keys), leased)
            assert len(reply.offsets) == len(reply.checksums) == len(keys)
            assert list(reply.tiers) == [pb.DRAM] * 4 + [pb.SSD] * (len(keys) - 4)
            if reply.lease_id:
                c.rpc.call("Release", pb.ReleaseRequest(lease_ids=[reply.lease_id]), retry=True, what="release")
            else:
                assert list(reply.tokens) == [b""] * len(keys)
        out = bufs(8)
        assert t.get_many_into(KEYS, out) == 8 and out == [bytearray(d) for d in DATAS]    # TCP: leased
        assert t.optimistic_retries == 0
    assert stats(small_up)["leases_open"] == 0


def test_optimistic_reads_is_checked_and_needs_the_fence(small_up):
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match=r"^optimistic_reads must be True or False, got "):
            PoolClient(small_up.address, optimistic_reads=bad)
    with PoolClient(small_up.address, verify="remote", release_linger_s=60) as c:     # no fence on mapped copies: leases, always
        assert c.optimistic_reads is False
        assert c.put_many(KEYS[:1], DATAS[:1]) == ["stored"]
        assert c.get_many_into(KEYS[:1], bufs(1)) == 1
        assert c.stats()["leases_open"] == 1
