"""Redis fail-over under Sentinel: the master's metadata store (a Redis primary with one replica, watched by a real
redis-sentinel, all on 127.0.0.1) loses its primary to SIGKILL while clients put.

Promise checked (redis_url redis+sentinel://.../kvpool?wait_replicas=1): the master keeps serving through the
fail-over (its calls wait for the sentinel to name the new primary); a put is acknowledged only once a replica has
its journal entry, so after the fail-over, the old primary's return as a replica, and finally a SIGKILL and restart
of the master itself (which reloads everything from the new primary), every acknowledged object is read back
byte-exact. Puts while no replica is connected fail (UNAVAILABLE), they are never acknowledged. Recovery time: from
the primary's kill to the first put acknowledged again (the fail-over plus the old primary's return as a replica).
"""

from __future__ import annotations

import time

import pytest
import redis

from kvpool import PoolClient
from kvpool.errors import PoolError
from tests.faults.harness import (Cluster, Figures, Ledger, Sentinel, connected_nodes, payload_of, start_redis,
                                  stats, wait_until)

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.redis]

SIZE = 16 << 10
BATCH = 8


def test_redis_failover_under_sentinel_loses_no_acknowledged_object(tmp_path, capsys):
    sentinel = Sentinel(tmp_path / "redis").start()
    cluster = Cluster(workdir=tmp_path)
    figures = Figures("Redis fail-over under Sentinel")
    ledger = Ledger()
    attempts: list[tuple[float, bool]] = []  # (started, stored in full)
    url = sentinel.url + "?wait_replicas=1&wait_timeout_ms=500&failover_timeout_s=10"
    counter = iter(range(1 << 30))

    def put_batch(client) -> bool:
        keys = [(0xFA11 << 96 | next(counter)).to_bytes(16, "big") for _ in range(BATCH)]
        started = time.monotonic()
        try:
            statuses = client.put_many(keys, [payload_of(k, SIZE) for k in keys])
        except PoolError:
            statuses = ["error"] * BATCH
        ledger.add(keys, statuses, started, time.monotonic())
        attempts.append((started, statuses == ["stored"] * BATCH))
        return attempts[-1][1]

    try:
        extra = ["--heartbeat-s", "0.3"]
        master = cluster.start_master(redis_url=url, node_ttl_s=3.0, extra=extra)
        port = int(master.address.rsplit(":", 1)[1])
        cluster.start_node("n1", dram="16MiB")
        with PoolClient(master.address, timeout=15, retries=0) as client:
            assert all(put_batch(client) for _ in range(4))
            old = sentinel.primary_port()
            sentinel.server_on(old).kill()
            killed_at = time.monotonic()
            # Puts go on: they wait through the fail-over, then fail while the new primary has no replica.
            wait_until(lambda: sentinel.primary_port() != old, 30, "the sentinel to promote the replica")
            figures.extra["fail-over s"] = time.monotonic() - killed_at
            put_batch(client)
            # The operator brings the old primary back (empty) as the new primary's replica.
            sentinel.servers.append(start_redis(tmp_path / "redis" / "r0b", port=old))
            back = redis.Redis(port=old)
            back.replicaof("127.0.0.1", sentinel.primary_port())
            back.close()
            new = redis.Redis(port=sentinel.primary_port())
            wait_until(lambda: new.info("replication").get("connected_slaves", 0) >= 1, 30,
                       "the old primary to rejoin as a replica")
            new.close()
            figures.extra["replica back s"] = time.monotonic() - killed_at
            wait_until(lambda: put_batch(client), 30, "puts to be acknowledged again")
            assert all(put_batch(client) for _ in range(4))
        # recovery: from the kill to the first put stored in full (the old primary's return as a replica included)
        figures.recovery_s = min(t0 for t0, ok in attempts if ok and t0 > killed_at) - killed_at
        figures.acked = len(ledger.acked)
        figures.extra["put batches refused meanwhile"] = sum(1 for t0, ok in attempts if not ok)
        # The master itself dies now: whatever it acknowledged must be in the new primary.
        master.kill()
        master = cluster.start_master(port=port, redis_url=url, node_ttl_s=3.0, extra=extra)
        wait_until(lambda: "n1" in connected_nodes(master.address), 30, "n1 to register with the new master")
        keys = list(ledger.acked)
        with PoolClient(master.address, timeout=15) as reader:
            present = reader.contains_many(keys)
            figures.acked_lost = present.count(False)
            chunk = [k for k, p in zip(keys, present) if p]
            bufs = [bytearray(SIZE) for _ in chunk]
            assert reader.get_many_into(chunk, bufs) == len(chunk)
            figures.wrong_bytes = sum(bytes(b) != payload_of(k, SIZE) for k, b in zip(chunk, bufs))
        assert stats(master.address)["objects"] >= len(keys)
    finally:
        cluster.close()
        sentinel.close()
    figures.report(capsys)
    figures.check()
