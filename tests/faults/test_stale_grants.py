"""A writer that stalls across a node restart, or a master restart, never overwrites the object the pool placed on
its extent since.

Real processes: a master and a node n1 (its data channel on a fixed port, so its next process listens where the
stalled writer's route points), a writer in a child process (harness.ChildClient) that SIGSTOPs itself right after
its PutStart answered, before it writes: over TCP (transport tcp), or into n1's mapped arena (transport auto; its
first put, of an object then removed, mapped it; an SSD grant goes through n1's data channel either way). Then
either n1 is SIGKILLed and started again (a new process on the same ports and SSD file), or the master is SIGKILLed
and started again on the same Redis (whose shared secret it keeps; the grant has not expired). The pool, starting
from nothing on n1, places the next put (b) on the very extent the stalled writer was granted; b is acknowledged.
Then the writer is let go:
- over TCP, before 2026-12-07 its token still verified at n1 (the one secret) and its bytes landed on b, so every
  read of b missed (DRAM) or found a's record header (SSD): an acknowledged object lost. Now write grants are signed
  with a key of n1's registration (store/tokens.py) and the write is refused;
- into the arena, across a master restart, it copied over b the same way; now it compares the arena's removal
  generation with the one it read before its PutStart (n1 bumps it when it registers) and copies nothing
  (kvpool/transfer.py `write`). Across a node restart it writes into the dead process's arena, as before.
The writer is told "no_space" (PoolUnavailable where it copied into the dead arena), and b reads back exact over TCP
and same-host. Run for a DRAM-only and an SSD-only n1."""

from __future__ import annotations

import contextlib

import pytest

from kvpool import PoolClient
from kvpool.launcher import free_port
from kvpool.proto import kvpool_pb2 as pb
from kvpool.store.wire import PUT_STATUS_NAME
from kvpool.tiers.types import Tier
from tests.faults.harness import (ChildClient, Cluster, Figures, connected_nodes, cont, inspect, master_stub,
                                  payload_of, read_back_exact, start_redis, stats, wait_stopped, wait_until)

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SIZE = 64 << 10
TIERS = {"dram": dict(dram="1MiB"), "ssd": dict(dram="0", ssd="16MiB")}
TIER_OF = {"dram": Tier.DRAM, "ssd": Tier.SSD}


def _key(i: int) -> bytes:
    return (0x57A1E << 64 | i).to_bytes(16, "big")


@pytest.mark.parametrize("transport", ["tcp", "auto"])
@pytest.mark.parametrize("tier", sorted(TIERS))
@pytest.mark.parametrize("restart", ["node", "master"])
def test_a_writer_stalled_across_a_restart_never_overwrites_the_object_placed_there_since(tmp_path, restart, tier,
                                                                                        transport, capsys):
    redis = start_redis(tmp_path / "redis") if restart == "master" else None
    cluster = Cluster(workdir=tmp_path)
    a, b = _key(1), _key(2)
    figures = Figures(f"writer ({transport}) stalled across a {restart} restart ({tier})")
    child = None
    try:
        master_port, port, data_port = free_port(), free_port(), free_port()
        node_args = dict(port=port, extra=["--data-listen", f"127.0.0.1:{data_port}"], **TIERS[tier])
        master = cluster.start_master(port=master_port, node_ttl_s=30.0, redis_url=redis and redis.url,
                                      extra=["--heartbeat-s", "0.3"])
        node = cluster.start_node("n1", **node_args)
        child = ChildClient(master.address, timeout=5, retries=0, transport=transport)
        # a first put maps n1's arena in the child (a client dates its same-host copies by what it has mapped before
        # its PutStart); its object is then removed, so that a's grant takes offset 0 again
        z = _key(0)
        assert child.call("put", ([z], SIZE, 0)) == ["stored"]
        with PoolClient(master.address, timeout=5) as parent:
            assert parent.remove_many([z]) == 1
        child.pause_at("kvpool.store.data_channel:DataClient.write_many" if transport == "tcp"
                       else "kvpool.transfer:Transfers.write")             # granted, nothing written yet
        child.send("put", ([a], SIZE, 0))
        wait_stopped(child.pid)
        assert stats(master.address)["grants_open"] == 1
        if restart == "node":
            node.kill()
            cluster.start_node("n1", **node_args)       # serves once registered (and, with an SSD, reported)
            wait_until(lambda: stats(master.address)["grants_open"] == 0, 10, "the old process's grant to go")
        else:
            master.kill()
            master = cluster.start_master(port=master_port, node_ttl_s=30.0, redis_url=redis.url,
                                          extra=["--heartbeat-s", "0.3"])
            wait_until(lambda: connected_nodes(master.address) == {"n1"}, 20, "n1 to register again")
        with PoolClient(master.address, timeout=5) as parent:
            # polled: an SSD node takes no new object until its report is in (a no_space put stores nothing)
            wait_until(lambda: parent.put_many([b], [payload_of(b, SIZE)]) == ["stored"], 20, "b to be stored")
            figures.acked += 1
            where = inspect(master.address, [b])[0]
            assert (where.node_id, where.tier, where.offset) == ("n1", TIER_OF[tier], 0)  # the stalled writer's extent
            cont(child.pid)
            if restart == "node" and tier == "dram" and transport == "auto":
                # it copied into the dead process's arena: the put fails as an outage (that arena's owner is gone)
                with pytest.raises(AssertionError, match=r"PoolUnavailable: node n1 .* is gone \(arena unlocked\)"):
                    child.recv()
            else:
                assert child.recv() == ["no_space"]      # it wrote nothing there: its put did not happen
            skipped = child.call("stats")["client_stale_writes_skipped"]
            figures.extra["stale same-host writes skipped"] = skipped
            assert skipped == (restart == "master" and tier == "dram" and transport == "auto")
            read_back_exact(master.address, b, SIZE, figures)
            assert parent.contains_many([a]) == [False]
    finally:
        if child is not None:
            child.close()
        cluster.close()
        if redis is not None:
            redis.kill()
        print(cluster.logs())
    figures.report(capsys)
    figures.check()


@contextlib.contextmanager
def _copy_stopped_across_a_master_restart(tmp_path, a: bytes, z: bytes):
    """A master on Redis and node n1 (1 MiB of DRAM: 16 extents of SIZE); a same-host writer in a child process whose
    put of `a` is stopped inside its copy into n1's arena (its first put, of `z`, mapped the arena and was removed,
    so a's grant takes offset 0 again); then the master SIGKILLed and started again on the same port and Redis, and
    n1 registered with it. Yields (the new master, the child); kills everything and prints the logs after."""
    redis = start_redis(tmp_path / "redis")
    cluster = Cluster(workdir=tmp_path)
    child = None
    try:
        master_port = free_port()
        master = cluster.start_master(port=master_port, node_ttl_s=30.0, redis_url=redis.url,
                                      extra=["--heartbeat-s", "0.3"])
        cluster.start_node("n1", dram="1MiB")
        # retries (the default 2): its commit, let go, may find the new master's address still reconnecting
        child = ChildClient(master.address, timeout=5)
        assert child.call("put", ([z], SIZE, 0)) == ["stored"]     # maps n1's arena in the child
        with PoolClient(master.address, timeout=5) as parent:
            assert parent.remove_many([z]) == 1                     # so that a's grant takes offset 0 again
        child.pause_at("kvpool.tiers.dram:DramArena.view")          # its claim stored, its checks passed
        child.send("put", ([a], SIZE, 0))
        wait_stopped(child.pid)
        master.kill()
        master = cluster.start_master(port=master_port, node_ttl_s=30.0, redis_url=redis.url,
                                      extra=["--heartbeat-s", "0.3"])
        wait_until(lambda: connected_nodes(master.address) == {"n1"}, 20, "n1 to register again")
        yield master, child
    finally:
        if child is not None:
            child.close()
        cluster.close()
        redis.kill()
        print(cluster.logs())


def test_a_same_host_writer_inside_its_copy_across_a_master_restart_keeps_its_extent_from_the_next_object(
        tmp_path, capsys):
    """The master is SIGKILLed and started again on the same Redis while a same-host writer is stopped inside its
    copy into n1's arena (past every check: nothing can stop that copy any more). The new master does not know the
    grant (a pending object is not journalled), but n1 registers with its scan of the writers' claims, and the new
    master holds the free part of the claimed range: the next put (b) goes elsewhere. Let go, the writer finishes its
    copy on its own extent and is told "no_space"; b reads back exact over TCP and same-host; the extent is freed once
    a heartbeat shows the claim gone. Before 2026-12-07 (evening) b was placed on that extent and the copy landed on
    it: an acknowledged object lost."""
    a, b, z = _key(11), _key(12), _key(10)
    figures = Figures("same-host writer inside its copy across a master restart")
    with _copy_stopped_across_a_master_restart(tmp_path, a, z) as (master, child):
        assert stats(master.address)["grants_held"] == 1
        with PoolClient(master.address, timeout=5) as parent:
            assert parent.put_many([b], [payload_of(b, SIZE)]) == ["stored"]
            figures.acked += 1
            assert inspect(master.address, [b])[0].offset != 0     # not the stopped writer's extent
            cont(child.pid)
            assert child.recv() == ["no_space"]         # its copy landed on its own extent; the commit was refused
            read_back_exact(master.address, b, SIZE, figures)
            assert parent.contains_many([a]) == [False]
            wait_until(lambda: stats(master.address)["grants_held"] == 0, 20, "the claimed extent to be freed")
            assert stats(master.address).get("dram_corrupt", 0) == 0
    figures.report(capsys)
    figures.check()


def test_a_commit_sent_across_a_master_restart_never_ends_a_grant_of_the_new_master(tmp_path, capsys):
    """A same-host writer is stopped inside its copy; the master is SIGKILLed and started again on the same Redis,
    and grants twelve objects to another writer, which has not committed them when the stopped writer is let go and
    sends its PutCommit to the new master. Grant ids never meet across master processes (store/leases.py), so the new
    master does not know the stale id: the writer is told "no_space", and the twelve grants stay open, uncommitted.
    Before 2026-12-07 (night) every master process numbered its grants and leases from 1: the stale commit ended the
    new master's grant of the same number, making another writer's object visible before its bytes were written,
    with the stale writer's checksum, and told the stale writer "stored" for a key the pool does not hold."""
    a, z = _key(21), _key(20)
    others = [_key(100 + i) for i in range(12)]         # with the child's held extent, 13 of n1's 16 extents
    figures = Figures("same-host writer's commit across a master restart")
    with _copy_stopped_across_a_master_restart(tmp_path, a, z) as (master, child):
        reply = master_stub(master.address).PutStart(pb.PutStartRequest(keys=others, sizes=[SIZE] * len(others)),
                                                     timeout=5)
        assert [PUT_STATUS_NAME[s] for s in reply.statuses] == ["stored"] * len(others)   # granted, not written
        assert stats(master.address)["grants_open"] == len(others)
        cont(child.pid)
        assert child.recv() == ["no_space"]          # the new master never granted what it commits
        assert stats(master.address)["grants_open"] == len(others)      # every one of the twelve still open
        with PoolClient(master.address, timeout=5) as parent:
            assert parent.contains_many([a, *others]) == [False] * (1 + len(others))
    figures.report(capsys)
    figures.check()
