"""Process wiring: the pool's servers (store/) with their observability (kvpool/dashboard.py, kvpool/metrics.py).

    MasterProcess   MasterServer + (http_listen) the dashboard, /metrics of pool state and RPC errors
    NodeProcess     NodeServer + (metrics_listen) /metrics
    UpProcess       LocalCluster (`kvpool up`) + the dashboard

store/ knows nothing of Prometheus or HTTP: the master servicer reports refused RPCs to a hook that is wired here
(refused credentials too: kvpool_rpc_errors_total{code="UNAUTHENTICATED"|"PERMISSION_DENIED"}). With authentication
on, the dashboard and its /metrics take an admin or viewer token (`dashboard_access`), over HTTPS when the master
has a TLS certificate.
This module sits in the top layer (docs/internals.md "Layers"): the CLI commands and tests start processes with it.
"""

from __future__ import annotations

import base64
import logging
from typing import Callable, Mapping

from prometheus_client import CollectorRegistry

from kvpool.dashboard import DashboardServer
from kvpool.metrics import PoolMetrics, start_metrics_server
from kvpool.store.config import MasterServerConfig, NodeServerConfig, UpConfig
from kvpool.store.local_cluster import LocalCluster
from kvpool.store.auth import Role
from kvpool.store.master_server import MasterServer
from kvpool.store.node_server import NodeServer

log = logging.getLogger(__name__)


def attach_dashboard(server: MasterServer, listen: str,
                     node_counts: Callable[[], Mapping[str, int]] | None = None) -> DashboardServer:
    """Dashboard page + /metrics fed by this master's stats, and its refused RPCs counted by method and code; with
    `node_counts` (`kvpool up`: its node's `NodeServer.node_counts`) the node's own counters too."""
    registry = CollectorRegistry()
    metrics = PoolMetrics.create(registry, stats_provider=server.stats, node_counts=node_counts)
    server.servicer.on_rpc_error = lambda method, code: metrics.rpc_errors.labels(method=method, code=code).inc()
    host, port = listen.rsplit(":", 1)
    authorize = dashboard_access(server) if server.config.auth_config().enabled else None
    tls = server.tls if server.tls is not None and server.tls.cert else None
    ssl_context = None
    if tls is not None:
        from kvpool.store.tls import TlsConfig

        ssl_context = TlsConfig(cert=tls.cert, key=tls.key).server_ssl_context()  # browsers send no certificate
    dashboard = DashboardServer(server.stats, registry, host, int(port), authorize=authorize,
                                ssl_context=ssl_context).start()
    log.info("dashboard at %s", dashboard.url)
    return dashboard


def bearer_or_basic(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer <token>` or `Basic base64(user:token)` header, or None."""
    value = headers.get("Authorization") or headers.get("authorization") or ""
    scheme, _, rest = value.partition(" ")
    if scheme.lower() == "bearer":
        return rest.strip() or None
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(rest.strip(), validate=True).decode().partition(":")[2] or None
        except (ValueError, UnicodeDecodeError):
            return None
    return None


def dashboard_access(server: MasterServer):
    """authorize(headers) for the dashboard: an admin or viewer token of the master's TokenStore."""
    tokens = server.tokens

    def authorize(headers: Mapping[str, str]) -> str | None:
        token = bearer_or_basic(headers)
        if token is None:
            return "authentication required: an admin or viewer token (Authorization: Bearer, or Basic with the " \
                   "token as password)"
        ident = tokens.identify(token) if tokens is not None else None
        if ident is None:
            return "unknown or revoked token"
        if ident.role not in (Role.ADMIN, Role.VIEWER):
            return f"a {ident.role.value} token may not read the dashboard; use an admin or viewer token"
        return None

    return authorize


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
            PoolMetrics.create(registry, node_counts=self.server.node_counts)
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
                self.dashboard = attach_dashboard(self.cluster.master, self.config.http_listen,
                                                  self.cluster.node.node_counts)
                self.dashboard_url = self.dashboard.url
            except OSError as exc:  # a taken port costs the page, not the pool
                log.warning("no dashboard: cannot listen on %s (%s)", self.config.http_listen, exc)
        return self

    def stop(self) -> None:
        if self.dashboard is not None:
            self.dashboard.stop()
        self.cluster.stop()


__all__ = ["MasterProcess", "NodeProcess", "UpProcess", "attach_dashboard", "dashboard_access", "bearer_or_basic"]
