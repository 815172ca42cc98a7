"""The master process: a `Master` behind its gRPC server (MasterService + health) and its control channel (the hot
client calls over framed TCP, store/control_channel.py, announced by the Hello RPC; `control_listen: off` for none),
plus its background threads.

    reaper     Master.reap() every min(ttl)/4: expired grants and leases, silent nodes (dropped within
               node_ttl_s even when no client calls in); at once when a call's own reap dropped a node
               (`leaving_wanted`), whose objects it then forgets a chunk at a time
    promoter   Master.promote_pending() whenever a lookup queued slow-tier hits: the copies run here, outside
               the master lock and after the lookup's reply, so neither the client nor the other clients wait
    writer     Master.copy_pending() every write_behind_s (when write_behind is on): DRAM objects copied to their
               reserved SSD extents, outside the lock (store/writebehind.py)
    recorder   while traffic is recorded (record_directory, or the StartRecording RPC): rows to Parquet files,
               outside the lock (store/recorder.py)

`stop()` ends the RPCs first, then the reaper, promoter and writer (a removal's remaining chunks are left:
`Master.closing`), then the recorder, the host feed and the journal, so no thread writes to a closed journal.

With `redis_url` the index is journalled to Redis and the token secret is shared through it, so a restarted or
standby master serves the same objects and the nodes' tokens. Metrics and the dashboard are attached by the
process wiring (kvpool/services.py), which store/ does not know about.

Security (config groups AuthFields, TlsFields): with any token source (or auth_cert_roles) configured, every RPC goes
through store/auth's AuthInterceptor (RegisterNode, which hands out the token secret, needs a node credential) and
the master presents the first node token to nodes; with tls_cert/tls_key it serves TLS (mutual with
tls_require_client_cert). Zero-config stays loopback and open; a master listening beyond loopback without
authentication logs a loud warning at start and `kvpool status` repeats it (stats()["security"]).
"""

from __future__ import annotations

import logging
import secrets
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store.auth import AuthInterceptor
from kvpool.store.auth.client import is_loopback
from kvpool.store.config import MasterServerConfig
from kvpool.store.control_channel import ControlServer
from kvpool.store.erasures import erase_loop
from kvpool.store.master import Master
from kvpool.store.master_servicer import MasterServicer
from kvpool.store.remote_node import GRPC_OPTIONS
from kvpool.store.writebehind import write_behind_loop

log = logging.getLogger(__name__)


class MasterServer:
    """Owns the Master, its gRPC server, and the reaper and promoter threads."""

    def __init__(self, config: MasterServerConfig) -> None:
        self.config = config
        self.metadata = None
        secret = secrets.token_bytes(32)
        if config.redis_url:
            from kvpool.store.redis_metadata import RedisMetadata

            self.metadata = RedisMetadata(config.redis_url, prefix=config.redis_prefix)
            secret = self.metadata.shared_secret()
        config.check_recording()    # an unwritable record_directory stops the start here, before anything binds
        auth = config.auth_config()
        self.tls = config.tls_config()
        self.tokens = config.token_store()   # None: auth off, or client certificates only
        self.master = Master(config, self.metadata, token_secret=secret, quotas=config.quotas(),
                             tenants=self.tokens.tenants() if self.tokens is not None else ())
        self.servicer = MasterServicer(self.master, max_batch_keys=config.max_batch_keys,
                                       list_limit=config.list_limit, heartbeat_s=config.heartbeat_s,
                                       node_ttl_s=config.node_ttl_s, node_rpc_timeout_s=config.node_rpc_timeout_s,
                                       metadata=self.metadata, node_token=config.peer_token(), node_tls=self.tls)
        interceptors = []
        if auth.enabled:
            interceptors.append(AuthInterceptor(self.tokens, cert_roles=auth.cert_roles, on_reject=self._rejected))
        self.server = grpc.server(futures.ThreadPoolExecutor(config.workers, thread_name_prefix="kvpool-master"),
                                  options=GRPC_OPTIONS, interceptors=interceptors)
        pbg.add_MasterServiceServicer_to_server(self.servicer, self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        serve_tls = self.tls is not None and bool(self.tls.cert)
        if serve_tls:
            self.port = self.server.add_secure_port(config.listen, self.tls.server_credentials())
        else:
            self.port = self.server.add_insecure_port(config.listen)
        if self.port == 0:
            raise ValueError(f"listen: cannot bind {config.listen!r}")
        host = config.listen.rsplit(":", 1)[0]
        self.address = f"{host}:{self.port}"
        self.servicer.security = {"auth": auth.enabled, "tls": serve_tls,
                                  "client_certificates": serve_tls and self.tls.require_client_cert,
                                  "loopback_only": is_loopback(self.address)}
        if not auth.enabled and not is_loopback(self.address):
            warning = (f"the master listens on {self.address} (beyond loopback) WITHOUT authentication: anyone who "
                       "can reach it can read every tenant's KV blocks, remove or evict them, and register a node to "
                       "learn the secret that signs every grant. Configure auth_*_tokens (and TLS).")
            self.servicer.security["warning"] = warning
            log.warning("%s\n%s\n%s", "!" * 100, warning, "!" * 100)
        self.control = self._control_server(config, auth, serve_tls, host)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._reap_loop, name="kvpool-reaper", daemon=True),
                         threading.Thread(target=self._promote_loop, name="kvpool-promoter", daemon=True)]
        if config.write_behind:
            self._threads.append(threading.Thread(target=write_behind_loop, args=(self.master, self._stop),
                                                  name="kvpool-writer", daemon=True))
        # a put's SSD erases sent after its answer (store/erasures.py)
        self.master.erase_in_background()
        self._threads.append(threading.Thread(target=erase_loop, args=(self.master, self._stop),
                                              name="kvpool-eraser", daemon=True))

    def _control_server(self, config: MasterServerConfig, auth, serve_tls: bool, host: str) -> ControlServer | None:
        """The control channel beside gRPC (store/control_channel.py), announced by the Hello RPC."""
        if config.control_listen == "off":
            return None
        c_host, c_port = (config.control_listen.rsplit(":", 1) if config.control_listen else (host, "0"))
        instance = secrets.token_bytes(16)
        control = ControlServer(self.servicer, c_host, int(c_port), instance=instance, tokens=self.tokens,
                                auth=auth.enabled, cert_roles=auth.cert_roles,
                                ssl_context=self.tls.server_ssl_context() if serve_tls else None,
                                idle_timeout_s=config.control_idle_timeout_s,
                                max_connections=config.control_max_connections,
                                on_reject=self._control_rejected)
        self.servicer.hello = pb.HelloResponse(control_port=control.port, instance=instance, control_tls=serve_tls)
        return control

    def _control_rejected(self, method: str, code: str) -> None:
        hook = self.servicer.on_rpc_error
        if hook is not None:
            hook(method, code)

    def _rejected(self, method: str, code: grpc.StatusCode) -> None:
        hook = self.servicer.on_rpc_error
        if hook is not None:
            hook(method.rsplit("/", 1)[-1], code.name)

    def start(self) -> "MasterServer":
        self.config.start_recording(self.master)    # record_directory (ValueError naming the field before serving)
        self.server.start()
        if self.control is not None:
            self.control.start()
        for thread in self._threads:
            thread.start()
        for service in ("", "kvpool.v1.MasterService"):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("master serving on %s (metadata: %s)", self.address, self.config.redis_url or "memory")
        return self

    def stats(self) -> dict:
        return self.servicer.stats()

    def _reap_loop(self) -> None:
        cfg = self.config
        period = min(cfg.node_ttl_s, cfg.lease_ttl_s, cfg.grant_ttl_s) / 4
        wanted = self.master.leaving_wanted     # a call's own reap dropped a node: forget its objects now
        while not self._stop.is_set():
            wanted.wait(period)
            if self._stop.is_set():
                break
            try:
                done = self.master.reap()
                if done.get("nodes"):
                    log.warning("dropped %d silent node(s)", done["nodes"])
            except Exception:  # noqa: BLE001 - the reaper must outlive one bad round
                log.exception("reap failed")

    def _promote_loop(self) -> None:
        wanted = self.master.promotion_wanted
        while not self._stop.is_set():
            if not wanted.wait(0.5):
                continue
            try:
                self.master.promote_pending()
            except Exception:  # noqa: BLE001 - promotions are an optimisation: log, keep serving
                log.exception("promotion round failed")

    def wait(self) -> None:
        self.server.wait_for_termination()

    def stop(self, grace: float = 2.0) -> None:
        self._stop.set()
        self.master.leaving_wanted.set()            # wakes the reaper to see the stop
        self.health.enter_graceful_shutdown()
        if self.control is not None:
            self.control.close()
        self.server.stop(grace).wait()
        # The background threads end before what they use is closed (a reaper still forgetting a removed node's
        # objects, or a copy round, would otherwise write to a closed journal). A removal's chunks stop at once;
        # a copy round's node calls end within their deadline.
        self.master.closing.set()
        self.master.erase_wanted.set()              # wakes the eraser to see the stop
        for thread in self._threads:
            if thread.is_alive():
                thread.join(self.config.node_rpc_timeout_s + 5.0)
        self.master.erase_pending()                 # the last puts' erases (one lost is what a failed Drop was)
        self.master.stop_recording()                # the files complete before the process goes
        self.master.host_feed.close()
        self.servicer.close()
        if self.metadata is not None:
            self.metadata.close()


__all__ = ["MasterServer", "MasterServerConfig"]
