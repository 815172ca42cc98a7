"""DramArena: byte-exact round trips, views not copies, a second process sees the same bytes, bounds errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kvpool.tiers.dram import DramArena, sweep_stale_arenas
from kvpool.tiers.gpu import filesystem_of
from kvpool.tiers.hbm import cuda_available

CAP = 1 << 20


@pytest.fixture
def arena(tmp_path):
    # /dev/shm in production; a tmp dir keeps parallel test runs apart and is removed by pytest.
    a = DramArena.create(CAP, name="test", directory=str(tmp_path))
    yield a
    a.close()
    a.unlink()


def test_create_reserves_a_named_file(tmp_path):
    a = DramArena.create(3 * 4096, name="n1", directory=str(tmp_path))
    assert a.path == str(tmp_path / "kvpool-n1")
    assert os.path.getsize(a.path) == 4 * 4096 and a.capacity == 3 * 4096      # + the tail page
    with pytest.raises(FileExistsError):
        DramArena.create(4096, name="n1", directory=str(tmp_path))
    a.close()
    a.unlink()
    assert not os.path.exists(a.path)


def test_the_tail_page_carries_the_capacity_and_a_removal_generation_only_the_owner_bumps(tmp_path):
    a = DramArena.create(10_000, name="gen", directory=str(tmp_path))
    assert os.path.getsize(a.path) == 3 * 4096 + 4096         # 10,000 rounded up to pages, then the tail page
    b = DramArena.attach(a.path)
    assert b.capacity == 10_000 and b.generation == a.generation == 0
    assert a.bump_generation() == 1 and a.bump_generation() == 2
    assert b.generation == 2                                   # the peer sees it in its own mapping
    with pytest.raises(ValueError, match=r"^only the arena's owner bumps its removal generation$"):
        b.bump_generation()
    b.write(0, b"x" * 10_000)                                  # objects never reach the tail page
    assert b.generation == 2
    b.close()
    assert b.generation == -1
    a.close()
    a.unlink()


def test_attach_refuses_a_file_that_is_not_an_arena(tmp_path):
    plain = tmp_path / "kvpool-plain"
    plain.write_bytes(bytes(8192))
    with pytest.raises(ValueError, match=r"is not a kvpool DRAM arena \(its tail page has no magic\)$"):
        DramArena.attach(str(plain))
    odd = tmp_path / "kvpool-odd"
    odd.write_bytes(bytes(5000))
    with pytest.raises(ValueError, match=r"is not a kvpool DRAM arena \(5000 bytes: no tail page\)$"):
        DramArena.attach(str(odd))


def test_default_directory_is_dev_shm_with_random_name():
    with DramArena.create(4096) as a:
        assert os.path.dirname(a.path) == "/dev/shm"
        assert os.path.basename(a.path).startswith("kvpool-")
        path = a.path
    assert not os.path.exists(path)               # the owner's context manager unlinks


def test_round_trip_is_byte_exact_for_every_buffer_kind(arena):
    rng = np.random.default_rng(7)
    payload = rng.integers(0, 256, 64 * 1024, dtype=np.uint8)
    assert arena.write(4096, payload) == 64 * 1024
    out = np.zeros(64 * 1024, dtype=np.uint8)
    assert arena.read_into(4096, out) == 64 * 1024
    assert np.array_equal(out, payload)

    floats = rng.standard_normal((2, 16, 8), dtype=np.float32)  # a KV-shaped block, written as its bytes
    arena.write(0, floats)
    back = np.empty_like(floats)
    arena.read_into(0, back)
    assert np.array_equal(back, floats)

    arena.write(CAP - 5, b"hello")
    buf = bytearray(5)
    arena.read_into(CAP - 5, memoryview(buf))
    assert bytes(buf) == b"hello"


def test_view_and_array_are_views_not_copies(arena):
    v = arena.view(100, 4)
    v[:] = b"abcd"
    arr = arena.array(100, 4)
    assert bytes(arr) == b"abcd"
    arr[0] = ord("z")
    assert bytes(arena.view(100, 4)) == b"zbcd"
    assert not v.readonly and arr.flags.writeable
    assert np.shares_memory(arr, arena.array(0, CAP))


def test_views_of_a_batch_are_the_same_views_and_bad_entries_are_named(arena):
    arena.write(0, b"abcdefgh")
    offsets, sizes = np.array([0, 2, 6], dtype=np.uint64), [2, 4, 2]
    got = arena.views(offsets, sizes)
    assert [bytes(v) for v in got] == [b"ab", b"cdef", b"gh"]
    got[1][0] = ord("X")                                      # writable, and the arena's own bytes
    assert bytes(arena.view(2, 1)) == b"X" and arena.views([], []) == []
    with pytest.raises(ValueError, match=r"^offsets\[1\] must be an int >= 0, got -1$"):
        arena.views([0, -1], [1, 1])
    with pytest.raises(ValueError, match=r"^sizes\[0\] must be an int >= 0, got 1.5$"):
        arena.views([0], [1.5])
    with pytest.raises(ValueError, match=r"^offsets\[1\] \+ sizes\[1\] \(1048575 \+ 2\) exceeds the arena capacity"):
        arena.views([0, CAP - 1], [1, 2])
    with pytest.raises(ValueError, match=r"^offsets and sizes differ in length \(2, 1\)$"):
        arena.views([0, 1], [1])


def test_numpy_integer_offsets_are_accepted(arena):
    offsets = np.array([0, 4096], dtype=np.int64)
    arena.write(offsets[1], b"xy")
    assert bytes(arena.view(offsets[1], np.int64(2))) == b"xy"


def test_bounds_errors_name_the_argument_and_change_nothing(arena):
    arena.write(0, b"keep")
    with pytest.raises(ValueError, match="offset must be an int >= 0"):
        arena.view(-1, 4)
    with pytest.raises(ValueError, match="size must be an int >= 0"):
        arena.view(0, -4)
    with pytest.raises(ValueError, match=r"offset \+ size \(1048573 \+ 4\) exceeds the arena capacity 1048576"):
        arena.write(CAP - 3, b"more")
    with pytest.raises(ValueError, match="offset"):
        arena.read_into(CAP, bytearray(1))
    with pytest.raises(ValueError, match="data must support the buffer protocol"):
        arena.write(0, "a str")
    with pytest.raises(ValueError, match="data must be C-contiguous"):
        arena.write(0, np.zeros((4, 4), np.uint8)[:, 1])
    with pytest.raises(ValueError, match="out must be a writable buffer"):
        arena.read_into(0, b"ro")
    with pytest.raises(ValueError, match="capacity"):
        DramArena.create(0)
    with pytest.raises(ValueError, match="name"):
        DramArena.create(4096, name="../escape")
    assert bytes(arena.view(0, 4)) == b"keep"
    assert bytes(arena.view(CAP - 3, 3)) == b"\0\0\0"


def test_attach_from_a_second_process_sees_the_same_bytes(arena):
    payload = bytes(range(256)) * 16
    arena.write(8192, payload)
    child = textwrap.dedent(f"""
        import sys
        from kvpool.tiers.dram import DramArena
        a = DramArena.attach({arena.path!r})
        assert a.capacity == {CAP}
        got = bytes(a.view(8192, {len(payload)}))
        a.write(0, b"from child")          # and writes land in the owner's mapping
        a.close()
        sys.stdout.write(got.hex())
    """)
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert bytes.fromhex(res.stdout) == payload
    assert bytes(arena.view(0, 10)) == b"from child"
    assert os.path.exists(arena.path)             # an attached peer never unlinks


def test_attach_capacity_checks(arena):
    with pytest.raises(ValueError, match="capacity"):
        DramArena.attach(arena.path, capacity=CAP + 1)
    with DramArena.attach(arena.path, capacity=4096) as peer:
        assert peer.capacity == 4096
    assert os.path.exists(arena.path)


def test_close_is_idempotent_and_blocks_further_use(arena):
    kept = arena.view(0, 8)                       # a caller still holding a view must not crash close()
    arena.close()
    arena.close()
    assert arena.closed
    assert len(kept) == 8
    with pytest.raises(ValueError, match="closed"):
        arena.view(0, 1)


def test_pin_without_cuda_is_a_no_op(arena):
    if cuda_available():
        pytest.skip("CUDA present: covered by the gpu test")
    from kvpool.tiers.gpu import unavailable_reason

    assert arena.pin() is False
    assert not arena.pinned
    assert arena.pin_error == unavailable_reason() and arena.pin_error


@pytest.mark.parametrize("where", ["tmp", "shm", "root"])
def test_filesystem_of_agrees_with_df(where, tmp_path, shm_path):
    path = {"tmp": tmp_path, "shm": shm_path, "root": "/"}[where]
    out = subprocess.run(["df", "--output=fstype,target", str(path)], capture_output=True, text=True, check=True)
    fstype, mount = out.stdout.splitlines()[1].split(None, 1)
    assert filesystem_of(str(path)) == (fstype, mount.strip())


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_pin_registers_with_cuda(shm_path):
    with DramArena.create(CAP, name="test", directory=str(shm_path)) as arena:
        assert arena.pin() is True
        assert arena.pinned
        arena.unpin()
        assert not arena.pinned


def test_arena_of_a_killed_process_is_swept_and_a_live_one_is_not(tmp_path):
    import signal
    import subprocess
    import sys

    from kvpool.tiers.dram import DramArena, sweep_stale_arenas

    code = ("import sys, time; from kvpool.tiers.dram import DramArena;"
            "a = DramArena.create(1 << 20, name=sys.argv[1], directory=sys.argv[2]);"
            "print(a.path, flush=True); time.sleep(60)")
    dead = subprocess.Popen([sys.executable, "-c", code, "dead", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    live = subprocess.Popen([sys.executable, "-c", code, "live", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        dead_path, live_path = dead.stdout.readline().strip(), live.stdout.readline().strip()
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=10)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["kvpool-dead", "kvpool-live"]
        (tmp_path / "not-an-arena").write_bytes(b"x")
        with DramArena.create(1 << 20, name="mine", directory=str(tmp_path)) as mine:
            assert sweep_stale_arenas(str(tmp_path)) == []      # the create already swept; nothing else is stale
            assert sorted(p.name for p in tmp_path.iterdir()) == ["kvpool-live", "kvpool-mine", "not-an-arena"]
            assert mine.path == str(tmp_path / "kvpool-mine")
        assert dead_path == str(tmp_path / "kvpool-dead") and live_path == str(tmp_path / "kvpool-live")
    finally:
        live.kill()
        live.wait(timeout=10)
    assert sweep_stale_arenas(str(tmp_path)) == [str(tmp_path / "kvpool-live")]


def test_create_refuses_an_existing_live_arena(tmp_path):
    from kvpool.tiers.dram import DramArena

    with DramArena.create(1 << 16, name="x", directory=str(tmp_path)):
        with pytest.raises(FileExistsError):
            DramArena.create(1 << 16, name="x", directory=str(tmp_path))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["kvpool-x"]


def test_owner_alive_says_whether_the_creating_process_still_holds_the_arena(tmp_path):
    """A peer asks the arena's flock before committing bytes it copied in; the kernel drops it with the owner."""
    import signal
    import subprocess
    import sys

    code = ("import sys, time; from kvpool.tiers.dram import DramArena; "
            f"a = DramArena.create(1 << 20, directory={str(tmp_path)!r}); print(a.path, flush=True); time.sleep(60)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        path = owner.stdout.readline().strip()
        peer = DramArena.attach(path)
        assert peer.owner_alive() is True
        assert peer.owner_alive() is True  # asking does not take the lock away from the owner
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        assert peer.owner_alive() is False
        peer.close()
        assert peer.owner_alive() is False
    finally:
        owner.kill()
        owner.wait(10)
    with DramArena.create(1 << 20, directory=str(tmp_path)) as mine:
        assert mine.owner_alive() is True


def test_close_drops_the_owners_lock_even_while_a_view_of_the_arena_lives_on(tmp_path):
    """A host index (tiers/host_index.py) or an engine may still view the arena when its owner closes it: peers must
    then see a gone owner at once, not when the last view is dropped (each mapping keeps a dup of the descriptor it
    was made from, so the lock must not be on that one)."""
    a = DramArena.create(1 << 20, directory=str(tmp_path), index_slots=64)
    region, data = a.index_region, a.view(0, 4096)
    peer = DramArena.attach(a.path)
    try:
        assert peer.owner_alive() is True
        a.close()
        assert peer.owner_alive() is False
        assert region.nbytes == 64 * 64 and data.nbytes == 4096     # the views are still mapped
        assert sweep_stale_arenas(str(tmp_path)) == [a.path]        # and the sweep sees a dead owner's file
    finally:
        peer.close()
        region.release()
        data.release()


def _thread_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


@pytest.mark.parametrize("prefault", [False, True])
def test_prefault_fills_a_fresh_mappings_page_tables(prefault):
    # A same-host client's fresh mapping of pages the node already has: reading them takes page faults unless the
    # mapping was prefaulted (PoolClient.warm does it at start). /dev/shm: the tmpfs arenas live on in production.
    owner = DramArena.create(16 << 20, directory="/dev/shm")
    try:
        owner.write(0, np.arange(16 << 20, dtype=np.uint32).view(np.uint8)[:16 << 20])
        peer = DramArena.attach(owner.path)
        out = np.ones(16 << 20, dtype=np.uint8)          # the destination's own pages faulted in already
        assert peer.prefault(0) == 0
        if prefault:
            assert peer.prefault() == 16 << 20
        before = _thread_faults()
        peer.read_into(0, out)
        faults = _thread_faults() - before
        assert bytes(out) == bytes(owner.view(0, 16 << 20))
        if prefault:
            assert faults == 0
        else:
            assert faults >= (16 << 20) // 65536          # at least one per 64 KiB (the kernel's fault-around)
        peer.close()
        assert peer.prefault() == 0                        # closed: nothing to do, no error
    finally:
        owner.close()
        owner.unlink()


def test_prefault_bounds_and_bad_argument(arena):
    assert arena.prefault(8192) == 8192
    assert arena.prefault(10 * CAP) == CAP
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="max_bytes"):
            arena.prefault(bad)


@pytest.mark.parametrize("where", ["tmp", "shm"])
def test_a_refused_pin_names_the_file_system_unless_it_is_tmpfs(where, tmp_path, shm_path, monkeypatch):
    """The GPU stands in here (a CPU machine cannot register memory): CUDA refusing the registration, as it did on
    an H100 for an arena file on /tmp (tests/tiers/test_gpu.py checks it there for real)."""
    from kvpool.tiers import gpu

    def refuse(ptr, size):
        raise RuntimeError("cudaHostRegister failed: CUDARuntimeError: cudaErrorInvalidValue: invalid argument")

    monkeypatch.setattr(gpu, "unavailable_reason", lambda: None)
    monkeypatch.setattr(gpu, "host_register", refuse)
    directory = {"tmp": tmp_path, "shm": shm_path}[where]
    fstype, mount = filesystem_of(str(directory))
    with DramArena.create(1 << 16, directory=str(directory)) as arena:
        assert arena.pin() is False and not arena.pinned
        base = "cudaHostRegister failed: CUDARuntimeError: cudaErrorInvalidValue: invalid argument"
        if fstype in gpu.PINNABLE_FILESYSTEMS:
            assert arena.pin_error == base
        else:
            assert arena.pin_error == (f"{base}; the arena file is on {fstype} ({mount}): Linux 6.5+ refuses long-term "
                                       f"pins of writable file mappings outside tmpfs/hugetlbfs, so put shm_dir on "
                                       f"/dev/shm")
