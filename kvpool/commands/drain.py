"""`kvpool drain NODE`: take a node out of the pool, moving its objects to the other nodes first."""

from __future__ import annotations

import argparse
import json

EPILOG = """\
examples:
  kvpool drain node-2                 # move node-2's objects to the other nodes, then remove node-2
  kvpool drain node-2 --json          # {"node": "node-2", "moved": N, "dropped": D, "no_room": R, ...}
  kvpool drain node-2 --no-migrate    # remove node-2 at once: its objects become misses

While draining, nothing new is placed on the node and its objects are still served from it. Each object is copied
through this process (shared memory on the same host, else the nodes' data channels) and switched to its new node
only if the copied bytes match its checksum. Objects no other node has room for (without evicting objects used more
recently) stay and are dropped with the node: `dropped` counts them (misses from now on, engines recompute them).
A drained node process may rejoin only after a restart. Run it before stopping a node for good.
exit codes: 0 drained, 1 master unreachable / unknown node / drain stopped by an error, 2 bad argument."""


def register(sub) -> None:
    p = sub.add_parser("drain", help="move a node's objects to the other nodes, then remove the node",
                       description="Drain a storage node: move its objects elsewhere, then remove it from the pool.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("node_id", metavar="NODE", help="the node id (as `kvpool nodes` lists it)")
    p.add_argument("--no-migrate", action="store_true", help="do not move objects: they become misses at once")
    p.add_argument("--deadline", type=float, default=120.0, metavar="S",
                   help="seconds to spend moving (default 120); what is left then is dropped")
    from kvpool.admin import add_master_args

    add_master_args(p, timeout=10.0, json_help='print {"node", "moved", "dropped", "no_room", "failed", "passes"}')
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.admin import fail, run_admin

    if not args.deadline > 0:
        return fail("drain", f"--deadline {args.deadline!r} must be > 0 seconds", 2)

    def body(admin) -> int:
        out = admin.drain(args.node_id, migrate=not args.no_migrate, deadline_s=args.deadline)
        if args.json:
            print(json.dumps(out))
        else:
            extra = f" ({out['no_room']} found no room elsewhere)" if out["no_room"] else ""
            print(f"node {out['node']} drained: {out['moved']} object(s) moved, {out['dropped']} dropped{extra}")
        return 0

    return run_admin("drain", args, body)
