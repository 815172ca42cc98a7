"""`kvpool node`: run a storage node (DRAM arena + optional SSD file) that joins a master."""

from __future__ import annotations


def register(sub) -> None:
    from kvpool.process import add_config_flags
    from kvpool.store.config import NodeServerConfig

    p = sub.add_parser("node", help="run a storage node that joins a master",
                       description="Run a storage node: serves its tiers over gRPC + a raw TCP data channel and "
                                   "shares its DRAM arena with same-host clients.")
    add_config_flags(p, NodeServerConfig)
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.process import config_from_args, run_until_signal
    from kvpool.services import NodeProcess
    from kvpool.store.config import NodeServerConfig

    try:
        process = NodeProcess(config_from_args(NodeServerConfig, args, "KVPOOL_")).start()
    except ValueError as exc:
        print(f"kvpool node: {exc}")
        return 2
    server = process.server
    print(f"kvpool node {server.config.node_id} serving on {server.address} (data {server.data_address})", flush=True)
    return run_until_signal(process.stop)
