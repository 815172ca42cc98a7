"""Eviction policies on the Mooncake FAST'25 trace: LRU vs S3-FIFO vs wlru vs clru, block hit rate at several pool sizes,
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

POLICIES = ("lru", "s3fifo", "wlru", "clru")
LABELS = {"lru": "LRU", "s3fifo": "S3-FIFO", "wlru": "wlru", "clru": "clru"}
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
    others = POLICIES[1:]
    print(f"{'pool size':>24} {'blocks':>7}  " + "  ".join(f"{LABELS[p]:>7}" for p in POLICIES) + "  "
          + "  ".join(f"{LABELS[p] + '-LRU':>11}" for p in others))
    for label, cap in sizes:
        rates = {p: results[(cap, p)].block_hit_rate for p in POLICIES}
        print(f"{label:>24} {cap:>7}  " + "  ".join(f"{rates[p]:>7.1%}" for p in POLICIES) + "  "
              + "  ".join(f"{100 * (rates[p] - rates['lru']):>+10.2f}p" for p in others))
    for policy in ("wlru", "clru"):
        for label, cap in sizes:
            lru, r = results[(cap, "lru")].block_hit_rate, results[(cap, policy)].block_hit_rate
            print(f"ratio {policy}/LRU block hit rate at {label}: {r / lru if lru else float('nan'):.3f}x "
                  f"({100 * (r - lru):+.2f} points)")
    for label, cap in sizes:
        lru, r = results[(cap, "lru")].block_hit_rate, results[(cap, "clru")].block_hit_rate
        small = label.endswith("of unique blocks") and float(label.split("%")[0]) < 10.5
        want = 1.5 if small else -0.5
        print(f"goal clru >= LRU {want:+.1f} points at {label}: {'met' if 100 * (r - lru) >= want else 'NOT met'}")
    refs = len(trace.block_ids) / len(trace)
    for policy in POLICIES:
        s = sorted(speed[policy])
        print(f"replay speed {policy}: median {s[len(s) // 2]:,.0f} requests/s ({refs:.0f} blocks/request), "
              f"range {s[0]:,.0f}-{s[-1]:,.0f}")


def policy_bytes(n: int = 100_000) -> None:
    """Bytes per tracked slot of each policy's arrays (and ghost) after n slots inserted in 1,000-block chains."""
    from kvpool.tiers.policy import make_policy
    for name in POLICIES:
        p = make_policy(name)
        for start in range(0, n, 1000):
            slots = list(range(start, start + 1000))
            p.insert_chain(slots, [x.to_bytes(16, "little") for x in slots])
        nbytes = p.nbytes() if hasattr(p, "nbytes") else sum(
            len(a) * a.itemsize if hasattr(a, "itemsize") else len(a)
            for a in (getattr(p, f, b"") for f in ("_prev", "_next", "_queue", "_freq", "_gfp", "_gseq")))
        print(f"policy memory {name}: {nbytes / len(p):.1f} B per tracked slot at {n:,} slots")


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
    policy_bytes()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
