"""PoolClient: the public pool API (exactly EmbeddedPool's, `kvpool.pool.Pool`) through a master and its nodes.

    put_many:      PutStart (one RPC) ─▶ bytes to each granted extent ─▶ PutCommit (one RPC; xxh3_64 per object)
    get_many_into: Lookup with lease + expect_sizes (one RPC) ─▶ bytes from each location ─▶ Release (not awaited)

The three layers it is built from, each usable on its own:
  kvpool/pool.py       PoolFront: argument checks, namespace, put counters (shared with EmbeddedPool)
  kvpool/rpc.py        MasterRpc: the channel, deadlines, retries of idempotent calls, the fault map
  kvpool/transfer.py   Transfers: same-host arena memcpy or the node's TCP data channel, read verification
`kvpool drain` moves objects with the same `rpc` and `transfers` (public attributes).

Faults: what is left after retries raises PoolUnavailable / PoolTimeout / PoolError; caller mistakes raise
ValueError before anything is sent. A node failing mid-put fails only its keys ("no_space"); a get whose transfer
fails stops at that key (a miss), like a get that hits a missing key.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Sequence

import grpc
import xxhash

from kvpool.pool import PoolFront
from kvpool.proto import kvpool_pb2 as pb
from kvpool.rpc import MasterRpc
from kvpool.store import wire
from kvpool.store.hostid import host_id
from kvpool.store.records import NO_NS, NsRef
from kvpool.tiers.types import Tier
from kvpool.transfer import Transfers

log = logging.getLogger(__name__)


class PoolClient(PoolFront):
    def __init__(self, address: str, *, transport: str = "auto", timeout: float = 10.0, retries: int = 2,
                 max_object_bytes: int = 64 << 20, connect_timeout: float | None = None,
                 verify: str = "remote") -> None:
        """`verify`: which reads are checked against the object's committed xxh3_64 before they count as hits
        (a mismatch is a miss at that key, never returned bytes). "remote" (default): bytes that crossed the data
        channel; "all": also same-host copies out of a mapped arena (costs ~30% of a same-host get: the hash runs
        at memory speed right after the copy); "none"."""
        if not isinstance(address, str) or ":" not in address:
            raise ValueError(f"address must be host:port of a kvpool master, got {address!r}")
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        self.transfers = Transfers(host_id(), transport=transport, timeout=float(timeout), verify=verify)
        super().__init__(max_object_bytes)
        self.address = address
        self.transport = transport
        self.verify = verify
        self.host_id = self.transfers.host_id
        self.rpc = MasterRpc(address, timeout=timeout, retries=retries)
        self._releases: set[grpc.Future] = set()  # lease releases in flight (sent without waiting)
        self._releases_lock = threading.Lock()
        try:
            self.rpc.wait_ready(connect_timeout or self.rpc.timeout)
        except BaseException:
            self.rpc.close()
            raise

    @property
    def timeout(self) -> float:
        return self.rpc.timeout

    @property
    def checksum_failures(self) -> int:
        return self.transfers.checksum_failures

    # ------------------------------------------------------------------ backend of PoolFront

    def _put(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef) -> list[str]:
        digest = _wire_digest(ns)
        req = pb.PutStartRequest(namespace=digest, block_tokens=ns.block_tokens, namespace_label=ns.label,
                                 client_host_id=self.host_id)
        req.keys.extend(bytes(k) for k in keys)
        req.sizes.extend(v.nbytes for v in views)
        reply = self.rpc.call("PutStart", req, what="put_start")
        statuses = [wire.PUT_STATUS_NAME.get(s, "no_space") for s in reply.statuses]
        granted = [i for i, s in enumerate(reply.statuses) if s == pb.STORED]
        grants = wire.grants_of(reply)
        failed: set[int] = set()
        try:
            failed = self.transfers.write(grants, granted, keys, views, digest)
        except BaseException:
            self._abort([reply.grant_ids[i] for i in granted])
            raise
        if failed:
            self._abort([reply.grant_ids[i] for i in failed])
        ok = [i for i in granted if i not in failed]
        if ok:
            commit = pb.PutCommitRequest()
            commit.grant_ids.extend(reply.grant_ids[i] for i in ok)
            commit.checksums.extend(xxhash.xxh3_64_intdigest(views[i]) for i in ok)
            for i, status in zip(ok, self.rpc.call("PutCommit", commit, what="put_commit").statuses):
                if status != pb.COMMITTED:
                    statuses[i] = "no_space"  # the grant expired before the commit: not stored
        for i in failed:
            statuses[i] = "no_space"
        return statuses

    def _lookup(self, keys: Sequence[bytes], ns: NsRef) -> int:
        req = pb.LookupRequest(namespace=_wire_digest(ns), block_tokens=ns.block_tokens, namespace_label=ns.label,
                               lease=False)
        req.keys.extend(bytes(k) for k in keys)
        return self.rpc.call("Lookup", req, retry=True, what="lookup").hits

    def _get_into(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef,
                  tiers_out: list[str] | None) -> int:
        req = pb.LookupRequest(namespace=_wire_digest(ns), block_tokens=ns.block_tokens, namespace_label=ns.label,
                               lease=True, client_host_id=self.host_id)
        req.keys.extend(bytes(k) for k in keys)
        req.expect_sizes.extend(v.nbytes for v in views)
        try:
            reply = self.rpc.call("Lookup", req, retry=True, what="lookup")
        except ValueError as exc:
            msg = str(exc)
            if msg.startswith("expect_sizes["):  # "expect_sizes[i] is X bytes, object has Y" -> the caller's words
                raise ValueError("buffers" + msg[len("expect_sizes"):].replace(" is ", " has ", 1)) from None
            raise
        if not reply.lease_id:
            return 0
        try:
            failed = self.transfers.read(wire.hits_of(reply), range(reply.hits), keys, views)
        finally:
            # Fire and forget: the bytes are already in the caller's buffers, so the caller need not wait a round
            # trip for the master to unpin them (a lost release only delays eviction until the lease expires).
            future = self.rpc.future("Release", pb.ReleaseRequest(lease_ids=[reply.lease_id]))
            with self._releases_lock:
                self._releases.add(future)
            future.add_done_callback(self._release_done)
        filled = min(failed) if failed else reply.hits
        if tiers_out is not None:
            tiers_out.extend(Tier(int(t)).label for t in reply.tiers[:filled])
        return filled

    def _contains(self, keys: Sequence[bytes]) -> list[bool]:
        return list(self.rpc.call("Contains", pb.ContainsRequest(keys=[bytes(k) for k in keys]), retry=True,
                                  what="contains").present)

    def _remove(self, keys: Sequence[bytes]) -> int:
        return self.rpc.call("Remove", pb.RemoveRequest(keys=[bytes(k) for k in keys]), retry=True,
                             what="remove").removed

    def _stats(self) -> dict:
        out = json.loads(self.rpc.call("Stats", pb.StatsRequest(), retry=True, what="stats").json)
        out["client_checksum_failures"] = self.checksum_failures
        return out

    def stats(self) -> dict:
        self._check_open()
        return super().stats()

    def _close(self) -> None:
        with self._releases_lock:
            pending = list(self._releases)
        for future in pending:  # let in-flight releases land, so leases do not linger until they expire
            try:
                future.result(timeout=min(self.timeout, 2.0))
            except (grpc.RpcError, grpc.FutureTimeoutError, grpc.FutureCancelledError):
                pass
        self.transfers.close()
        self.rpc.close()

    # ------------------------------------------------------------------ helpers

    def _release_done(self, future) -> None:
        with self._releases_lock:
            self._releases.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.warning("release of a read lease failed (it expires by itself): %s", future.exception())

    def _abort(self, grant_ids: list[int]) -> None:
        if not grant_ids:
            return
        try:
            self.rpc.call("PutAbort", pb.PutAbortRequest(grant_ids=grant_ids), retry=True, what="put_abort")
        except Exception as exc:  # noqa: BLE001 - the grants expire by themselves
            log.warning("put_abort failed: %s", exc)


def _wire_digest(ns: NsRef) -> bytes:
    """No namespace travels as an empty digest (the master's NO_NS), never as sixteen zero bytes."""
    return b"" if ns is NO_NS else ns.digest


__all__ = ["PoolClient"]
