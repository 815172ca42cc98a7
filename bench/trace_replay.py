"""Eviction policies on the Mooncake FAST'25 trace and a second, differently shaped synthetic trace: LRU vs S3-FIFO vs
wlru vs clru vs bclru vs lclru (and Belady's OPT), block hit rate at several pool sizes, and how fast the planner
replays.

Replays ../shared/traces/synthetic_trace.jsonl (3,993 requests, chained 512-token block ids) with kvpool.planner,
i.e. through the master's own index, placement and eviction code (lookup under a lease, release, put the missed
tail, commit), one object per block, at 5/10/25/50% of the trace's unique blocks and at 3.1M and 10M tokens of
capacity (6,054 and 19,531 blocks of 512 tokens). Policies are interleaved per size. Peer: the infinite-pool
ceiling (every previously seen prefix hits); the reference: Belady's OPT at each size (kvpool/belady.py, offline,
knowing the future: no policy can do better). Replay speed is requests/s of the whole replay (one core).

A row's partial last block is dropped (`--partial-blocks drop`, the default: kvpool's connectors store and look up
full blocks only, so the pool never sees it); `keep` replays it as a stored block. Block hit rate = hit blocks /
block refs replayed; token hit rate = hit tokens / every input token.

The second trace (`--second`, on by default; seed fixed, so every run replays the same rows) is built here, not
tuned to any policy: Zipf-popular shared system prompts / documents of varied chain lengths, per-user multi-turn
conversations whose every turn extends the user's previous prompt (its full blocks, then new ones: the previous
partial block is recomputed with the new text), and one-off requests, over an hour of Poisson arrivals.

Usage: python bench/trace_replay.py [--trace PATH ...] [--fractions 0.05 0.1 0.25 0.5] [--tokens 3.1e6 1e7]
       [--partial-blocks drop|keep] [--no-second] [--second-out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from kvpool.belady import opt_hits
from kvpool.planner import ceiling_hits, rate_basis, replay, summarize
from kvpool.trace import PARTIAL_BLOCKS, TraceError, load_trace

POLICIES = ("lru", "s3fifo", "wlru", "clru", "bclru", "lclru")
LABELS = {"lru": "LRU", "s3fifo": "S3-FIFO", "wlru": "wlru", "clru": "clru", "bclru": "bclru", "lclru": "lclru"}
DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "synthetic_trace.jsonl"


def second_trace_rows(seed: int = 20261124, *, users: int = 700, one_offs: int = 1400, prompts: int = 250,
                      horizon_s: float = 3600.0, block_tokens: int = 512) -> list[dict]:
    """Mooncake-format rows of the second trace (module docstring), sorted by arrival time."""
    rng = random.Random(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    # shared prefixes: chain lengths log-uniform over 1..64 blocks, popularity Zipf(1.1) by rank
    shared = [fresh(max(1, round(2 ** rng.uniform(0, 6)))) for _ in range(prompts)]
    weights = [1 / (rank + 1) ** 1.1 for rank in range(prompts)]

    def a_prompt() -> list[int]:
        return rng.choices(shared, weights)[0]

    def row(t: float, chain: list[int], partial: int) -> dict:
        return {"timestamp": int(t * 1000), "input_length": len(chain) * block_tokens - partial,
                "output_length": rng.randint(20, 600), "hash_ids": chain}

    rows = []
    for _ in range(users):
        t = rng.uniform(0, horizon_s)
        full = (list(a_prompt()) if rng.random() < 0.75 else []) + fresh(rng.randint(1, 8))
        for _turn in range(1 + int(rng.expovariate(1 / 3.0))):    # turns: 1 + geometric-like, mean ~4
            if t > horizon_s:
                break
            partial = rng.randint(1, block_tokens - 1)                # the prompt ends inside its last block
            rows.append(row(t, full, partial))
            # the next turn: this prompt's full blocks, then the answer and the next message (new blocks; the
            # partial block's id changes because its tokens do)
            full = full[:-1] + fresh(rng.randint(1, 6))
            t += rng.expovariate(1 / 90.0)
    for _ in range(one_offs):
        prefix = list(a_prompt()) if rng.random() < 0.3 else []
        rows.append(row(rng.uniform(0, horizon_s), prefix + fresh(rng.randint(1, 40)), rng.randint(0, 511)))
    rows.sort(key=lambda r: r["timestamp"])
    return rows


def run_trace(path: Path, fractions: list[float], tokens: list[float], partial_blocks: str, title: str = "") -> dict:
    trace = load_trace(path, partial_blocks=partial_blocks)
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
    opt = {cap: summarize(trace, opt_hits(trace, cap).hits, policy="opt", capacity_blocks=cap) for _, cap in sizes}
    print(f"\n{title or path.name}: {len(trace)} requests, {len(trace.block_ids)} block refs, {unique} unique blocks; "
          f"infinite-pool ceiling {ceiling.block_hit_rate:.1%} of blocks, {ceiling.token_hit_rate:.1%} of tokens")
    print(rate_basis(len(trace.block_ids), ceiling.tokens, trace.partial_blocks, trace.dropped_refs,
                     trace.dropped_tokens))
    others = POLICIES[1:]
    print("OPT = Belady's furthest-next-use with bypass over the chains' block references (kvpool/belady.py): "
          "the most prefix hits any policy could get, an upper bound, not a policy; 'gap' = the share of the "
          "LRU -> OPT gap a policy closes")
    print(f"{'pool size':>24} {'blocks':>7}  " + "  ".join(f"{LABELS[p]:>7}" for p in POLICIES) + f"  {'OPT':>7}  "
          + "  ".join(f"{LABELS[p] + '-LRU':>11}" for p in others) + "  "
          + "  ".join(f"{LABELS[p] + ' gap':>9}" for p in others))
    for label, cap in sizes:
        rates = {p: results[(cap, p)].block_hit_rate for p in POLICIES}
        best = opt[cap].block_hit_rate
        gap = best - rates["lru"]
        print(f"{label:>24} {cap:>7}  " + "  ".join(f"{rates[p]:>7.1%}" for p in POLICIES) + f"  {best:>7.1%}  "
              + "  ".join(f"{100 * (rates[p] - rates['lru']):>+10.2f}p" for p in others) + "  "
              + "  ".join(f"{(rates[p] - rates['lru']) / gap if gap > 0 else float('nan'):>+9.1%}" for p in others))
    print(f"{'token hit rate':>24} {'':>7}  " + "  ".join(f"{LABELS[p]:>7}" for p in POLICIES) + f"  {'OPT':>7}")
    for label, cap in sizes:
        print(f"{label:>24} {cap:>7}  " + "  ".join(f"{results[(cap, p)].token_hit_rate:>7.1%}" for p in POLICIES)
              + f"  {opt[cap].token_hit_rate:>7.1%}")
    for policy in ("wlru", "clru", "bclru", "lclru"):
        for label, cap in sizes:
            lru, r = results[(cap, "lru")].block_hit_rate, results[(cap, policy)].block_hit_rate
            print(f"ratio {policy}/LRU block hit rate at {label}: {r / lru if lru else float('nan'):.3f}x "
                  f"({100 * (r - lru):+.2f} points)")
    deltas: dict[str, list[tuple[str, bool, float]]] = {}
    for policy in others:
        deltas[policy] = []
        for (label, cap), fraction in zip(sizes, [*fractions, *([None] * len(tokens))]):
            lru, r = results[(cap, "lru")].block_hit_rate, results[(cap, policy)].block_hit_rate
            deltas[policy].append((label, fraction is not None and fraction <= 0.1, 100 * (r - lru)))
    for policy in others:
        for label, small, d in deltas[policy]:
            want = 1.5 if small else -0.5
            print(f"goal {policy} >= LRU {want:+.1f} points at {label}: {'met' if d >= want else 'NOT met'}")
    refs = len(trace.block_ids) / len(trace)
    for policy in POLICIES:
        s = sorted(speed[policy])
        print(f"replay speed {policy}: median {s[len(s) // 2]:,.0f} requests/s ({refs:.0f} blocks/request), "
              f"range {s[0]:,.0f}-{s[-1]:,.0f}")
    return deltas


def decide(per_trace: list[tuple[str, dict[str, list[tuple[str, bool, float]]]]]) -> None:
    """The rule for a new default: >= LRU + 1.5 points at every size up to 10% of unique blocks on EVERY trace, and
    never more than 0.5 points below LRU at any size of any trace."""
    if not per_trace:
        return
    passing = []
    for policy in POLICIES[1:]:
        small = [d for _, ds in per_trace for _, is_small, d in ds[policy] if is_small]
        every = [d for _, ds in per_trace for _, _, d in ds[policy]]
        checks = [(f">= LRU +1.5 points at every size <= 10% on all {len(per_trace)} traces", min(small) >= 1.5,
                   min(small)),
                  ("never more than 0.5 points below LRU", min(every) >= -0.5, min(every))]
        for what, ok, worst in checks:
            print(f"default rule, {policy}: {what}: {'met' if ok else 'NOT met'} (worst {worst:+.2f} points)")
        if all(ok for _, ok, _ in checks):
            passing.append(policy)
    best = max(passing, key=lambda p: min(d for _, ds in per_trace for _, small, d in ds[p] if small), default=None)
    print(f"default rule: {'LRU stays the default (no policy meets both)' if best is None else best + ' qualifies'}")


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
    ap.add_argument("--partial-blocks", default="drop", choices=PARTIAL_BLOCKS,
                    help="a row's partial last block: drop (connectors store full blocks only) or keep")
    ap.add_argument("--no-second", action="store_true", help="skip the second (built-in synthetic) trace")
    ap.add_argument("--second-out", metavar="FILE", help="also keep the second trace as Mooncake JSONL here")
    args = ap.parse_args(argv)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        print("pyarrow is missing (pip install 'kvpool[trace]'); skipping")
        return 0
    per_trace = []
    for name in args.trace:
        path = Path(name)
        if not path.is_file():
            print(f"trace {path} not found (expected ../shared/traces beside the repo); skipping")
            continue
        try:
            per_trace.append((path.name, run_trace(path, args.fractions, args.tokens, args.partial_blocks)))
        except TraceError as exc:
            print(f"{exc}; skipping")
    if not args.no_second:
        rows = second_trace_rows()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(args.second_out or Path(tmp) / "second_trace.jsonl")
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            per_trace.append(("the second trace", run_trace(
                path, args.fractions, args.tokens, args.partial_blocks,
                title="second synthetic trace (prompts + conversations + one-offs, seed 20261124)")))
    decide(per_trace)
    policy_bytes()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
