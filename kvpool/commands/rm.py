"""`kvpool rm KEY...` removes objects by key (hex); `--namespace NS` / `--all` evict a whole namespace / everything."""

from __future__ import annotations

import argparse
import json

EPILOG = """\
examples:
  kvpool rm 00112233445566778899aabbccddeeff 0123456789abcdef0123456789abcdef
  kvpool rm --namespace 3f2a...(32 hex)      # same as kvpool evict --namespace
  kvpool rm --all                            # empty the pool

Removed objects are misses from now on. By key: removed even while being read (the space is reused once the
readers finish); keys not in the pool are not counted, the count says how many were removed. --namespace / --all go
through the master's eviction (as kvpool evict): objects being read at that moment are kept. Every key named (in
the pool or not), the namespace, or everything stays removed when a node that was out of the pool comes back with
SSD records of them (removal tombstones; README "Failures").
exit codes: 0 ok (also when 0 objects were removed), 1 master unreachable or failing, 2 bad argument."""


def register(sub) -> None:
    p = sub.add_parser("rm", help="remove objects by key, or every object of a namespace",
                       description="Remove objects from the pool: by key, by namespace, or all of them.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("keys", nargs="*", metavar="KEY", help="block keys, 32 hex digits each")
    p.add_argument("--namespace", default="", metavar="HEX",
                   help="evict every object of this namespace (32 hex digits)")
    p.add_argument("--all", action="store_true", help="evict every object of every namespace")
    from kvpool.admin import add_master_args

    add_master_args(p, json_help='print {"removed": N}')
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.admin import fail, run_admin

    if bool(args.keys) + bool(args.namespace) + bool(args.all) != 1:
        return fail("rm", "give KEY..., or --namespace HEX, or --all (exactly one)", 2)

    def body(admin) -> int:
        if args.keys:
            n = admin.remove(args.keys)
        else:
            n = admin.evict(namespace=args.namespace) if args.namespace else admin.evict(everything=True)
        print(json.dumps({"removed": n}) if args.json else f"removed {n} object(s)")
        return 0

    return run_admin("rm", args, body)
