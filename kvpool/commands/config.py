"""`kvpool config check FILE`: validate a config file for one process kind without starting anything.

The check is the real loader (`kvpool.config.load_config` + the config class's own validation), so a file that
passes here is exactly a file the process accepts. KVPOOL_* variables are ignored unless --with-env, so the file
itself is what is checked.
"""

from __future__ import annotations

import json

# kind -> (module, class). Imported lazily: checking a node config needs neither torch nor the engine.
KINDS = {
    "up": ("kvpool.store.local_cluster", "UpConfig"),
    "master": ("kvpool.store.master_server", "MasterServerConfig"),
    "node": ("kvpool.store.node_server", "NodeServerConfig"),
    "embedded": ("kvpool.store.config", "EmbeddedConfig"),
    "connector": ("kvpool.connector.config", "ConnectorConfig"),
    "engine": ("kvpool.engine_adapter.config", "EngineConfig"),
}


def register(sub) -> None:
    p = sub.add_parser("config", help="check config files",
                       description="Config files: `kvpool config check FILE --kind KIND` validates FILE as the "
                                   "config of one process kind (the same loader the process uses).")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    check = actions.add_parser("check", help="validate a YAML/TOML config file",
                               description="Exit 0 if FILE is a valid config of KIND, 1 with a message naming the "
                                           "field otherwise.")
    check.add_argument("file")
    check.add_argument("--kind", required=True, choices=sorted(KINDS),
                       help="which process reads the file: " + ", ".join(sorted(KINDS)))
    check.add_argument("--with-env", action="store_true", help="apply KVPOOL_* environment variables too")
    check.add_argument("--json", action="store_true", help="print the result (and the full effective config)")
    check.set_defaults(func=run_check)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def run_check(args) -> int:
    import dataclasses
    import enum
    import importlib

    from kvpool.config import load_config

    module, name = KINDS[args.kind]
    cls = getattr(importlib.import_module(module), name)
    env_prefix = "KVPOOL_ENGINE_" if args.kind == "engine" else "KVPOOL_"
    try:
        config = load_config(cls, args.file, env=None if args.with_env else {}, env_prefix=env_prefix)
    except ValueError as exc:
        if args.json:
            print(json.dumps({"ok": False, "file": args.file, "kind": args.kind, "error": str(exc)}))
        else:
            print(f"kvpool config check: {args.file} is not a valid {args.kind} config: {exc}")
        return 1
    values = {f.name: _plain(getattr(config, f.name), enum) for f in dataclasses.fields(config)}
    if args.json:
        print(json.dumps({"ok": True, "file": args.file, "kind": args.kind, "config": values}, sort_keys=True))
    else:
        print(f"ok: {args.file} is a valid {args.kind} config")
        for key, value in values.items():
            print(f"  {key} = {value}")
    return 0


def _plain(value, enum):
    return value.value if isinstance(value, enum.Enum) else value
