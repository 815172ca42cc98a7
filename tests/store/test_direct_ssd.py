"""Same-host SSD reads (kvpool/transfer.py): a client on a node's host reads SSD records from the node's data file
itself (one preadv into its buffer) instead of through the node's data channel, with the node's checks (header,
key, size, payload checksum) and the committed checksum. Real master and node processes on 127.0.0.1; the node
has no DRAM tier, so every object is an SSD record."""

from __future__ import annotations

import json
import os
import shutil
import time

import grpc
import pytest

from kvpool import PoolClient
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import wire
from kvpool.tiers.ssd import DATA_FILE, HEADER_BYTES
from tests.faults.harness import wait_until
from tests.store.cluster import cluster, free_port, key_of, pattern  # noqa: F401

SIZE = 64 << 10
N = 12
MASTER_ARGS = ["--write-behind", "false", "--promote-on-hit", "false"]


def _lookup(address: str, keys: list[bytes]) -> pb.LookupResponse:
    with grpc.insecure_channel(address) as ch:
        stub = pbg.MasterServiceStub(ch)
        reply = stub.Lookup(pb.LookupRequest(keys=keys, lease=True), timeout=5)
        stub.Release(pb.ReleaseRequest(lease_ids=[reply.lease_id]), timeout=5)
    return reply


def _ssd_corrupt(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return json.loads(pbg.MasterServiceStub(ch).Stats(pb.StatsRequest(), timeout=5).json)["ssd_corrupt"]


def _get(address: str, keys: list[bytes], transport: str = "auto") -> tuple[int, list[bytes], int, int]:
    """(hits, the bytes of each buffer, direct SSD reads, checksum failures) of one fresh client's get."""
    with PoolClient(address, transport=transport, timeout=5) as c:
        return _get_with(c, keys)


def _get_with(c: PoolClient, keys: list[bytes]) -> tuple[int, list[bytes], int, int]:
    bufs = [bytearray(SIZE) for _ in keys]
    hits = c.get_many_into(keys, bufs)
    return hits, [bytes(b) for b in bufs], c.transfers.direct_ssd_reads, c.checksum_failures


def _damage_payload(address: str, key: bytes, at: int) -> None:
    """Flip payload byte `at` under `key`'s committed SSD record (what a bad sector or a stray writer does)."""
    reply = _lookup(address, [key])
    fd = os.open(wire.ssd_path(reply.nodes[0]), os.O_RDWR)
    try:
        pos = reply.offsets[0] + HEADER_BYTES + at
        os.pwrite(fd, bytes([os.pread(fd, 1, pos)[0] ^ 0xFF]), pos)
    finally:
        os.close(fd)


def _assert_forgotten_once(address: str, keys: list[bytes], bad: int, before: int) -> None:
    """keys[bad] forgotten by the master (the report rides on the release, which is not awaited), its neighbour
    kept, and counted once in ssd_corrupt (`before`: the count before the read)."""
    with PoolClient(address, timeout=5) as c:
        wait_until(lambda: not c.contains_many([keys[bad]])[0], 5, "the damaged object to be forgotten")
        assert c.contains_many([keys[bad], keys[bad + 1]]) == [False, True]
    assert _ssd_corrupt(address) == before + 1


def test_same_host_reads_come_from_the_data_file_byte_exact_and_tcp_still_works(cluster):
    master = cluster.start_master(extra=MASTER_ARGS)
    cluster.start_node("n1", dram="0", ssd="4MiB")
    keys = [key_of(i) for i in range(N)]
    with PoolClient(master.address, timeout=5) as c:
        assert c.put_many(keys, [pattern(i, SIZE) for i in range(N)]) == ["stored"] * N
    reply = _lookup(master.address, keys)
    assert reply.hits == N and set(reply.tiers) == {pb.SSD}
    assert wire.ssd_path(reply.nodes[0]) == str(cluster.workdir / "ssd-n1" / DATA_FILE)
    expected = [pattern(i, SIZE) for i in range(N)]
    assert _get(master.address, keys, "auto") == (N, expected, N, 0)   # every record read here, none by the node
    assert _get(master.address, keys, "tcp") == (N, expected, 0, 0)    # the data channel path is unchanged


def test_a_damaged_record_read_directly_is_a_miss_reported_to_the_master(cluster):
    master = cluster.start_master(extra=MASTER_ARGS)
    cluster.start_node("n1", dram="0", ssd="4MiB")
    keys = [key_of(i, salt=3) for i in range(N)]
    with PoolClient(master.address, timeout=5) as c:
        assert c.put_many(keys, [pattern(i, SIZE) for i in range(N)]) == ["stored"] * N
    bad = 5
    _damage_payload(master.address, keys[bad], 100)
    before = _ssd_corrupt(master.address)
    hits, got, direct, failures = _get(master.address, keys)
    # every hit was read (one batch); the damaged one failed here, then at the node (its data channel has the last
    # word): the get stops there, a miss
    assert (hits, got[:bad], direct, failures) == (bad, [pattern(i, SIZE) for i in range(bad)], N, 1)
    _assert_forgotten_once(master.address, keys, bad, before)


@pytest.mark.parametrize("verify", ["all", "none"])
def test_a_damaged_record_read_over_tcp_is_a_miss_reported_whoever_checks_its_payload(cluster, verify):
    """Over the data channel a checking client (`verify="all"`: FLAG_CHECKED) gets the record's payload straight
    from the node's file and its own hash finds the damage; a client that checks nothing (`verify="none"`) has the
    node read and verify the record, which answers NOT_FOUND. Either way: a miss, the bytes before it exact, the
    object forgotten and counted once in ssd_corrupt. The node's /metrics count the records it sent from its file,
    and the damaged records it found itself (only the ones it verified: the client's own finds are the master's)."""
    import urllib.request

    master = cluster.start_master(extra=MASTER_ARGS)
    metrics_port = free_port()
    cluster.start_node("n1", dram="0", ssd="4MiB", extra=["--metrics-listen", f"127.0.0.1:{metrics_port}"])
    keys = [key_of(i, salt=5) for i in range(N)]

    def node_metric(name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            lines = r.read().decode().splitlines()
        [line] = [x for x in lines if x.startswith(f"{name}_total ")]
        return float(line.split()[1])

    with PoolClient(master.address, timeout=5) as c:
        assert c.put_many(keys, [pattern(i, SIZE) for i in range(N)]) == ["stored"] * N
    bad = 3
    _damage_payload(master.address, keys[bad], 7)
    before = _ssd_corrupt(master.address)
    with PoolClient(master.address, transport="tcp", verify=verify, timeout=5) as c:
        hits, got, direct, failures = _get_with(c, keys)
    assert (hits, got[:bad], direct, failures) == (bad, [pattern(i, SIZE) for i in range(bad)], 0, 1)
    assert node_metric("kvpool_node_ssd_reads_from_file") == (N if verify == "all" else 0)  # one batch, all read
    assert node_metric("kvpool_node_ssd_corrupt_reads") == (0 if verify == "all" else 1)
    _assert_forgotten_once(master.address, keys, bad, before)


@pytest.mark.parametrize("share", ["false", "true"])
def test_a_node_that_does_not_share_is_read_through_its_data_channel(cluster, share):
    master = cluster.start_master(extra=MASTER_ARGS)
    cluster.start_node("n1", dram="0", ssd="4MiB", extra=["--share-dram", share])   # the last flag wins
    keys = [key_of(i, salt=4) for i in range(4)]
    with PoolClient(master.address, timeout=5) as c:
        assert c.put_many(keys, [pattern(i, SIZE) for i in range(4)]) == ["stored"] * 4
    shared = share == "true"
    assert bool(wire.ssd_path(_lookup(master.address, keys).nodes[0])) is shared
    assert _get(master.address, keys) == (4, [pattern(i, SIZE) for i in range(4)], 4 if shared else 0, 0)


def test_a_node_restarted_on_a_fresh_directory_is_read_from_its_new_file_at_once(cluster):
    """A node restarted on a fresh directory (same id and ports) has a new data file at the same path, while a
    long-lived client still holds the old one open. The restarted node shares a new arena (an SSD-only node's
    generation-only one, store/node.py), so the client routes to it anew and opens the new file: every read is
    direct and right at once, none goes to the old file, and nothing is reported corrupt. (A reader whose file was
    replaced under an unchanged route is still reopened after a failed read: kvpool/transfer.py.)"""
    master = cluster.start_master(extra=MASTER_ARGS)
    port, data_port = free_port(), free_port()
    node_args = dict(dram="0", ssd="4MiB", port=port, extra=["--data-listen", f"127.0.0.1:{data_port}"])
    cluster.start_node("n1", **node_args)
    keys = [key_of(i, salt=6) for i in range(N)]
    with PoolClient(master.address, timeout=5) as c:
        assert c.put_many(keys, [pattern(i, SIZE) for i in range(N)]) == ["stored"] * N
        assert _get_with(c, keys) == (N, [pattern(i, SIZE) for i in range(N)], N, 0)
        cluster.nodes["n1"].kill()
        shutil.rmtree(cluster.workdir / "ssd-n1")
        cluster.start_node("n1", **node_args)
        for _ in range(200):   # the master forgets what the restarted node did not report
            if c.contains_many(keys) == [False] * N:
                break
            time.sleep(0.05)
        assert c.put_many(keys, [pattern(i, SIZE, version=1) for i in range(N)]) == ["stored"] * N
        before = _ssd_corrupt(master.address)
        new = [pattern(i, SIZE, version=1) for i in range(N)]
        assert _get_with(c, keys) == (N, new, 2 * N, 0)
        assert _get_with(c, keys) == (N, new, 3 * N, 0)
        assert c.transfers.direct_ssd_retries == 0
    assert _ssd_corrupt(master.address) == before


def test_a_reader_whose_file_was_replaced_under_an_unchanged_route_is_reopened(tmp_path):
    """Transfers alone, on real files: a route that names no arena (a node from before generation-only arenas) and
    a data file replaced at the same path. The open reader reads the old file's record: not the committed bytes, so
    the read fails here (no data channel to retry on) without being called corrupt, and the reader is reopened: the
    next read of the same entry is direct and right."""
    import xxhash

    from kvpool.store.wire import ExtentBatch
    from kvpool.tiers.ssd import SsdFile
    from kvpool.transfer import Transfers

    key, ns = key_of(0, salt=9), bytes(16)
    old_data, new_data = pattern(0, SIZE), pattern(0, SIZE, version=1)
    files = []
    for name, data in (("old", old_data), ("new", new_data)):
        f = SsdFile.open(str(tmp_path / name), 1 << 20)
        f.write(0, key, ns, data)
        f.close()
        files.append(str(tmp_path / name / DATA_FILE))
    ep = pb.NodeEndpoint(node_id="n1", host_id="H",
                         tiers=[pb.TierCapacity(tier=pb.SSD, capacity_bytes=1 << 20, path=files[0])])
    batch = ExtentBatch([ep], [0], [pb.SSD], [0], [SIZE], [1], [b""], [xxhash.xxh3_64_intdigest(new_data)], 0)
    t = Transfers("H")
    try:
        out = bytearray(SIZE)
        check = ExtentBatch([ep], [0], [pb.SSD], [0], [SIZE], [1], [b""], [xxhash.xxh3_64_intdigest(old_data)], 0)
        assert t.read(check, [0], [key], [memoryview(out)]) == set() and bytes(out) == old_data
        os.replace(files[1], files[0])          # another file at the path; the reader holds the old one open
        corrupt: set[int] = set()
        assert t.read(batch, [0], [key], [memoryview(out)], corrupt=corrupt) == {0} and corrupt == set()
        assert (t.direct_ssd_reads, t.direct_ssd_retries, t.checksum_failures) == (2, 1, 0)
        out = bytearray(SIZE)
        assert t.read(batch, [0], [key], [memoryview(out)]) == set() and bytes(out) == new_data
        assert (t.direct_ssd_reads, t.direct_ssd_retries) == (3, 1)
    finally:
        t.close()


def test_records_of_mixed_sizes_read_back_exact_both_ways(cluster):
    """One connection reads records of growing and shrinking sizes (the node stages them in a buffer it keeps per
    connection thread, and one past its 8 MiB cap in a buffer of its own): every one byte-exact, directly and over
    the data channel."""
    master = cluster.start_master(extra=MASTER_ARGS + ["--max-object-bytes", "16MiB"])
    cluster.start_node("n1", dram="0", ssd="64MiB")
    sizes = [64 << 10, 2 << 20, 4096, 9 << 20, 100_000, 1 << 20]
    keys = [key_of(i, salt=7) for i in range(len(sizes))]
    data = [pattern(i, n) for i, n in enumerate(sizes)]
    with PoolClient(master.address, timeout=10) as c:
        assert c.put_many(keys, data) == ["stored"] * len(keys)
    for transport in ("tcp", "auto"):
        with PoolClient(master.address, transport=transport, timeout=10) as c:
            for _ in range(2):
                bufs = [bytearray(n) for n in sizes]
                assert c.get_many_into(keys, bufs) == len(keys)
                assert [bytes(b) for b in bufs] == data
            assert c.transfers.direct_ssd_reads == (0 if transport == "tcp" else 2 * len(keys))
