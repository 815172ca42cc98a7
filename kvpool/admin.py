"""Admin calls of the master (status, list, remove, evict, drain) as plain dicts: what `kvpool status|ls|rm` print.
Thin over MasterService; every call has a deadline and faults become PoolError subclasses."""

from __future__ import annotations

import json
from typing import Iterator

import grpc

from kvpool.errors import PoolError, PoolTimeout, PoolUnavailable

DEFAULT_MASTER = "127.0.0.1:50051"


def _hex16(text: str, what: str) -> bytes:
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not hex") from None
    if len(raw) != 16:
        raise ValueError(f"{what}: must be 32 hex digits (16 bytes), got {len(raw)} bytes")
    return raw


def _row(o) -> dict:
    from kvpool.proto import kvpool_pb2 as pb

    return {"key": o.key.hex(), "namespace": o.namespace.hex(), "node": o.node_id,
            "tier": pb.Tier.Name(o.tier).lower(), "offset": o.offset, "size": o.size, "checksum": f"{o.checksum:016x}"}


class AdminClient:
    def __init__(self, address: str = DEFAULT_MASTER, *, timeout: float = 5.0) -> None:
        from kvpool.proto import kvpool_pb2_grpc as pbg

        self.address = address
        self.timeout = timeout
        self._channel = grpc.insecure_channel(address)
        self._stub = pbg.MasterServiceStub(self._channel)

    def _call(self, name: str, request):
        try:
            return getattr(self._stub, name)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                raise PoolUnavailable(f"no kvpool master at {self.address}: {exc.details()}") from None
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise PoolTimeout(f"{name}: master at {self.address} did not answer in {self.timeout}s") from None
            if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                raise ValueError(exc.details()) from None
            raise PoolError(f"{name}: {exc.code().name}: {exc.details()}") from None

    def status(self) -> dict:
        from kvpool.proto import kvpool_pb2 as pb

        return json.loads(self._call("Stats", pb.StatsRequest()).json)

    def list(self, *, namespace: str = "", limit: int = 0, page: int = 1000) -> Iterator[dict]:
        """Committed objects in key order, paginated; `limit` 0 = all."""
        from kvpool.proto import kvpool_pb2 as pb

        ns = _hex16(namespace, "namespace") if namespace else b""
        start, n = b"", 0
        while True:
            reply = self._call("List", pb.ListRequest(namespace=ns, start_after=start, limit=page))
            for o in reply.objects:
                yield _row(o)
                n += 1
                if limit and n >= limit:
                    return
            if not reply.next_start_after:
                return
            start = reply.next_start_after

    def inspect(self, keys_hex: list[str]) -> list[dict | None]:
        """One row per key (None = not in the pool)."""
        from kvpool.proto import kvpool_pb2 as pb

        keys = [_hex16(k, f"keys[{i}]") for i, k in enumerate(keys_hex)]
        reply = self._call("Inspect", pb.InspectRequest(keys=keys))
        found = iter(reply.objects)
        return [_row(next(found)) if ok else None for ok in reply.found]

    def remove(self, keys_hex: list[str]) -> int:
        from kvpool.proto import kvpool_pb2 as pb

        keys = [_hex16(k, f"keys[{i}]") for i, k in enumerate(keys_hex)]
        return self._call("Remove", pb.RemoveRequest(keys=keys)).removed

    def evict(self, *, namespace: str = "") -> int:
        from kvpool.proto import kvpool_pb2 as pb

        ns = _hex16(namespace, "namespace") if namespace else b""
        return self._call("Evict", pb.EvictRequest(namespace=ns)).evicted

    def drain(self, node_id: str) -> int:
        from kvpool.proto import kvpool_pb2 as pb

        return self._call("DrainNode", pb.DrainNodeRequest(node_id=node_id)).objects_dropped

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
