"""`kvpool ls`: list committed objects (key, namespace, node, tier, size), paginated from the master."""

from __future__ import annotations

import json
import os


def register(sub) -> None:
    p = sub.add_parser("ls", help="list objects in the pool (or inspect the given keys)")
    p.add_argument("keys", nargs="*", help="only these block keys (32 hex digits each); a missing one prints 'missing'")
    p.add_argument("--master", default=os.environ.get("KVPOOL_MASTER", "127.0.0.1:50051"), help="master host:port")
    p.add_argument("--namespace", default="", help="only this namespace (32 hex digits of its digest)")
    p.add_argument("--limit", type=int, default=100, help="at most this many objects (0 = all)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.admin import AdminClient
    from kvpool.errors import PoolError

    try:
        with AdminClient(args.master, timeout=args.timeout) as admin:
            if args.keys:
                rows = admin.inspect(args.keys)
                rows = [r if r is not None else {"key": k.lower(), "missing": True} for k, r in zip(args.keys, rows)]
            else:
                rows = admin.list(namespace=args.namespace, limit=args.limit)
            for row in rows:
                if args.json:
                    print(json.dumps(row))
                elif row.get("missing"):
                    print(f"{row['key']}  missing")
                else:
                    print(f"{row['key']}  {row['namespace'][:12]}  {row['node']:<10} {row['tier']:<4} {row['size']:>10}")
    except (PoolError, ValueError) as exc:
        print(f"kvpool ls: {exc}")
        return 1
    return 0
