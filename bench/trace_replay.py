"""Eviction policies on the Mooncake FAST'25 trace: LRU vs S3-FIFO, block hit rate at several pool sizes.

Replays ../shared/traces/synthetic_trace.jsonl (3,993 requests, chained 512-token block ids) against an
EmbeddedPool exactly as the connector drives it: lookup_prefix, get_many_into the hit prefix (which refreshes
recency), put_many the missed tail. One object per block (4 KiB payloads: the index and the policy decide, the
bytes do not matter here). Capacity is a fraction of the trace's unique blocks; the ceiling is an infinite pool.

Usage: python bench/trace_replay.py [--trace PATH] [--fractions 0.05 0.1 0.25 0.5]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import xxhash
from tqdm import tqdm

from kvpool.embedded import EmbeddedPool

OBJ = 4096
DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "synthetic_trace.jsonl"


def replay(requests: list[list[bytes]], capacity_blocks: int, policy: str, bar) -> tuple[int, int]:
    payload = np.zeros(OBJ, dtype=np.uint8)
    out = np.empty((max(len(r) for r in requests), OBJ), dtype=np.uint8)
    hits = total = 0
    with EmbeddedPool(dram_bytes=capacity_blocks * OBJ, policy=policy) as pool:
        for keys in requests:
            n = pool.lookup_prefix(keys)
            if n:
                n = pool.get_many_into(keys[:n], list(out[:n]))
            hits += n
            total += len(keys)
            if n < len(keys):
                pool.put_many(keys[n:], [payload] * (len(keys) - n))
            bar.update(1)
    return hits, total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5])
    args = ap.parse_args(argv)
    path = Path(args.trace)
    if not path.is_file():
        print(f"trace {path} not found (expected ../shared/traces beside the repo); skipping")
        return 0
    raw = [json.loads(line)["hash_ids"] for line in path.read_text().splitlines() if line.strip()]
    requests = [[xxhash.xxh3_128_digest(f"block-{h}".encode()) for h in ids] for ids in raw]
    unique = len({k for r in requests for k in r})
    refs = sum(len(r) for r in requests)
    ceiling = (refs - unique) / refs
    runs = [(f, p) for f in args.fractions for p in ("lru", "s3fifo")]
    results: dict[tuple[float, str], float] = {}
    with tqdm(total=len(runs) * len(requests), desc="trace replay", file=sys.stderr) as bar:
        for fraction, policy in runs:
            hits, total = replay(requests, max(1, int(unique * fraction)), policy, bar)
            results[(fraction, policy)] = hits / total
    print(f"\n{path.name}: {len(requests)} requests, {refs} block refs, {unique} unique blocks; "
          f"infinite-pool ceiling {ceiling:.1%}")
    print(f"{'pool size':>22}  {'LRU':>7}  {'S3-FIFO':>7}  S3-FIFO/LRU")
    for fraction in args.fractions:
        lru, s3 = results[(fraction, "lru")], results[(fraction, "s3fifo")]
        print(f"{fraction:>6.0%} of unique blocks  {lru:>7.1%}  {s3:>7.1%}  {s3 / lru if lru else float('nan'):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
