"""TrafficWriter on its own: rows read back exactly with plain pyarrow, rolling files of bounded size, max_files,
no half-written file visible, bad arguments named."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import xxhash

from kvpool.store.traffic import SCHEMA, TrafficWriter, key_ids

NS = bytes(range(16))


def keys(n: int, salt: str = "") -> list[bytes]:
    return [xxhash.xxh3_128_digest(f"{salt}{i}".encode()) for i in range(n)]


def test_rows_round_trip_exactly(tmp_path):
    ks = keys(5)
    with TrafficWriter(tmp_path) as w:
        w.record("lookup", 1700000000.25, NS, ks, hits=3, hits_by_tier=(0, 2, 1), tokens=80, block_tokens=16,
                 ns_label="m/t")
        w.record("put", 1700000001.5, NS, ks[3:], hits=2, hits_by_tier=(0, 2, 0), tokens=32, block_tokens=16)
        assert list(tmp_path.glob("*.parquet")) == []          # still buffered / being written
    files = sorted(tmp_path.glob("*.parquet"))
    assert len(files) == 1 and w.files == files and w.rows_written == 2
    table = pq.read_table(files[0])
    assert table.schema.names == SCHEMA.names and table.num_rows == 2
    rows = table.to_pylist()
    assert [r["op"] for r in rows] == ["lookup", "put"]
    assert rows[0]["keys"] == [int.from_bytes(k[:8], "little") for k in ks]
    assert rows[1]["keys"] == key_ids(ks[3:]).tolist()
    assert [(r["hits"], r["hits_hbm"], r["hits_dram"], r["hits_ssd"], r["tokens"], r["block_tokens"]) for r in rows] \
        == [(3, 0, 2, 1, 80, 16), (2, 0, 2, 0, 32, 16)]
    assert rows[0]["namespace"] == NS and rows[0]["ns_label"] == "m/t" and rows[1]["ns_label"] == ""
    assert rows[0]["time"].timestamp() == 1700000000.25 and rows[1]["time"].timestamp() == 1700000001.5


def test_files_roll_at_max_file_bytes_and_old_ones_go(tmp_path):
    w = TrafficWriter(tmp_path / "log", max_file_bytes=4096, rows_per_group=50, max_files=3)
    for i in range(2000):
        w.record("lookup", 1e9 + i, NS, keys(8, salt=str(i)), hits=i % 8, tokens=8 * 512, block_tokens=512)
    w.close()
    files = sorted((tmp_path / "log").glob("*.parquet"))
    assert files == w.files and len(files) == 3                # older files were deleted (max_files)
    group_bytes = max(pq.ParquetFile(f).metadata.row_group(0).total_byte_size for f in files)
    for f in files[:-1]:
        meta = pq.ParquetFile(f).metadata
        assert f.stat().st_size < 4096 + 2 * group_bytes + 4096, (f, f.stat().st_size)   # one group + footer over
        assert meta.num_rows % 50 == 0
    total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    last = pq.read_table(files[-1]).column("time").to_pylist()[-1]
    assert w.rows_written == 2000 and total < 2000 and last.timestamp() == 1e9 + 1999
    assert list((tmp_path / "log").glob("*.part")) == []


def test_bad_arguments_are_named_and_change_nothing(tmp_path):
    for kwargs, name in [({"max_file_bytes": 0}, "max_file_bytes"), ({"max_files": -1}, "max_files"),
                         ({"rows_per_group": True}, "rows_per_group")]:
        with pytest.raises(ValueError, match=name):
            TrafficWriter(tmp_path, **kwargs)
    w = TrafficWriter(tmp_path)
    with pytest.raises(ValueError, match="op must be one of"):
        w.record("get", 1.0, NS, keys(1), hits=0)
    with pytest.raises(ValueError, match="ns_digest must be a 16-byte"):
        w.record("put", 1.0, b"short", keys(1), hits=0)
    with pytest.raises(ValueError, match="keys must all be 16-byte"):
        w.record("put", 1.0, NS, [b"k" * 15], hits=0)
    with pytest.raises(ValueError, match="hits_by_tier"):
        w.record("put", 1.0, NS, keys(1), hits=0, hits_by_tier=(1, 2))
    w.close()
    assert w.rows_written == 0 and list(tmp_path.glob("*")) == []
    with pytest.raises(ValueError, match="closed"):
        w.record("put", 1.0, NS, keys(1), hits=0)
