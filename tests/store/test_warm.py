"""PoolClient.warm (kvpool/pool.py): a client maps every same-host node's arena, and prefaults it, before its first
get, from the node list the master's Hello carries. Real master and node processes on 127.0.0.1."""

from __future__ import annotations

import resource

import numpy as np
import pytest

from kvpool import EmbeddedPool, PoolClient
from tests.store.cluster import cluster, key_of, pattern  # noqa: F401

SIZE = 256 << 10
N = 24
ARENA = 8 << 20


def _thread_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _first_get_faults(address: str, keys: list[bytes], prefault: bool) -> tuple[dict, int]:
    out = np.ones((N, SIZE), dtype=np.uint8)               # the destination's own pages faulted in already
    with PoolClient(address) as client:
        report = client.warm(prefault=prefault)
        assert client.transfers.mapped_nodes() == ("n1",)   # mapped before any get
        before = _thread_faults()
        assert client.get_many_into(keys, list(out)) == N
        faults = _thread_faults() - before
    assert [bytes(row) for row in out] == [pattern(i, SIZE) for i in range(N)]
    return report, faults


def test_warm_maps_and_prefaults_the_same_host_arena_before_the_first_get(cluster):
    master = cluster.start_master()
    cluster.start_node("n1", dram="8MiB")
    keys = [key_of(i) for i in range(N)]
    with PoolClient(master.address) as writer:
        assert writer.put_many(keys, [pattern(i, SIZE) for i in range(N)]) == ["stored"] * N
    cold_report, cold = _first_get_faults(master.address, keys, prefault=False)
    warm_report, warm = _first_get_faults(master.address, keys, prefault=True)
    assert cold_report == {"n1": "mapped"}
    assert warm_report == {"n1": f"mapped, {ARENA} bytes prefaulted"}
    # 6 MiB read out of the arena: a fresh mapping faults at least once per 64 KiB (the kernel's fault-around: ~100
    # here); the prefaulted one none (0 in every run here), or a few where the get's own work touches new memory.
    assert cold >= N * SIZE // 65536
    assert warm <= 4


def test_warm_over_tcp_a_bad_argument_and_a_pool_with_nothing_to_map(cluster):
    master = cluster.start_master()
    with PoolClient(master.address) as client:
        assert client.warm() == {}                           # no node registered yet
    cluster.start_node("n1", dram="8MiB")
    with PoolClient(master.address, transport="tcp") as client:
        with pytest.raises(ValueError, match="prefault must be True or False, got 'yes'"):
            client.warm(prefault="yes")
        assert client.transfers.mapped_nodes() == ()
        assert client.warm() == {"n1": "not mapped here (data channel)"}
        assert client.transfers.mapped_nodes() == ()
        assert client.put_many([key_of(1)], [pattern(1, SIZE)]) == ["stored"]
        out = bytearray(SIZE)
        assert client.get_many_into([key_of(1)], [out]) == 1 and bytes(out) == pattern(1, SIZE)
    with EmbeddedPool(dram_bytes=1 << 20) as pool:
        assert pool.warm() == {}                             # in-process: its own arena, nothing to map
