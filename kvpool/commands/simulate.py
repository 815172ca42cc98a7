"""`kvpool simulate`: replay a trace through the master's own index and eviction code at several pool sizes and
policies (kvpool/planner.py); this file only parses arguments and prints."""

from __future__ import annotations

import argparse
import json
import sys

EPILOG = """\
examples:
  kvpool simulate --trace ../shared/traces/synthetic_trace.jsonl                      # 5/10/25/50% of unique blocks
  kvpool simulate --trace trace.jsonl --capacity 1GiB,4GiB,16GiB --block-bytes 64MiB --policy lru,wlru
  kvpool simulate --trace /var/lib/kvpool/traffic --capacity-blocks 1000,10000 --prefill-tokens-per-s 8000 --json
  kvpool simulate --trace trace.jsonl --plot hit-rate.png                              # needs kvpool[plot]

TRACE is a Mooncake JSONL file (timestamp, input_length, output_length, hash_ids of 512-token blocks), a traffic
log written by the master (*.parquet), or a directory of them. Every block is one object; --capacity in bytes is
divided by --block-bytes (the size of one block of KV: default 64MiB = 512 tokens of Llama-3-8B in fp16). A Mooncake
row replays hash_ids[:input_length // block_tokens] (full blocks, what kvpool's connectors store) unless
--partial-blocks keep. Token hit rate = hit tokens / every input token (whole prompts); block hit rate = hit blocks /
block refs replayed.
exit codes: 0 ok, 2 bad argument or unreadable trace."""


def register(sub) -> None:
    p = sub.add_parser("simulate", help="replay a trace against pool sizes and eviction policies (capacity planner)",
                       description="Replay a trace through the master's real index and eviction code and print, per "
                       "capacity and policy, block and token hit rates and prefill seconds saved.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True, metavar="FILE", help="Mooncake JSONL, a .parquet traffic log or a "
                   "directory of them")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--capacity", metavar="SIZES", help="pool sizes in bytes, comma-separated (e.g. 1GiB,4GiB)")
    size.add_argument("--capacity-blocks", metavar="N", help="pool sizes in blocks, comma-separated; N%% = that "
                      "share of the trace's unique blocks (default 5%%,10%%,25%%,50%%)")
    p.add_argument("--policy", default="lru,lclru", metavar="NAMES", help="eviction policies, comma-separated "
                   "(default lru,lclru: the default policy and the one that beats it on the Mooncake trace)")
    p.add_argument("--block-bytes", default="64MiB", metavar="B", help="bytes of one block (default 64MiB)")
    p.add_argument("--block-tokens", type=int, default=512, metavar="N",
                   help="tokens per block of a Mooncake trace (default 512; traffic logs carry their own)")
    p.add_argument("--partial-blocks", default="drop", metavar="MODE",
                   help="a Mooncake row's partial last block: drop (default: kvpool's connectors store full blocks "
                   "only) or keep (a producer that stores partial blocks)")
    p.add_argument("--prefill-tokens-per-s", type=float, default=None, metavar="R",
                   help="the engine's prefill rate, to turn hit tokens into prefill seconds saved")
    p.add_argument("--ceiling-share", type=float, default=0.9, metavar="S",
                   help="report the smallest capacity reaching this share of the infinite-pool hit rate (0.9)")
    p.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of a table")
    p.add_argument("--plot", metavar="FILE", help="also write a PNG of hit rate against capacity (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"kvpool simulate: {message}", file=sys.stderr, flush=True)
    return 2


def _capacities(args, unique_blocks: int, block_bytes: int) -> list[int]:
    from kvpool.config import parse_size

    if args.capacity:
        out = []
        for part in args.capacity.split(","):
            n = parse_size(part.strip(), "--capacity")
            if n <= 0:
                raise ValueError(f"--capacity: {part.strip()!r} must be > 0 bytes")
            if n < block_bytes:
                raise ValueError(f"--capacity: {part.strip()!r} holds no block of --block-bytes {block_bytes}")
            out.append(n // block_bytes)
        return out
    out = []
    for part in (args.capacity_blocks or "5%,10%,25%,50%").split(","):
        part = part.strip()
        try:
            n = max(1, int(float(part[:-1]) / 100 * unique_blocks)) if part.endswith("%") and float(part[:-1]) > 0 \
                else int(part)
        except ValueError:
            raise ValueError(f"--capacity-blocks: {part!r} is not a block count or a percentage") from None
        if n <= 0:
            raise ValueError(f"--capacity-blocks: {part!r} must be > 0")
        out.append(n)
    return out


def run(args) -> int:
    from kvpool.config import parse_size
    from kvpool.tiers.policy import POLICY_NAMES

    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    for p in policies or [""]:
        if p not in POLICY_NAMES:
            return _fail(f"--policy: {p!r} is not a policy; choose from {', '.join(POLICY_NAMES)}")
    try:
        block_bytes = parse_size(args.block_bytes, "--block-bytes")
    except ValueError as exc:
        return _fail(str(exc))
    if block_bytes <= 0:
        return _fail(f"--block-bytes: {args.block_bytes!r} must be > 0")
    if args.block_tokens <= 0:
        return _fail(f"--block-tokens: {args.block_tokens} must be > 0")
    if args.partial_blocks not in ("drop", "keep"):
        return _fail(f"--partial-blocks: {args.partial_blocks!r} must be drop or keep")
    if not 0 < args.ceiling_share <= 1:
        return _fail(f"--ceiling-share: {args.ceiling_share} must be in (0, 1]")
    if args.prefill_tokens_per_s is not None and not args.prefill_tokens_per_s > 0:
        return _fail(f"--prefill-tokens-per-s: {args.prefill_tokens_per_s} must be > 0")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail("--plot needs matplotlib: pip install 'kvpool[plot]' (or run without --plot)")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return _fail("reading traces needs pyarrow: pip install 'kvpool[trace]'")

    from kvpool.planner import format_plan, plan, plot_plan
    from kvpool.trace import TraceError, load_trace

    try:
        trace = load_trace(args.trace, block_tokens=args.block_tokens, partial_blocks=args.partial_blocks)
    except TraceError as exc:
        return _fail(f"--trace: {exc}")
    try:
        capacities = _capacities(args, trace.unique_blocks(), block_bytes)
    except ValueError as exc:
        return _fail(str(exc))

    from tqdm import tqdm

    with tqdm(total=len(trace) * len(set(capacities)) * len(policies), desc="replay", unit="req",
              file=sys.stderr, disable=args.no_progress) as bar:
        result = plan(trace, capacities, policies, block_bytes=block_bytes, ceiling_share=args.ceiling_share,
                      prefill_tokens_per_s=args.prefill_tokens_per_s, progress=bar.update)
    if args.plot:
        plot_plan(result, args.plot)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(format_plan(result))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0
