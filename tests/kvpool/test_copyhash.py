"""kvpool._copyhash (kvpool/_copyhash.c): the one-pass copy + XXH3-64 behind the read fence.

The digest must be exactly xxhash's for every length the long-input algorithm covers (block and stripe edges, odd
tails, unaligned buffers), on the AVX2 path and the portable one; the copy must write exactly the destination;
bad arguments raise before a byte moves."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import xxhash

from kvpool import copyhash, fence

native = pytest.importorskip("kvpool._copyhash", reason="kvpool._copyhash is not built (no C compiler)")

MODES = [{"portable": False}, {"portable": False, "stream": True}, {"portable": True}]
MODE_IDS = ["simd", "simd-streaming-stores", "portable"]


def _aligned_zeros(n: int) -> np.ndarray:
    """n zero bytes starting on a 64-byte boundary (streaming stores need 32), whatever numpy's allocator gives."""
    raw = np.zeros(n + 64, np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip:skip + n]


def _lengths() -> list[int]:
    edges = [241, 242, 255, 256, 257, 319, 320, 321, 1023, 1024, 1025, 1087, 1088, 1089, 2047, 2048, 2049]
    edges += [1024 * k + d for k in (3, 16, 17, 64, 1024, 2048) for d in (-65, -64, -63, -1, 0, 1, 63, 64, 65)]
    rng = np.random.default_rng(11)
    return sorted(set(edges + list(range(241, 1400, 7)) + [int(n) for n in rng.integers(241, 5 << 20, 40)]))


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_the_digest_is_xxh3_64_of_the_bytes_copied_at_every_length_and_alignment(mode):
    """Streaming stores apply where the destination is 32-byte aligned: the offsets cover aligned and not."""
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, (5 << 20) + 128, dtype=np.uint8)
    for j, n in enumerate(_lengths()):
        s_off, d_off = j % 61, (j * 7) % 64           # unaligned source and destination
        dst = _aligned_zeros(n + 128)
        got = native.copy_xxh3(memoryview(dst)[d_off:d_off + n], memoryview(src)[s_off:s_off + n], **mode)
        assert got == xxhash.xxh3_64_intdigest(src[s_off:s_off + n]), f"length {n}"
        assert np.array_equal(dst[d_off:d_off + n], src[s_off:s_off + n]), f"length {n}"
        assert not dst[:d_off].any() and not dst[d_off + n:].any(), f"length {n}: wrote outside dst"


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_many_copies_every_pair_and_returns_their_digests_in_order(mode):
    srcs = [bytes((i * 13 + n) % 256 for i in range(size)) for n, size in enumerate([241, 5000, 1 << 16, 1025])]
    dsts = [bytearray(len(s)) for s in srcs]
    assert native.copy_xxh3_many(dsts, srcs, **mode) == [xxhash.xxh3_64_intdigest(s) for s in srcs]
    assert [bytes(d) for d in dsts] == srcs
    assert native.copy_xxh3_many([], []) == []


def test_a_changed_byte_changes_the_digest_anywhere_in_the_object():
    src = bytearray(np.random.default_rng(3).integers(0, 256, 70_000, dtype=np.uint8).tobytes())
    good = xxhash.xxh3_64_intdigest(src)
    for pos in (0, 63, 64, 1023, 1024, 40_000, 69_935, 69_999):   # first, stripe/block edges, the last stripe
        src[pos] ^= 0x80
        assert native.copy_xxh3(bytearray(len(src)), src) != good, pos
        src[pos] ^= 0x80
    assert native.copy_xxh3(bytearray(len(src)), src) == good


def test_bad_arguments_name_the_field_and_copy_nothing():
    dst = bytearray(300)
    with pytest.raises(ValueError, match=r"^dst has 300 bytes for a src of 301$"):
        native.copy_xxh3(dst, b"x" * 301)
    with pytest.raises(ValueError, match=r"^src has 240 bytes: copy_xxh3 needs at least 241$"):
        native.copy_xxh3(bytearray(240), b"x" * 240)
    with pytest.raises(BufferError):
        native.copy_xxh3(b"\0" * 300, b"x" * 300)     # a read-only destination
    assert dst == bytearray(300)
    first = bytearray(300)
    with pytest.raises(ValueError, match=r"^dsts\[1\] has 300 bytes for a src of 299$"):
        native.copy_xxh3_many([first, bytearray(300)], [b"a" * 300, b"b" * 299])
    with pytest.raises(ValueError, match=r"^srcs\[1\] has 10 bytes: copy_xxh3 needs at least 241$"):
        native.copy_xxh3_many([first, bytearray(10)], [b"a" * 300, b"b" * 10])
    with pytest.raises(ValueError, match=r"^dsts and srcs differ in length \(2, 1\)$"):
        native.copy_xxh3_many([first, bytearray(300)], [b"a" * 300])
    assert first == bytearray(300)      # the good pair before the bad one was not copied either


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_scatter_lands_every_run_at_its_start_and_hashes_the_object_in_its_order(mode):
    """Runs of 64 B to 12 KiB (a SmolLM2 block's per-layer K or V run), one to 61 of them, shuffled starts inside a
    larger destination, an offset `base`: exactly the runs are written and the digest is the object's."""
    rng = np.random.default_rng(5)
    for run in (64, 192, 1024, 4160, 12288):
        for count in (1, 4, 16, 17, 60, 61):
            if run * count < 241:
                continue
            src = rng.integers(0, 256, run * count, dtype=np.uint8)
            dst = _aligned_zeros(run * count * 3 + 128)
            starts = (rng.permutation(count * 3)[:count] * run).astype(np.uint64)
            got = native.scatter_xxh3(dst, src, starts, run, 100 + 28 * (count % 2), **mode)
            assert got == xxhash.xxh3_64_intdigest(src), (run, count)
            expect = np.zeros_like(dst)
            for k, start in enumerate(starts):
                at = 100 + 28 * (count % 2) + int(start)     # runs at 4 mod 32, and 0 mod 32
                expect[at:at + run] = src[k * run:(k + 1) * run]
            assert np.array_equal(dst, expect), (run, count)


def test_scatter_checks_every_run_before_it_copies():
    dst, src = np.zeros(1000, np.uint8), np.ones(512, np.uint8)
    with pytest.raises(ValueError, match=r"^starts\[1\]: run \[800, 1056\) is outside dst \(1000 bytes\)$"):
        native.scatter_xxh3(dst, src, np.array([0, 800], np.uint64), 256)
    assert not dst.any()    # run 0 fitted, and was not copied either
    with pytest.raises(ValueError, match=r"^starts must be a buffer of uint64"):
        native.scatter_xxh3(dst, src, np.array([0, 256], np.int64), 256)
    with pytest.raises(ValueError, match=r"^run must be a positive multiple of 64 bytes, got 250$"):
        native.scatter_xxh3(dst, src[:500], np.array([0, 256], np.uint64), 250)
    with pytest.raises(ValueError, match=r"^src has 500 bytes: it must be len\(starts\) x run = 2 x 256 bytes"):
        native.scatter_xxh3(dst, src[:500], np.array([0, 256], np.uint64), 256)
    with pytest.raises(ValueError, match=r"^base must be >= 0, got -1$"):
        native.scatter_xxh3(dst, src, np.array([0, 256], np.uint64), 256, -1)
    assert not dst.any()


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_copy_into_fills_each_destination_in_turn_and_hashes_the_source_order(mode):
    """30 pages of 96 KiB (a vLLM block's layers), odd mixes of stripe multiples, one destination."""
    rng = np.random.default_rng(9)
    for lens in ([98_304] * 30, [256, 64, 128], [64] * 5, [1024, 1024, 64], [4096]):
        src = rng.integers(0, 256, sum(lens), dtype=np.uint8)
        dsts = [_aligned_zeros(n) for n in lens]
        assert native.copy_xxh3_into(dsts, src, **mode) == xxhash.xxh3_64_intdigest(src), lens
        assert np.array_equal(np.concatenate(dsts), src), lens


def test_copy_into_checks_every_destination_before_it_copies():
    first = np.zeros(256, np.uint8)
    with pytest.raises(ValueError, match=r"^dsts\[1\] has 100 bytes: each must be a positive multiple of 64$"):
        native.copy_xxh3_into([first, np.zeros(100, np.uint8)], np.ones(356, np.uint8))
    with pytest.raises(ValueError, match=r"^src has 320 bytes, dsts 256 in all: they must be equal and at least 241$"):
        native.copy_xxh3_into([first], np.ones(320, np.uint8))
    with pytest.raises(BufferError):
        native.copy_xxh3_into([first, bytes(64)], np.ones(320, np.uint8))
    assert not first.any()


def test_the_fence_uses_it_where_it_is_built_and_can_be_turned_off():
    assert copyhash.simd() == native.SIMD and copyhash.REASON == ""
    src = bytes(range(256)) * 40
    previous = copyhash.use(False)
    try:
        assert copyhash.simd() == ""
        dst = bytearray(len(src))
        assert fence.copy_verified(memoryview(dst), memoryview(src), xxhash.xxh3_64_intdigest(src)) and dst == src
    finally:
        copyhash.use(previous)
    assert copyhash.simd() == native.SIMD
    env = dict(os.environ, KVPOOL_NATIVE_COPY="0")
    code = "from kvpool import copyhash; print(repr(copyhash.simd()), copyhash.REASON)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "'' KVPOOL_NATIVE_COPY=0"
    bad = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, KVPOOL_NATIVE_COPY="off"),
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 1
    assert "ValueError: KVPOOL_NATIVE_COPY must be 0 (two-pass copy) or 1 (one pass, the default), got 'off'" \
        in bad.stderr

