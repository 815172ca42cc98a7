"""`kvpool status`: is the pool up, which nodes, how full each tier is, hit rate so far."""

from __future__ import annotations

import json
import os


def register(sub) -> None:
    p = sub.add_parser("status", help="show the pool's nodes, tier usage and hit rate")
    p.add_argument("--master", default=os.environ.get("KVPOOL_MASTER", "127.0.0.1:50051"), help="master host:port")
    p.add_argument("--json", action="store_true", help="print the master's full stats as JSON")
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(func=run)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def run(args) -> int:
    from kvpool.admin import AdminClient
    from kvpool.errors import PoolError

    try:
        with AdminClient(args.master, timeout=args.timeout) as admin:
            stats = admin.status()
    except PoolError as exc:
        print(f"kvpool status: {exc}")
        return 1
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    endpoints = stats.get("endpoints", {})
    print(f"master {args.master}: {stats['objects']} objects, {len(stats['nodes'])} node(s) alive")
    for node_id, tiers in sorted(stats["nodes"].items()):
        ep = endpoints.get(node_id, {})
        usage = ", ".join(f"{t} {row['objects']} obj {_mib(row['bytes'])}/{_mib(row['capacity'])}"
                          for t, row in sorted(tiers.items()))
        print(f"  {node_id:<12} control {ep.get('control_address', '?')} data {ep.get('data_address', '?')}: {usage}")
    req, hit = stats.get("requested_keys", 0), stats.get("hit_keys", 0)
    rate = f"{100 * hit / req:.1f}%" if req else "n/a"
    print(f"lookups {stats.get('lookups', 0)}, key hit rate {rate}, demotions {stats.get('demotions', 0)}, "
          f"promotions {stats.get('promotions', 0)}, evictions {stats.get('evictions', {})}")
    return 0
