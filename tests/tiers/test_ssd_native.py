"""The SSD record reader in C (kvpool/_copyhash.c `read_records`) against the Python one (tiers/ssd.py
`_read_records`, the format's owner): the same results, the same bytes and the same preadv plan over good records,
damaged ones and mismatched requests; what the C reader refuses it leaves untouched for the Python one."""

from __future__ import annotations

import errno
import logging
import os
import struct

import numpy as np
import pytest
import xxhash

from kvpool import copyhash
from kvpool.tiers import ssd as ssd_module
from kvpool.tiers.ssd import HEADER_BYTES, SsdFile, SsdReader, record_size
from tests.tiers.test_ssd import plain_header as old_header
from tests.tiers.test_ssd import put_raw

pytestmark = pytest.mark.skipif(bool(copyhash.REASON), reason=f"the C reader is not built: {copyhash.REASON}")

NS = bytes(range(100, 116))
CAP = 16 << 20


def key(i: int) -> bytes:
    return i.to_bytes(2, "little") * 8


def payload(i: int, n: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8).tobytes()


def native():
    from kvpool import _copyhash
    return _copyhash


@pytest.mark.parametrize("portable", [False, True], ids=["simd", "portable"])
def test_the_reader_hashes_as_xxhash_does(portable):
    """Headers (17 to 128 bytes: 56 and 72 in use) and payloads (over 240 bytes), every length of both ranges up
    to 4,200 bytes and some large ones, at an odd start too."""
    data = np.random.default_rng(7).integers(0, 256, (3 << 20) + 1, dtype=np.uint8).tobytes()
    lengths = [*range(17, 129), *range(241, 4200), 65536, 65536 + 65, 1 << 20, 3 << 20]
    for n in lengths:
        for start in (0, 1):
            chunk = data[start:start + n]
            assert native().xxh3_64(chunk, portable=portable) == xxhash.xxh3_64_intdigest(chunk), (n, start)
    for n in (0, 16, 129, 240):
        with pytest.raises(ValueError, match=f"data has {n} bytes"):
            native().xxh3_64(bytes(n))


def flip(path: str, at: int) -> None:
    with open(path, "r+b") as raw:
        raw.seek(at)
        b = raw.read(1)
        raw.seek(at)
        raw.write(bytes([b[0] ^ 0x10]))


@pytest.fixture
def file_of_cases(tmp_path):
    """Records side by side (runs), one far away (its own preadv), and every kind of damage the checks catch.
    Yields (SsdFile, [(offset, key, size, expected digest or None when the read must miss)]), closed after."""
    f = SsdFile.open(str(tmp_path / "ssd"), CAP)
    cases, at = [], 0

    def place(n: int) -> int:
        nonlocal at
        off, at = at, at + -(-record_size(n) // 4096) * 4096
        return off

    def good(i: int, n: int, **kw) -> tuple[int, bytes, int, int]:
        off = place(n)
        f.write(off, key(i), NS, payload(i, n), written_us=1000 + i, **kw)
        return off, key(i), n, xxhash.xxh3_64_intdigest(payload(i, n))

    cases.append(good(1, 241))                                  # the smallest payload the C reader takes
    cases.append(good(2, 5000))                                 # a gap of 3192 bytes after it
    cases.append(good(3, 65536))
    off = place(7000)                                           # a record of a node from before (no WRITTEN flag)
    put_raw(f.path, off, old_header(key(4), NS, 7000, xxhash.xxh3_64_intdigest(payload(4, 7000))), payload(4, 7000))
    cases.append((off, key(4), 7000, xxhash.xxh3_64_intdigest(payload(4, 7000))))
    off, k, n, _ = good(5, 8192)                                # a payload byte flipped
    flip(f.path, off + HEADER_BYTES + 4000)
    cases.append((off, k, n, None))
    off, k, n, _ = good(6, 8192)                                # written_us flipped: time_sum fails
    flip(f.path, off + 66)
    cases.append((off, k, n, None))
    off, k, n, _ = good(7, 8192)                                # the WRITTEN flag cleared: hdr_sum covers flags
    flip(f.path, off + 6)
    cases.append((off, k, n, None))
    off = place(300)                                            # version 2 with good sums
    put_raw(f.path, off, old_header(key(8), NS, 300, xxhash.xxh3_64_intdigest(payload(8, 300)), version=2),
            payload(8, 300))
    cases.append((off, key(8), 300, None))
    off = place(300)                                            # another magic, its sum taken over it
    body = struct.pack("<4sHH16s16sQQ", b"KVPQ", 1, 0, key(9), NS, 300, xxhash.xxh3_64_intdigest(payload(9, 300)))
    put_raw(f.path, off, body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little"), payload(9, 300))
    cases.append((off, key(9), 300, None))
    off = place(5000)                   # a header for 5000 bytes whose checksum is of the first 4096: asked as 4096
    put_raw(f.path, off, old_header(key(14_000), NS, 5000, xxhash.xxh3_64_intdigest(payload(14, 5000)[:4096])),
            payload(14, 5000))
    cases.append((off, key(14_000), 4096, None))
    off, _, n, _ = good(10, 4096)                               # asked under another key
    cases.append((off, key(99), n, None))
    off, k, _, _ = good(11, 4096)                               # asked for another size
    cases.append((off, k, 4000, None))
    cases.append(good(12, (1 << 20) + 5))                       # over a run's cap: read alone
    at += 70_000 // 4096 * 4096                                 # a gap over 64 KiB: a new run
    for i in range(13, 13 + 140):                               # 140 x 8 KiB: more than one 1 MiB run
        cases.append(good(i, 4096))
    yield f, cases
    f.close()


def both(fd, offsets, keys, sizes, ns_digest=None):
    """(results, plan, bytes) of the Python reader and of the C reader, each into fresh buffers."""
    out = []
    for reader in ("python", "c"):
        bufs = [bytearray(n) for n in sizes]
        plan: list = []
        if reader == "python":
            real = os.preadv

            def counting(fd_, buffers, offset, plan=plan, real=real):
                plan.append((offset, len(buffers)))
                return real(fd_, buffers, offset)

            os.preadv = counting
            try:
                results = ssd_module._read_records(fd, offsets, keys, [memoryview(b) for b in bufs], ns_digest)
            finally:
                os.preadv = real
        else:
            got = copyhash.read_records(fd, offsets, keys, bufs, None, ns_digest, trace=plan)
            assert got is not None, "the C reader refused arguments it takes"
            results, failures = got
            assert failures == []
        out.append((results, plan, [bytes(b) for b in bufs]))
    return out


def test_c_and_python_readers_agree_on_every_case_and_plan(file_of_cases):
    f, cases = file_of_cases
    order = list(np.random.default_rng(3).permutation(len(cases))) + [1, 2]    # shuffled, two asked twice
    offsets = [cases[i][0] for i in order]
    keys = [cases[i][1] for i in order]
    sizes = [cases[i][2] for i in order]
    fd = os.open(f.path, os.O_RDONLY)
    (py, py_plan, py_bytes), (c, c_plan, c_bytes) = both(fd, offsets, keys, sizes)
    expected = [cases[i][3] for i in order]
    assert py == expected
    assert c == expected
    assert c_plan == py_plan and len(c_plan) >= 4
    for i, digest in enumerate(expected):
        if digest is not None:
            assert c_bytes[i] == py_bytes[i] and xxhash.xxh3_64_intdigest(c_bytes[i]) == digest
    # the namespace is checked where it is asked: every record is a miss under another
    (py, _, _), (c, _, _) = both(fd, offsets, keys, sizes, ns_digest=bytes(16))
    assert py == c == [None] * len(order)
    (py, _, _), (c, _, _) = both(fd, offsets, keys, sizes, ns_digest=NS)
    assert py == c == expected
    os.close(fd)


def test_portable_and_simd_readers_agree(file_of_cases):
    f, cases = file_of_cases
    offsets, keys, sizes = [c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases]
    results, fd = [], os.open(f.path, os.O_RDONLY)
    for portable in (False, True):
        bufs = [bytearray(n) for n in sizes]
        results.append(native().read_records(fd, offsets, keys, bufs, None, None, portable=portable)[0])
    assert results[0] == results[1] == [c[3] for c in cases]
    os.close(fd)


def test_a_run_cut_by_truncation_keeps_what_came_before_it(tmp_path):
    with SsdFile.open(str(tmp_path / "ssd"), CAP) as f:
        for i in range(4):
            f.write(i * 8192, key(i), NS, payload(i, 4096))
        os.truncate(f.path, 2 * 8192 + HEADER_BYTES + 100)      # record 2's payload cut, record 3 gone
        offsets, keys, fd = [0, 8192, 16384, 24576], [key(i) for i in range(4)], os.open(f.path, os.O_RDONLY)
        (py, py_plan, _), (c, c_plan, c_bytes) = both(fd, offsets, keys, [4096] * 4)
        os.close(fd)
    assert c == py == [xxhash.xxh3_64_intdigest(payload(0, 4096)), xxhash.xxh3_64_intdigest(payload(1, 4096)),
                       None, None]
    assert c_plan == py_plan == [(0, 12), (16384, 3), (24576, 3)]  # the run, then each record past the cut alone
    assert c_bytes[:2] == [payload(0, 4096), payload(1, 4096)]


def test_a_failed_read_is_a_miss_per_record_named_with_its_errno(tmp_path, caplog):
    fd = os.open(str(tmp_path), os.O_RDONLY)                    # a directory: every read fails with EISDIR
    try:
        plan: list = []
        results, failures = copyhash.read_records(fd, [0, 8192, 16384], [key(i) for i in range(3)],
                                                  [bytearray(4096) for _ in range(3)], trace=plan)
        assert results == [None] * 3
        assert failures == [(0, errno.EISDIR), (8192, errno.EISDIR), (16384, errno.EISDIR)]
        assert plan == [(0, 9), (0, 3), (8192, 3), (16384, 3)]     # the run, then each record alone
    finally:
        os.close(fd)
    reader = SsdReader(str(tmp_path))                           # a directory: it opens, and its reads fail
    try:
        outs = [memoryview(bytearray(4096)) for _ in range(2)]
        with caplog.at_level(logging.WARNING, logger="kvpool.tiers.ssd"):
            assert reader.read_many_into([0, 8192], [key(0), key(1)], outs) == [None, None]
        why = os.strerror(errno.EISDIR)
        assert [r.getMessage() for r in caplog.records] == [f"SSD read failed at offset {o}: {why}" for o in (0, 8192)]
    finally:
        reader.close()


@pytest.mark.parametrize("case", ["small payload", "numpy offset", "short key", "read-only buffer", "unaligned",
                                  "size over buffer", "past the limit", "bool offset", "str key"])
def test_what_the_c_reader_refuses_it_leaves_untouched(tmp_path, case):
    with SsdFile.open(str(tmp_path / "ssd"), CAP) as f:
        f.write(0, key(1), NS, payload(1, 4096))
        f.write(8192, key(2), NS, payload(2, 4096))
        fd = os.open(f.path, os.O_RDONLY)
        offsets, keys, bufs, sizes, limit = [0, 8192], [key(1), key(2)], [bytearray(4096), bytearray(4096)], None, CAP
        if case == "small payload":
            bufs[1], sizes = bytearray(4096), [4096, 240]
        elif case == "numpy offset":
            offsets[1] = np.int64(8192)
        elif case == "short key":
            keys[1] = b"short"
        elif case == "read-only buffer":
            bufs[1] = bytes(4096)
        elif case == "unaligned":
            offsets[1] = 8193
        elif case == "size over buffer":
            sizes = [4096, 4097]
        elif case == "past the limit":
            limit = 8192 + HEADER_BYTES + 4095
        elif case == "bool offset":
            offsets[0] = False
        elif case == "str key":
            keys[0] = "k" * 16
        plan: list = []
        assert copyhash.read_records(fd, offsets, keys, bufs, sizes, None, limit, trace=plan) is None
        os.close(fd)
        assert plan == [] and bufs[0] == bytearray(4096)             # nothing read
        # the same request through the file: the Python reader decides (a miss, a read or the named error)
        if case in ("short key", "read-only buffer", "unaligned", "size over buffer", "str key"):
            with pytest.raises(ValueError, match=r"keys\[|outs\[|offset must be|sizes\["):
                f.read_many_into(offsets, keys, sizes or [4096, 4096], bufs)
        elif case in ("numpy offset", "bool offset"):
            assert f.read_many_into(offsets, keys, [4096, 4096], bufs) == [True, True]
            assert bufs == [bytearray(payload(1, 4096)), bytearray(payload(2, 4096))]


def test_the_one_pass_switch_turns_the_c_reader_off(tmp_path):
    with SsdFile.open(str(tmp_path / "ssd"), CAP) as f:
        f.write(0, key(1), NS, payload(1, 4096))
        previous = copyhash.use(False)
        try:
            assert copyhash.read_records(-1, [0], [key(1)], [bytearray(4096)]) is None
            out = bytearray(4096)
            assert f.read_many_into([0], [key(1)], [4096], [out]) == [True] and bytes(out) == payload(1, 4096)
        finally:
            copyhash.use(previous)


def test_a_same_host_reader_names_an_offset_the_c_reader_refuses(tmp_path):
    """SsdReader leaves the offset checks to the C reader; one it refuses is named by the Python path, nothing read."""
    with SsdFile.open(str(tmp_path / "ssd"), CAP) as f:
        f.write(0, key(1), NS, payload(1, 4096))
        reader = SsdReader(f.path)
        try:
            out = memoryview(bytearray(4096))
            for bad in (100, -4096):
                with pytest.raises(ValueError, match=f"^offset must be an int >= 0 and a multiple of 4096, got {bad}$"):
                    reader.read_many_into([0, bad], [key(1), key(1)], [out, memoryview(bytearray(4096))])
                assert bytes(out) == bytes(4096)
            assert reader.read_many_into([0], [key(1)], [out]) == [xxhash.xxh3_64_intdigest(payload(1, 4096))]
        finally:
            reader.close()
