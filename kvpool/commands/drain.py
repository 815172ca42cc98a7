"""`kvpool drain NODE`: take a node out of the pool. Its objects are dropped from the index (misses from now on, so
engines recompute them) and no new object is placed on it; run it before stopping a node for good."""

from __future__ import annotations

import os


def register(sub) -> None:
    p = sub.add_parser("drain", help="remove a node from the pool (its objects become misses)")
    p.add_argument("node_id")
    p.add_argument("--master", default=os.environ.get("KVPOOL_MASTER", "127.0.0.1:50051"), help="master host:port")
    p.add_argument("--timeout", type=float, default=10.0)
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.admin import AdminClient
    from kvpool.errors import PoolError

    try:
        with AdminClient(args.master, timeout=args.timeout) as admin:
            n = admin.drain(args.node_id)
    except (PoolError, ValueError) as exc:
        print(f"kvpool drain: {exc}")
        return 1
    print(f"node {args.node_id} drained: {n} object(s) dropped")
    return 0
