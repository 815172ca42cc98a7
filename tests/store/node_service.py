"""A StorageNode's real NodeService on 127.0.0.1, in this process (what a node process serves, without its master
registration): for tests that call it through RemoteNodeOps or a raw stub."""

from __future__ import annotations

from concurrent import futures

import grpc

from kvpool.launcher import free_port
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store.node import StorageNode
from kvpool.store.node_data import NodeDataHandler
from kvpool.store.node_server import NodeServicer


def serve_node(node: StorageNode, address: str | None = None) -> tuple[grpc.Server, str]:
    """Start serving `node` at `address` (a free loopback port when None); returns the server (stop it) and where."""
    address = address or f"127.0.0.1:{free_port()}"
    server = grpc.server(futures.ThreadPoolExecutor(2))
    pbg.add_NodeServiceServicer_to_server(NodeServicer(node, NodeDataHandler(node)), server)
    assert server.add_insecure_port(address), f"cannot listen on {address}"
    server.start()
    return server, address
