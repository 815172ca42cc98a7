"""What every long-running `kvpool` process command shares: config from file < KVPOOL_* env < flags, and running
until Ctrl-C / SIGTERM with a clean shutdown."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import threading
from typing import Any, Callable, TypeVar

from kvpool.config import load_config

T = TypeVar("T")


def add_config_flags(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One `--field-name` flag per config field (parsed by load_config, so '256MiB' and 'true' work)."""
    parser.add_argument("--config", default=None, help="YAML/TOML config file (flags and KVPOOL_* env override it)")
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, metavar="VALUE",
                            help=f"(default: {default})")


def config_from_args(cls: type[T], args: argparse.Namespace, env_prefix: str = "KVPOOL_", **fixed: Any) -> T:
    """KVPOOL_<FIELD> variables (KVPOOL_NODE_ID, KVPOOL_DRAM_BYTES, ...): one process kind per container, so one
    prefix is enough; `kvpool up` has its own config class for its two servers."""
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
                 if getattr(args, f.name, None) is not None}
    overrides.update(fixed)
    return load_config(cls, getattr(args, "config", None), env_prefix=env_prefix, **overrides)


def run_until_signal(stop: Callable[[], None]) -> int:
    """Block the main thread until SIGINT/SIGTERM, then call `stop` once."""
    done = threading.Event()

    def handler(signum, frame):
        done.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not done.wait(3600):
            pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        stop()
    return 0
