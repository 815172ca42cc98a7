"""`kvpool ls`: list committed objects (key, namespace, node, tier, size), paginated from the master."""

from __future__ import annotations

import argparse
import json

EPILOG = """\
examples:
  kvpool ls                                  # the first 100 objects in key order
  kvpool ls --limit 0                        # all of them
  kvpool ls --namespace 3f2a...(32 hex)      # one namespace (its digest: the "namespace" column of --json)
  kvpool ls --json | jq -r .key              # one JSON object per line
  kvpool ls KEY KEY                          # only these keys; a missing one prints "missing"

Columns: key, namespace (first 12 hex digits), node, tier, size in bytes. Full detail of one key: kvpool inspect KEY.
exit codes: 0 ok, 1 master unreachable or failing, 2 bad argument (malformed key or namespace, negative --limit)."""


def register(sub) -> None:
    p = sub.add_parser("ls", help="list objects in the pool (or look up the given keys)",
                       description="List committed objects in key order: key, namespace, node, tier, size.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("keys", nargs="*", metavar="KEY",
                   help="only these block keys (32 hex digits each); a missing one prints 'missing'")
    p.add_argument("--namespace", default="", metavar="HEX", help="only this namespace (32 hex digits of its digest)")
    p.add_argument("--limit", type=int, default=100, metavar="N", help="at most N objects (default 100; 0 = all)")
    p.add_argument("--tenant", default="", metavar="NAME",
                   help="only this tenant's objects (authentication on: keys are listed as stored, in its key space)")
    from kvpool.admin import add_master_args

    add_master_args(p, json_help="one JSON object per line: key, namespace, node, tier, offset, size, checksum")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.admin import run_admin

    def body(admin) -> int:
        if args.keys:
            rows = admin.inspect(args.keys)  # checks every key before the RPC: a bad one prints nothing
            rows = [r if r is not None else {"key": k.lower(), "missing": True} for k, r in zip(args.keys, rows)]
        else:
            rows = admin.list(namespace=args.namespace, limit=args.limit, tenant=args.tenant)
        for row in rows:
            if args.json:
                print(json.dumps(row))
            elif row.get("missing"):
                print(f"{row['key']}  missing")
            else:
                tenant = f"  {row['tenant']}" if row.get("tenant") else ""
                print(f"{row['key']}  {row['namespace'][:12]}  {row['node']:<10} {row['tier']:<4} {row['size']:>10}"
                      f"{tenant}")
        return 0

    return run_admin("ls", args, body)
