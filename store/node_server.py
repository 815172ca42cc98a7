"""The storage-node process: `StorageNode` behind NodeService (gRPC control + data) and the raw TCP data channel.

    master ──Demote/Promote/Drop (gRPC)──▶ NodeServicer ──▶ StorageNode (DramArena + SsdFile)
    remote client ──TCP data channel──▶ NodeDataHandler ─┘   (token-checked: writes only inside a grant)
    same-host client ── mmap of the DRAM arena file (advertised path + host id) ── no node code involved

Lifecycle: serve, then register with the master (RegisterNode hands back the token keys; the writes in flight are
cut first, store/write_fence.py), report the objects found on the SSD file (ReportObjects, so a restarted node's
SSD contents are hits again), and heartbeat. A clean stop first asks the master to write this node's DRAM objects
to its SSD (FlushNode, served while the node still answers the master's Demote calls), so the next process
re-adopts them. A heartbeat answered with `reregister` (master restarted on the memory backend, or it dropped us)
or failing repeatedly makes the node register again. Health is SERVING only while registered: a client's health
check means "usable".

Security (PeerAuthFields, TlsFields): with node tokens configured the node presents the first one to the master
and accepts only node credentials for Demote / Promote / Drop (store/auth; Write / Read carry their own grant
tokens); with tls_cert/tls_key it serves gRPC over TLS, and its data channel too unless tls_data_channel is false
(advertised to clients as NodeEndpoint.data_tls).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import node_checks, wire
from kvpool.store.auth import AuthInterceptor, auth_channel
from kvpool.store.config import NodeServerConfig
from kvpool.store.data_channel import DataServer, Extent
from kvpool.store.hostid import host_id
from kvpool.store.node import Drop, StorageNode
from kvpool.store.node_data import NodeDataHandler
from kvpool.store.remote_node import GRPC_OPTIONS
from kvpool.store.tokens import TokenError
from kvpool.store.write_fence import WriteCut
from kvpool.tiers.types import Tier

log = logging.getLogger(__name__)

_REPORT_BATCH = 4096


def _abort_for(context, exc: Exception) -> None:
    if isinstance(exc, WriteCut):
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    if isinstance(exc, TokenError):
        context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
    if isinstance(exc, KeyError):
        context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0] if exc.args else exc))
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


class NodeServicer(pbg.NodeServiceServicer):
    def __init__(self, node: StorageNode, handler: NodeDataHandler) -> None:
        self.node = node
        self.handler = handler

    def _for_me(self, request, context) -> None:
        """A master's call made for another process of this node (it restarted at this address since): refused
        before anything changes, since its offsets are that process's (store/remote_node.py)."""
        if request.incarnation and request.incarnation != self.node.incarnation:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"incarnation: the call was made for node process {request.incarnation}, this is "
                          f"{self.node.incarnation} (the node restarted): nothing done")

    def Write(self, request_iterator, context):
        """Each chunk lands only while its grant holds, as on the data channel (store/write_fence.py)."""
        view, pos, e, landing, fence = None, 0, None, None, self.handler.write_fence
        try:
            for chunk in request_iterator:
                if view is None:
                    e = Extent(chunk.grant_id, chunk.tier, chunk.offset, chunk.size, chunk.expires_unix_ms,
                               chunk.token, chunk.key or bytes(16), chunk.namespace or bytes(16))
                    landing = fence.begin(e.expires_ms)
                    view = self.handler.write_view(e)
                n = len(chunk.data)
                if pos + n > len(view):
                    raise ValueError(f"data: {pos + n} bytes sent for a grant of size {len(view)}")
                with landing.lock:
                    landing.check()
                    view[pos:pos + n] = chunk.data
                pos += n
            if view is None:
                raise ValueError("grant_id: empty write stream")
            if pos != len(view):
                raise ValueError(f"data: {pos} bytes sent for a grant of size {len(view)}")
            with landing.lock:
                landing.check()
                self.handler.write_done(e, view)
        except (TokenError, ValueError, KeyError, WriteCut) as exc:
            _abort_for(context, exc)
        finally:
            if landing is not None:
                fence.end(landing)
        return pb.WriteResponse(written=pos)

    def Read(self, request, context):
        e = Extent(request.lease_id, request.tier, request.offset, request.size, request.expires_unix_ms,
                   request.token, request.key or bytes(16))
        try:
            view = self.handler.read_view(e)
        except (TokenError, ValueError, KeyError) as exc:
            _abort_for(context, exc)
        step = request.chunk_bytes or (1 << 20)
        for pos in range(0, len(view), step):
            yield pb.ReadChunk(data=bytes(view[pos:pos + step]))

    def Demote(self, request, context):
        self._for_me(request, context)
        try:
            moves = wire.moves_from_msg(request)
            node_checks.moves(self.node, moves)
            drops = wire.move_drops_from_msg(request)
            node_checks.drops(self.node, drops, "drops.")
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        reply = pb.MoveResponse()
        reply.ok.extend(self.node.demote(moves, drops))
        return reply

    def Promote(self, request, context):
        self._for_me(request, context)
        try:
            moves = wire.moves_from_msg(request)
            node_checks.moves(self.node, moves)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        reply = pb.MoveResponse()
        reply.ok.extend(self.node.promote(moves))
        return reply

    def Drop(self, request, context):
        self._for_me(request, context)
        try:
            drops = wire.drops_from_msg(request)
            node_checks.drops(self.node, drops)
            removed = wire.removed_keys_from_msg(request)
            node_checks.removed_keys(removed)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        dropped = self.node.drop(drops)
        if request.objects_removed:
            self.node.objects_removed(removed)
        return pb.DropResponse(dropped=dropped)

    def Publish(self, request, context):
        self._for_me(request, context)
        try:
            publication = wire.publication_from_msg(request)
            node_checks.publication(self.node, publication)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.PublishResponse(published=self.node.publish(publication))


class NodeServer:
    def __init__(self, config: NodeServerConfig) -> None:
        self.config = config
        self.node = StorageNode(config)
        self.incarnation = self.node.incarnation
        self.handler = NodeDataHandler(self.node)
        host = config.listen.rsplit(":", 1)[0]
        data_host, data_port = (config.data_listen.rsplit(":", 1) if config.data_listen else (host, "0"))
        tls = config.tls_config()
        serve_tls = tls is not None and bool(tls.cert)
        data_ssl = tls.server_ssl_context() if serve_tls and config.tls_data_channel else None
        self.data_server = DataServer(self.handler, data_host, int(data_port),
                                      idle_timeout_s=config.data_idle_timeout_s,
                                      max_connections=config.data_max_connections, ssl_context=data_ssl)
        auth = config.auth_config()
        interceptors = [AuthInterceptor(config.token_store(), cert_roles=auth.cert_roles)] if auth.enabled else []
        self.server = grpc.server(futures.ThreadPoolExecutor(config.workers, thread_name_prefix="kvpool-node"),
                                  options=GRPC_OPTIONS, interceptors=interceptors)
        pbg.add_NodeServiceServicer_to_server(NodeServicer(self.node, self.handler), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if serve_tls:
            port = self.server.add_secure_port(config.listen, tls.server_credentials())
        else:
            port = self.server.add_insecure_port(config.listen)
        if port == 0:
            raise ValueError(f"listen: cannot bind {config.listen!r}")
        advertise = config.advertise_host or host
        self.address = f"{advertise}:{port}"
        self.data_address = f"{advertise}:{self.data_server.address.rsplit(':', 1)[1]}"
        self._channel = auth_channel(config.master, token=config.peer_token(), tls=tls, options=GRPC_OPTIONS)
        self._master = pbg.MasterServiceStub(self._channel)
        self._stop = threading.Event()
        self._epoch = 0
        self._damaged_reported = 0  # of node.ssd_damaged_headers, told to a master (its ssd_corrupt)
        self.registered = threading.Event()
        self._thread = threading.Thread(target=self._liveness_loop, name="kvpool-heartbeat", daemon=True)

    def node_counts(self) -> dict[str, int]:
        """The node's own counters, its /metrics (kvpool/metrics.py NODE_FAMILIES): the write fence's
        (store/write_fence.py `WriteFence.counts`), the SSD records its data channel sent from the data file and
        the SSD records it found damaged when it read them (0 without an SSD tier)."""
        return {**self.handler.write_fence.counts(), "ssd_reads_from_file": self.handler.file_reads,
                "ssd_corrupt_reads": self.node.ssd_corrupt_reads}

    def endpoint(self) -> pb.NodeEndpoint:
        info = dataclasses.replace(self.node.info(), address=self.address, incarnation=self.incarnation,
                                   reports_ssd=self.node.ssd is not None, write_keys=True)
        return wire.endpoint_from_info(info, host_id=host_id(), data_address=self.data_address,
                                       ssd_path=self.node.ssd_share_path(),
                                       data_tls=self.data_server.ssl_context is not None)

    def start(self) -> "NodeServer":
        self.data_server.start()
        self.server.start()
        self._set_health(False)
        self._thread.start()
        log.info("node %s serving control %s, data %s", self.config.node_id, self.address, self.data_address)
        return self

    def _set_health(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", "kvpool.v1.NodeService"):
            self.health.set(service, status)

    def register(self) -> None:
        """Register, adopt the secret, then report SSD objects so they are hits again."""
        timeout = self.config.rpc_timeout_s
        # A master that lost its index (a restart on the memory backend) no longer has what same-host location
        # caches remember from the last one: they must ask again.
        self.node.objects_removed()
        # after that bump: a writer claiming later sees the new generation and copies nothing (tiers/writer_claims.py)
        claimed = self.node.claimed_ranges()
        # Writes in flight may hold grants of a master that restarted since: they may finish for register_drain_s,
        # the rest are cut before it can place anything here (store/write_fence.py); new writes are refused until
        # the registration's keys are in.
        if cut := self.handler.write_fence.close(self.config.register_drain_s):
            log.warning("node %s: %d write(s) still in flight after %.1f s cut before registering",
                        self.config.node_id, cut, self.config.register_drain_s)
        try:
            reply = self._master.RegisterNode(
                pb.RegisterNodeRequest(node=self.endpoint(), claimed_starts=[start for start, _ in claimed],
                                       claimed_ends=[end for _, end in claimed]), timeout=timeout)
            self.handler.write_key = bytes(reply.write_key)
            self.handler.secret = bytes(reply.token_secret)
        finally:
            self.handler.write_fence.reopen()
        self._epoch = reply.epoch
        self.node.heard_master_time(reply.master_time_us)
        records = self.node.scan_ssd()
        damaged = self.node.ssd_damaged_headers - self._damaged_reported
        adopted = dropped = 0
        # with an SSD at least one call, the last marked: the master places nothing on this node until it
        # (NodeInfo.reports_ssd)
        for i in range(0, max(len(records), 1 if damaged or self.node.ssd is not None else 0), _REPORT_BATCH):
            msg = wire.report_to_msg(self.config.node_id, records[i:i + _REPORT_BATCH])
            msg.corrupt = damaged if i == 0 else 0
            msg.last = i + _REPORT_BATCH >= len(records)
            rep = self._master.ReportObjects(msg, timeout=timeout)
            self._damaged_reported += msg.corrupt
            adopted += rep.adopted
            dropped += rep.dropped
            by_key = {r.key: r for r in records[i:i + _REPORT_BATCH]}
            stale = [Drop(k, Tier.SSD, by_key[k].offset, by_key[k].size) for k in rep.dropped_keys if k in by_key]
            if stale:
                self.node.drop(stale)
        log.info("node %s registered (epoch %d); SSD objects adopted %d, dropped %d", self.config.node_id,
                 self._epoch, adopted, dropped)
        self._set_health(True)
        self.registered.set()

    def _liveness_loop(self) -> None:
        registered = False
        while not self._stop.is_set():
            try:
                if not registered:
                    self.register()
                    registered = True
                else:
                    # scanned right before the call: the master counts on the scan following its last reply
                    claimed = self.node.claimed_ranges()
                    reply = self._master.Heartbeat(
                        pb.HeartbeatRequest(node_id=self.config.node_id, epoch=self._epoch,
                                            claimed_starts=[start for start, _ in claimed],
                                            claimed_ends=[end for _, end in claimed]),
                        timeout=self.config.rpc_timeout_s)
                    self.node.heard_master_time(reply.master_time_us)
                    if reply.reregister:
                        log.warning("master asked node %s to register again", self.config.node_id)
                        registered = False
                        continue
            except grpc.RpcError as exc:
                log.warning("master %s: %s %s", self.config.master, exc.code(), exc.details())
                registered = False
            self._stop.wait(self.config.heartbeat_s)

    def wait(self) -> None:
        self.server.wait_for_termination()

    def flush_to_ssd(self) -> tuple[int, int] | None:
        """Ask the master to copy every object of this node not yet on its SSD there (a clean stop). Returns
        (copied, left), or None when there is nothing to ask (no SSD, not registered) or the master did not answer."""
        if self.node.ssd is None or not self.registered.is_set():
            return None
        try:
            reply = self._master.FlushNode(pb.FlushNodeRequest(node_id=self.config.node_id),
                                           timeout=self.config.stop_flush_s)
        except grpc.RpcError as exc:
            log.warning("node %s: flush before stop failed (%s %s): objects not yet on SSD are lost",
                        self.config.node_id, exc.code(), exc.details())
            return None
        log.info("node %s: %d objects written to SSD before stopping, %d left", self.config.node_id, reply.copied,
                 reply.left)
        return reply.copied, reply.left

    def stop(self, grace: float = 2.0) -> None:
        self._stop.set()
        self.flush_to_ssd()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()
        self.data_server.close()
        self._channel.close()
        self.node.close()
