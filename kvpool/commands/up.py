"""`kvpool up`: start a whole pool on this machine (master + one node with DRAM and SSD tiers) and serve until
Ctrl-C / SIGTERM. Prints the address clients pass to `PoolClient`."""

from __future__ import annotations


def register(sub) -> None:
    from kvpool.process import add_config_flags
    from kvpool.store.config import UpConfig

    p = sub.add_parser("up", help="start a pool here: master + one DRAM/SSD node, until Ctrl-C",
                       description="Start a master and one storage node (DRAM arena + SSD file) in this process. "
                                   "Clients: PoolClient('<printed address>'); watch it with `kvpool status`.")
    add_config_flags(p, UpConfig)
    p.set_defaults(func=run)


def run(args) -> int:
    from kvpool.process import config_from_args, run_until_signal
    from kvpool.services import UpProcess
    from kvpool.store.config import UpConfig
    from kvpool.tiers.dram import page_kind

    try:
        cluster = UpProcess(config_from_args(UpConfig, args, "KVPOOL_")).start()
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"kvpool up: {exc}")
        return 2
    c = cluster.config
    ssd = f"SSD {c.ssd_bytes >> 20} MiB at {c.ssd_path}" if c.ssd_path else "no SSD tier"
    dashboard = f"dashboard {cluster.dashboard_url}" if cluster.dashboard_url else "no dashboard"
    dram = f"DRAM {c.dram_bytes >> 20} MiB on {page_kind(c.shm_dir)}"
    print(f"kvpool pool up at {cluster.address} ({dram}, {ssd}); {dashboard}; Ctrl-C to stop", flush=True)
    code = run_until_signal(cluster.stop)
    print("kvpool pool stopped", flush=True)
    return code
