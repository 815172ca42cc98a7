"""`kvpool rm KEY...` removes objects by key (hex); `kvpool rm --namespace NS` evicts a whole namespace."""

from __future__ import annotations

import os


def register(sub) -> None:
    p = sub.add_parser("rm", help="remove objects by key, or every object of a namespace")
    p.add_argument("keys", nargs="*", help="block keys, 32 hex digits each")
    p.add_argument("--master", default=os.environ.get("KVPOOL_MASTER", "127.0.0.1:50051"), help="master host:port")
    p.add_argument("--namespace", default="", help="evict every object of this namespace (32 hex digits)")
    p.add_argument("--all", action="store_true", help="evict every object of every namespace")
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.admin import AdminClient
    from kvpool.errors import PoolError

    if bool(args.keys) + bool(args.namespace) + bool(args.all) != 1:
        print("kvpool rm: give KEY..., or --namespace NS, or --all (exactly one)")
        return 2
    try:
        with AdminClient(args.master, timeout=args.timeout) as admin:
            n = admin.remove(args.keys) if args.keys else admin.evict(namespace=args.namespace)
    except (PoolError, ValueError) as exc:
        print(f"kvpool rm: {exc}")
        return 1
    print(f"removed {n} object(s)")
    return 0
