"""MasterServicer: the kvpool.v1.MasterService handlers over a `Master`, plus what only the server knows about
nodes (their endpoints and the gRPC channels the master reaches them by).

    clients ──PutStart/Lookup/...──▶ MasterServicer ──wire──▶ Master (index, placement, leases)
    nodes   ──RegisterNode/Heartbeat/ReportObjects──▶   │        │ NodeOps
                                                        ▼        ▼
                                   endpoints table   RemoteNodeOps ──Demote/Promote/Drop──▶ node's NodeService

Error mapping (every message names the field; a rejected call changes nothing because `Master` validates before
it mutates): BatchTooLarge and NamespaceTableFull -> RESOURCE_EXHAUSTED, ValueError -> INVALID_ARGUMENT,
KeyError (unknown node) -> NOT_FOUND, TokenError -> PERMISSION_DENIED, RecordingActive (StartRecording) ->
FAILED_PRECONDITION, MetadataUnavailable (Redis down past its fail-over retries, or short of its wait_replicas) ->
UNAVAILABLE. Each refusal is reported to `on_rpc_error(method, code)` when the process exports metrics
(kvpool/services.py wires it); store/ itself knows nothing of Prometheus.

Tenants: with authentication on (store/auth AuthInterceptor in front of this servicer) a CLIENT credential's tenant
is passed to every client call of the Master (`current_identity()`, never a request field); admins and viewers, and
every caller with auth off, use the unscoped space "" (stored keys as given).

Nodes: RegisterNode and DrainNode run one at a time per node id (`_member`), since a removal lets the master's lock
go between its chunks. Why one module of ~400 lines: one short handler per MasterService RPC, each a wire
conversion around one Master call; what is more than that (node endpoints and channels) is the table above.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from typing import Callable

import grpc

from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import checks, wire
from kvpool.store.auth import Role, TokenSource, current_identity
from kvpool.store.index import NamespaceTableFull
from kvpool.store.master import BatchTooLarge, Master, RecordingActive
from kvpool.store.metadata import MetadataUnavailable
from kvpool.store.remote_node import RemoteNodeOps
from kvpool.store.stats import PoolStats
from kvpool.store.tokens import TokenError

log = logging.getLogger(__name__)


def _rpc(method):
    """Run a handler, turning caller mistakes into status codes that name the field (and counting them)."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except (BatchTooLarge, NamespaceTableFull) as exc:
            code, msg = grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
        except TokenError as exc:
            code, msg = grpc.StatusCode.PERMISSION_DENIED, str(exc)
        except ValueError as exc:
            code, msg = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except KeyError as exc:
            code, msg = grpc.StatusCode.NOT_FOUND, str(exc.args[0] if exc.args else exc)
        except MetadataUnavailable as exc:
            code, msg = grpc.StatusCode.UNAVAILABLE, str(exc)
            log.warning("%s -> UNAVAILABLE: %s", name, msg)
        log.info("%s -> %s: %s", name, code.name, msg)
        if self.on_rpc_error is not None:
            self.on_rpc_error(name, code.name)
        context.abort(code, msg)

    return wrapper


class MasterServicer(pbg.MasterServiceServicer):
    def __init__(self, master: Master, *, max_batch_keys: int, list_limit: int, heartbeat_s: float,
                 node_ttl_s: float, node_rpc_timeout_s: float, metadata=None, node_token: TokenSource | None = None,
                 node_tls=None) -> None:
        """`node_token` / `node_tls`: what the master presents when it calls a node (RemoteNodeOps)."""
        self.master = master
        self.max_batch_keys = max_batch_keys
        self.list_limit = list_limit
        self.heartbeat_s = heartbeat_s
        self.node_ttl_s = node_ttl_s
        self.node_rpc_timeout_s = node_rpc_timeout_s
        self._metadata = metadata
        self._grant_ttl_ms = min(int(master.config.grant_ttl_s * 1000), 2**32 - 1)  # PutStart/MigrateStart ttl_ms
        self._endpoints: dict[str, pb.NodeEndpoint] = {}
        self._ops: dict[str, RemoteNodeOps] = {}
        self._drained: dict[str, str] = {}  # node_id -> incarnation that was drained (a new process may rejoin)
        self._lock = threading.Lock()
        # per node id: one RegisterNode or DrainNode at a time, from its checks to the master's answer (a removal lets
        # the master's lock go between its chunks; a registration in the middle would be half undone by it)
        self._membership: dict[str, threading.Lock] = {}
        self._node_token, self._node_tls = node_token, node_tls
        self.security: dict = {}   # how the server is exposed (MasterServer fills it; Stats shows it to admins)
        self.hello = pb.HelloResponse()  # where the control channel listens (MasterServer fills it; Hello adds nodes)
        self.on_rpc_error: Callable[[str, str], None] | None = None
        if metadata is not None and hasattr(metadata, "load_node_endpoints"):
            for node_id, data in metadata.load_node_endpoints().items():
                self._endpoints[node_id] = pb.NodeEndpoint.FromString(data)

    # ---------------------------------------------------------------- helpers
    def endpoint(self, node_id: str) -> pb.NodeEndpoint:
        with self._lock:
            ep = self._endpoints.get(node_id)
        return ep if ep is not None else pb.NodeEndpoint(node_id=node_id)

    def _prefer(self, host_id: str) -> str | None:
        if not host_id:
            return None
        with self._lock:
            local = [node_id for node_id, ep in self._endpoints.items() if ep.host_id == host_id]
            if len(local) == len(self._endpoints):
                return None  # every node is local: let the master spread by free space
        # Among the caller's host's nodes, the one with the most free DRAM (a racy read is fine: it is a hint).
        return max(local, key=self.master.free_dram, default=None)

    @staticmethod
    def _tenant() -> str:
        """The calling client's tenant; "" for admins, viewers, and everyone with auth off."""
        ident = current_identity()
        return ident.tenant if ident is not None and ident.role is Role.CLIENT else ""

    def _check_batch(self, n: int, field: str) -> None:
        if n > self.max_batch_keys:
            raise BatchTooLarge(f"{field}: batch of {n} exceeds max_batch_keys={self.max_batch_keys}")

    # ---------------------------------------------------------------- nodes
    @_rpc
    def RegisterNode(self, request, context):
        ep = request.node
        if len(request.claimed_starts) != len(request.claimed_ends):
            raise ValueError(f"claimed_ends: {len(request.claimed_ends)} entries for {len(request.claimed_starts)} "
                             f"claimed_starts")
        if not ep.node_id:
            raise ValueError("node.node_id: must be a non-empty string")
        if not ep.control_address or not ep.data_address:
            raise ValueError("node.control_address/data_address: a node must advertise both")
        info = wire.info_from_endpoint(ep)
        checks.node_info(info)  # before the channel or endpoint tables change (register_node checks it again)
        with self._member(ep.node_id):
            return self._register(ep, info, context, list(zip(request.claimed_starts, request.claimed_ends)))

    def _register(self, ep, info, context, claimed):
        with self._lock:
            if self._drained.get(ep.node_id) == ep.incarnation:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"node_id {ep.node_id!r} was drained; restart the node process to rejoin")
            old = self._ops.get(ep.node_id)
            if old is not None and old.address == ep.control_address:
                ops, old = old, None  # same node address: keep the channel (a move may be using it right now)
            else:
                ops = self._ops[ep.node_id] = RemoteNodeOps(ep.control_address, self.node_rpc_timeout_s,
                                                            token=self._node_token, tls=self._node_tls)
            self._endpoints[ep.node_id] = pb.NodeEndpoint.FromString(ep.SerializeToString())
        if old is not None:
            old.close()
        # the calls for this process name it: one made for the process before it at this address is refused there
        registered = self.master.register(info, ops.bound(ep.incarnation), claimed=claimed)
        epoch = registered.epoch
        if self._metadata is not None and hasattr(self._metadata, "put_node_endpoint"):
            self._metadata.put_node_endpoint(ep.node_id, ep.SerializeToString())
        log.info("node %s registered (epoch %d, data %s, host %s)", ep.node_id, epoch, ep.data_address, ep.host_id)
        return pb.RegisterNodeResponse(token_secret=self.master.token_secret, write_key=registered.write_key,
                                       node_ttl_s=self.node_ttl_s,
                                       heartbeat_interval_s=self.heartbeat_s, epoch=epoch,
                                       master_time_us=self.master.time_us())

    @_rpc
    def Heartbeat(self, request, context):
        if len(request.claimed_starts) != len(request.claimed_ends):
            raise ValueError(f"claimed_ends: {len(request.claimed_ends)} entries for {len(request.claimed_starts)} "
                             f"claimed_starts")
        reregister, time_us = self.master.heartbeat_stamped(
            request.node_id, request.epoch, claimed=list(zip(request.claimed_starts, request.claimed_ends)))
        return pb.HeartbeatResponse(reregister=reregister, master_time_us=time_us)

    @_rpc
    def ReportObjects(self, request, context):
        records = wire.report_from_msg(request)
        self._check_batch(len(records), "keys")
        return wire.report_reply(self.master.report_objects(request.node_id, records, request.corrupt,
                                                            last=request.last))

    @_rpc
    def DrainNode(self, request, context):
        """The wire name predates the split: this REMOVES the node (its objects become misses). Moving its objects
        first is BeginDrain + Migrate* (`kvpool drain` does both). One at a time with the node's registrations
        (`_member`): its process is refused from before the removal, and a new process of the node waits for the
        removal to end, then registers as a new node."""
        node_id = request.node_id
        with self._member(node_id):
            with self._lock:
                ep = self._endpoints.get(node_id)
                before = self._drained.get(node_id)
                if ep is not None:
                    self._drained[node_id] = ep.incarnation
            try:
                n = self.master.remove_node(node_id)
            finally:
                removed = node_id not in self.master.node_ids()    # also when a later step of the removal failed
                with self._lock:
                    ops = None
                    if removed:
                        ops = self._ops.pop(node_id, None)
                        self._endpoints.pop(node_id, None)
                    elif ep is not None and self._drained.get(node_id) == ep.incarnation:   # nothing changed
                        if before is None:
                            del self._drained[node_id]
                        else:
                            self._drained[node_id] = before
                if ops is not None:
                    ops.close()
        return pb.DrainNodeResponse(objects_dropped=n)

    def _member(self, node_id: str) -> threading.Lock:
        with self._lock:
            return self._membership.setdefault(node_id, threading.Lock())

    @_rpc
    def FlushNode(self, request, context):
        if not request.node_id:
            raise ValueError("node_id: must be a non-empty string")
        remaining = context.time_remaining()
        deadline = 600.0 if remaining is None else max(0.0, min(600.0, remaining - 0.5))
        copied, left = self.master.flush_node(request.node_id, deadline)
        return pb.FlushNodeResponse(copied=copied, left=left)

    # ---------------------------------------------------------------- put
    @_rpc
    def PutStart(self, request, context):
        ns = wire.ns_from_msg(request.namespace, request.block_tokens, request.namespace_label)
        tenant = self._tenant()
        results = self.master.put_start(list(request.keys), list(request.sizes), ns,
                                        prefer_node=self._prefer(request.client_host_id), tenant=tenant,
                                        pin_s=request.pin_s)
        reply = wire.put_start_reply(results, self.endpoint, record_keys=bool(tenant))
        reply.ttl_ms = self._grant_ttl_ms
        return reply

    @_rpc
    def PutCommit(self, request, context):
        self._check_batch(wire.check_columns(request, "grant_ids", "checksums"), "grant_ids")
        ok = self.master.put_commit(list(request.grant_ids), list(request.checksums), tenant=self._tenant())
        reply = pb.PutCommitResponse()
        reply.statuses.extend(pb.COMMITTED if o else pb.EXPIRED for o in ok)
        return reply

    @_rpc
    def PutAbort(self, request, context):
        self._check_batch(len(request.grant_ids), "grant_ids")
        return pb.PutAbortResponse(aborted=self.master.put_abort(list(request.grant_ids), tenant=self._tenant()))

    # ---------------------------------------------------------------- get
    @_rpc
    def Lookup(self, request, context):
        ns = wire.ns_from_msg(request.namespace, request.block_tokens, request.namespace_label)
        expect = list(request.expect_sizes) if len(request.expect_sizes) else None
        result = self.master.lookup(list(request.keys), ns, lease=request.lease, expect_sizes=expect,
                                    tenant=self._tenant(), s_per_token=request.prefill_s_per_token,
                                    mapped_nodes=frozenset(request.mapped_nodes),
                                    release=list(request.release_lease_ids), uses=request.uses or 1,
                                    optimistic=request.optimistic, unpublish_misses=request.unpublish_misses,
                                    index_stale=request.index_stale, count_only=request.count_only,
                                    continued=request.continued)
        return wire.lookup_reply(result, self.endpoint)

    @_rpc
    def Release(self, request, context):
        tenant = self._tenant()
        if len(request.corrupt_keys):
            if len(request.lease_ids) != 1:
                raise ValueError(f"lease_ids: corrupt_keys name the keys of exactly one lease, got "
                                 f"{len(request.lease_ids)} lease ids")
            corrupt = checks.keys(list(request.corrupt_keys), self.max_batch_keys, "corrupt_keys")
            self.master.report_corrupt(request.lease_ids[0], corrupt, tenant=tenant)
        return pb.ReleaseResponse(released=self.master.release(list(request.lease_ids), tenant=tenant))

    def Hello(self, request, context):
        with self._lock:
            nodes = list(self._endpoints.values())
        if not nodes:
            return self.hello
        reply = pb.HelloResponse()
        reply.CopyFrom(self.hello)
        reply.nodes.extend(nodes)
        return reply

    @_rpc
    def Contains(self, request, context):
        reply = pb.ContainsResponse()
        reply.present.extend(self.master.contains(list(request.keys), tenant=self._tenant()))
        return reply

    @_rpc
    def Remove(self, request, context):
        return pb.RemoveResponse(removed=self.master.remove(list(request.keys), tenant=self._tenant()))

    # ---------------------------------------------------------------- admin
    @_rpc
    def List(self, request, context):
        if request.namespace and len(request.namespace) != 16:
            raise ValueError(f"namespace: must be a 16-byte namespace digest, got {len(request.namespace)} bytes")
        if request.start_after and len(request.start_after) != 16:
            raise ValueError(f"start_after: must be a 16-byte key, got {len(request.start_after)} bytes")
        limit = min(request.limit or self.list_limit, self.list_limit)
        records, next_key = self.master.list_objects(bytes(request.namespace), bytes(request.start_after), limit,
                                                     node_id=request.node_id, tenant=request.tenant or None)
        return pb.ListResponse(objects=[wire.object_info(r) for r in records], next_start_after=next_key)

    @_rpc
    def Inspect(self, request, context):
        records = self.master.inspect(list(request.keys))
        reply = pb.InspectResponse()
        reply.found.extend(r is not None for r in records)
        reply.objects.extend(wire.object_info(r) for r in records if r is not None)
        return reply

    @_rpc
    def Evict(self, request, context):
        if request.namespace and len(request.namespace) != 16:
            raise ValueError(f"namespace: must be a 16-byte namespace digest, got {len(request.namespace)} bytes")
        if not request.idle_seconds >= 0:  # also NaN
            raise ValueError(f"idle_seconds: must be >= 0 (0 = any age), got {request.idle_seconds}")
        if request.idle_seconds > checks.MAX_IDLE_S:
            raise ValueError(f"idle_seconds: at most {checks.MAX_IDLE_S:.0f} (13.6 years), got {request.idle_seconds}")
        if request.all:
            if request.namespace or request.idle_seconds:
                raise ValueError("all: evicts everything; give it without namespace or idle_seconds")
            return pb.EvictResponse(evicted=self.master.evict(b"", 0.0))
        if not request.namespace and not request.idle_seconds:
            # proto3 cannot tell an empty request from "everything": that takes all=true, said on purpose
            raise ValueError("namespace, idle_seconds or all: give at least one (all=true evicts every object)")
        # idle_seconds 0 with a namespace = any age: all of that namespace (unleased)
        older = request.idle_seconds if request.idle_seconds else None
        return pb.EvictResponse(evicted=self.master.evict(bytes(request.namespace), older))

    def stats_record(self) -> PoolStats:
        """The master's stats plus what only the server knows (node endpoints); also the dashboard's feed."""
        record = self.master.stats_record()
        known = set(record.nodes)
        with self._lock:
            # Nodes the master dropped (silent past the TTL) are not listed; "connected" is False for a node known
            # from the metadata backend that has not registered with this master process yet.
            record.extra["endpoints"] = {
                n: {"data_address": e.data_address, "control_address": e.control_address, "host_id": e.host_id,
                    "connected": self.master.is_connected(n), "dram_pages": e.dram_pages}
                for n, e in self._endpoints.items() if n in known}
        record.nodes_alive = len(record.nodes)
        if self.security:
            record.extra["security"] = dict(self.security)
        return record

    def stats(self) -> dict:
        return self.stats_record().to_dict()

    @_rpc
    def Stats(self, request, context):
        ident = current_identity()
        if ident is not None and ident.role is Role.CLIENT:  # a tenant sees its own figures, nothing of the others
            return pb.StatsResponse(json=json.dumps(self.master.stats_record(tenant=ident.tenant).to_dict(),
                                                    sort_keys=True))
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
            result = self.master.migrate_next(request.node_id, request.cursor,
                                              request.limit or min(256, self.max_batch_keys), request.max_bytes)
        else:
            result = self.master.migrate_start(list(request.keys))
        reply = wire.migrate_start_reply(result, self.endpoint)
        reply.ttl_ms = self._grant_ttl_ms
        return reply

    @_rpc
    def MigrateCommit(self, request, context):
        self._check_batch(wire.check_columns(request, "move_ids", "checksums"), "move_ids")
        return pb.MigrateCommitResponse(moved=self.master.migrate_commit(list(request.move_ids),
                                                                         list(request.checksums)))

    @_rpc
    def MigrateAbort(self, request, context):
        self._check_batch(len(request.move_ids), "move_ids")
        return pb.MigrateAbortResponse(aborted=self.master.migrate_abort(list(request.move_ids)))

    @_rpc
    def StartRecording(self, request, context):
        from kvpool.store.recorder import DEFAULT_MAX_FILE_BYTES

        max_file_bytes = request.max_file_bytes if request.HasField("max_file_bytes") else DEFAULT_MAX_FILE_BYTES
        try:
            status = self.master.start_recording(request.directory, max_file_bytes=max_file_bytes,
                                                 duration_s=request.duration_s, max_files=request.max_files)
        except RecordingActive as exc:
            log.info("StartRecording -> FAILED_PRECONDITION: %s", exc)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return wire.recording_msg(status)

    @_rpc
    def StopRecording(self, request, context):
        return wire.recording_msg(self.master.stop_recording())

    def close(self) -> None:
        with self._lock:
            ops, self._ops = list(self._ops.values()), {}
        for o in ops:
            o.close()


__all__ = ["MasterServicer"]
