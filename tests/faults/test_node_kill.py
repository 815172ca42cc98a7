"""Node kill under load (issue 11 item 2): a storage node SIGKILLed while same-host clients put and read.

Promise checked: no read returns wrong bytes; every put acknowledged "stored" is readable afterwards, except objects
that were on the killed node before it died (lost by a named event: the node is gone). A put that started after the
kill must never be acknowledged on the dead node: same-host writers check the arena owner's lock after their copies
(kvpool/fence.py) and the master stops placing on a node whose heartbeats stopped (suspect_after_s) long before it
drops it (node_ttl_s). Recovery time: from the kill to the first put batch, started after it, stored in full.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from kvpool import PoolClient
from kvpool.proto import kvpool_pb2 as pb
from tests.faults.harness import Cluster, Figures, Ledger, master_stub, payload_of, stats, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SIZE = 16 << 10
BATCH = 8
PACE_S = 0.05     # between a writer's batches: ~160 objects/s each, so the run never fills DRAM (no evictions)
NODE_TTL = 3.0
SUSPECT = 0.9


def _key(worker: int, i: int) -> bytes:
    return (0xD1E << 80 | worker << 48 | i).to_bytes(16, "big")


def _load(address: str, worker: int, stop_path: str) -> tuple[list, int, int]:
    """Put batches of new keys and read each stored batch back until `stop_path` exists. Returns the ledger entries
    (keys, statuses, started, ended), reads that returned wrong bytes, and objects read."""
    from kvpool.errors import PoolError

    entries, wrong, read = [], 0, 0
    with PoolClient(address, timeout=3, retries=0) as client:
        n = 0
        while not os.path.exists(stop_path):
            keys = [_key(worker, n + i) for i in range(BATCH)]
            n += BATCH
            started = time.monotonic()
            try:
                statuses = client.put_many(keys, [payload_of(k, SIZE) for k in keys])
            except PoolError:
                statuses = ["error"] * BATCH
            entries.append((keys, statuses, started, time.monotonic()))
            stored = [k for k, s in zip(keys, statuses) if s == "stored"]
            bufs = [bytearray(SIZE) for _ in stored]
            try:
                got = client.get_many_into(stored, bufs)
            except PoolError:
                got = 0
            read += got
            wrong += sum(bytes(b) != payload_of(k, SIZE) for k, b in zip(stored[:got], bufs[:got]))
            time.sleep(PACE_S)
    return entries, wrong, read


def _listed_on(address: str, node_id: str) -> set[bytes]:
    stub = master_stub(address)
    keys, start = set(), b""
    while True:
        reply = stub.List(pb.ListRequest(node_id=node_id, start_after=start, limit=1000), timeout=5)
        keys.update(o.key for o in reply.objects)
        if not reply.next_start_after:
            return keys
        start = reply.next_start_after


def test_node_sigkilled_under_load_loses_no_put_acknowledged_after_its_death(tmp_path, capsys):
    cluster = Cluster(workdir=tmp_path)
    figures = Figures("node kill under load")
    stop_path = str(tmp_path / "stop")
    try:
        master = cluster.start_master(node_ttl_s=NODE_TTL, extra=["--suspect-after-s", str(SUSPECT),
                                                                  "--heartbeat-s", "0.3"])
        address = master.address
        for n in ("n1", "n2"):
            cluster.start_node(n, dram="64MiB")
        with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
            workers = [pool.submit(_load, address, w, stop_path) for w in range(2)]
            wait_until(lambda: stats(address)["objects"] >= 200, 60, "the load to store 200 objects")
            cluster.nodes["n1"].kill()  # SIGKILL, and reaped: it is dead from here on
            killed_at = time.monotonic()
            on_dead = _listed_on(address, "n1")  # still indexed until node_ttl_s: what the kill took
            wait_until(lambda: "n1" not in stats(address)["nodes"], 4 * NODE_TTL, "the master to drop n1")
            dropped_at = time.monotonic()
            time.sleep(0.5)  # keep the load on a little after the drop: puts land on n2 only
            open(stop_path, "w").close()
            ledger = Ledger()
            for future in workers:
                entries, wrong, read = future.result(60)
                figures.wrong_bytes += wrong
                figures.extra["reads during the run"] = figures.extra.get("reads during the run", 0) + read
                for keys, statuses, started, ended in entries:
                    ledger.add(keys, statuses, started, ended)
                    if started > killed_at and statuses == ["stored"] * BATCH:
                        figures.recovery_s = min(started - killed_at, figures.recovery_s or float("inf"))
        assert sum(stats(address)["evictions"].values()) == 0  # nothing left for want of space: misses mean loss
        figures.acked = len(ledger.acked)
        keys = list(ledger.acked)
        with PoolClient(address, timeout=5) as reader:
            present = reader.contains_many(keys)
            for i in range(0, len(keys), 64):
                chunk = [k for k, p in zip(keys[i:i + 64], present[i:i + 64]) if p]
                bufs = [bytearray(SIZE) for _ in chunk]
                got = reader.get_many_into(chunk, bufs)
                assert got == len(chunk)
                figures.wrong_bytes += sum(bytes(b) != payload_of(k, SIZE) for k, b in zip(chunk, bufs))
        for k, p in zip(keys, present):
            if p:
                continue
            started, _ = ledger.acked[k]
            if k in on_dead and started < killed_at:
                figures.lost_by_event += 1  # it was on n1 when n1 died
            else:
                figures.acked_lost += 1
        figures.extra["acknowledged after the kill"] = len(ledger.started_after(killed_at))
        figures.extra["drop after kill s"] = dropped_at - killed_at
    finally:
        open(stop_path, "w").close()
        cluster.close()
    figures.report(capsys)
    figures.check()
    assert figures.lost_by_event > 0 and figures.extra["acknowledged after the kill"] > 0  # the scenario happened
    assert figures.recovery_s is not None and figures.recovery_s < NODE_TTL  # puts recovered before the drop
