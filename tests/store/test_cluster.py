"""The distributed pool with real processes on 127.0.0.1: a master, two storage nodes, client processes, and a real
redis-server for the restart test. Every client call has a deadline; every wait loop is bounded in time and count."""

from __future__ import annotations

import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor

from kvpool import PoolClient
from tests.store.cluster import cluster, client_get, client_put, key_of, pattern, start_redis  # noqa: F401

SIZE = 64 << 10
TTL = 1.5


def _inspect_nodes(address: str, keys: list[bytes]) -> list[str]:
    import grpc

    from kvpool.proto import kvpool_pb2 as pb
    from kvpool.proto import kvpool_pb2_grpc as pbg

    with grpc.insecure_channel(address) as ch:
        reply = pbg.MasterServiceStub(ch).Inspect(pb.InspectRequest(keys=keys), timeout=5)
    assert list(reply.found) == [True] * len(keys)
    return [o.node_id for o in reply.objects]


def test_put_in_one_client_process_get_byte_exact_in_two_others(cluster):
    master = cluster.start_master(node_ttl_s=TTL)
    cluster.start_node("n1")
    cluster.start_node("n2")
    indices = list(range(40))
    with ProcessPoolExecutor(3, mp_context=mp.get_context("spawn")) as pool:
        assert pool.submit(client_put, master.address, indices, SIZE).result(60) == ["stored"] * 40
        shm = pool.submit(client_get, master.address, indices, SIZE, "auto")
        tcp = pool.submit(client_get, master.address, indices, SIZE, "tcp")
        assert shm.result(60) == 40 and tcp.result(60) == 40
        assert pool.submit(client_put, master.address, indices[:3], SIZE).result(60) == ["exists"] * 3
    placed = _inspect_nodes(master.address, [key_of(i) for i in indices])
    assert set(placed) == {"n1", "n2"}  # both nodes hold some of the objects


def test_sigkilled_node_keys_become_misses_others_still_served(cluster):
    master = cluster.start_master(node_ttl_s=TTL)
    cluster.start_node("n1")
    cluster.start_node("n2")
    indices = list(range(24))
    with PoolClient(master.address, timeout=3, retries=0) as c:
        assert c.put_many([key_of(i) for i in indices], [pattern(i, SIZE) for i in indices]) == ["stored"] * 24
        placed = dict(zip(indices, _inspect_nodes(master.address, [key_of(i) for i in indices])))
        lost = [i for i in indices if placed[i] == "n1"]
        kept = [i for i in indices if placed[i] == "n2"]
        assert lost and kept
        cluster.nodes["n1"].kill()
        # Before the TTL passes, reads of n1's keys still answer (a miss or bytes from a dead mapping never
        # appear: the TCP read fails fast, the shared-memory file is still mapped); nothing hangs.
        for transport in ("tcp", "auto"):
            with PoolClient(master.address, transport=transport, timeout=3, retries=0) as t:
                bufs = [bytearray(SIZE) for _ in lost]
                n = t.get_many_into([key_of(i) for i in lost], bufs)
                for i, buf in zip(lost[:n], bufs[:n]):
                    assert bytes(buf) == pattern(i, SIZE)
        # A put while n1 is dead but not yet dropped: keys placed on n1 are "no_space", the rest are stored; no raise.
        with PoolClient(master.address, transport="tcp", timeout=3, retries=0) as t:
            fresh = list(range(100, 108))
            statuses = t.put_many([key_of(i) for i in fresh], [pattern(i, SIZE) for i in fresh])
            assert set(statuses) <= {"stored", "no_space"}
            stored = [i for i, st in zip(fresh, statuses) if st == "stored"]
            for i in stored:
                buf = bytearray(SIZE)
                assert t.get_many_into([key_of(i)], [buf]) == 1 and bytes(buf) == pattern(i, SIZE)
        deadline = time.monotonic() + TTL + 10
        for _ in range(200):
            if not any(c.contains_many([key_of(i) for i in lost])):
                break
            assert time.monotonic() < deadline, "n1's keys still indexed long after its TTL"
            time.sleep(0.1)
        assert c.contains_many([key_of(i) for i in lost]) == [False] * len(lost)
        assert c.lookup_prefix([key_of(lost[0])]) == 0
        bufs = [bytearray(SIZE) for _ in kept]
        assert c.get_many_into([key_of(i) for i in kept], bufs) == len(kept)
        assert [bytes(b) for b in bufs] == [pattern(i, SIZE) for i in kept]
        stats = c.stats()
        assert sorted(stats["nodes"]) == ["n2"]


def test_master_sigkilled_and_restarted_on_redis_loses_no_committed_key(cluster, tmp_path):
    redis = start_redis(tmp_path / "redis", appendonly=True)
    try:
        master = cluster.start_master(node_ttl_s=5.0, redis_url=redis.url)
        cluster.start_node("n1", ssd="16MiB")
        cluster.start_node("n2")
        indices = list(range(300))  # 300 x 64 KiB > the two 8 MiB arenas: some objects land on n1's SSD
        with PoolClient(master.address, timeout=5) as c:
            statuses = c.put_many([key_of(i) for i in indices], [pattern(i, SIZE) for i in indices])
            stored = [i for i, s in zip(indices, statuses) if s == "stored"]
            before = c.stats()
        assert len(stored) == 300 and before["tiers"]["ssd"]["objects"] > 0
        port = int(master.address.rsplit(":", 1)[1])
        master.kill()
        master = cluster.start_master(port=port, node_ttl_s=5.0, redis_url=redis.url)
        with PoolClient(master.address, timeout=5) as c:
            assert c.contains_many([key_of(i) for i in stored]) == [True] * len(stored)
            deadline = time.monotonic() + 10
            endpoints = c.stats()["endpoints"]
            assert sorted(endpoints) == ["n1", "n2"]  # known from Redis before the nodes call in
            for _ in range(100):  # nodes notice the new master at their next heartbeat and re-register
                if all(e["connected"] for e in c.stats()["endpoints"].values()):
                    break
                assert time.monotonic() < deadline
                time.sleep(0.1)
            for transport in ("auto", "tcp"):
                with PoolClient(master.address, transport=transport, timeout=5) as t:
                    bufs = [bytearray(SIZE) for _ in stored]
                    assert t.get_many_into([key_of(i) for i in stored], bufs) == len(stored)
                    assert all(bytes(b) == pattern(i, SIZE) for i, b in zip(stored, bufs))
            assert c.stats()["objects"] == before["objects"]
    finally:
        redis.kill()


def test_kvpool_drain_removes_a_node_and_it_stays_out_until_restarted(cluster):
    import subprocess
    import sys

    master = cluster.start_master(node_ttl_s=TTL)
    cluster.start_node("n1", heartbeat_s=0.2)
    cluster.start_node("n2", heartbeat_s=0.2)
    indices = list(range(16))
    with PoolClient(master.address, timeout=5) as c:
        assert c.put_many([key_of(i) for i in indices], [pattern(i, SIZE) for i in indices]) == ["stored"] * 16
        on_n1 = [i for i, n in zip(indices, _inspect_nodes(master.address, [key_of(i) for i in indices])) if n == "n1"]
        out = subprocess.run([sys.executable, "-m", "kvpool.cli", "drain", "n1", "--no-migrate", "--master",
                              master.address], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == f"node n1 drained: 0 object(s) moved, {len(on_n1)} dropped"
        assert c.contains_many([key_of(i) for i in on_n1]) == [False] * len(on_n1)
        time.sleep(1.0)  # five heartbeats of n1: each asks to re-register and is refused
        assert sorted(c.stats()["nodes"]) == ["n2"]
        cluster.nodes["n1"].stop()
        cluster.start_node("n1")  # a new process (new incarnation) may rejoin
        assert sorted(c.stats()["nodes"]) == ["n1", "n2"]


def test_restarted_node_re_adopts_its_ssd_objects(cluster):
    # Exclusive tiers: DRAM dies with the process (the inclusive tier's restarts: tests/faults/test_warm_restart.py).
    master = cluster.start_master(node_ttl_s=5.0, extra=["--write-behind", "false"])
    cluster.start_node("n1", dram="1MiB", ssd="4MiB")
    indices = list(range(30))
    with PoolClient(master.address, timeout=5) as c:
        # 16 fill the 1 MiB arena; the next 14 make the master demote the 14 coldest (Demote RPC to the node).
        assert c.put_many([key_of(i) for i in indices[:16]], [pattern(i, SIZE) for i in indices[:16]]) == \
            ["stored"] * 16
        assert c.put_many([key_of(i) for i in indices[16:]], [pattern(i, SIZE) for i in indices[16:]]) == \
            ["stored"] * 14
        assert c.stats()["demotions"] == 14
        tiers = {o["key"]: o["tier"] for o in _list(master.address)}
        on_ssd = [i for i in indices if tiers[key_of(i).hex()] == "ssd"]
        in_dram = [i for i in indices if tiers[key_of(i).hex()] == "dram"]
        assert len(on_ssd) == 14 and set(on_ssd) <= set(indices[:16])  # the victims came from the older batch
        cluster.nodes["n1"].kill()
        cluster.start_node("n1", dram="1MiB", ssd="4MiB")  # same id and SSD file, new process
        assert c.contains_many([key_of(i) for i in in_dram]) == [False] * 16  # DRAM died with the process
        assert c.contains_many([key_of(i) for i in on_ssd]) == [True] * 14   # re-reported from the SSD scan
        for transport in ("auto", "tcp"):
            with PoolClient(master.address, transport=transport, timeout=5) as t:
                bufs = [bytearray(SIZE) for _ in on_ssd]
                assert t.get_many_into([key_of(i) for i in on_ssd], bufs) == 14
                assert [bytes(b) for b in bufs] == [pattern(i, SIZE) for i in on_ssd]


def _list(address: str) -> list[dict]:
    from kvpool.admin import AdminClient

    with AdminClient(address) as admin:
        return list(admin.list())
