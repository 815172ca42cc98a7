"""Releaser: the background thread of a PoolClient, talking to the master off every get's path.

    release(lease_id, corrupt_keys)   a get is done with its read lease: the client's next Lookup carries it (`take`,
                                      `give_back`: LookupRequest.release_lease_ids), else one Release after the
                                      linger time; keys read back wrong go at once in a Release of their own (a
                                      linger under way is cut short)
    report_uses(ns, keys)             a get was served from the location cache (kvpool/locations.py): the gets of
                                      one chain within a linger coalesce into one `send_uses(ns, keys, uses)` call,
                                      whose leased Lookup also carries the pending releases
    flush_uses(timeout)               the caller's next call must find the master knowing of its cached gets (a
                                      put that may evict, stats): the pending reports go now

A Release per get cost client and master a request each: ~15% of a 64 KiB x 32 get (bench/pool_remote.py).
Nothing here is awaited by a get: a lost release only delays eviction until the lease expires, a lost report only
costs the master one use of a chain (logged).
"""

from __future__ import annotations

import logging
import threading
import time

from kvpool.proto import kvpool_pb2 as pb
from kvpool.rpc import MasterRpc
from kvpool.store.checks import MAX_USES
from kvpool.store.records import NsRef

log = logging.getLogger(__name__)


class Releaser:
    """One thread per client; `send_uses(ns, keys, uses)` is the client's report call (PoolClient._report_uses)."""

    _MAX_IDS = 1024  # lease ids per Release request

    def __init__(self, rpc: MasterRpc, linger_s: float, send_uses=None) -> None:
        self._rpc = rpc
        self._linger_s = linger_s
        self._send_uses_to = send_uses
        self._uses: dict[tuple, list] = {}   # (ns, keys) -> [ns, keys, gets]
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        self._sent = threading.Condition(lock)      # same lock: a report the thread has finished sending
        self._sending = False
        self._pending: list[int] = []
        self._reports: list[tuple[int, list[bytes]]] = []
        self._closing = False
        self._idle = False
        self._thread = threading.Thread(target=self._run, name="kvpool-release", daemon=True)
        self._thread.start()

    def release(self, lease_id: int, corrupt_keys: list[bytes]) -> None:
        with self._cond:
            if corrupt_keys:
                self._reports.append((lease_id, corrupt_keys))
            else:
                self._pending.append(lease_id)
            if self._idle or corrupt_keys:  # a corrupt report cuts the linger short: it goes now, the rest with it
                self._idle = False
                self._cond.notify()

    def report_uses(self, ns: NsRef, keys: list[bytes]) -> None:
        """One get of the chain `keys` was served without a lookup: report it within the linger time."""
        k = (ns, tuple(keys))
        with self._cond:
            entry = self._uses.get(k)
            if entry is None:
                entry = self._uses[k] = [ns, keys, 0]
            elif entry[2] >= MAX_USES:     # full: it goes as it is, a new report counts on
                self._uses[(k, len(self._uses))] = entry
                entry = self._uses[k] = [ns, keys, 0]
            entry[2] += 1
            if self._idle:
                self._idle = False
                self._cond.notify()

    def flush_uses(self, timeout: float) -> None:
        """Before a call whose effect depends on what the master knows of this client's gets (a put that may evict,
        stats): send the pending use reports now, from the caller's thread, and wait up to `timeout` for one this
        thread is sending. The master then orders this client's cached gets before its next call, as it would have
        without the cache. Nothing pending (the usual case): returns at once."""
        if not self._uses and not self._sending:
            return
        deadline = time.monotonic() + timeout
        with self._cond:
            uses, self._uses = list(self._uses.values()), {}
            while self._sending and (left := deadline - time.monotonic()) > 0:
                self._sent.wait(left)
        self._send_uses(uses)

    def _send_uses(self, uses: list) -> None:
        for ns, keys, gets in uses:     # their lookups carry the pending releases
            try:
                self._send_uses_to(ns, keys, gets)
            except Exception as exc:  # noqa: BLE001 - the gets were served; only their report is lost
                log.warning("report of %d get(s) served from the location cache failed: %s", gets, exc)

    def take(self) -> list[int]:
        """The finished leases, for a lookup to carry (`give_back` them if it was not sent)."""
        with self._cond:
            ids, self._pending = self._pending[:self._MAX_IDS], self._pending[self._MAX_IDS:]
        return ids

    def give_back(self, lease_ids: list[int]) -> None:
        for lease_id in lease_ids:
            self.release(lease_id, [])

    def close(self, timeout: float) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._pending or self._reports or self._uses or self._closing):
                    self._idle = True
                    self._cond.wait()
                reports, self._reports = self._reports, []
            self._send([pb.ReleaseRequest(lease_ids=[lease_id], corrupt_keys=keys) for lease_id, keys in reports])
            with self._cond:
                if (self._pending or self._uses) and not (self._closing or self._reports):
                    # a lookup may take them meanwhile; only close() or a corrupt report wakes this
                    self._cond.wait(self._linger_s)
                uses, self._uses = list(self._uses.values()), {}
                self._sending = bool(uses)
            try:
                self._send_uses(uses)
            finally:
                with self._cond:
                    self._sending = False
                    self._sent.notify_all()
            with self._cond:
                ids, self._pending = self._pending, []
                closing = self._closing
            self._send([pb.ReleaseRequest(lease_ids=ids[i:i + self._MAX_IDS]) for i in range(0, len(ids),
                                                                                               self._MAX_IDS)])
            if closing:
                with self._cond:
                    if not (self._pending or self._reports or self._uses):
                        return

    def _send(self, requests: list) -> None:
        for request in requests:
            try:
                self._rpc.call("Release", request, retry=not request.corrupt_keys, what="release")
            except Exception as exc:  # noqa: BLE001 - leases expire by themselves
                log.warning("release of %d read lease(s) failed (they expire by themselves): %s",
                            len(request.lease_ids), exc)


__all__ = ["Releaser"]
