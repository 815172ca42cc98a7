"""The `kvpool` command line: a thin front over the public API and the RPCs; it holds no logic of its own.

Each subcommand lives in `kvpool/commands/<name>.py` and exposes `register(subparsers)`, which adds its parser and
sets `func(args) -> int` as the handler. Modules are discovered, so adding a command touches only its own file.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from kvpool import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpool",
        description="kvpool: a tiered KV-cache pool for LLM inference. Start a pool with `kvpool up`, "
        "watch it with `kvpool status` / `kvpool stats --watch`.",
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (DEBUG, INFO, WARNING, ERROR)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    version = sub.add_parser("version", help="print the kvpool version")
    version.set_defaults(func=lambda args: print(f"kvpool {__version__}") or 0)
    import kvpool.commands as commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kvpool.commands.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
