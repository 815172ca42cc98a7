"""`kvpool drain NODE` with real processes on 127.0.0.1: a master, two storage nodes, a client process putting and
getting (verifying every byte) while the drain runs. Every loop is bounded in count and time."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
import time

import grpc
import pytest

from kvpool import PoolClient
from kvpool.drain import drain
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from tests.lost_calls import OneLostCall
from tests.store.cluster import check_pattern, cluster, key_of, pattern  # noqa: F401

SIZE = 16 << 10
TRAFFIC_PUTS = 300      # objects the traffic process adds (2 per iteration), on top of the initial ones
TRAFFIC_ITERS = 30000   # bounded by TRAFFIC_SECONDS first: repeat gets served by the location cache take ~1 ms
TRAFFIC_SECONDS = 40.0


def traffic(address: str, initial: int, stop, progress, out) -> None:
    """Put new objects and read random stored ones (bytes checked) until `stop`, bounded in count and time.
    Sends (stored indices, reads verified, misses) on `out`."""
    import random

    rng = random.Random(7)
    stored = list(range(initial))
    verified = misses = 0
    next_i = initial
    end = time.monotonic() + TRAFFIC_SECONDS
    with PoolClient(address, timeout=5) as c:
        for it in range(TRAFFIC_ITERS):
            if stop.is_set() or time.monotonic() > end:
                break
            if next_i < initial + TRAFFIC_PUTS:
                batch = [next_i, next_i + 1]
                next_i += 2
                statuses = c.put_many([key_of(i) for i in batch], [pattern(i, SIZE) for i in batch])
                stored += [i for i, s in zip(batch, statuses) if s == "stored"]
            picks = rng.sample(stored, 4)
            bufs = [bytearray(SIZE) for _ in picks]
            n = c.get_many_into([key_of(i) for i in picks], bufs)
            for i, buf in zip(picks[:n], bufs[:n]):
                check_pattern(buf, i)  # raises on a wrong byte
            verified += n
            misses += n < len(picks)
            progress.value = it + 1
    out.put((stored, verified, misses))


def _wait(cond, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(what)
        time.sleep(0.02)


def _inspect(address: str, indices: list[int]) -> list[str | None]:
    with grpc.insecure_channel(address) as ch:
        reply = pbg.MasterServiceStub(ch).Inspect(pb.InspectRequest(keys=[key_of(i) for i in indices]), timeout=5)
    found = iter(reply.objects)
    return [next(found).node_id if ok else None for ok in reply.found]


def _places(address: str) -> list[tuple[str, str]]:
    from kvpool.admin import AdminClient

    with AdminClient(address) as admin:
        return [(o["node"], o["tier"]) for o in admin.list()]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvpool.cli", *args], capture_output=True, text=True, timeout=120)


def _read_all(address: str, indices: list[int], transport: str) -> list[bytes | None]:
    out = []
    with PoolClient(address, transport=transport, timeout=5) as c:
        for i in indices:
            buf = bytearray(SIZE)
            out.append(bytes(buf) if c.get_many_into([key_of(i)], [buf]) == 1 else None)
    return out


def test_drain_under_traffic_moves_every_committed_object_byte_exact(cluster):
    master = cluster.start_master(node_ttl_s=3.0)
    cluster.start_node("n1", dram="12MiB")
    cluster.start_node("n2", dram="12MiB")
    initial = 240
    with PoolClient(master.address, timeout=5) as c:
        assert c.put_many([key_of(i) for i in range(initial)], [pattern(i, SIZE) for i in range(initial)]) \
            == ["stored"] * initial
    on_n1 = [i for i, n in zip(range(initial), _inspect(master.address, list(range(initial)))) if n == "n1"]
    assert len(on_n1) > 50
    ctx = mp.get_context("spawn")
    stop, progress, out = ctx.Event(), ctx.Value("i", 0), ctx.Queue()
    proc = ctx.Process(target=traffic, args=(master.address, initial, stop, progress, out))
    proc.start()
    try:
        _wait(lambda: progress.value >= 20, 30, "traffic did not start")
        before = progress.value
        done = _cli("drain", "n1", "--json", "--master", master.address)
        during = progress.value - before
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        after = progress.value
        _wait(lambda: progress.value >= after + 20, 30, "traffic stalled after the drain")
        stop.set()
        stored, verified, misses = out.get(timeout=60)
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        stop.set()
        if proc.is_alive():
            proc.kill()
    assert during > 0  # the client kept putting and getting while the drain ran
    assert report["dropped"] == 0 and report["no_room"] == 0 and report["failed"] == 0
    assert report["moved"] >= len(on_n1) and report["node"] == "n1"
    assert misses == 0 and verified > 0  # no reader missed a committed object or saw a wrong byte
    assert len(stored) > initial
    assert set(_inspect(master.address, stored)) == {"n2"}
    for transport in ("auto", "tcp"):
        assert _read_all(master.address, stored, transport) == [pattern(i, SIZE) for i in stored]
    nodes = json.loads(_cli("nodes", "--json", "--master", master.address).stdout)
    assert [n["node"] for n in nodes] == ["n2"]
    stats = json.loads(_cli("stats", "--json", "--master", master.address).stdout)
    assert (stats["draining"], stats["moves_open"], stats["objects"]) == ([], 0, len(stored))


def test_drain_with_too_little_room_moves_what_fits_and_drops_the_rest(cluster):
    master = cluster.start_master(node_ttl_s=3.0)
    cluster.start_node("n1", dram=str(16 * SIZE))
    old = list(range(16))
    with PoolClient(master.address, timeout=5) as c:
        assert c.put_many([key_of(i) for i in old], [pattern(i, SIZE) for i in old]) == ["stored"] * 16
    time.sleep(0.3)  # n2's objects are used later (atime ticks are 0.1 s): the drain must not push them out
    cluster.start_node("n2", dram=str(10 * SIZE))
    new = list(range(100, 106))
    with PoolClient(master.address, transport="tcp", timeout=5) as c:
        assert c.put_many([key_of(i) for i in new], [pattern(i, SIZE) for i in new]) == ["stored"] * 6
        assert set(_inspect(master.address, new)) == {"n2"}
        result = drain(c, "n1")  # through the TCP data channel: read and write tokens checked by the nodes
    assert (result.moved, result.dropped, result.no_room, result.failed) == (4, 12, 12, 0)
    # Batches follow the index order (= put order here): the first four found room, the rest left with n1.
    assert _inspect(master.address, old + new) == ["n2"] * 4 + [None] * 12 + ["n2"] * 6
    for transport in ("auto", "tcp"):
        got = _read_all(master.address, old + new, transport)
        assert got == [pattern(i, SIZE) for i in old[:4]] + [None] * 12 + [pattern(i, SIZE) for i in new]


def test_drain_rpcs_reject_bad_input_with_codes_that_name_the_field(cluster):
    master = cluster.start_master(node_ttl_s=3.0)
    cluster.start_node("n1", dram="1MiB")
    with PoolClient(master.address, timeout=5) as c:
        assert c.put_many([key_of(1)], [pattern(1, SIZE)]) == ["stored"]
    cases = [
        ("BeginDrain", pb.BeginDrainRequest(node_id=""), "INVALID_ARGUMENT", "node_id: must be a non-empty string"),
        ("BeginDrain", pb.BeginDrainRequest(node_id="nope"), "NOT_FOUND", "node_id 'nope' is not registered"),
        ("List", pb.ListRequest(node_id="nope"), "NOT_FOUND", "node_id 'nope' is not registered"),
        ("MigrateStart", pb.MigrateStartRequest(keys=[b"abc"]), "INVALID_ARGUMENT",
         "keys[0] must be a 16-byte key, got 3"),
        ("MigrateStart", pb.MigrateStartRequest(keys=[key_of(1)], node_id="n1"), "INVALID_ARGUMENT",
         "keys: give keys or node_id, not both"),
        ("MigrateStart", pb.MigrateStartRequest(node_id="n1"), "INVALID_ARGUMENT",
         "node_id 'n1' is not draining: call begin_drain (BeginDrain) first"),
        ("MigrateStart", pb.MigrateStartRequest(node_id="nope"), "NOT_FOUND", "node_id 'nope' is not registered"),
        ("MigrateCommit", pb.MigrateCommitRequest(move_ids=[1]), "INVALID_ARGUMENT",
         "checksums: has 0 entries, move_ids has 1"),
        ("DrainNode", pb.DrainNodeRequest(node_id="nope"), "NOT_FOUND", "node_id 'nope' is not registered"),
    ]
    with grpc.insecure_channel(master.address) as ch:
        stub = pbg.MasterServiceStub(ch)
        for method, request, code, message in cases:
            with pytest.raises(grpc.RpcError) as err:
                getattr(stub, method)(request, timeout=5)
            assert (err.value.code().name, err.value.details()) == (code, message), method
        # Not draining: nothing to move, nothing changes; unknown moves are no-ops.
        assert list(stub.MigrateStart(pb.MigrateStartRequest(keys=[key_of(1)]), timeout=5).statuses) == [pb.GONE]
        assert list(stub.MigrateCommit(pb.MigrateCommitRequest(move_ids=[77], checksums=[0]), timeout=5).moved) \
            == [False]
        assert stub.MigrateAbort(pb.MigrateAbortRequest(move_ids=[77]), timeout=5).aborted == 0
        stats = json.loads(stub.Stats(pb.StatsRequest(), timeout=5).json)
    assert (stats["objects"], stats["draining"], stats["moves_open"]) == (1, [], 0)
    assert _inspect(master.address, [1]) == ["n1"]
    bad = _cli("drain", "nope", "--master", master.address)
    assert (bad.returncode, bad.stdout, bad.stderr.strip()) == (1, "", "kvpool drain: node_id 'nope' is not registered")
    bad = _cli("drain", "n1", "--deadline", "0", "--master", master.address)
    assert (bad.returncode, bad.stderr.strip()) == (2, "kvpool drain: --deadline 0.0 must be > 0 seconds")
    assert _inspect(master.address, [1]) == ["n1"]


def test_drain_moves_ssd_objects_and_writes_ssd_records_on_the_destination(cluster):
    master = cluster.start_master(node_ttl_s=3.0)
    cluster.start_node("n1", dram=str(4 * SIZE), ssd="1MiB")
    cluster.start_node("n2", dram="0", ssd="1MiB")  # SSD only: every move writes a record through the node
    indices = list(range(12))
    with PoolClient(master.address, timeout=5) as c:
        for i in indices:  # one at a time: the 8 oldest are demoted to n1's SSD
            assert c.put_many([key_of(i)], [pattern(i, SIZE)]) == ["stored"]
        assert sorted(_places(master.address)) == [("n1", "dram")] * 4 + [("n1", "ssd")] * 8
        result = drain(c, "n1")
        assert (result.moved, result.dropped) == (12, 0)
    assert sorted(_places(master.address)) == [("n2", "ssd")] * 12
    for transport in ("auto", "tcp"):
        assert _read_all(master.address, indices, transport) == [pattern(i, SIZE) for i in indices]


@pytest.mark.parametrize("ran, moved, failed", [(False, 8, 0), (True, 0, 8)])
def test_a_migrate_commit_that_failed_unavailable_is_sent_again(cluster, ran, moved, failed):
    """A drain whose MigrateCommit is lost on the way (the retry commits: all moved) or on the way back (the retry
    finds the moves ended: reported failed, told less than happened) still ends with every object on n2 byte-exact
    and nothing dropped. Without the retry the drain raised PoolUnavailable."""
    master = cluster.start_master(node_ttl_s=3.0)
    cluster.start_node("n1", dram=str(16 * SIZE))
    old = list(range(8))
    with PoolClient(master.address, timeout=5) as c:
        assert c.put_many([key_of(i) for i in old], [pattern(i, SIZE) for i in old]) == ["stored"] * 8
    cluster.start_node("n2", dram=str(16 * SIZE))
    with PoolClient(master.address, timeout=5, control_channel=False) as c:
        stub = c.rpc.stub = OneLostCall(c.rpc.stub, "MigrateCommit", ran)
        result = drain(c, "n1")
    assert stub.calls == 2
    assert (result.moved, result.failed, result.dropped, result.no_room) == (moved, failed, 0, 0)
    assert _inspect(master.address, old) == ["n2"] * 8
    assert _read_all(master.address, old, "auto") == [pattern(i, SIZE) for i in old]
