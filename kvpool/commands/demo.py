"""`kvpool demo`: pool + two engine instances as separate processes; shows cross-instance prefix reuse."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("demo", help="start a pool and two engines; show B reusing A's prefix (TTFT, hits, output)",
                       description="Starts `kvpool up` and engines A, B (with the pool) and B0 (without) as separate "
                                   "processes on 127.0.0.1, sends a long shared-prefix prompt to A, then a different "
                                   "question with the same prefix to B and B0, and prints the comparison.")
    p.add_argument("--sections", type=int, default=40,
                   help="handbook sections in the shared prefix (~40 tokens each; default 40)")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens to generate per answer (default 16)")
    p.add_argument("--workdir", default=None, help="keep logs and the SSD file here (default: a temp dir, removed)")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.demo import format_result, run_demo

    if args.sections < 1 or args.sections > 45:
        print("kvpool demo: --sections must be between 1 and 45 (the prompt must fit 2,048 tokens)")
        return 2
    if args.max_tokens < 1:
        print("kvpool demo: --max-tokens must be >= 1")
        return 2
    result = run_demo(sections=args.sections, max_tokens=args.max_tokens, workdir=args.workdir)
    print(format_result(result))
    return 0 if result.outputs_match and result.pool_hit_tokens > 0 else 1
