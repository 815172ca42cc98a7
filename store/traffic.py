"""Traffic log: the master's lookups and puts as Apache Parquet rows (keys only: no KV bytes, no token ids), the
input of `kvpool simulate` beside Mooncake JSONL traces (kvpool/trace.py reads both).

One row per master call (a lookup or a put batch), columns:

    time        timestamp[us, UTC]   when the master handled the call
    namespace   fixed_size_binary[16] namespace digest (the chain root; not secret, keys derive from it)
    ns_label    string               "model/tenant" (NsRef.label), for per-namespace reports
    op          string               "lookup" (under a read lease) | "probe" (no lease: lookup_prefix) | "put"
    keys        list<uint64>         the chain, prefix order: each key's first 8 bytes, little-endian. Keys are
                                     xxh3_128 digests, so 64 bits stay unique (collision odds ~n^2/2^65: 3e-8 at 1M)
    hits        int32                lookup: leading keys found; put: keys stored (granted)
    hits_hbm    int32   ┐
    hits_dram   int32   ├            how many of `hits` were found (lookup) / placed (put) on each tier
    hits_ssd    int32   ┘
    tokens      int64                tokens the call covers: lookup = tokens asked for, put = tokens of the keys
    block_tokens int32               tokens per block of the namespace (0 = unknown: count keys only)

`TrafficWriter` buffers rows in plain lists and writes one row group per `rows_per_group` rows into rolling files
`<dir>/traffic-<UTC start>-<seq>.parquet`; a file is closed once it reaches `max_file_bytes` (so it exceeds that
by at most one row group), and with `max_files` the oldest closed files are deleted. A file being written is named
`*.parquet.part` and renamed when closed, so a reader of the directory never sees a half-written file.
The writer does no I/O in `record` except when a row group is due; it is not thread-safe (the master calls it under
its lock). pyarrow is imported with this module: import it only where recording is switched on.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

OP_LOOKUP = "lookup"
OP_PROBE = "probe"      # a lookup without a read lease: the policy does not see it as a use (Master.lookup)
OP_PUT = "put"
OPS = (OP_LOOKUP, OP_PROBE, OP_PUT)
KEY_BYTES = 16

SCHEMA = pa.schema([
    pa.field("time", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("namespace", pa.binary(16), nullable=False),
    pa.field("ns_label", pa.string(), nullable=False),
    pa.field("op", pa.string(), nullable=False),
    pa.field("keys", pa.list_(pa.field("item", pa.uint64(), nullable=False)), nullable=False),
    pa.field("hits", pa.int32(), nullable=False),
    pa.field("hits_hbm", pa.int32(), nullable=False),
    pa.field("hits_dram", pa.int32(), nullable=False),
    pa.field("hits_ssd", pa.int32(), nullable=False),
    pa.field("tokens", pa.int64(), nullable=False),
    pa.field("block_tokens", pa.int32(), nullable=False),
], metadata={b"kvpool.traffic": b"1"})
COLUMNS = tuple(SCHEMA.names)


def key_ids(keys: Sequence[bytes]) -> np.ndarray:
    """Compact ids of 16-byte keys: the first 8 bytes of each as a little-endian uint64 (one numpy call)."""
    if not keys:
        return np.zeros(0, dtype=np.uint64)
    joined = b"".join(keys)
    if len(joined) != KEY_BYTES * len(keys):
        raise ValueError(f"keys must all be {KEY_BYTES}-byte keys")
    return np.frombuffer(joined, dtype="<u8")[::2].astype(np.uint64)


class TrafficWriter:
    """Rolling Parquet files of traffic rows (schema above). Use as a context manager or call `close()`."""

    def __init__(self, directory: str | os.PathLike, *, max_file_bytes: int = 64 << 20, max_files: int = 0,
                 rows_per_group: int = 16384, compression: str = "zstd") -> None:
        for name, value, low in (("max_file_bytes", max_file_bytes, 1), ("max_files", max_files, 0),
                                 ("rows_per_group", rows_per_group, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files
        self.rows_per_group = rows_per_group
        self.compression = compression
        self.rows_written = 0
        self.files: list[Path] = []       # closed files, oldest first (the ones this writer still keeps)
        self._stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self._seq = 0
        self._writer: pq.ParquetWriter | None = None
        self._sink: pa.NativeFile | None = None
        self._part: Path | None = None
        self._closed = False
        self._reset_buffer()

    def _reset_buffer(self) -> None:
        self._time: list[int] = []
        self._ns: list[bytes] = []
        self._label: list[str] = []
        self._op: list[str] = []
        self._key_chunks: list[np.ndarray] = []
        self._lengths: list[int] = []
        self._ints: dict[str, list[int]] = {c: [] for c in ("hits", "hits_hbm", "hits_dram", "hits_ssd", "tokens",
                                                           "block_tokens")}

    def record(self, op: str, time_s: float, ns_digest: bytes, keys: Sequence[bytes], *, hits: int,
               hits_by_tier: Sequence[int] = (0, 0, 0), tokens: int = 0, block_tokens: int = 0,
               ns_label: str = "") -> None:
        """One master call. `hits_by_tier` is (hbm, dram, ssd); `time_s` is seconds since the epoch."""
        if self._closed:
            raise ValueError("TrafficWriter is closed")
        if op not in OPS:
            raise ValueError(f"op must be one of {list(OPS)}, got {op!r}")
        if not isinstance(ns_digest, (bytes, bytearray)) or len(ns_digest) != KEY_BYTES:
            raise ValueError(f"ns_digest must be a {KEY_BYTES}-byte namespace digest, got {ns_digest!r}")
        if len(hits_by_tier) != 3:
            raise ValueError(f"hits_by_tier must be (hbm, dram, ssd), got {hits_by_tier!r}")
        ids = key_ids(keys)
        self._time.append(int(round(time_s * 1e6)))
        self._ns.append(bytes(ns_digest))
        self._label.append(ns_label)
        self._op.append(op)
        self._key_chunks.append(ids)
        self._lengths.append(len(ids))
        ints = self._ints
        ints["hits"].append(hits)
        ints["hits_hbm"].append(hits_by_tier[0])
        ints["hits_dram"].append(hits_by_tier[1])
        ints["hits_ssd"].append(hits_by_tier[2])
        ints["tokens"].append(tokens)
        ints["block_tokens"].append(block_tokens)
        if len(self._time) >= self.rows_per_group:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as one row group (and roll the file if it reached max_file_bytes)."""
        if not self._time:
            return
        offsets = np.zeros(len(self._lengths) + 1, dtype=np.int32)
        np.cumsum(self._lengths, out=offsets[1:])
        values = np.concatenate(self._key_chunks) if self._key_chunks else np.zeros(0, dtype=np.uint64)
        keys = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.uint64()),
                                        type=SCHEMA.field("keys").type)
        columns = [pa.array(self._time, type=pa.int64()).cast(SCHEMA.field("time").type),
                   pa.array(self._ns, type=pa.binary(16)), pa.array(self._label, type=pa.string()),
                   pa.array(self._op, type=pa.string()), keys]
        columns += [pa.array(self._ints[c], type=SCHEMA.field(c).type) for c in COLUMNS[5:]]
        table = pa.Table.from_arrays(columns, schema=SCHEMA)
        if self._writer is None:
            self._open()
        self._writer.write_table(table)
        self.rows_written += table.num_rows
        self._reset_buffer()
        if self._sink.tell() >= self.max_file_bytes:
            self._roll()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        if self._writer is not None:
            self._roll()
        self._closed = True

    def __enter__(self) -> "TrafficWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self) -> None:
        self._seq += 1
        self._part = self.directory / f"traffic-{self._stamp}-{self._seq:06d}.parquet.part"
        self._sink = pa.OSFile(str(self._part), "wb")   # tell() counts what the writer has handed it
        self._writer = pq.ParquetWriter(self._sink, SCHEMA, compression=self.compression)

    def _roll(self) -> None:
        self._writer.close()
        self._sink.close()
        final = self._part.with_suffix("")       # drop ".part"
        os.replace(self._part, final)
        self.files.append(final)
        self._writer = self._sink = self._part = None
        while self.max_files and len(self.files) > self.max_files:
            old = self.files.pop(0)
            try:
                old.unlink()
            except FileNotFoundError:
                pass
            log.info("traffic log: removed %s (max_files=%d)", old.name, self.max_files)


__all__ = ["SCHEMA", "COLUMNS", "OPS", "OP_LOOKUP", "OP_PROBE", "OP_PUT", "TrafficWriter", "key_ids"]
