"""Warm restart keeps the hot prefixes (issue 11 item 4), with real processes: a `kvpool node` stopped with SIGTERM
or killed with SIGKILL and started again on the same SSD directory, and `kvpool up` stopped with SIGTERM.

Workload (tests/faults/prefixes.py): 24 chains of 8 blocks, DRAM = 25% of the objects, and the 6 oldest chains
read again last, so DRAM holds exactly the chains used last. Before the fix (the exclusive tiers, kept below as
`exclusive`) a restart lost DRAM, hence the heads of those chains: 75% of prefix hit tokens kept and 0 of the 6
most recent chains. Each test prints the share of prefix hit tokens kept, the recent chains kept, wrong bytes and
the recovery time (restart until the node serves again, its SSD re-adopted)."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest

from kvpool import PoolClient
from kvpool.launcher import free_port, spawn
from tests.faults.prefixes import (
    BLOCKS,
    CHAINS,
    DRAM_BYTES,
    RECENT,
    SSD_BYTES,
    chain_keys,
    kept,
    prefix_hits,
    put_chains,
    read_back,
    reuse_recent,
    wait_written,
)
from tests.store.cluster import cluster, wait_serving  # noqa: F401 - the cluster fixture

pytestmark = [pytest.mark.faults, pytest.mark.slow]


def start_node(cluster, port: int):
    return cluster.start_node("n1", dram=str(DRAM_BYTES), ssd=str(SSD_BYTES), port=port, heartbeat_s=0.3)


def restart_and_measure(cluster, port: int, master_address: str, before: list[int]) -> dict:
    start = time.monotonic()
    start_node(cluster, port)                  # returns once the node serves: registered, SSD records reported
    recovery_s = time.monotonic() - start
    with PoolClient(master_address, timeout=10) as c:
        after = prefix_hits(c)
        wrong = read_back(c, after)
    share, recent = kept(before, after)
    return {"after": after, "share": share, "recent": recent, "wrong": wrong, "recovery_s": recovery_s}


@pytest.mark.parametrize("write_behind", [True, False], ids=["inclusive", "exclusive"])
def test_node_restart_after_sigterm_keeps_every_prefix_hit_token(cluster, write_behind):
    master = cluster.start_master(node_ttl_s=5.0, extra=["--write-behind", str(write_behind).lower()])
    port = free_port()
    node = start_node(cluster, port)
    with PoolClient(master.address, timeout=10) as c:
        put_chains(c)
        reuse_recent(c)                        # no waiting for the write-behind: the clean stop must flush
        before = prefix_hits(c)
    assert before == [BLOCKS] * CHAINS
    t = time.monotonic()
    assert node.stop(timeout=60) == 0
    stop_s = time.monotonic() - t
    m = restart_and_measure(cluster, port, master.address, before)
    mode = "inclusive SSD tier" if write_behind else "exclusive tiers (before the fix)"
    print(f"\nwarm restart after SIGTERM, {mode}: prefix hit tokens kept {m['share']:.1%} "
          f"({sum(m['after'])}/{sum(before)} blocks), most recent chains kept {m['recent']}/{RECENT}, "
          f"wrong bytes {m['wrong']}, stop {stop_s:.2f}s, recovery {m['recovery_s']:.2f}s")
    assert m["wrong"] == 0
    if write_behind:
        assert (m["share"], m["recent"]) == (1.0, RECENT)
        assert "objects written to SSD before stopping" in node.log()
    else:  # the reproduction: exactly the chains used last lost their heads, nothing else was lost
        assert m["recent"] == 0 and m["after"] == [0] * RECENT + [BLOCKS] * (CHAINS - RECENT)


def test_node_restart_after_sigkill_keeps_what_the_write_behind_wrote(cluster):
    master = cluster.start_master(node_ttl_s=5.0)
    port = free_port()
    node = start_node(cluster, port)
    with PoolClient(master.address, timeout=10) as c:
        put_chains(c)
        reuse_recent(c)
        before = prefix_hits(c)
        lag_s = wait_written(c)                # the lag itself is not the goal: wait until it is behind us
    node.kill()
    m = restart_and_measure(cluster, port, master.address, before)
    print(f"\nwarm restart after SIGKILL (write-behind caught up in {lag_s:.2f}s): prefix hit tokens kept "
          f"{m['share']:.1%} ({sum(m['after'])}/{sum(before)} blocks), most recent chains kept "
          f"{m['recent']}/{RECENT}, wrong bytes {m['wrong']}, recovery {m['recovery_s']:.2f}s")
    assert m["wrong"] == 0
    assert m["share"] >= 0.95 and m["recent"] == RECENT

    # Inside the lag: 4 new chains put and the node killed at once. Whatever survives is whole prefixes of right
    # bytes (a copy is written parent-first, a record is whole or absent); the share is the lag's, not a goal.
    node = cluster.nodes["n1"]
    fresh = range(CHAINS, CHAINS + 4)
    with PoolClient(master.address, timeout=10) as c:
        put_chains(c, fresh)
    node.kill()
    start_node(cluster, port)
    with PoolClient(master.address, timeout=10) as c:
        hits = [c.lookup_prefix(chain_keys(x)) for x in fresh]
        wrong = read_back(c, hits, fresh)
    print(f"SIGKILL right after 4 new chains (inside the write-behind lag): {sum(hits)}/{4 * BLOCKS} of their "
          f"blocks kept, wrong bytes {wrong}")
    assert wrong == 0


def test_kvpool_up_restart_after_sigterm_keeps_every_prefix_hit_token(tmp_path):
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    port = free_port()
    address = f"127.0.0.1:{port}"
    args = ["up", "--listen", address, "--dram-bytes", str(DRAM_BYTES), "--ssd-path", str(tmp_path / "ssd"),
            "--ssd-bytes", str(SSD_BYTES), "--shm-dir", shm, "--http-listen", "", "--node-ttl-s", "5"]
    procs = []

    def up():
        proc = spawn(f"up-{len(procs)}", args, tmp_path)
        procs.append(proc)
        start = time.monotonic()
        wait_serving(address, proc=proc.popen)
        while "kvpool pool up at" not in proc.log():    # printed once the node registered and reported its SSD
            proc.check_alive()
            assert time.monotonic() - start < 30, proc.log()
            time.sleep(0.02)
        return proc, time.monotonic() - start

    try:
        proc, _ = up()
        with PoolClient(address, timeout=10) as c:
            put_chains(c)
            reuse_recent(c)
            before = prefix_hits(c)
        assert proc.stop(timeout=60) == 0
        proc, recovery_s = up()                          # a new master too: everything comes from the SSD
        with PoolClient(address, timeout=10) as c:
            after = prefix_hits(c)
            wrong = read_back(c, after)
        share, recent = kept(before, after)
        print(f"\n`kvpool up` restart after SIGTERM: prefix hit tokens kept {share:.1%} "
              f"({sum(after)}/{sum(before)} blocks), most recent chains kept {recent}/{RECENT}, "
              f"wrong bytes {wrong}, recovery {recovery_s:.2f}s")
        assert wrong == 0 and (share, recent) == (1.0, RECENT)
    finally:
        for p in procs:
            p.kill()
        shutil.rmtree(shm, ignore_errors=True)
