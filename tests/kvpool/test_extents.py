"""reserve_many / acquire_many (kvpool/extents.py): the caller copies into and out of the pool's own bytes.

EmbeddedPool (in-process arena, an SSD file) and PoolClient against a real master + node (LocalCluster on 127.0.0.1,
its arena in a private /dev/shm directory): direct buffers ARE the arena extents (same-host DRAM), everything else is
staged through the caller's allocator; the read fence, the write deadline, aborts and argument errors.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time

import numpy as np
import pytest
import xxhash

from kvpool.client import PoolClient
from kvpool.embedded import EmbeddedPool
from kvpool.store.config import UpConfig
from kvpool.store.local_cluster import LocalCluster
from kvpool.tiers.gpu import unavailable_reason
from tests.store.test_control_channel import wait_until

SIZE = 8192


def key(i: int) -> bytes:
    return bytes([i]) * 16


def data(i: int, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8)


def fill(write, ids):
    for i, buf in zip(ids, write.buffers):
        if buf is not None:
            np.frombuffer(buf, np.uint8)[:] = data(i)


# ---------------------------------------------------------------- EmbeddedPool


def test_embedded_buffers_are_the_arena_and_round_trip(tmp_path):
    with EmbeddedPool(dram_bytes=1 << 20, shm_dir=str(tmp_path)) as pool:
        w = pool.reserve_many([key(1), key(2)], [SIZE, SIZE])
        assert w.statuses == ["granted", "granted"] and w.direct == [True, True] and w.granted == [0, 1]
        base = pool.node.dram.address
        offsets = [np.frombuffer(b, np.uint8).ctypes.data - base for b in w.buffers]
        assert all(0 <= o < (1 << 20) for o in offsets)                  # inside the arena: no staging copy
        fill(w, [1, 2])
        assert pool.contains_many([key(1)]) == [False]                   # nothing visible before the commit
        assert w.commit() == ["stored", "stored"]
        with pytest.raises(ValueError, match="already committed"):
            w.commit()
        out = [np.zeros(SIZE, np.uint8) for _ in range(2)]
        assert pool.get_many_into([key(1), key(2)], out) == 2 and all(np.array_equal(o, data(i))
                                                                      for o, i in zip(out, (1, 2)))
        again = pool.reserve_many([key(1), key(3)], [SIZE, SIZE])
        assert again.statuses == ["exists", "granted"] and again.buffers[0] is None
        again.abort()
        with pool.acquire_many([key(1), key(2), key(3)], [SIZE] * 3) as r:
            assert r.count == 2 and r.direct == [True, True] and r.tiers == ["dram", "dram"]
            assert r.verify() == 2
            assert [bytes(b) for b in r.buffers] == [data(1).tobytes(), data(2).tobytes()]
        assert pool.stats()["puts"] == {"stored": 2, "exists": 0, "no_space": 0}


def test_embedded_abort_frees_the_grants(tmp_path):
    with EmbeddedPool(dram_bytes=4 * SIZE, shm_dir=str(tmp_path)) as pool:
        with pool.reserve_many([key(i) for i in range(4)], [SIZE] * 4) as w:
            assert w.statuses == ["granted"] * 4
        assert pool.stats()["objects"] == 0
        w = pool.reserve_many([key(i) for i in range(4)], [SIZE] * 4)   # the space is free again
        assert w.statuses == ["granted"] * 4
        fill(w, range(4))
        assert w.commit() == ["stored"] * 4


def recording_staging() -> tuple[list[int], object]:
    """A staging allocator that records the size of each buffer it hands out."""
    staged: list[int] = []

    def staging(n):
        staged.append(n)
        return np.zeros(n, np.uint8)

    return staged, staging


@contextlib.contextmanager
def two_tier_pool(tmp_path):
    """An EmbeddedPool holding keys 0 and 1 on SSD, 2 and 3 in DRAM."""
    with EmbeddedPool(dram_bytes=2 * SIZE, ssd_path=str(tmp_path / "ssd"), ssd_bytes=1 << 20,
                      shm_dir=str(tmp_path), promote_on_hit=False, write_behind=False) as pool:
        for ids in ((0, 1), (2, 3)):      # two puts: the first pair is the colder one, demoted by the second
            assert pool.put_many([key(i) for i in ids], [data(i) for i in ids]) == ["stored"] * 2
        yield pool


def test_embedded_ssd_entries_are_staged_and_verified(tmp_path):
    staged, staging = recording_staging()
    with two_tier_pool(tmp_path) as pool:
        tiers = {i: rec.tier.label for i, rec in enumerate(pool.master.inspect([key(i) for i in range(4)]))}
        assert tiers == {0: "ssd", 1: "ssd", 2: "dram", 3: "dram"}
        with pool.acquire_many([key(i) for i in range(4)], [SIZE] * 4, staging=staging) as r:
            assert r.count == 4 and r.direct == [False, False, True, True] and r.tiers == ["ssd", "ssd", "dram", "dram"]
            assert staged == [SIZE, SIZE]
            assert all(bytes(b) == data(i).tobytes() for i, b in enumerate(r.buffers))
        # A damaged SSD record ends the run there, and the pool forgets it.
        rec = pool.master.inspect([key(1)])[0]
        with open(tmp_path / "ssd" / "kvpool.data", "r+b") as f:
            f.seek(rec.offset + 4096 + 100)
            f.write(b"\xff\x00\xff")
        with pool.acquire_many([key(i) for i in range(4)], [SIZE] * 4) as r:
            assert r.count == 1 and r.tiers == ["ssd"]
        assert pool.contains_many([key(1)]) == [False]
        # A staging allocator that hands back read-only memory is the caller's mistake: named, lease released.
        with pytest.raises(ValueError, match=r"staging\(8192\) is read-only"):
            pool.acquire_many([key(0)], [SIZE], staging=lambda n: bytes(n))
        assert pool.stats()["leases_open"] == 0


def test_embedded_max_staged_ends_the_read_before_the_next_staged_hit(tmp_path):
    staged, staging = recording_staging()
    with two_tier_pool(tmp_path) as pool:
        order = [2, 3, 0, 1]              # DRAM, DRAM, SSD, SSD
        cases = [(None, 4, False, 2), (3, 4, False, 2), (2, 4, False, 2), (1, 3, True, 1), (0, 2, True, 0)]
        for max_staged, count, full, n_staged in cases:
            staged.clear()
            with pool.acquire_many([key(i) for i in order], [SIZE] * 4, staging=staging, max_staged=max_staged) as r:
                assert (r.count, r.staging_full, len(staged)) == (count, full, n_staged), max_staged
                assert r.direct == [True, True, False, False][:count]
                assert all(bytes(b) == data(order[j]).tobytes() for j, b in enumerate(r.buffers))
        with pool.acquire_many([key(i) for i in (0, 1)], [SIZE] * 2, max_staged=0) as r:
            assert (r.count, r.staging_full) == (0, True)
        with pool.acquire_many([key(i) for i in (2, 9)], [SIZE] * 2, max_staged=0) as r:
            assert (r.count, r.staging_full) == (1, False)     # a miss is not a full staging
        assert pool.stats()["leases_open"] == 0


def test_argument_errors_name_the_argument_and_change_nothing(tmp_path):
    with EmbeddedPool(dram_bytes=1 << 20, shm_dir=str(tmp_path), max_object_bytes=1 << 16) as pool:
        cases = [
            (lambda: pool.reserve_many([key(1)], [SIZE, SIZE]), "sizes has 2 entries, keys has 1"),
            (lambda: pool.reserve_many([key(1)], [0]), r"sizes\[0\] must be an int in \[1, max_object_bytes=65536\]"),
            (lambda: pool.reserve_many([key(1)], [1 << 17]), r"sizes\[0\] must be an int"),
            (lambda: pool.reserve_many([key(1)], [True]), r"sizes\[0\] must be an int"),
            (lambda: pool.reserve_many([key(1)], SIZE), "sizes must be a sequence of ints"),
            (lambda: pool.reserve_many([b"short"], [SIZE]), "keys"),
            (lambda: pool.acquire_many([key(1)], [SIZE], staging=42), "staging must be a callable"),
            (lambda: pool.acquire_many([key(1)], [SIZE], max_staged=-1), r"max_staged must be None or an int >= 0"),
            (lambda: pool.acquire_many([key(1)], [SIZE], max_staged=True), "max_staged"),
            (lambda: pool.acquire_many([key(1)], [SIZE], max_staged=1.0), "max_staged"),
        ]
        for call, message in cases:
            with pytest.raises(ValueError, match=message):
                call()
        assert pool.stats()["objects"] == 0
        pool.put_many([key(1)], [data(1)])
        with pytest.raises(ValueError, match=r"^sizes\[0\] is 4096 bytes, object has 8192$"):
            pool.acquire_many([key(1)], [4096])
        s = pool.stats()
        assert (s["objects"], s["grants_open"], s["leases_open"]) == (1, 0, 0)


def test_pin_host_memory_reports_why_not_without_a_gpu(tmp_path):
    if unavailable_reason() is None:
        pytest.skip("a CUDA device is present: tests/connector/test_gpu_engine.py covers pinning")
    with EmbeddedPool(dram_bytes=1 << 20, shm_dir=str(tmp_path)) as pool:
        assert pool.pin_host_memory() == {"local": f"not pinned: {unavailable_reason()}"}


# ---------------------------------------------------------------- PoolClient against a real master + node


@pytest.fixture
def up(port, tmp_path):
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    cluster = LocalCluster(UpConfig(listen=f"127.0.0.1:{port}", http_listen="", shm_dir=shm, dram_bytes=4 * SIZE,
                                    ssd_path=str(tmp_path / "ssd"), ssd_bytes=1 << 20, node_id="n1",
                                    promote_on_hit=False, grant_ttl_s=1.0, write_behind=False)).start()
    yield cluster
    cluster.stop()
    shutil.rmtree(shm, ignore_errors=True)


@pytest.mark.parametrize("pipelined", [False, True])
def test_client_same_host_buffers_are_the_mapped_arena(up, pipelined, monkeypatch):
    """`pipelined`: verify() splits the hashing with the fence's helper thread (fence.verify_many) even here."""
    from kvpool import fence

    if pipelined:
        monkeypatch.setattr(fence, "PIPELINE_MIN", 1)
        monkeypatch.setattr(fence, "HANDOFF", 1)
    with PoolClient(up.address) as client:
        w = client.reserve_many([key(i) for i in range(3)], [SIZE] * 3)
        assert w.statuses == ["granted"] * 3 and w.direct == [True] * 3
        fill(w, range(3))
        assert w.commit() == ["stored"] * 3
        with client.acquire_many([key(i) for i in range(3)], [SIZE] * 3) as r:
            assert r.count == 3 and r.direct == [True] * 3 and r.tiers == ["dram"] * 3
            assert r.verify() == 3
            assert all(bytes(b) == data(i).tobytes() for i, b in enumerate(r.buffers))
            # A late writer (simulated: bytes changed in place) makes entry 1 a miss at verify, never returned bytes.
            np.frombuffer(r.buffers[1], np.uint8)[:8] ^= 0xFF
            assert r.verify() == 1 and r.count == 1
        assert client.checksum_failures == 1
        assert client.pin_host_memory() == {"n1": f"not pinned: {unavailable_reason()}"} \
            if unavailable_reason() else client.pin_host_memory() == {"n1": "pinned"}
    with PoolClient(up.address) as other:   # the release named the bad key (the first client waited for it)
        assert other.contains_many([key(i) for i in range(3)]) == [True, False, True]


def test_client_verify_entry_checks_one_entry_after_its_copy_and_reports_the_bad_key(up):
    """verify_entry(i): the fence for entry i alone (a caller copying entry by entry checks each while it is still
    in cache); a mismatch shrinks count to i, and the release makes the master forget the bad object."""
    with PoolClient(up.address) as client:
        assert client.put_many([key(i) for i in range(3)], [data(i) for i in range(3)]) == ["stored"] * 3
        with client.acquire_many([key(i) for i in range(3)], [SIZE] * 3) as r:
            assert r.count == 3 and r.direct == [True] * 3
            copies = [bytes(r.buffers[0])]
            assert r.verify_entry(0) is True and r.count == 3
            np.frombuffer(r.buffers[1], np.uint8)[5] ^= 0x01          # a late writer's byte, during the copy
            copies.append(bytes(r.buffers[1]))
            assert r.verify_entry(1) is False and r.count == 1
            assert copies[0] == data(0).tobytes() and copies[1] != data(1).tobytes()
            with pytest.raises(ValueError, match=r"^i: 1 is outside the read's 1 entries$"):
                r.verify_entry(1)
        with pytest.raises(ValueError, match="released"):
            r.verify_entry(0)
        assert client.checksum_failures == 1
    with PoolClient(up.address) as other:
        assert other.contains_many([key(i) for i in range(3)]) == [True, False, True]


def test_verify_copy_judges_the_callers_digest_where_given_else_the_extent(up):
    """verify_copy(i, digest): the caller's hash of its copy where it took one (a digest of other bytes is refused
    even though the extent is intact), the extent hashed now where it did not (None)."""
    with PoolClient(up.address) as client:
        assert client.put_many([key(i) for i in range(3)], [data(i) for i in range(3)]) == ["stored"] * 3
        with client.acquire_many([key(i) for i in range(3)], [SIZE] * 3) as r:
            assert r.needs_check(0) and r.verify_copy(0, xxhash.xxh3_64_intdigest(data(0))) is True
            assert r.verify_copy(1, None) is True and r.count == 3
            assert r.verify_copy(2, xxhash.xxh3_64_intdigest(data(1))) is False and r.count == 2
        assert client.checksum_failures == 1


def test_embedded_verify_entry_accepts_what_verify_accepts(tmp_path):
    with EmbeddedPool(dram_bytes=4 * SIZE) as pool:
        assert pool.put_many([key(0), key(1)], [data(0), data(1)]) == ["stored"] * 2
        with pool.acquire_many([key(0), key(1)], [SIZE] * 2) as r:
            assert [r.verify_entry(0), r.verify_entry(1)] == [True, True] and r.count == 2
            with pytest.raises(ValueError, match=r"^i: -1 is outside the read's 2 entries$"):
                r.verify_entry(-1)


def test_client_tcp_and_ssd_entries_land_in_the_callers_staging(up):
    handed: list[np.ndarray] = []

    def staging(n):
        handed.append(np.zeros(n, np.uint8))
        return handed[-1]

    with PoolClient(up.address, transport="tcp") as client:
        w = client.reserve_many([key(i) for i in range(6)], [SIZE] * 6, staging=staging)
        assert w.statuses == ["granted"] * 6 and w.direct == [False] * 6 and len(handed) == 6
        fill(w, range(6))
        assert w.commit() == ["stored"] * 6                  # DRAM holds 4: the oldest went to SSD meanwhile
        handed.clear()
        with client.acquire_many([key(i) for i in range(6)], [SIZE] * 6, staging=staging) as r:
            assert r.count == 6 and r.direct == [False] * 6 and r.verify() == 6
            assert all(np.frombuffer(b, np.uint8).ctypes.data == h.ctypes.data for b, h in zip(r.buffers, handed))
            assert all(bytes(b) == data(i).tobytes() for i, b in enumerate(r.buffers))
            assert sorted(set(r.tiers)) == ["dram", "ssd"]
    with PoolClient(up.address) as client:                     # same host: DRAM direct, SSD staged
        with client.acquire_many([key(i) for i in range(6)], [SIZE] * 6) as r:
            assert r.count == 6
            assert r.direct == [t == "dram" for t in r.tiers] and r.verify() == 6
            assert all(xxhash.xxh3_64_intdigest(b) == xxhash.xxh3_64_intdigest(data(i)) for i, b in enumerate(r.buffers))


def test_client_max_staged_ends_the_read_before_the_next_staged_hit(up):
    handed, staging = recording_staging()
    keys = [key(i) for i in range(6)]
    with PoolClient(up.address) as client:
        assert client.put_many(keys, [data(i) for i in range(6)]) == ["stored"] * 6   # DRAM holds 4: 2 go to SSD
        with client.acquire_many(keys, [SIZE] * 6) as r:
            direct = r.direct
        assert r.count == 6 and direct.count(False) == 2
        for max_staged in (0, 1, 2, None):
            handed.clear()
            staged_at = [i for i, d in enumerate(direct) if not d]
            count = staged_at[max_staged] if max_staged is not None and max_staged < 2 else 6
            with client.acquire_many(keys, [SIZE] * 6, staging=staging, max_staged=max_staged) as r:
                assert (r.count, r.staging_full) == (count, count < 6), max_staged
                assert r.direct == direct[:count] and len(handed) == direct[:count].count(False)
                assert r.verify() == count
                assert all(bytes(b) == data(i).tobytes() for i, b in enumerate(r.buffers))
    with PoolClient(up.address, transport="tcp") as client:         # nothing direct: every hit is staged
        with client.acquire_many(keys, [SIZE] * 6, max_staged=4) as r:
            assert (r.count, r.staging_full, r.direct) == (4, True, [False] * 4)
            assert all(bytes(b) == data(i).tobytes() for i, b in enumerate(r.buffers))
        # the rest of that read, `continued`: the master answers it and counts nothing (its keys were counted above)
        before = up.master.stats()
        with client.acquire_many(keys[4:], [SIZE] * 2, max_staged=4, continued=True) as r:
            assert (r.count, r.staging_full) == (2, False)
            assert all(bytes(b) == data(4 + i).tobytes() for i, b in enumerate(r.buffers))
        after = up.master.stats()
        assert [after[n] - before[n] for n in ("lookups", "requested_keys", "hit_keys")] == [0, 0, 0]
        with client.acquire_many(keys[4:], [SIZE] * 2) as r:          # a read of its own is counted
            assert r.count == 2
        again = up.master.stats()
        assert [again[n] - after[n] for n in ("lookups", "requested_keys", "hit_keys")] == [1, 2, 2]
    assert up.master.stats()["leases_open"] == 0


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_client_rest_reads_on_under_the_first_read_s_lease(up, transport, monkeypatch):
    """ExtentRead.rest through the service: over TCP every hit is staged, 2 per read; on the same host the DRAM
    hits are the arena's extents and the 2 SSD records are staged, 1 per read. Either way one lookup for the whole
    chain (the master counts it once), one lease however many reads ride on it, ended by the last release. Close to
    the lease's end (REST_MARGIN_S past the lease's lifetime here) the rest is looked up again, under a second lease
    that is not counted either."""
    from kvpool import client as client_module

    keys = [key(i) for i in range(6)]
    with PoolClient(up.address) as writer:
        assert writer.put_many(keys, [data(i) for i in range(6)]) == ["stored"] * 6   # DRAM holds 4: 2 go to SSD
    rows = 2 if transport == "tcp" else 1
    # (no host index reads: on the same host the chain is published, and a published acquire takes no lease at all)
    with PoolClient(up.address, transport=transport, host_index_reads=False) as client:
        before = up.master.stats()
        reads = [client.acquire_many(keys, [SIZE] * 6, max_staged=rows)]
        while reads[-1].staging_full:
            reads.append(reads[-1].rest(max_staged=rows))
            assert up.master.stats()["leases_open"] == 1
        assert [bytes(b) for r in reads for b in r.buffers[:r.count]] == [data(i).tobytes() for i in range(6)]
        assert sum(r.direct.count(False) for r in reads) == (6 if transport == "tcp" else 2)
        assert all(r.direct.count(False) <= rows for r in reads) and len(reads) == (3 if transport == "tcp" else 2)
        assert all(r.verify() == r.count for r in reads)
        after = up.master.stats()
        assert [after[n] - before[n] for n in ("lookups", "requested_keys", "hit_keys")] == [1, 6, 6]
        for r in reads[:-1]:
            r.release()
            assert up.master.stats()["leases_open"] == 1
        reads[-1].release()             # (sent with the next lookup, or after the releaser's linger)
        monkeypatch.setattr(client_module, "REST_MARGIN_S", 31.0)     # the lease (30 s) is always too close to its end
        before = up.master.stats()
        with client.acquire_many(keys, [SIZE] * 6, max_staged=rows) as first:
            assert first.staging_full
            with first.rest() as rest:
                wait_until(lambda: up.master.stats()["leases_open"] == 2, "both leases")
                got = [bytes(b) for r in (first, rest) for b in r.buffers[:r.count]]
        assert got == [data(i).tobytes() for i in range(6)]
        after = up.master.stats()
        assert [after[n] - before[n] for n in ("lookups", "requested_keys", "hit_keys")] == [1, 6, 6]
    assert up.master.stats()["leases_open"] == 0       # the client's close sent what its releaser held


def test_client_a_bad_entry_read_by_a_rest_is_reported_when_the_lease_ends(up):
    """An object whose bytes changed in the node's arena (written through a same-host read's extent, as a stalled
    peer would), read over TCP by a load's second read (a rest): that read ends before it (checked as it arrived),
    and the master hears of it once the lease ends, with the last read's release, and forgets it."""
    keys = [key(i) for i in range(6)]
    with PoolClient(up.address) as writer:
        assert writer.put_many(keys, [data(i) for i in range(6)]) == ["stored"] * 6   # DRAM holds 4: 2 go to SSD
        with writer.acquire_many(keys, [SIZE] * 6) as r:
            assert r.count == 6 and r.direct == [True] * 4 + [False] * 2
            np.frombuffer(r.buffers[3], np.uint8)[:8] ^= 0xFF
    with PoolClient(up.address, transport="tcp") as client:
        first = client.acquire_many(keys, [SIZE] * 6, max_staged=2)
        second = first.rest(max_staged=2)
        assert [(r.count, r.staging_full) for r in (first, second)] == [(2, True), (1, False)]
        assert [bytes(b) for r in (first, second) for b in r.buffers] == [data(i).tobytes() for i in range(3)]
        assert client.checksum_failures == 1
        first.release()
        assert up.master.stats()["dram_corrupt"] == 0       # the lease is still held: nothing reported yet
        second.release()
        wait_until(lambda: up.master.stats()["dram_corrupt"] == 1, "the corrupt report")
        assert client.contains_many(keys) == [True] * 3 + [False] + [True] * 2
    assert up.master.stats()["leases_open"] == 0


def test_client_direct_write_past_its_grant_is_never_committed(up):
    with PoolClient(up.address) as client:
        w = client.reserve_many([key(7)], [SIZE])
        assert w.direct == [True]
        fill(w, [7])
        time.sleep(1.0)                                        # the grant's whole lifetime (grant_ttl_s=1) passes
        assert w.commit() == ["no_space"]
        assert client.transfers.late_writes_skipped == 1
        assert client.contains_many([key(7)]) == [False]
        w = client.reserve_many([key(7)], [SIZE])              # a fresh grant works
        fill(w, [7])
        assert w.commit() == ["stored"]


def test_a_same_host_copy_is_not_made_once_the_arena_s_generation_moved_since_the_put_start(up):
    """A node bumps its arena's removal generation when it registers (a restarted master has maybe placed another
    object on a granted extent since: tests/faults/test_stale_grants.py). A put whose copy comes after such a bump
    copies nothing into the arena (`Transfers.write(dated=)`): the key answers no_space, the extent keeps the bytes
    it had, the skip is counted. A put that starts after the bump goes through."""
    with PoolClient(up.address) as client:
        assert client.put_many([key(1)], [data(1)]) == ["stored"]       # maps the arena
        assert client.remove_many([key(1)]) == 1
        node, transfers = up.node.node, client.transfers
        arena = node.dram
        before = bytes(arena.view(0, 4 * SIZE))                        # the whole DRAM tier
        real_write = transfers.write
        bumped = []

        def write(*args, **kwargs):
            node.objects_removed()          # as the node does when it registers, between the PutStart and the copy
            bumped.append(arena.generation)
            return real_write(*args, **kwargs)

        transfers.write = write
        assert client.put_many([key(2)], [data(2)]) == ["no_space"]
        del transfers.write
        assert len(bumped) == 1 and transfers.stale_writes_skipped == 1 and transfers.late_writes_skipped == 0
        assert bytes(arena.view(0, 4 * SIZE)) == before                 # nothing landed on the granted extent
        assert client.stats()["client_stale_writes_skipped"] == 1
        assert client.contains_many([key(2)]) == [False]
        assert client.put_many([key(2)], [data(2)]) == ["stored"]
        out = bytearray(SIZE)
        assert client.get_many_into([key(2)], [out]) == 1 and bytes(out) == data(2).tobytes()
        assert transfers.stale_writes_skipped == 1


def test_a_zero_staging_put_does_not_map_an_arena_whose_generation_moved_since_its_put_start(up):
    """The same for `reserve_many`: the node bumps its generation between the PutStart and the claim of the
    mapped extents (`Transfers.claim_mapped(dated=)`): the caller gets a staging buffer instead of the extent, whose
    later write is dated too and copies nothing; the key answers no_space and the arena keeps its bytes."""
    with PoolClient(up.address) as client:
        assert client.put_many([key(1)], [data(1)]) == ["stored"]       # maps the arena
        assert client.remove_many([key(1)]) == 1
        node, transfers = up.node.node, client.transfers
        arena = node.dram
        before = bytes(arena.view(0, 4 * SIZE))
        real_claim = transfers.claim_mapped

        def claim_mapped(*args, **kwargs):
            node.objects_removed()          # the node registers again between the PutStart and the claim
            return real_claim(*args, **kwargs)

        transfers.claim_mapped = claim_mapped
        w = client.reserve_many([key(2)], [SIZE])
        del transfers.claim_mapped
        assert w.direct == [False]          # staged, not the extent itself
        fill(w, [2])
        assert w.commit() == ["no_space"] and transfers.stale_writes_skipped == 1
        assert bytes(arena.view(0, 4 * SIZE)) == before
        w = client.reserve_many([key(2)], [SIZE])
        assert w.direct == [True]
        fill(w, [2])
        assert w.commit() == ["stored"]
