"""Process wiring: the pool's servers (store/) with their observability (kvpool/dashboard.py, kvpool/metrics.py).

    MasterProcess   MasterServer + (http_listen) the dashboard, /metrics of pool state and RPC errors
    NodeProcess     NodeServer + (metrics_listen) /metrics
    UpProcess       LocalCluster (`kvpool up`) + the dashboard

store/ knows nothing of Prometheus or HTTP: the master servicer reports refused RPCs to a hook that is wired here.
This module sits in the top layer (docs/internals.md "Layers"): the CLI commands and tests start processes with it.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from kvpool.dashboard import DashboardServer
from kvpool.metrics import PoolMetrics, start_metrics_server
from kvpool.store.config import MasterServerConfig, NodeServerConfig, UpConfig
from kvpool.store.local_cluster import LocalCluster
from kvpool.store.master_server import MasterServer
from kvpool.store.node_server import NodeServer

log = logging.getLogger(__name__)


def attach_dashboard(server: MasterServer, listen: str) -> DashboardServer:
    """Dashboard page + /metrics fed by this master's stats, and its refused RPCs counted by method and code."""
    registry = CollectorRegistry()
    metrics = PoolMetrics.create(registry, stats_provider=server.stats)
    server.servicer.on_rpc_error = lambda method, code: metrics.rpc_errors.labels(method=method, code=code).inc()
    host, port = listen.rsplit(":", 1)
    dashboard = DashboardServer(server.stats, registry, host, int(port)).start()
    log.info("dashboard at %s", dashboard.url)
    return dashboard


class MasterProcess:
    def __init__(self, config: MasterServerConfig) -> None:
        self.server = MasterServer(config)
        self.dashboard: DashboardServer | None = None

    @property
    def address(self) -> str:
        return self.server.address

    def start(self) -> "MasterProcess":
        self.server.start()
        if self.server.config.http_listen:
            self.dashboard = attach_dashboard(self.server, self.server.config.http_listen)
        return self

    def stop(self) -> None:
        if self.dashboard is not None:
            self.dashboard.stop()
        self.server.stop()


class NodeProcess:
    def __init__(self, config: NodeServerConfig) -> None:
        self.server = NodeServer(config)
        self.metrics_server = None

    @property
    def address(self) -> str:
        return self.server.address

    def start(self) -> "NodeProcess":
        if self.server.config.metrics_listen:
            registry = CollectorRegistry()
            PoolMetrics.create(registry)
            host, port = self.server.config.metrics_listen.rsplit(":", 1)
            self.metrics_server = start_metrics_server(int(port), registry, host)
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()


class UpProcess:
    def __init__(self, config: UpConfig) -> None:
        self.config = config
        self.cluster = LocalCluster(config)
        self.dashboard: DashboardServer | None = None
        self.dashboard_url = ""

    @property
    def address(self) -> str:
        return self.cluster.address

    def start(self) -> "UpProcess":
        self.cluster.start()
        if self.config.http_listen:
            try:
                self.dashboard = attach_dashboard(self.cluster.master, self.config.http_listen)
                self.dashboard_url = self.dashboard.url
            except OSError as exc:  # a taken port costs the page, not the pool
                log.warning("no dashboard: cannot listen on %s (%s)", self.config.http_listen, exc)
        return self

    def stop(self) -> None:
        if self.dashboard is not None:
            self.dashboard.stop()
        self.cluster.stop()


__all__ = ["MasterProcess", "NodeProcess", "UpProcess", "attach_dashboard"]
