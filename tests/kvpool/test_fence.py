"""kvpool/fence.py: the verified copy (every chunking of the object) and the writer's deadline."""

from __future__ import annotations

import math

import pytest
import xxhash

from kvpool import fence


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5])
def test_copy_verified_copies_every_byte_and_checks_them(monkeypatch, size):
    monkeypatch.setattr(fence, "CHUNK", 4096)  # exercise the chunked path with small objects
    src = bytes((i * 31 + 7) % 256 for i in range(size))
    dst = bytearray(size)
    assert fence.copy_verified(memoryview(dst), memoryview(src), xxhash.xxh3_64_intdigest(src)) is True
    assert bytes(dst) == src
    if size:
        wrong = bytearray(size)
        assert fence.copy_verified(memoryview(wrong), memoryview(src), xxhash.xxh3_64_intdigest(src) ^ 1) is False
        assert bytes(wrong) == src  # copied all the same: the caller must not use it (a miss)


def test_copy_verified_sees_bytes_that_are_not_the_committed_objects():
    committed = b"A" * 10_000
    dst = bytearray(10_000)
    late = b"A" * 9_999 + b"B"  # one byte changed by a late writer
    assert fence.copy_verified(memoryview(dst), memoryview(late), xxhash.xxh3_64_intdigest(committed)) is False


def test_write_deadline_keeps_a_margin_inside_the_grants_lifetime():
    assert fence.write_deadline(100.0, 0) == math.inf  # the master did not say: no deadline
    assert fence.write_deadline(100.0, 1000) == pytest.approx(100.9)  # 10% margin
    assert fence.write_deadline(100.0, 30_000) == pytest.approx(129.0)  # margin capped at 1 s
