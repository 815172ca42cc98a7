"""`kvpool status`: is the pool up, how many nodes, how full each tier is, and the TOKEN hit rate by tier."""

from __future__ import annotations

import argparse
import json

EPILOG = """\
examples:
  kvpool status                              # the pool on 127.0.0.1:50051 (or $KVPOOL_MASTER)
  kvpool status --master 10.0.0.5:50051
  kvpool status --json | jq .hit_rate        # the stats dict + hit_rate, hit_rate_by_tier (for scripts)

Hit rate is measured in tokens: hit tokens / requested tokens over all prefix lookups since the master started;
a tier's share is the hit tokens it served / all requested tokens. "—" means no token was requested yet.
Per-node detail: `kvpool nodes`; every counter: `kvpool stats`.
exit codes: 0 ok, 1 master unreachable or failing, 2 bad argument."""


def register(sub) -> None:
    p = sub.add_parser("status", help="show the pool's nodes, tier usage and token hit rate",
                       description="One screen on the pool: nodes alive, objects and bytes per tier (summed over "
                                   "nodes) and the token hit rate, overall and by the tier that served the hits.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    from kvpool.admin import add_master_args

    add_master_args(p, json_help="print the master's stats dict plus hit_rate / hit_rate_by_tier as JSON")
    p.set_defaults(func=run)


def render(address: str, stats: dict) -> list[str]:
    from kvpool.admin import human_bytes, percent

    lines = [f"master {address}: {stats['objects']} objects, {stats['nodes_alive']} node(s) alive"]
    tiers = {t: row for t, row in stats.get("tiers", {}).items() if row.get("capacity") or row.get("objects")}
    if tiers:
        lines.append(f"  {'tier':<5} {'objects':>8} {'used':>10} {'capacity':>10} {'full':>6}")
        for t in ("hbm", "dram", "ssd"):
            if t in tiers:
                row = tiers[t]
                full = row["bytes"] / row["capacity"] if row["capacity"] else None
                lines.append(f"  {t:<5} {row['objects']:>8} {human_bytes(row['bytes']):>10} "
                             f"{human_bytes(row['capacity']):>10} {percent(full):>6}")
    req, hit = stats["requested_tokens"], stats["hit_tokens"]
    if req:
        by_tier = ", ".join(f"{t} {percent(r)}" for t, r in stats["hit_rate_by_tier"].items()
                            if t in tiers or stats["hit_tokens_by_tier"].get(t))
        lines.append(f"token hit rate {percent(stats['hit_rate'])} ({hit} of {req} requested tokens): {by_tier}")
    else:
        lines.append("token hit rate — (no tokens requested yet)")
    evictions = sum(stats.get("evictions", {}).values())
    lines.append(f"lookups {stats['lookups']}, evictions {evictions}, demotions {stats.get('demotions', 0)}, "
                 f"promotions {stats.get('promotions', 0)}")
    return lines


def run(args) -> int:
    from kvpool.admin import run_admin

    def body(admin) -> int:
        stats = admin.stats()
        if args.json:
            print(json.dumps(stats, indent=2, sort_keys=True))
        else:
            print("\n".join(render(admin.address, stats)))
        return 0

    return run_admin("status", args, body)
