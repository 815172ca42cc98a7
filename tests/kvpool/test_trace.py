"""kvpool.trace: Mooncake JSONL and traffic-log Parquet read into exact columns; malformed input names the file and
row; a recorded log replays through the planner."""

from __future__ import annotations

import json

import pytest
import xxhash

from kvpool.planner import replay
from kvpool.store.traffic import TrafficWriter, key_ids
from kvpool.trace import LOOKUP, PUT, REQUEST, TraceError, load_trace

ROWS = [{"timestamp": 1000, "input_length": 1030, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [0, 3]},
        {"timestamp": 4000, "input_length": 100, "output_length": 1, "hash_ids": [9]}]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_mooncake_columns(tmp_path):
    t = load_trace(write_jsonl(tmp_path / "t.jsonl", ROWS), partial_blocks="keep")
    assert len(t) == 3 and t.num_lookups == 3 and t.unique_blocks() == 5
    assert t.offsets.tolist() == [0, 3, 5, 6] and t.block_ids.tolist() == [0, 1, 2, 0, 3, 9]
    assert t.op.tolist() == [REQUEST] * 3 and t.time_s.tolist() == [0.0, 0.5, 3.0]
    assert t.tokens.tolist() == [1030, 600, 100] and t.block_tokens.tolist() == [512] * 3
    assert t.chain(1).tolist() == [0, 3]
    assert (t.partial_blocks, t.dropped_refs, t.dropped_tokens) == ("keep", 0, 0)
    t16 = load_trace(tmp_path / "t.jsonl", block_tokens=16)   # input_length capped at the blocks' tokens
    assert t16.tokens.tolist() == [48, 32, 16] and t16.offsets.tolist() == [0, 3, 5, 6] and t16.dropped_refs == 0


def test_mooncake_partial_last_blocks_are_dropped_by_default(tmp_path):
    """hash_ids[:input_length // block_tokens]: 1030 tokens = 2 full blocks, 600 = 1, 100 = none; tokens unchanged."""
    t = load_trace(write_jsonl(tmp_path / "t.jsonl", ROWS))
    assert t.offsets.tolist() == [0, 2, 3, 3] and t.block_ids.tolist() == [0, 1, 0]
    assert t.tokens.tolist() == [1030, 600, 100] and t.unique_blocks() == 2 and t.chain(2).tolist() == []
    assert (t.partial_blocks, t.dropped_refs, t.dropped_tokens) == ("drop", 3, 6 + 88 + 100)
    t200 = load_trace(tmp_path / "t.jsonl", block_tokens=200)  # 1030 -> 5 full blocks of 200, capped at 3 ids
    assert t200.offsets.tolist() == [0, 3, 5, 5] and t200.tokens.tolist() == [600, 400, 100]
    assert (t200.dropped_refs, t200.dropped_tokens) == (1, 100)
    with pytest.raises(ValueError, match=r"partial_blocks must be one of \['drop', 'keep'\], got 'trim'"):
        load_trace(tmp_path / "t.jsonl", partial_blocks="trim")


@pytest.mark.parametrize("text, message", [
    ('{"timestamp": 0, "hash_ids": [1]}\n{"timestamp": 1, "hash_ids": "x"}\n', r"not a JSONL trace \(pyarrow"),
    ('{"timestamp": 0, "hash_ids": [1]}\n{"timestamp": 1}\n', r"row 2: hash_ids is missing"),
    ('{"timestamp": 0, "hash_ids": [1]}\n{"timestamp": 1, "hash_ids": [2, -3]}\n', r"row 2: hash_ids must be >= 0"),
    ('{"timestamp": 0, "hash_ids": [1, null]}\n', r"row 1: hash_ids holds a null"),
    ('{"timestamp": 0, "hash_ids": [1]}\n{"timestamp": 1, "input_len\n', r"not a JSONL trace"),
    ('{"hash_ids": [1]}\n', r"every row needs 'timestamp'"),
    ('{"timestamp": "now", "hash_ids": [1]}\n', r"timestamp must be a number"),
    ('{"timestamp": 0, "input_length": -1, "hash_ids": [1]}\n', r"row 1: input_length must be >= 0"),
    ('', r"not a JSONL trace"),
])
def test_malformed_mooncake_rows_are_named(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(TraceError, match=message) as info:
        load_trace(path)
    assert str(path) in str(info.value)


def test_missing_paths_and_bad_block_tokens(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        load_trace(tmp_path / "nope.jsonl")
    with pytest.raises(TraceError, match="holds no \\*.parquet"):
        load_trace(tmp_path)
    with pytest.raises(ValueError, match="block_tokens must be an int > 0"):
        load_trace(tmp_path / "nope.jsonl", block_tokens=0)
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(TraceError, match="not a Parquet traffic log"):
        load_trace(tmp_path / "x.parquet")


def test_traffic_log_reads_back_as_lookup_and_put_events(tmp_path):
    ns = b"\x01" * 16
    chain = [xxhash.xxh3_128_digest(b"%d" % i) for i in range(4)]
    with TrafficWriter(tmp_path / "log", rows_per_group=2, max_file_bytes=1) as w:   # one file per row group
        w.record("lookup", 100.0, ns, chain, hits=0, tokens=60, block_tokens=16, ns_label="m/a")
        w.record("put", 100.5, ns, chain[:3], hits=3, hits_by_tier=(0, 3, 0), tokens=48, block_tokens=16,
                 ns_label="m/a")
        w.record("lookup", 102.0, ns, chain, hits=3, hits_by_tier=(0, 3, 0), tokens=60, block_tokens=16,
                 ns_label="m/b")
    assert len(w.files) == 2
    t = load_trace(tmp_path / "log")
    assert t.op.tolist() == [LOOKUP, PUT, LOOKUP] and t.time_s.tolist() == [0.0, 0.5, 2.0]
    assert t.offsets.tolist() == [0, 4, 7, 11]
    assert t.block_ids[:4].tolist() == key_ids(chain).tolist()
    assert t.tokens.tolist() == [60, 48, 60] and t.block_tokens.tolist() == [16, 16, 16]
    assert [t.ns_labels[i] for i in t.ns] == ["m/a", "m/a", "m/b"]
    result, hits = replay(t, 10, "lru")                       # the put stored 3 blocks: the 2nd lookup hits them
    assert hits.tolist() == [0, 0, 3] and result.lookups == 2 and result.blocks == 8 and result.hit_blocks == 3
    assert result.tokens == 120 and result.hit_tokens == 48
    single = load_trace(w.files[0])
    assert len(single) == 2


def test_traffic_log_with_foreign_columns_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": [1]}), tmp_path / "other.parquet")
    with pytest.raises(TraceError, match=r"not a kvpool traffic log: columns \['time'"):
        load_trace(tmp_path / "other.parquet")
