"""`kvpool nodes`: one row per storage node: id, address, state, and objects / bytes / capacity of each tier."""

from __future__ import annotations

import argparse
import json

EPILOG = """\
examples:
  kvpool nodes
  kvpool nodes --master 10.0.0.5:50051 --json   # [{"node", "address", "data_address", "state", "dram_pages",
                                                #   "tiers": {...}}]

address is the node's gRPC control address, data the raw TCP data channel clients read and write through.
The DRAM tier says what pages its arena has: "on 2 MiB pages, tmpfs huge=within_size" (a --shm-dir on a huge-page
mount, README "Huge pages for the arena") or "on base pages"; nothing from a node older than 2026-11-29.
state is "alive" (registered, heartbeating). A node that misses heartbeats past the master's node TTL, or that
was drained (`kvpool drain NODE`), is no longer listed.
exit codes: 0 ok, 1 master unreachable or failing, 2 bad argument."""


def register(sub) -> None:
    p = sub.add_parser("nodes", help="list storage nodes with per-tier objects, bytes and capacity",
                       description="Every storage node the master knows, with its addresses, state and the "
                                   "objects / bytes used / capacity of each tier it has.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    from kvpool.admin import add_master_args

    add_master_args(p)
    p.set_defaults(func=run)


def render(rows: list[dict]) -> list[str]:
    from kvpool.admin import human_bytes

    if not rows:
        return ["no storage nodes registered"]
    width = max(4, *(len(r["node"]) for r in rows))
    addr = max(7, *(len(r["address"]) for r in rows))
    lines = [f"{'NODE':<{width}}  {'ADDRESS':<{addr}}  {'STATE':<8}  TIERS (objects, used / capacity)"]
    for r in rows:
        tiers = "   ".join(f"{t} {u['objects']} obj, {human_bytes(u['bytes'])} / {human_bytes(u['capacity'])}"
                           + (f" on {r['dram_pages']}" if t == "dram" and r.get("dram_pages") else "")
                           for t, u in r["tiers"].items())
        lines.append(f"{r['node']:<{width}}  {r['address']:<{addr}}  {r['state']:<8}  {tiers}")
    return lines


def run(args) -> int:
    from kvpool.admin import run_admin

    def body(admin) -> int:
        rows = admin.nodes()
        print(json.dumps(rows, indent=2) if args.json else "\n".join(render(rows)))
        return 0

    return run_admin("nodes", args, body)
