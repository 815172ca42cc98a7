"""PoolClient: the public pool API (exactly EmbeddedPool's) through a master and its storage nodes.

    put_many:      PutStart (one RPC) ─▶ bytes to each granted extent ─▶ PutCommit (one RPC; xxh3_64 per object)
    get_many_into: Lookup with lease + expect_sizes (one RPC) ─▶ bytes from each location ─▶ Release

Bytes move one of two ways, chosen per node:
  * same host (node's host_id equals ours and its DRAM arena file is there): map the arena once
    (`DramArena.attach`) and memcpy straight into / out of it. No node code runs.
  * otherwise, or `transport="tcp"`, or an SSD-tier object: the node's raw TCP data channel
    (store/data_channel.py), pipelined per node, `recv_into` the caller's buffer.

Faults: every RPC has a deadline (`timeout`); idempotent calls are retried `retries` times on UNAVAILABLE /
DEADLINE_EXCEEDED. What is left raises PoolUnavailable / PoolTimeout / PoolError; caller mistakes raise ValueError
before anything is sent. A get whose transfer fails stops at that key (a miss), like a get that hits a missing key.
Thread-safe: gRPC stubs are, data connections are pooled per caller, arena maps are shared read-mostly.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Callable, Sequence

import grpc
import xxhash

from kvpool.buffers import as_bytes, as_writable_bytes
from kvpool.errors import PoolError, PoolTimeout, PoolUnavailable
from kvpool.keys import KEY_BYTES, Namespace, check_keys
from kvpool.proto import convert
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store.data_channel import DataClient, Extent
from kvpool.store.hostid import host_id
from kvpool.tiers.types import Tier

log = logging.getLogger(__name__)

_GRPC_OPTIONS = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)]
_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_STATUS = {pb.STORED: "stored", pb.EXISTS: "exists", pb.NO_SPACE: "no_space"}
_NO_NS = bytes(KEY_BYTES)


def _pool_error(exc: grpc.RpcError, what: str) -> Exception:
    code, details = exc.code(), exc.details()
    if code == grpc.StatusCode.UNAVAILABLE:
        return PoolUnavailable(f"{what}: master unavailable: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PoolTimeout(f"{what}: no answer within the deadline")
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return ValueError(details)
    return PoolError(f"{what}: {code.name}: {details}")


class _Route:
    """How to reach one node: its arena mapped here (same host) and/or its data channel."""

    __slots__ = ("node_id", "arena", "data", "data_address")

    def __init__(self, node_id: str, arena, data: DataClient | None, data_address: str) -> None:
        self.node_id, self.arena, self.data, self.data_address = node_id, arena, data, data_address


class PoolClient:
    def __init__(self, address: str, *, transport: str = "auto", timeout: float = 10.0, retries: int = 2,
                 max_object_bytes: int = 64 << 20, connect_timeout: float | None = None,
                 verify: str = "remote") -> None:
        """`verify`: which reads are checked against the object's committed xxh3_64 before they count as hits
        (a mismatch is a miss at that key, never returned bytes). "remote" (default): bytes that crossed the data
        channel; "all": also same-host copies out of a mapped arena (costs ~30% of a same-host get: the hash runs
        at memory speed right after the copy); "none"."""
        if not isinstance(address, str) or ":" not in address:
            raise ValueError(f"address must be host:port of a kvpool master, got {address!r}")
        if transport not in ("auto", "tcp"):
            raise ValueError(f"transport must be 'auto' (shared memory when same host, else TCP) or 'tcp', "
                             f"got {transport!r}")
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        self.address = address
        self.transport = transport
        self.timeout = float(timeout)
        self.retries = retries
        self.max_object_bytes = max_object_bytes
        if verify not in ("remote", "all", "none"):
            raise ValueError(f"verify must be 'remote', 'all' or 'none', got {verify!r}")
        self.verify = verify
        self.checksum_failures = 0
        self.host_id = host_id()
        self._channel = grpc.insecure_channel(address, options=_GRPC_OPTIONS)
        self._master = pbg.MasterServiceStub(self._channel)
        self._routes: dict[tuple[str, str, str], _Route] = {}
        self._routes_lock = threading.Lock()
        self._puts = {"stored": 0, "exists": 0, "no_space": 0}
        self._releases: set[grpc.Future] = set()  # lease releases in flight (sent without waiting)
        self._closed = False
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout or self.timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise PoolUnavailable(f"address: no kvpool master answering at {address} "
                                  f"within {connect_timeout or self.timeout}s") from None

    # ------------------------------------------------------------------ public API

    def put_many(self, keys: Sequence[bytes], buffers: Sequence[Any], *, namespace: Namespace | None = None
                 ) -> list[str]:
        """Store each buffer under its key. One status per key: "stored" | "exists" | "no_space"."""
        self._check_open()
        check_keys(keys, "keys")
        views = self._views(keys, buffers, as_bytes)
        for i, view in enumerate(views):
            if view.nbytes == 0:
                raise ValueError(f"buffers[{i}] is empty; objects must have at least 1 byte")
            if view.nbytes > self.max_object_bytes:
                raise ValueError(f"buffers[{i}] has {view.nbytes} bytes, over max_object_bytes="
                                 f"{self.max_object_bytes}")
        if not keys:
            return []
        digest, block_tokens, label = self._ns(namespace)
        req = pb.PutStartRequest(namespace=digest, block_tokens=block_tokens, namespace_label=label,
                                 client_host_id=self.host_id)
        req.keys.extend(bytes(k) for k in keys)
        req.sizes.extend(v.nbytes for v in views)
        reply = self._call(self._master.PutStart, req, "put_start", retry=False)
        statuses = [_STATUS.get(s, "no_space") for s in reply.statuses]
        granted = [i for i, s in enumerate(reply.statuses) if s == pb.STORED]
        failed: set[int] = set()
        try:
            failed = self._transfer(reply, granted, keys, views, digest, write=True)
        except BaseException:
            self._abort([reply.grant_ids[i] for i in granted])
            raise
        if failed:
            self._abort([reply.grant_ids[i] for i in failed])
        ok = [i for i in granted if i not in failed]
        commit = pb.PutCommitRequest()
        commit.grant_ids.extend(reply.grant_ids[i] for i in ok)
        commit.checksums.extend(xxhash.xxh3_64_intdigest(views[i]) for i in ok)
        committed = self._call(self._master.PutCommit, commit, "put_commit", retry=False).statuses if ok else []
        for i, status in zip(ok, committed):
            if status != pb.COMMITTED:
                statuses[i] = "no_space"  # the grant expired before the commit: not stored
        for i in failed:
            statuses[i] = "no_space"
        for s in statuses:
            self._puts[s] += 1
        return statuses

    def lookup_prefix(self, keys: Sequence[bytes], *, namespace: Namespace | None = None) -> int:
        """Number of leading keys present in any tier (one RPC, no lease)."""
        self._check_open()
        check_keys(keys, "keys")
        if not keys:
            return 0
        digest, block_tokens, label = self._ns(namespace)
        req = pb.LookupRequest(namespace=digest, block_tokens=block_tokens, namespace_label=label, lease=False)
        req.keys.extend(bytes(k) for k in keys)
        return self._call(self._master.Lookup, req, "lookup").hits

    def get_many_into(self, keys: Sequence[bytes], buffers: Sequence[Any], *, namespace: Namespace | None = None,
                      tiers_out: list[str] | None = None) -> int:
        """Fill buffers[i] with object keys[i] in order, stopping at the first miss; returns how many were filled.
        Each buffer must have exactly the object's size (checked by the master for every hit before any copy).
        `tiers_out`, if given, receives the tier label ("dram", "ssd", ...) each filled buffer was read from."""
        self._check_open()
        check_keys(keys, "keys")
        views = self._views(keys, buffers, as_writable_bytes)
        if not keys:
            return 0
        digest, block_tokens, label = self._ns(namespace)
        req = pb.LookupRequest(namespace=digest, block_tokens=block_tokens, namespace_label=label, lease=True,
                               client_host_id=self.host_id)
        req.keys.extend(bytes(k) for k in keys)
        req.expect_sizes.extend(v.nbytes for v in views)
        try:
            reply = self._call(self._master.Lookup, req, "lookup")
        except ValueError as exc:
            msg = str(exc)
            if msg.startswith("expect_sizes["):  # "expect_sizes[i] is X bytes, object has Y" -> the caller's words
                raise ValueError("buffers" + msg[len("expect_sizes"):].replace(" is ", " has ", 1)) from None
            raise
        if not reply.lease_id:
            return 0
        try:
            failed = self._transfer(reply, list(range(reply.hits)), keys, views, _NO_NS, write=False)
        finally:
            # Fire and forget: the bytes are already in the caller's buffers, so the caller need not wait a round
            # trip for the master to unpin them (a lost release only delays eviction until the lease expires).
            future = self._master.Release.future(pb.ReleaseRequest(lease_ids=[reply.lease_id]), timeout=self.timeout)
            with self._routes_lock:
                self._releases.add(future)
            future.add_done_callback(self._release_done)
        filled = min(failed) if failed else reply.hits
        if tiers_out is not None:
            tiers_out.extend(Tier(int(t)).label for t in reply.tiers[:filled])
        return filled

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys, "keys")
        if not keys:
            return []
        return list(self._call(self._master.Contains, pb.ContainsRequest(keys=[bytes(k) for k in keys]),
                               "contains").present)

    def remove_many(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys, "keys")
        if not keys:
            return 0
        return self._call(self._master.Remove, pb.RemoveRequest(keys=[bytes(k) for k in keys]), "remove").removed

    def stats(self) -> dict:
        self._check_open()
        out = json.loads(self._call(self._master.Stats, pb.StatsRequest(), "stats").json)
        out["puts"] = dict(self._puts)
        out["client_checksum_failures"] = self.checksum_failures
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._routes_lock:
            pending = list(self._releases)
        for future in pending:  # let in-flight releases land, so leases do not linger until they expire
            try:
                future.result(timeout=min(self.timeout, 2.0))
            except (grpc.RpcError, grpc.FutureTimeoutError, grpc.FutureCancelledError):
                pass
        with self._routes_lock:
            routes, self._routes = list(self._routes.values()), {}
        for route in routes:
            if route.data is not None:
                route.data.close()
            if route.arena is not None:
                route.arena.close()
        self._channel.close()

    def __enter__(self) -> "PoolClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ data movement

    def _transfer(self, reply, positions: list[int], keys: Sequence[bytes], views: list[memoryview], ns: bytes, *,
                  write: bool) -> set[int]:
        """Move bytes for `positions` (indexes into the reply's columns = into keys); returns the positions that
        failed. Same-host DRAM extents are copied here; everything else goes per node over the data channel."""
        failed: set[int] = set()
        unreachable: list[tuple[_Route, OSError]] = []
        remote: dict[int, list[int]] = {}
        routes = [self._route(ep) for ep in reply.nodes]
        expires = reply.expires_unix_ms
        for i in positions:
            route = routes[reply.node_index[i]]
            if route.arena is not None and reply.tiers[i] == Tier.DRAM:
                extent = route.arena.view(reply.offsets[i], reply.sizes[i])
                if write:
                    extent[:] = views[i]
                else:
                    views[i][:] = extent
                    if self.verify == "all":
                        self._check_read(reply, i, keys, views, failed)
            else:
                remote.setdefault(reply.node_index[i], []).append(i)
        for node_index, group in remote.items():
            route = routes[node_index]
            if route.data is None:
                failed.update(group)
                continue
            extents = [Extent(reply.grant_ids[i] if write else reply.lease_id, reply.tiers[i], reply.offsets[i],
                              reply.sizes[i], expires, reply.tokens[i], bytes(keys[i]), ns) for i in group]
            try:
                run = route.data.write_many if write else route.data.read_many_into
                results = run(extents, [views[i] for i in group])
            except OSError as exc:  # includes timeouts: this node's keys fail, the other nodes' go on
                log.warning("node %s (%s) failed during a %s: %s", route.node_id, route.data_address,
                            "write" if write else "read", exc)
                failed.update(group)
                unreachable.append((route, exc))
                continue
            for i, err in zip(group, results):
                if err is not None:
                    log.info("node %s refused %s of key %s: %s", route.node_id, "write" if write else "read",
                             bytes(keys[i]).hex(), err)
                    failed.add(i)
                elif not write and self.verify != "none":
                    self._check_read(reply, i, keys, views, failed)
        if write and unreachable and len(failed) == len(positions):
            # Nothing could be written anywhere: that is an outage, not "no space".
            route, exc = unreachable[0]
            kind = PoolTimeout if isinstance(exc, TimeoutError) else PoolUnavailable
            raise kind(f"node {route.node_id} ({route.data_address}): {exc}") from exc
        return failed

    def _release_done(self, future) -> None:
        with self._routes_lock:
            self._releases.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.warning("release of a read lease failed (it expires by itself): %s", future.exception())

    def _check_read(self, reply, i: int, keys, views, failed: set[int]) -> None:
        if xxhash.xxh3_64_intdigest(views[i]) != reply.checksums[i]:
            self.checksum_failures += 1
            log.warning("key %s: bytes read do not match the committed checksum; served as a miss",
                        bytes(keys[i]).hex())
            failed.add(i)

    def _route(self, ep: pb.NodeEndpoint) -> _Route:
        path = convert.dram_path(ep) if self.transport == "auto" and ep.host_id == self.host_id else ""
        cache_key = (ep.node_id, ep.data_address, path)
        with self._routes_lock:
            route = self._routes.get(cache_key)
            if route is not None:
                return route
        arena = None
        if path and os.path.exists(path):
            from kvpool.tiers.dram import DramArena

            try:
                arena = DramArena.attach(path)
            except (OSError, ValueError) as exc:
                log.info("cannot map %s of node %s, using TCP: %s", path, ep.node_id, exc)
        data = DataClient(ep.data_address, timeout=self.timeout) if ep.data_address else None
        route = _Route(ep.node_id, arena, data, ep.data_address)
        with self._routes_lock:
            existing = self._routes.setdefault(cache_key, route)
        if existing is not route:
            if data is not None:
                data.close()
            if arena is not None:
                arena.close()
        return existing

    # ------------------------------------------------------------------ helpers

    def _call(self, rpc: Callable, request, what: str, *, retry: bool = True):
        attempts = 1 + (self.retries if retry else 0)
        for attempt in range(attempts):
            try:
                return rpc(request, timeout=self.timeout)
            except grpc.RpcError as exc:
                if exc.code() in _RETRY_CODES and attempt + 1 < attempts:
                    time.sleep(min(0.05 * 2 ** attempt, 1.0))
                    continue
                raise _pool_error(exc, what) from None
        raise AssertionError("unreachable")

    def _abort(self, grant_ids: list[int]) -> None:
        if not grant_ids:
            return
        try:
            self._call(self._master.PutAbort, pb.PutAbortRequest(grant_ids=grant_ids), "put_abort")
        except (PoolError, ValueError) as exc:  # the grants expire by themselves
            log.warning("put_abort failed: %s", exc)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("pool is closed")

    @staticmethod
    def _views(keys: Sequence[bytes], buffers: Sequence[Any], conv) -> list[memoryview]:
        if isinstance(buffers, (bytes, bytearray, memoryview)) or not hasattr(buffers, "__len__"):
            raise ValueError(f"buffers must be a sequence of buffers (one per key), got {type(buffers).__name__}")
        if len(buffers) != len(keys):
            raise ValueError(f"buffers has {len(buffers)} entries, keys has {len(keys)}")
        return [conv(b, f"buffers[{i}]") for i, b in enumerate(buffers)]

    @staticmethod
    def _ns(namespace: Namespace | None) -> tuple[bytes, int, str]:
        if namespace is None:
            return b"", 0, ""
        if not isinstance(namespace, Namespace):
            raise ValueError(f"namespace must be a kvpool.Namespace, got {type(namespace).__name__}")
        return namespace.digest, namespace.block_tokens, f"{namespace.model}/{namespace.tenant}"


__all__ = ["PoolClient"]
