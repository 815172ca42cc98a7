"""kvpool/fence.py: the verified copy (every chunking of the object, one pass and two) and the writer's deadline."""

from __future__ import annotations

import math
import os
import shutil

import pytest
import xxhash

from kvpool import copyhash, fence


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5])
def test_copy_verified_copies_every_byte_and_checks_them(monkeypatch, size, copy_path):
    monkeypatch.setattr(fence, "CHUNK", 4096)  # exercise the chunked path with small objects
    src = bytes((i * 31 + 7) % 256 for i in range(size))
    dst = bytearray(size)
    assert fence.copy_verified(memoryview(dst), memoryview(src), xxhash.xxh3_64_intdigest(src)) is True
    assert bytes(dst) == src
    if size:
        wrong = bytearray(size)
        assert fence.copy_verified(memoryview(wrong), memoryview(src), xxhash.xxh3_64_intdigest(src) ^ 1) is False
        assert bytes(wrong) == src  # copied all the same: the caller must not use it (a miss)


def test_copy_verified_sees_bytes_that_are_not_the_committed_objects(copy_path):
    committed = b"A" * 10_000
    dst = bytearray(10_000)
    late = b"A" * 9_999 + b"B"  # one byte changed by a late writer
    assert fence.copy_verified(memoryview(dst), memoryview(late), xxhash.xxh3_64_intdigest(committed)) is False


def test_write_deadline_keeps_a_margin_inside_the_grants_lifetime():
    assert fence.write_deadline(100.0, 0) == math.inf  # the master did not say: no deadline
    assert fence.write_deadline(100.0, 1000) == pytest.approx(100.9)  # 10% margin
    assert fence.write_deadline(100.0, 30_000) == pytest.approx(129.0)  # margin capped at 1 s


def _objects(sizes, seed=3):
    return [bytes((i * 131 + seed * 7 + n) % 256 for i in range(size)) for n, size in enumerate(sizes)]


@pytest.mark.parametrize("pipeline", [True, False])
def test_copy_verified_many_copies_and_checks_every_object_on_either_path(monkeypatch, pipeline, copy_path):
    """Small CHUNK and PIPELINE_MIN so the helper-thread path runs with objects that straddle chunks, an empty
    object and objects smaller than a chunk (several per hand-off)."""
    monkeypatch.setattr(fence, "CHUNK", 4096)
    monkeypatch.setattr(fence, "PIPELINE_MIN", 8192)
    srcs = _objects([0, 100, 4096, 10_000, 3 * 4096 + 1, 5000])
    sums = [xxhash.xxh3_64_intdigest(s) for s in srcs]
    sums[3] ^= 1   # object 3's committed checksum is another one: its copy must not count
    dsts = [bytearray(len(s)) for s in srcs]
    oks = fence.copy_verified_many([memoryview(d) for d in dsts], [memoryview(s) for s in srcs], sums,
                                   pipeline=pipeline)
    assert oks == [True, True, True, False, True, True]
    assert [bytes(d) for d in dsts] == srcs


def test_copy_verified_many_hashes_what_landed_not_what_was_committed(monkeypatch, copy_path):
    """A late writer's byte in one object of a pipelined batch: that object is a miss, its neighbours are hits."""
    monkeypatch.setattr(fence, "CHUNK", 4096)
    monkeypatch.setattr(fence, "PIPELINE_MIN", 8192)
    committed = _objects([9000, 9000, 9000])
    landed = [bytearray(c) for c in committed]
    landed[1][8999] ^= 0x01
    dsts = [bytearray(9000) for _ in committed]
    oks = fence.copy_verified_many([memoryview(d) for d in dsts], [memoryview(x) for x in landed],
                                   [xxhash.xxh3_64_intdigest(c) for c in committed])
    assert oks == [True, False, True]


def test_copy_verified_many_rejects_mismatched_arguments_before_copying(monkeypatch, copy_path):
    monkeypatch.setattr(fence, "PIPELINE_MIN", 1)
    src, dst = b"x" * 10, bytearray(10)
    with pytest.raises(ValueError, match=r"^dsts, srcs and checksums differ in length \(1, 1, 2\)$"):
        fence.copy_verified_many([memoryview(dst)], [memoryview(src)], [0, 1])
    assert dst == bytearray(10)
    with pytest.raises(ValueError, match="^destination of 9 bytes for a source of 10$"):
        fence.copy_verified_many([memoryview(bytearray(9))], [memoryview(src)], [0])
    big, first = b"y" * 4096, bytearray(4096)   # the one-pass path too: the bad pair is found before any copy
    with pytest.raises(ValueError, match="^destination of 4095 bytes for a source of 4096$"):
        fence.copy_verified_many([memoryview(first), memoryview(bytearray(4095))], [memoryview(big)] * 2, [0, 0])
    assert first == bytearray(4096)


def test_the_helper_thread_is_one_per_process_and_restarts_in_a_forked_child(monkeypatch, two_pass):
    import multiprocessing as mp
    import threading

    monkeypatch.setattr(fence, "PIPELINE_MIN", 1)
    src = _objects([3 << 20])[0]
    for _ in range(3):
        dst = bytearray(len(src))
        assert fence.copy_verified_many([memoryview(dst)], [memoryview(src)], [xxhash.xxh3_64_intdigest(src)]) \
            == [True]
    assert [t.name for t in threading.enumerate()].count("kvpool-verify") == 1
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as workers:
        assert workers.apply_async(_copy_in_child, (src,)).get(timeout=60) == [True]  # a dead helper: a hang
    with fence._helper._lock:          # forked while another thread starts a helper: the child's lock is free
        workers = ctx.Pool(1)
    with workers:
        assert workers.apply_async(_copy_in_child, (src,)).get(timeout=60) == [True]


def _copy_in_child(src: bytes) -> list[bool]:
    fence.PIPELINE_MIN = 1
    copyhash.use(False)
    dst = bytearray(len(src))
    oks = fence.copy_verified_many([memoryview(dst)], [memoryview(src)], [xxhash.xxh3_64_intdigest(src)])
    return oks if bytes(dst) == src else [False]


@pytest.mark.parametrize("pipeline", [True, False])
def test_verify_many_checks_every_view_split_between_two_threads(monkeypatch, pipeline):
    """Views of mixed sizes (one larger than a hand-off, an empty one) with two wrong checksums: exactly those two
    fail, whichever thread hashed them."""
    monkeypatch.setattr(fence, "HANDOFF", 4096)
    monkeypatch.setattr(fence, "PIPELINE_MIN", 8192)
    views = _objects([5000, 0, 100, 9000, 4096, 3000, 7000, 1])
    sums = [xxhash.xxh3_64_intdigest(v) for v in views]
    sums[0] ^= 1    # hashed by the helper (the split alternates by bytes: 0, 4, 5, 7 helper; 1, 2, 3, 6 here)
    sums[6] ^= 1    # hashed by this thread
    handed = []
    submit = fence._helper.submit
    monkeypatch.setattr(fence._helper, "submit", lambda pieces, done: (handed.append(len(pieces)),
                                                                       submit(pieces, done)))
    oks = fence.verify_many([memoryview(v) for v in views], sums, pipeline=pipeline)
    assert oks == [False, True, True, True, True, True, False, True]
    assert (sum(handed) > 0) is pipeline and sum(handed) < len(views)   # the helper took some, not all
    with pytest.raises(ValueError, match=r"^views and checksums differ in length \(1, 0\)$"):
        fence.verify_many([memoryview(b"x")], [])


def test_the_one_pass_copy_is_built_wherever_a_c_compiler_is():
    """scripts/setup.sh installs a compiler where apt-get can; the build is optional only for machines without."""
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on PATH")
    if os.environ.get("KVPOOL_NATIVE_COPY") == "0":
        pytest.skip("KVPOOL_NATIVE_COPY=0")
    assert copyhash.REASON == ""
    from kvpool import _copyhash
    with open("/proc/cpuinfo") as f:
        avx2 = os.uname().machine == "x86_64" and "avx2" in f.read()
    assert _copyhash.SIMD == ("avx2" if avx2 else "portable")
