"""`kvpool up`'s servers: a master and one storage node (DRAM arena + SSD file) in one process, the pool's default
deployment on one machine. Same servers as `kvpool master` + `kvpool node`, so clients cannot tell the difference;
the node registers over loopback gRPC like any other. Stop order: node first (it deregisters by going silent), then
master. The dashboard is attached by the process wiring (kvpool/services.py).
"""

from __future__ import annotations

import logging

from kvpool.store.config import UpConfig
from kvpool.store.master_server import MasterServer
from kvpool.store.node_server import NodeServer

log = logging.getLogger(__name__)


class LocalCluster:
    def __init__(self, config: UpConfig) -> None:
        self.config = config
        self.master = MasterServer(config.master_server_config())
        try:
            host, port = self.master.address.rsplit(":", 1)
            # The node dials the master like any client: a wildcard listen address is reached over loopback (and a
            # TLS master's certificate names 127.0.0.1, never 0.0.0.0).
            loopback = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}.get(host)
            dial = f"{loopback}:{port}" if loopback else self.master.address
            self.node = NodeServer(config.node_server_config(dial))
        except BaseException:
            self.master.stop(0)
            raise

    @property
    def address(self) -> str:
        return self.master.address

    def start(self, registered_timeout: float = 10.0) -> "LocalCluster":
        self.master.start()
        self.node.start()
        if not self.node.registered.wait(registered_timeout):
            self.stop()
            raise RuntimeError(f"node did not register with the master at {self.address} "
                               f"within {registered_timeout}s")
        return self

    def stop(self) -> None:
        self.node.stop()
        self.master.stop()


__all__ = ["LocalCluster", "UpConfig"]
