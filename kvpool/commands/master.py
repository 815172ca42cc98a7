"""`kvpool master`: run the metadata master (gRPC MasterService + health) until Ctrl-C / SIGTERM."""

from __future__ import annotations


def register(sub) -> None:
    from kvpool.process import add_config_flags
    from kvpool.store.config import MasterServerConfig

    p = sub.add_parser("master", help="run the pool's metadata master",
                       description="Run the metadata master. Index in memory, or journalled to Redis with "
                                   "--redis-url so a restarted or standby master loses no committed object.")
    add_config_flags(p, MasterServerConfig)
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.process import config_from_args, run_until_signal
    from kvpool.services import MasterProcess
    from kvpool.store.config import MasterServerConfig

    try:
        server = MasterProcess(config_from_args(MasterServerConfig, args, "KVPOOL_")).start()
    except ValueError as exc:
        print(f"kvpool master: {exc}")
        return 2
    print(f"kvpool master serving on {server.address}", flush=True)
    return run_until_signal(server.stop)
