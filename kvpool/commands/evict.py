"""`kvpool evict`: drop every object of a namespace, or every object idle for longer than a duration, or both; or
everything (`--all`, said on purpose: an empty request evicts nothing)."""

from __future__ import annotations

import argparse
import json

EPILOG = """\
examples:
  kvpool evict --namespace 3f2a...(32 hex)   # a model / tenant is gone: drop its blocks
  kvpool evict --older-than 2h               # objects nobody put or read for 2 hours
  kvpool evict --namespace 3f2a... --older-than 10m
  kvpool evict --older-than 30m --json       # {"evicted": N, "namespace": ..., "older_than_s": 1800.0}
  kvpool evict --all                         # every object of every namespace (same as kvpool rm --all)

DURATION is a number with a unit: ms, s, m, h, d (a bare number is seconds). The namespace is the digest shown in
the namespace column of `kvpool ls --json`. Idle = not stored or hit by a lookup since then (the master keeps
access times in tenths of a second). Evicted objects are misses from now on and count in the evictions stats;
objects being read at that moment are skipped (run it again). To remove single keys: `kvpool rm KEY...`.
exit codes: 0 ok (also when nothing matched), 1 master unreachable or failing, 2 bad argument."""


def register(sub) -> None:
    p = sub.add_parser("evict", help="evict a namespace's objects, or objects idle for longer than a duration",
                       description="Evict committed objects by namespace and/or idle age (give at least one).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--namespace", default="", metavar="HEX", help="only this namespace (32 hex digits of its digest)")
    p.add_argument("--older-than", default="", metavar="DURATION",
                   help="only objects not put or read for longer than this (e.g. 90s, 10m, 2h, 1d)")
    p.add_argument("--all", action="store_true", help="every object of every namespace (no other filter)")
    from kvpool.admin import add_master_args

    add_master_args(p, json_help='print {"evicted": N, "namespace": HEX|null, "older_than_s": S|null}')
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.admin import fail, parse_duration, parse_hex16, run_admin

    if args.all and (args.namespace or args.older_than):
        return fail("evict", "--all evicts everything: give it without --namespace or --older-than", 2)
    if not args.namespace and not args.older_than and not args.all:
        return fail("evict", "give --namespace HEX and/or --older-than DURATION, or --all to evict everything", 2)
    try:
        if args.namespace:
            parse_hex16(args.namespace, "--namespace")
        age = parse_duration(args.older_than) if args.older_than else None
    except ValueError as exc:
        return fail("evict", str(exc), 2)

    def body(admin) -> int:
        try:
            n = admin.evict(namespace=args.namespace, older_than_s=age, everything=args.all)
        except ValueError as exc:
            if age is not None and "idle_seconds" in str(exc):  # the master predates age eviction
                return fail("evict", f"--older-than: the master at {admin.address} cannot evict by age yet "
                                     f"({exc})", 1)
            raise
        if args.json:
            print(json.dumps({"evicted": n, "namespace": args.namespace.lower() or None, "older_than_s": age}))
        else:
            what = " and ".join(filter(None, [args.namespace and f"namespace {args.namespace.lower()}",
                                              age is not None and f"idle for more than {args.older_than}"])) \
                or "everything"
            print(f"evicted {n} object(s) ({what})")
        return 0

    return run_admin("evict", args, body)
