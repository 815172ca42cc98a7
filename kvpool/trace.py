"""Trace input for the capacity planner: a Mooncake-format JSONL trace or kvpool's own traffic log (Parquet, schema
in store/traffic.py), read column-wise with pyarrow into one `Trace` of flat numpy arrays (no per-request object).

    Trace.offsets   [0, n0, n0+n1, ...]       event i's chain is block_ids[offsets[i]:offsets[i+1]], prefix order
    Trace.block_ids uint64                    compact block ids: equal id = the same block (and the same prefix)
    Trace.op        uint8 per event           REQUEST: look the chain up, then put what missed (a Mooncake request,
                                              as a connector drives the pool); LOOKUP / PROBE / PUT: one recorded
                                              master call (PROBE: a lookup without a read lease, no policy touch)
    Trace.time_s    float64 per event         seconds since the first event
    Trace.tokens    int64 per event           the request's tokens (a Mooncake request: input_length, its whole
                                              prompt even where a partial last block is dropped; a recorded call:
                                              its `tokens` column = keys x block_tokens)
    Trace.block_tokens int32 per event        tokens per full block (hit tokens = min(hits * block_tokens, tokens))

Partial blocks: a Mooncake row whose input_length is not a multiple of block_tokens ends in a partial block, and its
last hash id names it. kvpool's connectors (connector/connector.py, connector/vllm_plan.py) and the bundled engine
key, look up and save FULL blocks only, so by default (`partial_blocks="drop"`) a request's chain is
`hash_ids[:input_length // block_tokens]`: a pool never sees the partial block, which could neither take capacity nor
ever hit. `partial_blocks="keep"` replays the whole `hash_ids` (for a producer that stores partial blocks). Either
way `tokens` stays the whole prompt, so token hit rates have one denominator: every input token. A recorded traffic
log holds the keys the master saw (full blocks only when written by kvpool's connectors); it is read as written.

Mooncake JSONL (kvcache-ai/Mooncake FAST25-release/traces): one object per line with `timestamp` (ms),
`input_length`, `output_length` (tokens) and `hash_ids` (chained ids of 512-token blocks). Bad input raises
`TraceError` (a ValueError) naming the file and the field or row at fault.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REQUEST, LOOKUP, PUT, PROBE = 0, 1, 2, 3
MOONCAKE_BLOCK_TOKENS = 512
PARTIAL_BLOCKS = ("drop", "keep")      # what a Mooncake row's partial last block does (see above); drop = default


class TraceError(ValueError):
    """A trace file that cannot be read (missing, malformed rows, wrong types); the message names the file."""


@dataclass(slots=True)
class Trace:
    offsets: np.ndarray
    block_ids: np.ndarray
    op: np.ndarray
    time_s: np.ndarray
    tokens: np.ndarray
    block_tokens: np.ndarray
    source: str = ""
    ns: np.ndarray | None = None                      # per event: index into ns_labels (recorded traces)
    ns_labels: list[str] = field(default_factory=list)
    partial_blocks: str = ""                          # Mooncake: "drop" / "keep"; recorded logs: "" (as recorded)
    dropped_refs: int = 0                             # partial last blocks left out of the chains ("drop")
    dropped_tokens: int = 0                           # the tokens of those blocks (still in `tokens`)

    def __len__(self) -> int:
        return len(self.op)

    @property
    def num_lookups(self) -> int:
        return int(np.count_nonzero(self.op != PUT))

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def unique_blocks(self) -> int:
        return int(len(np.unique(self.block_ids)))

    def chain(self, i: int) -> np.ndarray:
        return self.block_ids[self.offsets[i]:self.offsets[i + 1]]


def load_trace(path: str | os.PathLike, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS,
               partial_blocks: str = "drop") -> Trace:
    """A trace by path: a directory of traffic-*.parquet files, one .parquet file, or Mooncake JSONL (any other
    name). `block_tokens` and `partial_blocks` apply to Mooncake traces (recorded ones carry their own blocks)."""
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens <= 0:
        raise ValueError(f"block_tokens must be an int > 0, got {block_tokens!r}")
    check_partial_blocks(partial_blocks)
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.parquet"))
        if not files:
            raise TraceError(f"trace directory {str(p)!r} holds no *.parquet files")
        return read_traffic(files, source=str(p))
    if not p.is_file():
        raise TraceError(f"trace file {str(p)!r} does not exist")
    if p.suffix == ".parquet":
        return read_traffic([p], source=str(p))
    return read_mooncake(p, block_tokens=block_tokens, partial_blocks=partial_blocks)


def check_partial_blocks(partial_blocks) -> None:
    if partial_blocks not in PARTIAL_BLOCKS:
        raise ValueError(f"partial_blocks must be one of {list(PARTIAL_BLOCKS)}, got {partial_blocks!r}")


def read_mooncake(path: str | os.PathLike, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS,
                  partial_blocks: str = "drop") -> Trace:
    import pyarrow as pa
    import pyarrow.json as pj

    name = str(path)
    try:
        table = pj.read_json(name, parse_options=pj.ParseOptions(newlines_in_values=False))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise TraceError(f"{name}: not a JSONL trace (pyarrow: {_first_line(exc)})") from None
    if table.num_rows == 0:
        raise TraceError(f"{name}: no requests")
    for column in ("hash_ids", "timestamp"):
        if column not in table.column_names:
            raise TraceError(f"{name}: every row needs {column!r} (Mooncake format: timestamp, input_length, "
                             f"output_length, hash_ids); columns found: {table.column_names}")
    hashes = _column(table, "hash_ids", name)
    if not pa.types.is_list(hashes.type) or not pa.types.is_integer(hashes.type.value_type):
        raise TraceError(f"{name}: hash_ids must be a list of integers, got {hashes.type}")
    offsets = hashes.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    row_of = lambda position: int(np.searchsorted(offsets, position, side="right"))  # noqa: E731  (1-based)
    if hashes.values.null_count:
        raise TraceError(f"{name}: row {row_of(_first_null(hashes.values))}: hash_ids holds a null")
    values = hashes.values.to_numpy()
    if len(values) and values.min() < 0:
        raise TraceError(f"{name}: row {row_of(int(np.argmax(values < 0)))}: hash_ids must be >= 0")
    time_ms = _column(table, "timestamp", name)
    if not (pa.types.is_integer(time_ms.type) or pa.types.is_floating(time_ms.type)):
        raise TraceError(f"{name}: timestamp must be a number (milliseconds) in every row, got {time_ms.type}")
    time_ms = time_ms.to_numpy().astype(np.float64)
    n = table.num_rows
    lengths = np.diff(offsets)
    full = lengths * block_tokens
    if "input_length" in table.column_names:
        tokens = _int_column(table, "input_length", name)
        if (tokens < 0).any():
            raise TraceError(f"{name}: row {int(np.argmax(tokens < 0)) + 1}: input_length must be >= 0")
        tokens = np.minimum(tokens, full)
    else:
        tokens = full
    dropped_refs = dropped_tokens = 0
    if partial_blocks == "drop":
        keep = tokens // block_tokens                   # <= lengths: tokens is capped at the chain's tokens
        if (keep < lengths).any():
            position = np.arange(len(values), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
            values = values[position < np.repeat(keep, lengths)]
            dropped_refs = int((lengths - keep).sum())
            dropped_tokens = int((tokens - keep * block_tokens).sum())
            offsets = np.concatenate(([0], np.cumsum(keep))).astype(np.int64)
    return Trace(offsets=offsets, block_ids=values.astype(np.uint64), op=np.zeros(n, dtype=np.uint8),
                 time_s=(time_ms - time_ms[0]) / 1000.0, tokens=tokens.astype(np.int64),
                 block_tokens=np.full(n, block_tokens, dtype=np.int32), source=name, partial_blocks=partial_blocks,
                 dropped_refs=dropped_refs, dropped_tokens=dropped_tokens)


def read_traffic(files: list[Path], *, source: str) -> Trace:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvpool.store.traffic import COLUMNS, OP_LOOKUP, OP_PROBE, OP_PUT

    tables = []
    for f in files:
        try:
            t = pq.read_table(f)
        except (pa.ArrowInvalid, OSError) as exc:
            raise TraceError(f"{f}: not a Parquet traffic log ({_first_line(exc)})") from None
        missing = [c for c in COLUMNS if c not in t.column_names]
        if missing:
            raise TraceError(f"{f}: not a kvpool traffic log: columns {missing} missing")
        tables.append(t.select(list(COLUMNS)))
    try:
        table = pa.concat_tables(tables)
    except pa.ArrowInvalid as exc:
        raise TraceError(f"{source}: traffic files disagree on their schema ({_first_line(exc)})") from None
    if table.num_rows == 0:
        raise TraceError(f"{source}: no traffic rows")
    table = table.sort_by([("time", "ascending")])     # rolled files may interleave at their edges
    keys = _column(table, "keys", source)
    offsets = keys.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    op_names = _column(table, "op", source).to_numpy(zero_copy_only=False)
    op = np.full(len(op_names), 255, dtype=np.uint8)
    op[op_names == OP_LOOKUP] = LOOKUP
    op[op_names == OP_PUT] = PUT
    op[op_names == OP_PROBE] = PROBE
    if (op == 255).any():
        bad = int(np.argmax(op == 255))
        raise TraceError(f"{source}: row {bad + 1}: op must be {OP_LOOKUP!r}, {OP_PROBE!r} or {OP_PUT!r}, "
                         f"got {op_names[bad]!r}")
    time_us = _column(table, "time", source).cast(pa.int64()).to_numpy()
    labels = _column(table, "ns_label", source).dictionary_encode()
    return Trace(offsets=offsets, block_ids=keys.values.to_numpy().astype(np.uint64), op=op,
                 time_s=(time_us - time_us[0]) / 1e6, tokens=_int_column(table, "tokens", source),
                 block_tokens=_int_column(table, "block_tokens", source).astype(np.int32), source=source,
                 ns=labels.indices.to_numpy().astype(np.int32), ns_labels=labels.dictionary.to_pylist())


def _column(table, name: str, source: str):
    column = table.column(name).combine_chunks()
    if column.null_count:
        raise TraceError(f"{source}: row {_first_null(column) + 1}: {name} is missing (null)")
    return column


def _int_column(table, name: str, source: str) -> np.ndarray:
    import pyarrow as pa

    column = _column(table, name, source)
    if not pa.types.is_integer(column.type):
        raise TraceError(f"{source}: {name} must be an integer in every row, got {column.type}")
    return column.to_numpy().astype(np.int64)


def _first_null(array) -> int:
    return int(np.argmax(array.is_null().to_numpy(zero_copy_only=False)))


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


__all__ = ["Trace", "TraceError", "load_trace", "check_partial_blocks", "read_mooncake", "read_traffic", "REQUEST",
           "LOOKUP", "PUT", "PROBE", "MOONCAKE_BLOCK_TOKENS", "PARTIAL_BLOCKS"]
