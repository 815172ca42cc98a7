"""Eviction policies on the Mooncake FAST'25 trace: LRU vs S3-FIFO vs wlru, block hit rate at several pool sizes,
and how fast the planner replays.

Replays ../shared/traces/synthetic_trace.jsonl (3,993 requests, chained 512-token block ids) with kvpool.planner,
i.e. through the master's own index, placement and eviction code (lookup under a lease, release, put the missed
tail, commit), one object per block, at 5/10/25/50% of the trace's unique blocks and at 3.1M and 10M tokens of
capacity (6,054 and 19,531 blocks of 512 tokens). Policies are interleaved per size. Peer: the infinite-pool
ceiling (every previously seen prefix hits). Replay speed is requests/s of the whole replay (one core).

Usage: python bench/trace_replay.py [--trace PATH ...] [--fractions 0.05 0.1 0.25 0.5] [--tokens 3.1e6 1e7]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tqdm import tqdm

from kvpool.planner import ceiling_hits, replay, summarize
from kvpool.trace import TraceError, load_trace

POLICIES = ("lru", "s3fifo", "wlru")
DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "synthetic_trace.jsonl"


def run_trace(path: Path, fractions: list[float], tokens: list[float]) -> None:
    trace = load_trace(path)
    unique = trace.unique_blocks()
    block_tokens = int(trace.block_tokens[0])
    sizes = [(f"{f:.0%} of unique blocks", max(1, int(unique * f))) for f in fractions]
    sizes += [(f"{t / 1e6:g}M tokens", int(t // block_tokens)) for t in tokens]
    ceiling = summarize(trace, ceiling_hits(trace), policy="infinite", capacity_blocks=0)
    results: dict[tuple[int, str], object] = {}
    speed: dict[str, list[float]] = {p: [] for p in POLICIES}
    with tqdm(total=len(sizes) * len(POLICIES) * len(trace), desc=f"replay {path.name}", unit="req",
              file=sys.stderr) as bar:
        for _, cap in sizes:
            for policy in POLICIES:
                t0 = time.perf_counter()
                r, _ = replay(trace, cap, policy, progress=bar.update)
                speed[policy].append(len(trace) / (time.perf_counter() - t0))
                results[(cap, policy)] = r
    print(f"\n{path.name}: {len(trace)} requests, {len(trace.block_ids)} block refs, {unique} unique blocks; "
          f"infinite-pool ceiling {ceiling.block_hit_rate:.1%} of blocks")
    print(f"{'pool size':>24} {'blocks':>7}  {'LRU':>6}  {'S3-FIFO':>7}  {'wlru':>6}  {'wlru-LRU':>9}  {'S3-FIFO-LRU':>11}")
    for label, cap in sizes:
        lru, s3, w = (results[(cap, p)].block_hit_rate for p in POLICIES)
        print(f"{label:>24} {cap:>7}  {lru:>6.1%}  {s3:>7.1%}  {w:>6.1%}  {100 * (w - lru):>+8.2f}p  "
              f"{100 * (s3 - lru):>+10.2f}p")
    for label, cap in sizes:
        lru, w = results[(cap, "lru")].block_hit_rate, results[(cap, "wlru")].block_hit_rate
        print(f"ratio wlru/LRU block hit rate at {label}: {w / lru if lru else float('nan'):.3f}x")
    refs = len(trace.block_ids) / len(trace)
    for policy in POLICIES:
        s = sorted(speed[policy])
        print(f"replay speed {policy}: median {s[len(s) // 2]:,.0f} requests/s ({refs:.0f} blocks/request), "
              f"range {s[0]:,.0f}-{s[-1]:,.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", nargs="+", default=[str(DEFAULT_TRACE)])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5])
    ap.add_argument("--tokens", type=float, nargs="+", default=[3.1e6, 1e7])
    args = ap.parse_args(argv)
    for name in args.trace:
        path = Path(name)
        if not path.is_file():
            print(f"trace {path} not found (expected ../shared/traces beside the repo); skipping")
            continue
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            print("pyarrow is missing (pip install 'kvpool[trace]'); skipping")
            return 0
        try:
            run_trace(path, args.fractions, args.tokens)
        except TraceError as exc:
            print(f"{exc}; skipping")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
