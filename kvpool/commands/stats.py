"""`kvpool stats [--watch]`: every counter and gauge of the master's stats dict, once or refreshed in place."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

EPILOG = """\
examples:
  kvpool stats                               # every counter, one per line (nested fields joined with dots)
  kvpool stats --json                        # stats dict + hit_rate, hit_rate_by_tier (= dashboard /api/stats)
  kvpool stats --watch                       # refresh every 2 s in place until Ctrl-C
  kvpool stats --watch --interval 1 --count 10 --json   # 10 samples, one JSON object per line

Counters (lookups, requested_tokens, hit_tokens_by_tier.*, evictions.*, ...) are cumulative since the master
started; objects / bytes / capacity are current values. hit_rate = hit tokens / requested tokens ("—" before the
first lookup). The same numbers feed the dashboard and /metrics.
exit codes: 0 ok (also Ctrl-C during --watch), 1 master unreachable or failing, 2 bad argument."""


def register(sub) -> None:
    p = sub.add_parser("stats", help="print the pool's counters (once, or --watch to refresh)",
                       description="The master's stats dict as a table or JSON, optionally refreshed in place.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--watch", action="store_true", help="refresh until Ctrl-C (or --count samples)")
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between samples (default 2)")
    p.add_argument("--count", type=int, default=0, metavar="N",
                   help="with --watch: stop after N samples (default 0 = until Ctrl-C)")
    from kvpool.admin import add_master_args

    add_master_args(p, json_help="print the stats dict as JSON (with --watch: one object per line per sample)")
    p.set_defaults(func=run)


def flatten(value, prefix: str = "") -> list[tuple[str, object]]:
    if isinstance(value, dict):
        out = []
        for k in sorted(value):
            out += flatten(value[k], f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, value)]


def render(stats: dict) -> list[str]:
    from kvpool.admin import percent

    rows = []
    for name, value in flatten(stats):
        if name == "hit_rate" or name.startswith("hit_rate_by_tier."):
            value = percent(value)
        elif isinstance(value, list):
            value = ", ".join(map(str, value)) or "-"
        rows.append((name, value))
    width = max(len(n) for n, _ in rows)
    return [f"{n:<{width}}  {v}" for n, v in rows]


def run(args) -> int:
    from kvpool.admin import fail, run_admin

    if not args.interval > 0:
        return fail("stats", f"--interval {args.interval!r} must be > 0 seconds", 2)
    if args.count < 0:
        return fail("stats", f"--count {args.count!r} must be >= 0 (0 = until Ctrl-C)", 2)
    if args.count and not args.watch:
        return fail("stats", "--count only applies with --watch", 2)

    def show(admin, n: int) -> None:
        stats = admin.stats()
        if args.json:  # compact under --watch: one sample per line, for `| jq` and log files
            print(json.dumps(stats, sort_keys=True, indent=None if args.watch else 2), flush=True)
            return
        lines = render(stats)
        if args.watch:
            head = f"kvpool stats  {admin.address}  {time.strftime('%H:%M:%S')}  sample {n}  (Ctrl-C to stop)"
            if sys.stdout.isatty():  # redraw in place; a pipe or file gets the samples one after another
                sys.stdout.write("\x1b[H\x1b[2J")
            lines = [head, *lines, ""]
        print("\n".join(lines), flush=True)

    def body(admin) -> int:
        if not args.watch:
            show(admin, 1)
            return 0
        pause = threading.Event()
        n = 0
        try:
            while not args.count or n < args.count:
                if n:
                    pause.wait(args.interval)
                n += 1
                show(admin, n)
        except KeyboardInterrupt:
            pass
        return 0

    return run_admin("stats", args, body)
