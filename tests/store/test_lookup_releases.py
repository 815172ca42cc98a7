"""A get costs one master round trip: its read lease is ended by the client's next lookup (release_lease_ids) or,
when none comes, by one Release a few ms later; and a lookup names the nodes whose DRAM the client maps, whose
hits then carry no data-channel token (only the data channel checks them). Real `kvpool up` pool in this process
(LocalCluster: gRPC master + node with DRAM and SSD on 127.0.0.1), exact per-method call counts at the master."""

from __future__ import annotations

import os
import shutil

import pytest

from kvpool import PoolClient
from kvpool.launcher import free_port
from kvpool.proto import kvpool_pb2 as pb
from kvpool.store.config import UpConfig
from kvpool.store.local_cluster import LocalCluster
from kvpool.store.tokens import TOKEN_BYTES
from tests.store.test_control_channel import wait_until

OBJ = 8 << 10
KEYS = [(0xD0 << 120 | i).to_bytes(16, "big") for i in range(8)]
DATAS = [bytes([i + 1]) * OBJ for i in range(8)]


@pytest.fixture
def cluster(tmp_path):
    shm = os.path.join("/dev/shm", f"kvpool-rel-{os.getpid()}-{free_port()}")
    os.makedirs(shm, exist_ok=True)
    cfg = UpConfig(listen=f"127.0.0.1:{free_port()}", http_listen="", shm_dir=shm, dram_bytes=4 * OBJ,
                   ssd_path=str(tmp_path / "ssd"), ssd_bytes=64 * OBJ, promote_on_hit=False)
    c = LocalCluster(cfg).start()
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(shm, ignore_errors=True)


def leases_open(c: PoolClient) -> int:
    return c.stats()["leases_open"]


def test_each_get_ends_the_previous_gets_lease_and_close_sends_the_last(cluster):
    calls = cluster.master.control.calls
    with PoolClient(cluster.address, release_linger_s=60) as c:   # no timer-sent Release here: exact counts
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
    with PoolClient(cluster.address) as admin:
        assert leases_open(admin) == 0


def test_release_linger_s_out_of_range_names_the_field(cluster):
    for bad in (-1, 61, True, "5ms"):
        with pytest.raises(ValueError, match=r"^release_linger_s must be a number of seconds in \[0, 60\], got "):
            PoolClient(cluster.address, release_linger_s=bad)


def test_an_idle_clients_lease_ends_by_one_release(cluster):
    calls = cluster.master.control.calls
    with PoolClient(cluster.address) as c:
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


def test_hits_on_mapped_nodes_dram_carry_no_token_and_tcp_clients_get_every_token(cluster):
    with PoolClient(cluster.address) as c:
        assert c.put_many(KEYS, DATAS) == ["stored"] * 8       # 4 fit in DRAM: the first 4 went down to SSD
        node = cluster.node.node.info().node_id
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
    with PoolClient(cluster.address, transport="tcp") as t:
        bufs = [bytearray(OBJ) for _ in KEYS]
        assert t.get_many_into(KEYS, bufs) == 8 and bufs == [bytearray(d) for d in DATAS]
        assert t.transfers.mapped_nodes() == ()
