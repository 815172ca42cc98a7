"""A gRPC server for auth/TLS tests built from the real kvpool.v1 generated stubs, each method a trivial body that
records (method, current_identity()), plus the real health servicer; and `call`, which invokes any RPC by name."""

from __future__ import annotations

from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store.auth import current_identity
from kvpool.store.tls import TlsConfig

SERVICES = {"kvpool.v1.MasterService": (pb, pbg.MasterServiceStub),
            "kvpool.v1.NodeService": (pb, pbg.NodeServiceStub),
            "grpc.health.v1.Health": (health_pb2, health_pb2_grpc.HealthStub)}


def all_methods():
    """(full method name, module, method descriptor) for every RPC kvpool serves, from the descriptors."""
    out = []
    for service, (module, _) in SERVICES.items():
        for m in module.DESCRIPTOR.services_by_name[service.rsplit(".", 1)[1]].methods:
            out.append((f"/{service}/{m.name}", module, m))
    return out


def make_servicer(base, service_name, calls):
    def method(name, out_type, client_streaming, server_streaming):
        def unary(self, request, context):
            calls.append((name, current_identity()))
            return out_type()

        def stream_in(self, request_iterator, context):
            calls.append((name, current_identity()))
            for _ in request_iterator:
                pass
            return out_type()

        def stream_out(self, request, context):
            calls.append((name, current_identity()))
            yield out_type()
            calls.append((name + ":after-yield", current_identity()))

        return stream_in if client_streaming else stream_out if server_streaming else unary

    attrs = {m.name: method(f"/{service_name}/{m.name}", getattr(pb, m.output_type.name), m.client_streaming,
                            m.server_streaming)
             for m in pb.DESCRIPTOR.services_by_name[service_name.rsplit(".", 1)[1]].methods}
    return type("Recording" + base.__name__, (base,), attrs)()


class Server:
    def __init__(self, interceptors, *, tls: TlsConfig | None = None):
        self.calls = []
        self.server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=interceptors)
        pbg.add_MasterServiceServicer_to_server(
            make_servicer(pbg.MasterServiceServicer, "kvpool.v1.MasterService", self.calls), self.server)
        pbg.add_NodeServiceServicer_to_server(
            make_servicer(pbg.NodeServiceServicer, "kvpool.v1.NodeService", self.calls), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if tls is None:
            port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            port = self.server.add_secure_port("127.0.0.1:0", tls.server_credentials())
        self.address = f"127.0.0.1:{port}"
        self.server.start()

    def close(self):
        self.server.stop(0).wait()


def call(channel, full, module, m):
    """Call one RPC with an empty request; returns the status code."""
    service, name = full[1:].split("/")
    stub = SERVICES[service][1](channel)
    request = getattr(module, m.input_type.name)()
    try:
        if m.client_streaming:
            getattr(stub, name)(iter([request]), timeout=5)
        elif name == "Watch":  # the first reply is enough: Health/Watch never ends by itself
            replies = stub.Watch(request, timeout=5)
            next(replies)
            replies.cancel()
        elif m.server_streaming:
            list(getattr(stub, name)(request, timeout=5))
        else:
            getattr(stub, name)(request, timeout=5)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""
