"""`kvpool inspect KEY...`: where one object lives and what the master knows of it."""

from __future__ import annotations

import argparse
import json

EPILOG = """\
examples:
  kvpool inspect 00112233445566778899aabbccddeeff
  kvpool inspect KEY1 KEY2 --json            # one JSON object per line

Prints node, tier, offset (in the tier's arena or SSD file), size in bytes, checksum (xxh3_64 of the bytes) and
namespace (digest). Keys come from `kvpool ls` or from kvpool.block_keys() in your code.
exit codes: 0 every key found, 1 a key is not in the pool ("not found") or the master is unreachable,
2 a KEY is not 32 hex digits."""

FIELDS = ("key", "namespace", "node", "tier", "offset", "size", "checksum")


def register(sub) -> None:
    p = sub.add_parser("inspect", help="show node, tier, offset, size, checksum and namespace of objects",
                       description="Look up block keys in the master's index.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("keys", nargs="+", metavar="KEY", help="block key, 32 hex digits")
    from kvpool.admin import add_master_args

    add_master_args(p, json_help="one JSON object per found key: " + ", ".join(FIELDS))
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.admin import fail, run_admin

    def body(admin) -> int:
        rows = admin.inspect(args.keys)
        found = [r for r in rows if r is not None]
        for i, row in enumerate(found):
            if args.json:
                print(json.dumps(row))
            else:
                if i:
                    print()
                print("\n".join(f"{name:<10} {row[name]}" for name in FIELDS))
        missing = [k for k, r in zip(args.keys, rows) if r is None]
        if missing:
            return fail("inspect", f"KEY {', '.join(missing)}: not found", 1)
        return 0

    return run_admin("inspect", args, body)
