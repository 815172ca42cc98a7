"""Releaser: the background thread of a PoolClient, talking to the master off every get's path.

    release(lease_id, corrupt_keys)   a get is done with its read lease: the client's next Lookup carries it (`take`,
                                      `give_back`: LookupRequest.release_lease_ids), else one Release after the
                                      linger time; keys read back wrong go at once in a Release of their own (a
                                      linger under way is cut short)
    report_uses(ns, keys)             a get was served from the location cache (kvpool/locations.py): the gets of
                                      one chain within a linger coalesce into one `send_uses(ns, keys, uses)` call,
                                      whose leased Lookup also carries the pending releases
    report_lookup(ns, keys, s)        a lookup was answered from a same-host node's host index: the Lookup the
                                      client would have sent (`send_lookup(ns, keys, s)`) goes within the linger,
                                      its answer unread, so the master counts it as before; False when
                                      MAX_LOOKUPS wait already (the caller then asks the master itself)
    flush_uses(timeout)               the caller's next call must find the master knowing of its cached gets (a
                                      put that may evict, stats): the pending reports go now
    flush_lookups(timeout)            the same, only while a lookup report waits (a get about to ask the master)

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
    MAX_LOOKUPS = 256  # lookup reports waiting at most: a caller past them asks the master itself

    def __init__(self, rpc: MasterRpc, linger_s: float, send_uses=None, send_lookup=None) -> None:
        self._rpc = rpc
        self._linger_s = linger_s
        self._send_uses_to = send_uses
        self._send_lookup_to = send_lookup
        # The reports in the order made, so the master hears of this client's reads in the order they were served:
        # [ns, keys, gets, seq] per chain's gets (more gets of it join the entry until a lookup report is queued
        # after it), ("lookup", ns, keys, s_per_token) per lookup report
        self._uses: list[list | tuple] = []
        self._open: dict[tuple, list] = {}   # (ns, keys) -> that chain's entry the next get joins
        self._seq = 0
        self._last_lookup = 0                # seq of the last lookup report queued
        self._lookups = 0                    # lookup reports queued
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
            entry = self._open.get(k)
            if entry is None or entry[2] >= MAX_USES or entry[3] < self._last_lookup:
                # new, full (it goes as it is), or a lookup was answered after it: a new report counts on
                self._seq += 1
                entry = self._open[k] = [ns, keys, 0, self._seq]
                self._uses.append(entry)
            entry[2] += 1
            if self._idle:
                self._idle = False
                self._cond.notify()

    def report_lookup(self, ns: NsRef, keys: list[bytes], s_per_token: float) -> bool:
        """A lookup of `keys` was answered without the master: send it within the linger time (False, nothing
        queued: MAX_LOOKUPS are waiting, or this releaser has no `send_lookup`)."""
        with self._cond:
            if self._send_lookup_to is None or self._lookups >= self.MAX_LOOKUPS or self._closing:
                return False
            self._seq += 1
            self._last_lookup = self._seq
            self._uses.append(("lookup", ns, keys, s_per_token))
            self._lookups += 1
            if self._idle:
                self._idle = False
                self._cond.notify()
        return True

    def flush_uses(self, timeout: float) -> None:
        """Before a call whose effect depends on what the master knows of this client's gets (a put that may evict,
        stats): send the pending use reports now, from the caller's thread, and wait up to `timeout` for one this
        thread is sending. The master then orders this client's cached gets before its next call, as it would have
        without the cache. Nothing pending (the usual case): returns at once."""
        if not self._uses and not self._sending:
            return
        deadline = time.monotonic() + timeout
        with self._cond:
            uses, self._uses, self._open, self._lookups = self._uses, [], {}, 0
            while self._sending and (left := deadline - time.monotonic()) > 0:
                self._sent.wait(left)
        self._send_uses(uses)

    def flush_lookups(self, timeout: float) -> None:
        """`flush_uses`, only while a lookup report waits (a get that asks the master: its Lookup must reach the
        master after the lookups answered before it; pending use reports alone keep their linger, as before)."""
        if self._lookups:
            self.flush_uses(timeout)

    def _send_uses(self, uses: list) -> None:
        for entry in uses:              # their lookups carry the pending releases
            if isinstance(entry, tuple):    # ("lookup", ns, keys, s_per_token)
                _, ns, keys, s_per_token = entry
                try:
                    self._send_lookup_to(ns, keys, s_per_token)
                except Exception as exc:  # noqa: BLE001 - the lookup was answered; only its count is lost
                    log.warning("report of a lookup answered from the host index failed: %s", exc)
                continue
            ns, keys, gets, _ = entry
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
                if (self._pending or self._uses) and not (self._closing or self._reports or reports):
                    # a lookup may take them meanwhile; only close() or a corrupt report wakes this. Not after
                    # corrupt reports just sent: the rest goes with them (a report queued while this thread was
                    # busy, and taken at the top, used to leave the rest lingering the whole linger time)
                    self._cond.wait(self._linger_s)
                uses, self._uses, self._open, self._lookups = self._uses, [], {}, 0
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
