"""A leased get (PoolClient(optimistic_reads=False), or any get whose hits are not all in arenas mapped here; an
optimistic get takes no lease: tests/kvpool/test_optimistic_reads.py) costs one master round trip: its read lease is
ended by the client's next lookup (release_lease_ids) or, when none comes, by one Release a few ms later; and a
lookup names the nodes whose DRAM the client maps, whose hits then carry no data-channel token (only the data
channel checks them). Real `kvpool up` pool in this process (LocalCluster: gRPC master + node with DRAM and SSD on
127.0.0.1), exact per-method call counts at the master."""

from __future__ import annotations

import pytest

from kvpool import PoolClient
from kvpool.proto import kvpool_pb2 as pb
from kvpool.store.tokens import TOKEN_BYTES
from tests.conftest import SMALL_UP_OBJ
from tests.store.test_control_channel import wait_until

OBJ = SMALL_UP_OBJ
KEYS = [(0xD0 << 120 | i).to_bytes(16, "big") for i in range(8)]
DATAS = [bytes([i + 1]) * OBJ for i in range(8)]


def leases_open(c: PoolClient) -> int:
    return c.stats()["leases_open"]


def test_each_get_ends_the_previous_gets_lease_and_close_sends_the_last(small_up):
    calls = small_up.master.control.calls
    # no timer-sent Release here: exact counts
    with PoolClient(small_up.address, release_linger_s=60, optimistic_reads=False, location_cache_s=0,
                    host_index_reads=False) as c:
        assert c.put_many(KEYS[:4], DATAS[:4]) == ["stored"] * 4
        bufs = [bytearray(OBJ) for _ in range(4)]
        for n in range(1, 6):
            assert c.get_many_into(KEYS[:4], bufs) == 4 and bufs == [bytearray(d) for d in DATAS[:4]]
            assert leases_open(c) == 1      # this get's; the one before rode along with its lookup
        assert (calls["Lookup"], calls["Release"]) == (5, 0)
        with pytest.raises(ValueError, match=r"buffers\[0\] has 4096 bytes, object has 8192"):
            c.get_many_into(KEYS[:1], [bytearray(4096)])
        assert leases_open(c) == 1          # a refused lookup released nothing: the lease went back to the queue
        assert c.get_many_into(KEYS[:1], bufs[:1]) == 1 and leases_open(c) == 1
    # the refused lookup is not among the answered calls counted; close() sent the last lease in one Release
    assert calls["Lookup"] == 6 and calls["Release"] == 1
    with PoolClient(small_up.address) as admin:
        assert leases_open(admin) == 0


def test_release_linger_s_out_of_range_names_the_field(small_up):
    for bad in (-1, 61, True, "5ms"):
        with pytest.raises(ValueError, match=r"^release_linger_s must be a number of seconds in \[0, 60\], got "):
            PoolClient(small_up.address, release_linger_s=bad)


def test_an_idle_clients_lease_ends_by_one_release(small_up):
    calls = small_up.master.control.calls
    with PoolClient(small_up.address, optimistic_reads=False) as c:
        assert c.put_many(KEYS[:2], DATAS[:2]) == ["stored"] * 2
        bufs = [bytearray(OBJ) for _ in range(2)]
        assert c.get_many_into(KEYS[:2], bufs) == 2
        wait_until(lambda: calls["Release"] == 1, "the lease's release")
        assert leases_open(c) == 0 and calls["Lookup"] == 1


def lookup(c: PoolClient, keys, mapped: list[str]) -> pb.LookupResponse:
    req = pb.LookupRequest(lease=True, keys=keys, mapped_nodes=mapped)
    reply = c.rpc.call("Lookup", req, retry=True, what="lookup")
    c.rpc.call("Release", pb.ReleaseRequest(lease_ids=[reply.lease_id]), retry=True, what="release")
    return reply


def test_hits_on_mapped_nodes_dram_carry_no_token_and_tcp_clients_get_every_token(small_up):
    with PoolClient(small_up.address) as c:
        assert c.put_many(KEYS, DATAS) == ["stored"] * 8       # 4 fit in DRAM: the first 4 went down to SSD
        node = small_up.node.node.info().node_id
        full = lookup(c, KEYS, [])
        assert [len(t) for t in full.tokens] == [TOKEN_BYTES] * 8
        mapped = lookup(c, KEYS, [node])
        dram = [t == pb.DRAM for t in mapped.tiers]
        assert sum(dram) == 4
        assert [len(t) for t in mapped.tokens] == [0 if d else TOKEN_BYTES for d in dram]
        assert [len(t) for t in lookup(c, KEYS, ["another-node"]).tokens] == [TOKEN_BYTES] * 8
        assert c.transfers.mapped_nodes() == (node,)           # the puts mapped its arena
        bufs = [bytearray(OBJ) for _ in KEYS]
        assert c.get_many_into(KEYS, bufs) == 8 and bufs == [bytearray(d) for d in DATAS]   # DRAM by memcpy, SSD by TCP
    with PoolClient(small_up.address, transport="tcp") as t:
        bufs = [bytearray(OBJ) for _ in KEYS]
        assert t.get_many_into(KEYS, bufs) == 8 and bufs == [bytearray(d) for d in DATAS]
        assert t.transfers.mapped_nodes() == ()
