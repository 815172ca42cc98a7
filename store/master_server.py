"""The master process: `Master` behind the kvpool.v1.MasterService gRPC API, plus node liveness.

    clients ──PutStart/Lookup/...──▶ MasterServicer ──▶ Master (index, placement, leases)
    nodes   ──RegisterNode/Heartbeat/ReportObjects──▶        │ NodeOps
                                                             ▼
                                          RemoteNodeOps ──Demote/Promote/Drop──▶ node's NodeService

Error mapping (every message names the field; a rejected call changes nothing because `Master` validates before
it mutates): BatchTooLarge -> RESOURCE_EXHAUSTED, ValueError -> INVALID_ARGUMENT, KeyError (unknown node) ->
NOT_FOUND, TokenError -> PERMISSION_DENIED. A reaper thread calls `Master.reap()` so silent nodes are dropped
within node_ttl_s even when no client calls in. With `redis_url` the index is journalled to Redis and the token
secret is shared through it, so a restarted or standby master serves the same objects and the nodes' tokens.
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvpool.proto import convert
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store.config import MasterConfig
from kvpool.store.master import BatchTooLarge, Master
from kvpool.store.migration import MigrateStatus
from kvpool.store.remote_node import GRPC_OPTIONS, RemoteNodeOps
from kvpool.store.records import NO_NS, NsRef, PutStatus
from kvpool.store.tokens import TokenError

log = logging.getLogger(__name__)

_PUT_STATUS = {PutStatus.STORED: pb.STORED, PutStatus.EXISTS: pb.EXISTS, PutStatus.NO_SPACE: pb.NO_SPACE}
_MIGRATE_STATUS = {MigrateStatus.MOVING: pb.MOVING, MigrateStatus.GONE: pb.GONE, MigrateStatus.NO_SPACE: pb.NO_ROOM,
                   MigrateStatus.BUSY: pb.BUSY}


@dataclass(frozen=True, slots=True, kw_only=True)
class MasterServerConfig:
    """The `kvpool master` process: where it listens, its metadata backend, and the MasterConfig fields."""

    listen: str = "127.0.0.1:50051"
    redis_url: str | None = None      # None = in-memory metadata (lost with the process)
    redis_prefix: str = "kvpool"
    heartbeat_s: float = 1.0          # told to nodes at registration
    node_rpc_timeout_s: float = 5.0   # deadline of master -> node control calls (demote/promote/drop)
    list_limit: int = 1000
    workers: int = 16
    http_listen: str = ""             # host:port of the dashboard + /metrics ("" = none)
    max_object_bytes: int = 64 << 20
    max_batch_keys: int = 65536
    lease_ttl_s: float = 30.0
    grant_ttl_s: float = 30.0
    node_ttl_s: float = 10.0
    promote_on_hit: bool = True
    policy: str = "lru"

    def __post_init__(self) -> None:
        if not isinstance(self.listen, str) or ":" not in self.listen:
            raise ValueError(f"listen must be host:port, got {self.listen!r}")
        for name in ("heartbeat_s", "node_rpc_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        for name in ("list_limit", "workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be an int > 0, got {value!r}")
        if self.http_listen and ":" not in self.http_listen:
            raise ValueError(f"http_listen must be host:port or empty, got {self.http_listen!r}")
        if self.heartbeat_s >= self.node_ttl_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s}) must be below node_ttl_s ({self.node_ttl_s}), "
                             "or every node is dropped between two heartbeats")
        self.master_config()

    def master_config(self) -> MasterConfig:
        return MasterConfig(max_object_bytes=self.max_object_bytes, max_batch_keys=self.max_batch_keys,
                            lease_ttl_s=self.lease_ttl_s, grant_ttl_s=self.grant_ttl_s, node_ttl_s=self.node_ttl_s,
                            promote_on_hit=self.promote_on_hit, policy=self.policy)


def _rpc(method):
    """Run a handler, turning caller mistakes into status codes that name the field (and counting them)."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except BatchTooLarge as exc:
            code, msg = grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
        except TokenError as exc:
            code, msg = grpc.StatusCode.PERMISSION_DENIED, str(exc)
        except ValueError as exc:
            code, msg = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except KeyError as exc:
            code, msg = grpc.StatusCode.NOT_FOUND, str(exc.args[0] if exc.args else exc)
        log.info("%s -> %s: %s", name, code.name, msg)
        if self.metrics is not None:
            self.metrics.rpc_errors.labels(method=name, code=code.name).inc()
        context.abort(code, msg)

    return wrapper


def _ns(digest: bytes, block_tokens: int, label: str) -> NsRef:
    if not digest:
        return NsRef(block_tokens=block_tokens, label=label) if block_tokens or label else NO_NS
    if len(digest) != 16:
        raise ValueError(f"namespace: must be a 16-byte namespace digest, got {len(digest)} bytes")
    return NsRef(digest=bytes(digest), label=label or digest.hex()[:12], block_tokens=block_tokens)


class MasterServicer(pbg.MasterServiceServicer):
    def __init__(self, master: Master, config: MasterServerConfig, metadata=None) -> None:
        self.master = master
        self.config = config
        self._metadata = metadata
        self._endpoints: dict[str, pb.NodeEndpoint] = {}
        self._ops: dict[str, RemoteNodeOps] = {}
        self.metrics = None  # kvpool.metrics.PoolMetrics when the process exports metrics
        self._drained: dict[str, str] = {}  # node_id -> incarnation that was drained (a new process may rejoin)
        self._lock = threading.Lock()
        if metadata is not None and hasattr(metadata, "load_node_endpoints"):
            for node_id, data in metadata.load_node_endpoints().items():
                self._endpoints[node_id] = pb.NodeEndpoint.FromString(data)

    # ---------------------------------------------------------------- helpers
    def _node_table(self, node_ids: Sequence[str]) -> tuple[list[int], list[pb.NodeEndpoint]]:
        """Per-entry index into a table of the distinct nodes referenced."""
        table: dict[str, int] = {}
        nodes: list[pb.NodeEndpoint] = []
        index = []
        for node_id in node_ids:
            i = table.get(node_id)
            if i is None:
                i = table[node_id] = len(nodes)
                with self._lock:
                    ep = self._endpoints.get(node_id)
                nodes.append(ep if ep is not None else pb.NodeEndpoint(node_id=node_id))
            index.append(i)
        return index, nodes

    def _prefer(self, host_id: str) -> str | None:
        if not host_id:
            return None
        with self._lock:
            local = [node_id for node_id, ep in self._endpoints.items() if ep.host_id == host_id]
            if len(local) == len(self._endpoints):
                return None  # every node is local: let the master spread by free space
        # Among the caller's host's nodes, the one with the most free DRAM (a racy read is fine: it is a hint).
        best, best_free = None, -1
        for node_id in local:
            node = self.master.placement.nodes.get(node_id)
            free = self.master._free(node) if node is not None else -1  # noqa: SLF001
            if free > best_free:
                best, best_free = node_id, free
        return best

    # ---------------------------------------------------------------- nodes
    @_rpc
    def RegisterNode(self, request, context):
        ep = request.node
        if not ep.node_id:
            raise ValueError("node.node_id: must be a non-empty string")
        if not ep.control_address or not ep.data_address:
            raise ValueError("node.control_address/data_address: a node must advertise both")
        info = convert.info_from_endpoint(ep)
        with self._lock:
            if self._drained.get(ep.node_id) == ep.incarnation:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"node_id {ep.node_id!r} was drained; restart the node process to rejoin")
            old = self._ops.get(ep.node_id)
            if old is not None and old.address == ep.control_address:
                ops, old = old, None  # same node address: keep the channel (a move may be using it right now)
            else:
                ops = self._ops[ep.node_id] = RemoteNodeOps(ep.control_address, self.config.node_rpc_timeout_s)
            self._endpoints[ep.node_id] = pb.NodeEndpoint.FromString(ep.SerializeToString())
        if old is not None:
            old.close()
        epoch = self.master.register_node(info, ops)
        if self._metadata is not None and hasattr(self._metadata, "put_node_endpoint"):
            self._metadata.put_node_endpoint(ep.node_id, ep.SerializeToString())
        log.info("node %s registered (epoch %d, data %s, host %s)", ep.node_id, epoch, ep.data_address, ep.host_id)
        return pb.RegisterNodeResponse(token_secret=self.master.token_secret, node_ttl_s=self.config.node_ttl_s,
                                       heartbeat_interval_s=self.config.heartbeat_s, epoch=epoch)

    @_rpc
    def Heartbeat(self, request, context):
        return pb.HeartbeatResponse(reregister=self.master.heartbeat(request.node_id, request.epoch))

    @_rpc
    def ReportObjects(self, request, context):
        records = convert.report_from_msg(request)
        if len(records) > self.config.max_batch_keys:
            raise BatchTooLarge(f"keys: batch of {len(records)} exceeds max_batch_keys={self.config.max_batch_keys}")
        result = self.master.report_objects(request.node_id, records)
        return pb.ReportObjectsResponse(adopted=result.adopted, known=result.known, dropped=len(result.dropped_keys),
                                        dropped_keys=result.dropped_keys)

    @_rpc
    def DrainNode(self, request, context):
        n = self.master.drain_node(request.node_id)
        with self._lock:
            ops = self._ops.pop(request.node_id, None)
            ep = self._endpoints.pop(request.node_id, None)
            if ep is not None:
                self._drained[request.node_id] = ep.incarnation
        if ops is not None:
            ops.close()
        return pb.DrainNodeResponse(objects_dropped=n)

    # ---------------------------------------------------------------- put
    @_rpc
    def PutStart(self, request, context):
        ns = _ns(request.namespace, request.block_tokens, request.namespace_label)
        results = self.master.put_start(list(request.keys), list(request.sizes), ns,
                                        prefer_node=self._prefer(request.client_host_id))
        reply = pb.PutStartResponse()
        reply.statuses.extend(_PUT_STATUS[r.status] for r in results)
        grants = [r.grant for r in results]
        node_index, nodes = self._node_table([g.location.node_id for g in grants if g is not None])
        it = iter(node_index)
        reply.node_index.extend(next(it) if g is not None else 0 for g in grants)
        reply.grant_ids.extend(g.grant_id if g is not None else 0 for g in grants)
        reply.tiers.extend(int(g.location.tier) if g is not None else 0 for g in grants)
        reply.offsets.extend(g.location.offset if g is not None else 0 for g in grants)
        reply.sizes.extend(g.location.size if g is not None else 0 for g in grants)
        reply.tokens.extend(g.token if g is not None else b"" for g in grants)
        reply.nodes.extend(nodes)
        live = [g for g in grants if g is not None]
        reply.expires_unix_ms = int(live[0].expires_at * 1000) if live else 0
        return reply

    @_rpc
    def PutCommit(self, request, context):
        n = convert.check_columns(request, "grant_ids", "checksums")
        if n > self.config.max_batch_keys:
            raise BatchTooLarge(f"grant_ids: batch of {n} exceeds max_batch_keys={self.config.max_batch_keys}")
        ok = self.master.put_commit(list(request.grant_ids), list(request.checksums))
        reply = pb.PutCommitResponse()
        reply.statuses.extend(pb.COMMITTED if o else pb.EXPIRED for o in ok)
        return reply

    @_rpc
    def PutAbort(self, request, context):
        return pb.PutAbortResponse(aborted=self.master.put_abort(list(request.grant_ids)))

    # ---------------------------------------------------------------- get
    @_rpc
    def Lookup(self, request, context):
        ns = _ns(request.namespace, request.block_tokens, request.namespace_label)
        expect = list(request.expect_sizes) if len(request.expect_sizes) else None
        result = self.master.lookup(list(request.keys), ns, lease=request.lease, expect_sizes=expect)
        reply = pb.LookupResponse(hits=result.hits, lease_id=result.lease_id,
                                  expires_unix_ms=int(result.expires_at * 1000))
        if result.locations:
            node_index, nodes = self._node_table([loc.node_id for loc in result.locations])
            reply.node_index.extend(node_index)
            reply.tiers.extend(int(loc.tier) for loc in result.locations)
            reply.offsets.extend(loc.offset for loc in result.locations)
            reply.sizes.extend(loc.size for loc in result.locations)
            reply.checksums.extend(result.checksums)
            reply.tokens.extend(result.tokens)
            reply.nodes.extend(nodes)
        return reply

    @_rpc
    def Release(self, request, context):
        return pb.ReleaseResponse(released=self.master.release(list(request.lease_ids)))

    @_rpc
    def Contains(self, request, context):
        reply = pb.ContainsResponse()
        reply.present.extend(self.master.contains(list(request.keys)))
        return reply

    @_rpc
    def Remove(self, request, context):
        return pb.RemoveResponse(removed=self.master.remove(list(request.keys)))

    # ---------------------------------------------------------------- admin
    @_rpc
    def List(self, request, context):
        if request.namespace and len(request.namespace) != 16:
            raise ValueError(f"namespace: must be a 16-byte namespace digest, got {len(request.namespace)} bytes")
        if request.start_after and len(request.start_after) != 16:
            raise ValueError(f"start_after: must be a 16-byte key, got {len(request.start_after)} bytes")
        limit = min(request.limit or self.config.list_limit, self.config.list_limit)
        records, next_key = self.master.list_objects(bytes(request.namespace), bytes(request.start_after), limit,
                                                     node_id=request.node_id)
        return pb.ListResponse(objects=[convert.object_info(r) for r in records], next_start_after=next_key)

    @_rpc
    def Inspect(self, request, context):
        records = self.master.inspect(list(request.keys))
        reply = pb.InspectResponse()
        reply.found.extend(r is not None for r in records)
        reply.objects.extend(convert.object_info(r) for r in records if r is not None)
        return reply

    @_rpc
    def Evict(self, request, context):
        if request.namespace and len(request.namespace) != 16:
            raise ValueError(f"namespace: must be a 16-byte namespace digest, got {len(request.namespace)} bytes")
        if not request.idle_seconds >= 0:  # also NaN
            raise ValueError(f"idle_seconds: must be >= 0 (0 = any age), got {request.idle_seconds}")
        # idle_seconds 0 = any age: a namespace alone evicts all of it, an empty request everything (unleased).
        older = request.idle_seconds if request.idle_seconds or not request.namespace else None
        return pb.EvictResponse(evicted=self.master.evict(bytes(request.namespace), older))

    def stats(self) -> dict:
        """The master's stats plus what only the server knows (node addresses); also the dashboard's feed."""
        stats = self.master.stats()
        known = self.master.placement.nodes  # read without the master lock: a snapshot for display only
        with self._lock:
            # Nodes the master dropped (silent past the TTL) are not listed; "connected" is False for a node known
            # from the metadata backend that has not registered with this master process yet.
            stats["endpoints"] = {n: {"data_address": e.data_address, "control_address": e.control_address,
                                      "host_id": e.host_id,
                                      "connected": isinstance(getattr(known.get(n), "ops", None), RemoteNodeOps)}
                                  for n, e in self._endpoints.items() if n in known}
        stats["nodes_alive"] = len(stats.get("nodes", {}))
        return stats

    @_rpc
    def Stats(self, request, context):
        return pb.StatsResponse(json=json.dumps(self.stats(), sort_keys=True))

    # ---------------------------------------------------------------- drain with moves (store/migration.py)
    @_rpc
    def BeginDrain(self, request, context):
        if not request.node_id:
            raise ValueError("node_id: must be a non-empty string")
        objects, pending = self.master.begin_drain(request.node_id)
        return pb.BeginDrainResponse(objects=objects, pending=pending)

    @_rpc
    def MigrateStart(self, request, context):
        if request.node_id:
            if len(request.keys):
                raise ValueError("keys: give keys or node_id, not both")
            result = self.master.migrate_next(request.node_id, request.cursor, request.limit or 256,
                                              request.max_bytes)
        else:
            result = self.master.migrate_start(list(request.keys))
        moves = result.moves
        live = [m for m in moves if m.status is MigrateStatus.MOVING]
        index, nodes = self._node_table([n for m in live for n in (m.source.node_id, m.dest.node_id)])
        reply = pb.MigrateStartResponse(read_id=result.read_id if live else 0,
                                        expires_unix_ms=int(result.expires_at * 1000) if live else 0)
        reply.statuses.extend(_MIGRATE_STATUS[m.status] for m in moves)
        it = iter(index)
        src_index, dst_index = [], []
        for m in moves:
            if m.status is MigrateStatus.MOVING:
                src_index.append(next(it))
                dst_index.append(next(it))
            else:
                src_index.append(0)
                dst_index.append(0)
        moving = [m.status is MigrateStatus.MOVING for m in moves]
        reply.move_ids.extend(m.move_id for m in moves)
        reply.src_node_index.extend(src_index)
        reply.src_tiers.extend(int(m.source.tier) if ok else 0 for m, ok in zip(moves, moving))
        reply.src_offsets.extend(m.source.offset if ok else 0 for m, ok in zip(moves, moving))
        reply.src_tokens.extend(m.read_token for m in moves)
        reply.dst_node_index.extend(dst_index)
        reply.dst_tiers.extend(int(m.dest.tier) if ok else 0 for m, ok in zip(moves, moving))
        reply.dst_offsets.extend(m.dest.offset if ok else 0 for m, ok in zip(moves, moving))
        reply.dst_tokens.extend(m.write_token for m in moves)
        reply.sizes.extend(m.source.size if ok else 0 for m, ok in zip(moves, moving))
        reply.checksums.extend(m.checksum for m in moves)
        reply.namespaces.extend(m.ns_digest for m in moves)
        reply.nodes.extend(nodes)
        reply.keys.extend(result.keys)
        reply.next_cursor = result.next_cursor
        return reply

    @_rpc
    def MigrateCommit(self, request, context):
        n = convert.check_columns(request, "move_ids", "checksums")
        if n > self.config.max_batch_keys:
            raise BatchTooLarge(f"move_ids: batch of {n} exceeds max_batch_keys={self.config.max_batch_keys}")
        return pb.MigrateCommitResponse(moved=self.master.migrate_commit(list(request.move_ids),
                                                                         list(request.checksums)))

    @_rpc
    def MigrateAbort(self, request, context):
        n = len(request.move_ids)
        if n > self.config.max_batch_keys:
            raise BatchTooLarge(f"move_ids: batch of {n} exceeds max_batch_keys={self.config.max_batch_keys}")
        return pb.MigrateAbortResponse(aborted=self.master.migrate_abort(list(request.move_ids)))

    def close(self) -> None:
        with self._lock:
            ops, self._ops = list(self._ops.values()), {}
        for o in ops:
            o.close()


class MasterServer:
    """Owns the Master, its gRPC server (MasterService + health) and the reaper thread."""

    def __init__(self, config: MasterServerConfig) -> None:
        self.config = config
        self.metadata = None
        secret = secrets.token_bytes(32)
        if config.redis_url:
            from kvpool.store.redis_metadata import RedisMetadata

            self.metadata = RedisMetadata(config.redis_url, prefix=config.redis_prefix)
            secret = self.metadata.shared_secret()
        self.master = Master(config.master_config(), self.metadata, token_secret=secret)
        self.servicer = MasterServicer(self.master, config, self.metadata)
        self.server = grpc.server(futures.ThreadPoolExecutor(config.workers, thread_name_prefix="kvpool-master"),
                                  options=GRPC_OPTIONS)
        pbg.add_MasterServiceServicer_to_server(self.servicer, self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(config.listen)
        if self.port == 0:
            raise ValueError(f"listen: cannot bind {config.listen!r}")
        host = config.listen.rsplit(":", 1)[0]
        self.address = f"{host}:{self.port}"
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="kvpool-reaper", daemon=True)
        self.dashboard = None

    def start(self) -> "MasterServer":
        self.server.start()
        self._reaper.start()
        if self.config.http_listen:
            self.start_dashboard(self.config.http_listen)
        for service in ("", "kvpool.v1.MasterService"):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("master serving on %s (metadata: %s)", self.address, self.config.redis_url or "memory")
        return self

    def start_dashboard(self, listen: str) -> str:
        """Dashboard page + /metrics (kvpool/dashboard.py) fed by this master's stats; returns its URL."""
        from prometheus_client import CollectorRegistry

        from kvpool.dashboard import DashboardServer
        from kvpool.metrics import PoolMetrics

        registry = CollectorRegistry()
        self.servicer.metrics = PoolMetrics.create(registry, stats_provider=self.servicer.stats)
        host, port = listen.rsplit(":", 1)
        self.dashboard = DashboardServer(self.servicer.stats, registry, host, int(port)).start()
        log.info("dashboard at %s", self.dashboard.url)
        return self.dashboard.url

    def _reap_loop(self) -> None:
        cfg = self.config
        period = min(cfg.node_ttl_s, cfg.lease_ttl_s, cfg.grant_ttl_s) / 4
        while not self._stop.wait(period):
            try:
                done = self.master.reap()
                if done.get("nodes"):
                    log.warning("dropped %d silent node(s)", done["nodes"])
            except Exception:  # noqa: BLE001 - the reaper must outlive one bad round
                log.exception("reap failed")

    def wait(self) -> None:
        self.server.wait_for_termination()

    def stop(self, grace: float = 2.0) -> None:
        self._stop.set()
        self.health.enter_graceful_shutdown()
        if self.dashboard is not None:
            self.dashboard.stop()
        self.server.stop(grace).wait()
        self.servicer.close()
        if self.metadata is not None:
            self.metadata.close()
