"""`kvpool up`: a master and one storage node (DRAM arena + SSD file) in one process, the pool's default deployment
on one machine. Same servers as `kvpool master` + `kvpool node`, so clients cannot tell the difference; the node
registers over loopback gRPC like any other. Stop order: node first (it deregisters by going silent), then master.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kvpool.store.master_server import MasterServer, MasterServerConfig
from kvpool.store.node_server import NodeServer, NodeServerConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class UpConfig:
    listen: str = "127.0.0.1:50051"      # the master: what clients and `kvpool status` dial
    node_listen: str = ""                # "" = the master's host, any free port
    redis_url: str | None = None
    node_id: str = "local"
    dram_bytes: int = 256 << 20
    ssd_path: str | None = "/var/tmp/kvpool"
    ssd_bytes: int = 1 << 30
    shm_dir: str = "/dev/shm"
    max_object_bytes: int = 64 << 20
    heartbeat_s: float = 1.0
    node_ttl_s: float = 10.0
    lease_ttl_s: float = 30.0
    grant_ttl_s: float = 30.0
    http_listen: str = "127.0.0.1:8080"  # dashboard + /metrics; "" = none; taken port = warning, pool still starts
    hbm_bytes: int = 0                   # HBM tier of the node (needs a CUDA device)
    hbm_device: int = 0

    def __post_init__(self) -> None:
        if self.ssd_path in ("", "none", "None"):
            object.__setattr__(self, "ssd_path", None)
        self.master_config()
        self.node_config("127.0.0.1:1")

    def master_config(self) -> MasterServerConfig:
        return MasterServerConfig(listen=self.listen, redis_url=self.redis_url, heartbeat_s=self.heartbeat_s,
                                  node_ttl_s=self.node_ttl_s, lease_ttl_s=self.lease_ttl_s,
                                  grant_ttl_s=self.grant_ttl_s, max_object_bytes=self.max_object_bytes)

    def node_config(self, master_address: str) -> NodeServerConfig:
        host = self.listen.rsplit(":", 1)[0]
        return NodeServerConfig(node_id=self.node_id, master=master_address,
                                listen=self.node_listen or f"{host}:0", dram_bytes=self.dram_bytes,
                                ssd_path=self.ssd_path, ssd_bytes=self.ssd_bytes if self.ssd_path else 0,
                                shm_dir=self.shm_dir, heartbeat_s=self.heartbeat_s, hbm_bytes=self.hbm_bytes,
                                hbm_device=self.hbm_device)


class LocalCluster:
    def __init__(self, config: UpConfig) -> None:
        self.config = config
        self.master = MasterServer(config.master_config())
        try:
            self.node = NodeServer(config.node_config(self.master.address))
        except BaseException:
            self.master.stop(0)
            raise

    @property
    def address(self) -> str:
        return self.master.address

    def start(self, registered_timeout: float = 10.0) -> "LocalCluster":
        self.master.start()
        self.node.start()
        self.dashboard_url = ""
        if self.config.http_listen:
            try:
                self.dashboard_url = self.master.start_dashboard(self.config.http_listen)
            except OSError as exc:
                log.warning("no dashboard: cannot listen on %s (%s)", self.config.http_listen, exc)
        if not self.node.registered.wait(registered_timeout):
            self.stop()
            raise RuntimeError(f"node did not register with the master at {self.address} "
                               f"within {registered_timeout}s")
        return self

    def stop(self) -> None:
        self.node.stop()
        self.master.stop()
