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
Prefill seconds saved: hit tokens x the prefill seconds per token the connectors measured and reported with their
lookups. Pinned: objects holding a retention hint (a put's pin_s), keys stored unpinned past their tenant's cap
(clipped), pinned objects that yielded to make room (pinned evictions); shown once any pin was asked for.
Removal tombstones: keys removed and namespaces evicted that a node coming back must not bring back, those folded
past max_tombstones (or max_tenant_tombstones), and the SSD records nodes reported that were refused as written before a
removal; shown once there is any.
With authentication on or tenant quotas, a line per tenant: its bytes against its DRAM and total quotas and its
own token hit rate. While the master records traffic (`kvpool trace record`), a line says where to. A master
listening beyond loopback without authentication is flagged with a WARNING line.
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
    saved = stats.get("prefill_seconds_saved", 0.0)
    if saved or req:
        lines.append(f"prefill seconds saved {saved:.3f} (hit tokens x the prefill s/token connectors measured)")
    if stats.get("pinned_objects") or stats.get("pins_clipped") or stats.get("pinned_evictions"):
        lines.append(f"pinned {stats.get('pinned_objects', 0)} objects ({human_bytes(stats.get('pinned_bytes', 0))}),"
                     f" pins clipped {stats.get('pins_clipped', 0)}, pinned evictions "
                     f"{stats.get('pinned_evictions', 0)}")
    if stats.get("tombstones") or stats.get("records_refused"):
        lines.append(f"removal tombstones {stats.get('tombstones', 0)} (folded {stats.get('tombstones_folded', 0)}), "
                     f"reported SSD records refused {stats.get('records_refused', 0)}")
    evictions = sum(stats.get("evictions", {}).values())
    lines.append(f"lookups {stats['lookups']}, evictions {evictions}, demotions {stats.get('demotions', 0)}, "
                 f"promotions {stats.get('promotions', 0)}")
    tenants = stats.get("tenants") or {}
    if tenants:
        lines.append(f"  {'tenant':<16} {'objects':>8} {'dram / quota':>22} {'total / quota':>22} {'hit rate':>8} "
                     f"{'quota evictions':>15} {'no space':>8}")

        def of(used: int, quota: int) -> str:
            return f"{human_bytes(used)} / {human_bytes(quota) if quota else '—'}"

        for name in sorted(tenants):
            t = tenants[name]
            rate = t["hit_tokens"] / t["requested_tokens"] if t["requested_tokens"] else None
            dram = of(t["bytes_by_tier"].get("dram", 0), t["quota"]["dram_bytes"])
            lines.append(f"  {name:<16} {t['objects']:>8} {dram:>22} {of(t['bytes'], t['quota']['total_bytes']):>22} "
                         f"{percent(rate):>8} {t['quota_evictions']:>15} {t['no_space']:>8}")
    recording = stats.get("recording")
    if recording:
        until = f"for {recording['duration_s']:g}s" if recording["duration_s"] else "until `kvpool trace stop`"
        lines.append(f"recording traffic to {recording['directory']} {until}: {recording['rows']} rows written, "
                     f"{recording['dropped']} dropped")
    security = stats.get("security") or {}
    if security.get("warning"):
        lines.append(f"WARNING: {security['warning']}")
    elif security.get("auth") or security.get("tls"):  # loopback and open (the zero-config default): nothing to say
        lines.append("security: " + ", ".join(
            [f"authentication {'on' if security.get('auth') else 'off'}",
             "TLS" + (" with client certificates" if security.get("client_certificates") else "")
             if security.get("tls") else "no TLS"]))
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
