"""SsdFile: byte-exact round trip, crash recovery after SIGKILL, corruption and truncation are counted misses."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import xxhash

from kvpool import copyhash
from kvpool.tiers.ssd import DATA_FILE, HEADER_BYTES, SsdFile, SsdReader, SsdRecord, _pack_header, record_size

CAP = 1 << 20
NS = bytes(range(100, 116))


def key(i: int) -> bytes:
    return i.to_bytes(2, "little") * 8


def payload(i: int, n: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.fixture(autouse=True, params=["c", "python"])
def reader(request):
    """Every test with each record reader: the C one (kvpool/_copyhash.c, where it takes the arguments: payloads
    over 240 bytes) and the Python one (tiers/ssd.py _read_records, the one-pass copy's switch off)."""
    if request.param == "c" and copyhash.REASON:
        pytest.skip(f"the C reader is not built: {copyhash.REASON}")
    previous = copyhash.use(request.param == "c")
    yield request.param
    copyhash.use(previous)


@pytest.fixture
def ssd(tmp_path):
    f = SsdFile.open(str(tmp_path / "ssd"), CAP)
    yield f
    f.close()


def test_open_preallocates_the_data_file(tmp_path):
    with SsdFile.open(str(tmp_path / "d"), CAP) as f:
        assert f.path == str(tmp_path / "d" / DATA_FILE)
        assert os.path.getsize(f.path) == CAP and f.capacity == CAP and f.corrupt_reads == 0
        assert list(f.scan()) == []


def test_round_trip_is_byte_exact(ssd):
    data = payload(1, 10_000)
    assert record_size(10_000) == HEADER_BYTES + 10_000
    checksum = ssd.write(8192, key(1), NS, data)
    assert checksum == xxhash.xxh3_64_intdigest(data)
    out = bytearray(10_000)
    assert ssd.read_into(8192, key(1), 10_000, out) is True
    assert bytes(out) == data
    arr = np.zeros(12_000, dtype=np.uint8)        # a larger buffer: only the first `size` bytes are filled
    assert ssd.read_into(8192, key(1), 10_000, arr, ns_digest=NS) is True
    assert arr[:10_000].tobytes() == data and not arr[10_000:].any()
    assert ssd.corrupt_reads == 0


def test_scan_finds_exact_records_across_chunks(ssd):
    # record 0 spans the first 256 KiB scan chunk; the others start in later chunks
    layout = [(0, 300_000), (512 * 1024, 4096), (CAP - 8192, 4096)]
    for i, (off, n) in enumerate(layout):
        ssd.write(off, key(i), NS, payload(i, n))
    found = list(ssd.scan())
    assert found == [SsdRecord(key(i), NS, off, n, xxhash.xxh3_64_intdigest(payload(i, n)))
                     for i, (off, n) in enumerate(layout)]
    assert all(ssd.verify(r) for r in found)


def test_header_bytes_inside_a_payload_are_not_records(ssd):
    fake = _pack_header(key(9), NS, 10, 0).ljust(8192, b"\0")  # looks like a record at a page boundary
    ssd.write(0, key(1), NS, fake)
    assert [r.key for r in ssd.scan()] == [key(1)]


def test_reopen_recovers_records_and_erase_is_permanent(tmp_path):
    d = str(tmp_path / "ssd")
    with SsdFile.open(d, CAP) as f:
        f.write(0, key(1), NS, payload(1, 5000))
        f.write(16384, key(2), NS, payload(2, 5000))
        f.write(32768, key(3), NS, payload(3, 5000))
        f.erase(16384)
        out = bytearray(5000)
        assert f.read_into(16384, key(2), 5000, out) is False
        assert f.corrupt_reads == 1
    with SsdFile.open(d, CAP, create=False) as f:
        assert [(r.key, r.offset) for r in f.scan()] == [(key(1), 0), (key(3), 32768)]
        out = bytearray(5000)
        assert f.read_into(32768, key(3), 5000, out) and bytes(out) == payload(3, 5000)


def test_corrupted_payload_byte_is_a_counted_miss(ssd):
    data = payload(4, 8192)
    ssd.write(4096, key(4), NS, data)
    with open(ssd.path, "r+b") as raw:             # flip one payload byte on disk
        raw.seek(4096 + HEADER_BYTES + 1234)
        b = raw.read(1)
        raw.seek(4096 + HEADER_BYTES + 1234)
        raw.write(bytes([b[0] ^ 0x40]))
    out = bytearray(8192)
    assert ssd.read_into(4096, key(4), 8192, out) is False
    assert ssd.corrupt_reads == 1
    [rec] = ssd.scan()                             # lazy recovery still lists it ...
    assert ssd.verify(rec) is False                # ... verification catches it
    assert list(ssd.scan(verify=True)) == []


def test_corrupted_header_and_mismatched_request_are_misses(ssd):
    ssd.write(0, key(5), NS, payload(5, 100))
    out = bytearray(100)
    assert ssd.read_into(0, key(6), 100, out) is False                           # wrong key
    assert ssd.read_into(0, key(5), 99, out) is False                            # wrong size
    assert ssd.read_into(0, key(5), 100, out, ns_digest=bytes(16)) is False      # wrong namespace
    with open(ssd.path, "r+b") as raw:
        raw.seek(41)                                                             # a byte of the size field
        raw.write(b"\x7f")
    assert ssd.read_into(0, key(5), 100, out) is False                           # header checksum
    assert list(ssd.scan()) == []
    assert ssd.corrupt_reads == 4


def test_truncated_file_is_a_miss_now_and_after_reopen(tmp_path):
    d = str(tmp_path / "ssd")
    f = SsdFile.open(d, CAP)
    f.write(0, key(1), NS, payload(1, 4096))
    f.write(8192, key(2), NS, payload(2, 20_000))
    os.truncate(f.path, 8192 + HEADER_BYTES + 10_000)    # cuts record 2's payload in half
    out = bytearray(20_000)
    assert f.read_into(8192, key(2), 20_000, out) is False
    assert f.corrupt_reads == 1
    f.close()
    with SsdFile.open(d, CAP) as f:                       # grown back to capacity, zero-filled
        assert os.path.getsize(f.path) == CAP
        assert [r.key for r in f.scan()] == [key(1)]      # the truncated record is not recovered
        assert f.read_into(8192, key(2), 20_000, out) is False
        assert f.corrupt_reads == 1


def test_bad_arguments_name_the_argument(ssd, tmp_path):
    data = b"x" * 10
    with pytest.raises(ValueError, match="key must be 16 bytes"):
        ssd.write(0, b"short", NS, data)
    with pytest.raises(ValueError, match="ns_digest must be 16 bytes"):
        ssd.write(0, key(1), b"", data)
    with pytest.raises(ValueError, match="offset must be an int >= 0 and a multiple of 4096"):
        ssd.write(100, key(1), NS, data)
    with pytest.raises(ValueError, match=r"offset \+ record size"):
        ssd.write(CAP - 4096, key(1), NS, data)
    with pytest.raises(ValueError, match="size must be an int"):
        ssd.read_into(0, key(1), 11, bytearray(10))
    with pytest.raises(ValueError, match="payload must support the buffer protocol"):
        ssd.write(0, key(1), NS, "text")
    with pytest.raises(ValueError, match="capacity"):
        SsdFile.open(str(tmp_path / "x"), 0)
    with pytest.raises(ValueError, match="capacity"):
        SsdFile.open(os.path.dirname(ssd.path) + "2", -1)
    assert list(ssd.scan()) == []                 # nothing was written


def test_second_open_of_the_same_file_is_refused_and_capacity_cannot_shrink(ssd, tmp_path):
    d = os.path.dirname(ssd.path)
    with pytest.raises(RuntimeError, match="in use"):
        SsdFile.open(d, CAP)
    ssd.close()
    with pytest.raises(ValueError, match="capacity 4096 is smaller than the existing data file"):
        SsdFile.open(d, 4096)
    with pytest.raises(ValueError, match="directory"):
        SsdFile.open(str(tmp_path / "missing"), CAP, create=False)


CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from kvpool.tiers.ssd import SsdFile, HEADER_BYTES, _ERASED, _pwrite_all
    d, = sys.argv[1:]
    ns = bytes(range(100, 116))
    key = lambda i: i.to_bytes(2, "little") * 8
    payload = lambda i, n: np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8).tobytes()
    f = SsdFile.open(d, 1 << 20)
    for i in range(6):                               # committed records at 0, 16K, ... 80K
        f.write(i * 16384, key(i), ns, payload(i, 6000))
    f.erase(2 * 16384)                               # removed before the crash
    # crash simulation 1: a new record whose payload landed but whose header was never written
    _pwrite_all(f._fd, _ERASED, 96 * 1024)
    _pwrite_all(f._fd, payload(50, 6000), 96 * 1024 + HEADER_BYTES)
    # crash simulation 2: overwriting record 5 with another object, killed after the payload
    _pwrite_all(f._fd, _ERASED, 5 * 16384)
    _pwrite_all(f._fd, payload(51, 6000), 5 * 16384 + HEADER_BYTES)
    print("ready", flush=True)
    time.sleep(120)
""")


def test_recovery_after_sigkill_finds_exactly_the_committed_records(tmp_path):
    d = str(tmp_path / "ssd")
    child = subprocess.Popen([sys.executable, "-c", CHILD, d], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with SsdFile.open(d, CAP, create=False) as f:     # the kernel dropped the dead owner's lock
        recs = list(f.scan())
        assert [(r.key, r.offset, r.size) for r in recs] == [(key(i), i * 16384, 6000) for i in (0, 1, 3, 4)]
        for r in recs:
            out = bytearray(r.size)
            assert f.read_into(r.offset, r.key, r.size, out) is True
            assert bytes(out) == payload(int.from_bytes(r.key[:2], "little"), 6000)
        assert f.corrupt_reads == 0


def test_threads_on_distinct_records_never_see_each_others_bytes(ssd):
    import threading

    errors: list[str] = []

    def worker(t: int) -> None:
        off = t * 65536
        out = bytearray(30_000)
        for i in range(40):                       # bounded: 40 rewrites + reads per thread
            data = payload(t * 1000 + i, 30_000)
            ssd.write(off, key(t), NS, data)
            if not ssd.read_into(off, key(t), 30_000, out) or bytes(out) != data:
                errors.append(f"thread {t} round {i}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert errors == [] and ssd.corrupt_reads == 0
    assert [(r.key, r.offset) for r in ssd.scan()] == [(key(t), t * 65536) for t in range(4)]


def test_reader_in_another_process_reads_and_checks_records_like_the_owner(ssd):
    """SsdReader is what a same-host client opens: the owner keeps its lock; the reader's checks are the owner's."""
    data = payload(7, 20_000)
    ssd.write(8192, key(7), NS, data)
    ssd.write(0, key(8), NS, payload(8, 100))
    code = textwrap.dedent(f"""
        import sys
        from kvpool.tiers.ssd import SsdReader
        r = SsdReader({ssd.path!r})
        out = bytearray(20_000)
        print(r.read_into(8192, {key(7)!r}, memoryview(out)), out == {data!r},
              r.read_into(8192, {key(8)!r}, memoryview(out)),       # wrong key
              r.read_into(8192, {key(7)!r}, memoryview(out)[:19_999]),   # wrong size
              r.read_into(0, {key(8)!r}, memoryview(out)[:100]) is not None)
        r.close()
        try:
            r.read_into(0, {key(8)!r}, memoryview(out)[:100])
        except ValueError as e:
            print(e)
    """)
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           check=True).stdout.splitlines()
    assert lines == [f"{xxhash.xxh3_64_intdigest(data)} True None None True", f"SsdReader of {ssd.path} is closed"]
    with open(ssd.path, "r+b") as raw:             # one payload byte flipped: a miss, counted by nobody but the caller
        raw.seek(8192 + HEADER_BYTES + 5)
        raw.write(bytes([data[5] ^ 1]))
    reader = SsdReader(ssd.path)
    try:
        assert reader.read_into(8192, key(7), memoryview(bytearray(20_000))) is None
        with pytest.raises(ValueError, match="^offset must be an int >= 0 and a multiple of 4096, got 100$"):
            reader.read_into(100, key(7), memoryview(bytearray(10)))
    finally:
        reader.close()
    assert ssd.corrupt_reads == 0   # the reader's misses are its caller's to count


@pytest.fixture
def preadv_calls(monkeypatch):
    """Every preadv the reads make, as (offset, number of buffers): what the coalescing is checked by. The Python
    reader's os.preadv calls, and the C reader's as its trace reports them."""
    calls, real, native = [], os.preadv, copyhash.read_records

    def counting(fd, buffers, offset):
        calls.append((offset, len(buffers)))
        return real(fd, buffers, offset)

    def traced(*args, **kwargs):
        return native(*args, **kwargs, trace=calls)

    monkeypatch.setattr(os, "preadv", counting)
    monkeypatch.setattr(copyhash, "read_records", traced)
    return calls


def test_records_side_by_side_are_read_in_one_preadv_and_each_is_checked_alone(ssd, preadv_calls):
    """Records one after the other (4 KiB-aligned, so a 5000-byte payload leaves a 3192-byte gap) are one preadv
    whatever the order asked; a flipped byte, a wrong key and a wrong size stay misses of their own record only."""
    sizes = [5000, 8192, 0, 12_000, 4096, 7000]
    offsets, at = [], 0
    for i, n in enumerate(sizes):
        offsets.append(at)
        ssd.write(at, key(i), NS, payload(i, n))
        at += -(-record_size(n) // 4096) * 4096
    with open(ssd.path, "r+b") as raw:             # record 3's payload: one byte flipped
        raw.seek(offsets[3] + HEADER_BYTES + 77)
        b = raw.read(1)
        raw.seek(offsets[3] + HEADER_BYTES + 77)
        raw.write(bytes([b[0] ^ 1]))
    ask = [5, 0, 3, 1, 2, 4]
    keys = [key(i) for i in ask]
    keys[3] = key(9)                                # record 1 asked under another key
    asked = [sizes[i] for i in ask]
    asked[5] = 4095                                 # record 4 asked with a wrong size: a miss
    outs = [bytearray(n) for n in asked]
    preadv_calls.clear()
    got = ssd.read_many_into([offsets[i] for i in ask], keys, asked, outs)
    assert got == [True, True, False, False, True, False]
    # one call: header, the rest of its page and payload of each of the 6, and a gap buffer after records 0
    # (3192 B), 3 (288 B), 4 (1 B: asked as 4095 bytes, it ends a byte before the next record)
    assert preadv_calls == [(0, 6 * 3 + 3)]
    assert [bytes(outs[k]) for k in (0, 1, 4)] == [payload(5, 7000), payload(0, 5000), payload(2, 0)]
    assert ssd.corrupt_reads == 3


def test_a_far_record_starts_a_new_preadv_and_a_repeated_one_is_read_twice(ssd, preadv_calls):
    ssd.write(0, key(1), NS, payload(1, 4096))
    ssd.write(8192, key(2), NS, payload(2, 4096))
    ssd.write(8192 + 4096 * 2 + 65536 + 4096, key(3), NS, payload(3, 4096))   # 69632 bytes past record 2: too far
    outs = [bytearray(4096) for _ in range(4)]
    offsets = [0, 8192, 8192 + 4096 * 2 + 65536 + 4096, 8192]
    preadv_calls.clear()
    got = ssd.read_many_into(offsets, [key(1), key(2), key(3), key(2)], [4096] * 4, outs)
    assert got == [True, True, True, True]
    assert preadv_calls == [(0, 6), (8192, 3), (offsets[2], 3)]
    assert [bytes(o) for o in outs] == [payload(1, 4096), payload(2, 4096), payload(3, 4096), payload(2, 4096)]


def test_a_run_cut_by_a_truncated_file_keeps_the_records_before_the_cut(tmp_path, preadv_calls):
    f = SsdFile.open(str(tmp_path / "ssd"), CAP)
    try:
        for i in range(4):
            f.write(i * 8192, key(i), NS, payload(i, 4096))
        os.truncate(f.path, 2 * 8192 + HEADER_BYTES + 100)    # record 2's payload cut, record 3 gone
        outs = [bytearray(4096) for _ in range(4)]
        preadv_calls.clear()
        got = f.read_many_into([0, 8192, 16384, 24576], [key(i) for i in range(4)], [4096] * 4, outs)
        assert got == [True, True, False, False]
        assert preadv_calls == [(0, 12), (16384, 3), (24576, 3)]  # the run, then each record past the cut alone
        assert [bytes(o) for o in outs[:2]] == [payload(0, 4096), payload(1, 4096)]
        assert f.corrupt_reads == 2
    finally:
        f.close()


def test_a_run_stops_at_its_byte_cap_and_at_the_buffers_one_preadv_may_fill(tmp_path, preadv_calls, monkeypatch):
    """600 empty-payload records side by side (one 4 KiB header page each, 3 buffers: header, the rest of its page,
    payload): runs of 1 MiB (256 records) by default; without that cap, 1800 buffers are over Linux's IOV_MAX of 1024,
    so runs of 341 records all the same."""
    import kvpool.tiers.ssd as ssd_module

    with SsdFile.open(str(tmp_path / "ssd"), 600 * 4096) as f:
        for i in range(600):
            f.write(i * 4096, key(i), NS, b"")
        offsets, keys = [i * 4096 for i in range(600)], [key(i) for i in range(600)]
        preadv_calls.clear()
        assert f.read_many_into(offsets, keys, [0] * 600, [bytearray(0) for _ in range(600)]) == [True] * 600
        assert preadv_calls == [(0, 768), (256 * 4096, 768), (512 * 4096, 264)]
        monkeypatch.setattr(ssd_module, "_MAX_RUN", 1 << 30)
        preadv_calls.clear()
        assert f.read_many_into(offsets, keys, [0] * 600, [bytearray(0) for _ in range(600)]) == [True] * 600
        assert preadv_calls == [(0, 1023), (341 * 4096, 777)]


# ---------------------------------------------------------------- written_us: a header extension (flags bit WRITTEN)
def plain_header(k: bytes, ns: bytes, size: int, checksum: int, version: int = 1, flags: int = 0) -> bytes:
    """A header as a node from before 2026-12-06 writes it: hdr_sum at +56 over bytes +0..+56, no extension."""
    body = struct.pack("<4sHH16s16sQQ", b"KVPR", version, flags, k, ns, size, checksum)
    return body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")


def old_reader_parse(head: bytes):
    """What a reader from before 2026-12-06 checks of a header (a same-host client reads records itself): magic,
    the sum of bytes +0..+56, version 1; flags and anything after +64 ignored."""
    body = head[:56]
    if body[:4] != b"KVPR" or xxhash.xxh3_64_intdigest(body) != int.from_bytes(head[56:64], "little"):
        return None
    _magic, version, _flags, k, ns, size, checksum = struct.unpack("<4sHH16s16sQQ", body)
    return (k, ns, size, checksum) if version == 1 else None


def put_raw(path: str, offset: int, header: bytes, data: bytes) -> None:
    """A record written by hand (payload, then its header page), bypassing SsdFile.write."""
    with open(path, "r+b") as raw:
        raw.seek(offset + HEADER_BYTES)
        raw.write(data)
        raw.seek(offset)
        raw.write(header.ljust(HEADER_BYTES, b"\0"))


def test_a_record_carries_its_write_time_through_scan_and_reads_and_an_old_reader_still_reads_it(ssd):
    data = payload(1, 10_000)
    checksum = ssd.write(8192, key(1), NS, data, written_us=123456789)
    ssd.write(32768, key(2), NS, payload(2, 100))                      # written_us left out: 0
    ssd.write(65536, key(3), NS, payload(3, 100), xxhash.xxh3_64_intdigest(payload(3, 100)), written_us=2**64 - 1)
    with open(ssd.path, "rb") as raw:
        raw.seek(8192)
        head = raw.read(88)
    assert head[:8] == b"KVPR\x01\x00\x01\x00"                          # magic, version 1, flags WRITTEN
    assert int.from_bytes(head[56:64], "little") == xxhash.xxh3_64_intdigest(head[:56])
    assert int.from_bytes(head[64:72], "little") == 123456789
    assert int.from_bytes(head[72:80], "little") == xxhash.xxh3_64_intdigest(head[:72])
    assert head[80:] == bytes(8)
    assert old_reader_parse(head) == (key(1), NS, 10_000, checksum)    # a rolling upgrade's older clients
    expected = [SsdRecord(key(1), NS, 8192, 10_000, checksum, 123456789),
                SsdRecord(key(2), NS, 32768, 100, xxhash.xxh3_64_intdigest(payload(2, 100)), 0),
                SsdRecord(key(3), NS, 65536, 100, xxhash.xxh3_64_intdigest(payload(3, 100)), 2**64 - 1)]
    assert list(ssd.scan()) == expected
    assert list(ssd.scan(verify=True)) == expected
    out = bytearray(10_000)
    assert ssd.read_into(8192, key(1), 10_000, out, ns_digest=NS) is True and bytes(out) == data
    outs = [bytearray(10_000), bytearray(100), bytearray(100)]
    assert ssd.read_many_into([8192, 32768, 65536], [key(1), key(2), key(3)], [10_000, 100, 100], outs) == [True] * 3
    assert [bytes(o) for o in outs] == [data, payload(2, 100), payload(3, 100)]
    reader = SsdReader(ssd.path)
    try:
        assert reader.read_into(8192, key(1), memoryview(bytearray(10_000))) == checksum
    finally:
        reader.close()
    assert ssd.corrupt_reads == 0


def test_a_record_of_a_node_from_before_is_read_verified_and_scanned_with_written_us_0(tmp_path, preadv_calls):
    d = str(tmp_path / "ssd")
    old, new = payload(1, 5000), payload(2, 7000)
    x = xxhash.xxh3_64_intdigest(b"x" * 10)
    with SsdFile.open(d, CAP) as f:
        put_raw(f.path, 0, plain_header(key(1), NS, 5000, xxhash.xxh3_64_intdigest(old)), old)
        f.write(16384, key(2), NS, new, written_us=42)                  # a record with its time right after it
        # invalid: a bad header sum; version 2; the WRITTEN flag with no valid extension after it
        bad = bytearray(plain_header(key(3), NS, 10, x))
        bad[60] ^= 1
        put_raw(f.path, 65536, bytes(bad), b"x" * 10)
        put_raw(f.path, 81920, plain_header(key(4), NS, 10, x, version=2), b"x" * 10)
        put_raw(f.path, 98304, plain_header(key(5), NS, 10, x, flags=1) + (7).to_bytes(8, "little") + bytes(8),
                b"x" * 10)

        out = bytearray(5000)
        assert f.read_into(0, key(1), 5000, out, ns_digest=NS) is True and bytes(out) == old
        outs = [bytearray(5000), bytearray(7000)]
        preadv_calls.clear()
        assert f.read_many_into([0, 16384], [key(1), key(2)], [5000, 7000], outs) == [True, True]
        assert preadv_calls == [(0, 7)]                                # both in one preadv, a 7288-byte gap between
        assert [bytes(o) for o in outs] == [old, new]
        reader = SsdReader(f.path)
        try:
            assert reader.read_many_into([0, 16384], [key(1), key(2)], [memoryview(bytearray(5000)),
                                                                       memoryview(bytearray(7000))]) == [
                xxhash.xxh3_64_intdigest(old), xxhash.xxh3_64_intdigest(new)]
        finally:
            reader.close()
        assert f.read_into(0, key(9), 5000, out) is False              # the other checks still apply
        assert f.read_into(0, key(1), 4999, out) is False
        assert f.read_many_into([65536, 81920, 98304], [key(3), key(4), key(5)], [10] * 3,
                                [bytearray(10) for _ in range(3)]) == [False, False, False]
        assert f.corrupt_reads == 5
        expected = [SsdRecord(key(1), NS, 0, 5000, xxhash.xxh3_64_intdigest(old), 0),
                    SsdRecord(key(2), NS, 16384, 7000, xxhash.xxh3_64_intdigest(new), 42)]
        damaged: list[int] = []
        assert list(f.scan(on_damaged=damaged.append)) == expected
        assert damaged == [65536, 81920, 98304]
        assert list(f.scan(verify=True)) == expected
        f.erase(16384)
    with SsdFile.open(d, CAP, create=False) as f:                      # a restart's scan finds it too
        assert list(f.scan()) == expected[:1]
        f.write(0, key(6), NS, b"y" * 10, written_us=5)                 # an overwrite carries its time
        assert list(f.scan()) == [SsdRecord(key(6), NS, 0, 10, xxhash.xxh3_64_intdigest(b"y" * 10), 5)]


def test_a_header_cut_by_a_shorter_file_is_erased_when_the_file_grows(tmp_path):
    """A page holding a whole 64-byte header without the extension is looked at, even with fewer than the 80 bytes
    of a header with it before the old end of the file."""
    d = str(tmp_path / "ssd")
    data = payload(1, 4096)
    with SsdFile.open(d, CAP) as f:
        put_raw(f.path, 0, plain_header(key(1), NS, 4096, xxhash.xxh3_64_intdigest(data)), data)
        put_raw(f.path, 8192, plain_header(key(2), NS, 4096, xxhash.xxh3_64_intdigest(data)), data)
        os.truncate(f.path, 8192 + 64)                                 # record 2: its header alone is left
    with SsdFile.open(d, CAP) as f:
        assert [(r.key, r.written_us) for r in f.scan()] == [(key(1), 0)]
        with open(f.path, "rb") as raw:
            raw.seek(8192)
            assert raw.read(80) == bytes(80)                           # erased, not left to hide later records


@pytest.mark.parametrize("flip", [65, 6], ids=["written_us", "flag cleared"])
def test_a_flipped_byte_of_written_us_or_its_flag_invalidates_the_header(ssd, flip):
    """Damage to the time or to its flag is a damaged header, never a record read with another time."""
    ssd.write(8192, key(1), NS, payload(1, 5000), written_us=123456789)
    with open(ssd.path, "r+b") as raw:
        raw.seek(8192 + flip)
        b = raw.read(1)
        raw.seek(8192 + flip)
        raw.write(bytes([b[0] ^ (0x10 if flip == 65 else 0x01)]))
    out = bytearray(5000)
    assert ssd.read_into(8192, key(1), 5000, out) is False
    assert ssd.read_many_into([8192], [key(1)], [5000], [out]) == [False]
    assert ssd.corrupt_reads == 2
    damaged: list[int] = []
    assert list(ssd.scan(on_damaged=damaged.append)) == [] and damaged == [8192]
    assert list(ssd.scan(verify=True)) == []


def test_a_bad_written_us_is_refused_before_anything_is_written(ssd):
    ssd.write(0, key(1), NS, payload(1, 5000), written_us=7)
    with open(ssd.path, "rb") as raw:
        before = raw.read()
    for bad in (-1, True, False, 2**64, 1.5, "1", None):
        with pytest.raises(ValueError, match=r"^written_us must be an int in \[0, 2\*\*64\), got "):
            ssd.write(0, key(2), NS, payload(2, 100), written_us=bad)
    with open(ssd.path, "rb") as raw:
        assert raw.read() == before
    assert list(ssd.scan()) == [SsdRecord(key(1), NS, 0, 5000, xxhash.xxh3_64_intdigest(payload(1, 5000)), 7)]


def test_payload_offsets_check_headers_only_and_refuse_bad_arguments_before_reading(ssd):
    """`payload_offsets` (the data channel's sendfile of a checked read): where each payload lies when the header
    names the key and size asked for, None for any other header (counted, as a failed read is); a payload damaged at
    rest is NOT caught here (its reader's hash against the committed checksum does). Bad arguments name the argument
    and read nothing."""
    for i in range(4):
        ssd.write(i * 8192, key(i), NS, payload(i, 4096))
    ssd.erase(3 * 8192)
    with open(ssd.path, "r+b") as raw:
        raw.seek(2 * 8192 + HEADER_BYTES + 7)                                    # record 2's payload
        raw.write(b"\x00" if payload(2, 4096)[7] else b"\x01")
    got = ssd.payload_offsets([0, 8192, 8192, 2 * 8192, 3 * 8192], [key(0), key(5), key(1), key(2), key(3)],
                              [4096, 4096, 4095, 4096, 4096])
    assert got == [HEADER_BYTES, None, None, 2 * 8192 + HEADER_BYTES, None]     # wrong key, wrong size, erased
    assert ssd.corrupt_reads == 3
    assert ssd.fileno() >= 0 and os.pread(ssd.fileno(), 4096, got[0]) == payload(0, 4096)
    for args, name in [(([100], [key(0)], [10]), "offset"), (([0], [b"short"], [10]), "keys[0]"),
                       (([0], [key(0)], [-1]), "sizes[0]"), (([0], [key(0)], [True]), "sizes[0]"),
                       (([0, 0], [key(0)], [10]), "offsets, keys and sizes"), (([CAP - 4096], [key(0)], [10]),
                                                                                "offset + record size")]:
        with pytest.raises(ValueError, match=name.replace("[", r"\[").replace("+", r"\+")):
            ssd.payload_offsets(*args)
    assert ssd.corrupt_reads == 3
