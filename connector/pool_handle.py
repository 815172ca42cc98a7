"""A pool connection that backs off after a fault: the one place a connector side decides "is the pool usable now".

    get()  -> the open PoolClient, or None while backing off (a dead pool then costs a request nothing)
    warm() -> open now and map + prefault the same-host arenas (`Pool.warm`); never raises: {} on a fault
    fault(exc, where) -> the reason; drops the client and backs off `retry_after_s` unless the fault was one bad
                         block (checksum), which says nothing about the pool's health
    on_fault(reason, where) is called for every fault (connect failures too), so the owner counts it its way.

Reasons (kvpool.metrics.FALLBACK_REASONS): timeout, checksum, unreachable, error. Each reason is logged once per
handle at WARNING, then counted only. Used by both sides of the vLLM connector (each process has its own handle).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from kvpool.errors import PoolDataError, PoolError, PoolTimeout

log = logging.getLogger(__name__)


def fault_reason(exc: BaseException) -> str:
    if isinstance(exc, PoolTimeout):
        return "timeout"
    if isinstance(exc, PoolDataError):
        return "checksum"
    if isinstance(exc, (PoolError, OSError, ConnectionError)):
        return "unreachable"
    return "error"


class PoolHandle:
    def __init__(self, opener: Callable[[], Any], *, address: str, retry_after_s: float,
                 on_fault: Callable[[str, str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._opener = opener
        self._address = address
        self._retry_after_s = retry_after_s
        self._on_fault = on_fault
        self._clock = clock
        self._lock = threading.Lock()
        self._pool = None
        self._retry_at = 0.0
        self._logged: set[str] = set()

    def get(self):
        with self._lock:
            if self._pool is not None:
                return self._pool
            if self._clock() < self._retry_at:
                return None
            try:
                self._pool = self._opener()
                log.info("kvpool connector: pool %s connected", self._address)
                self._logged.discard("unreachable")
            except Exception as exc:  # noqa: BLE001 - any failure to open is a pool fault
                self._retry_at = self._clock() + self._retry_after_s
                self._note(exc, "connect")
            return self._pool

    def fault(self, exc: BaseException, where: str) -> str:
        reason = self._note(exc, where)
        if reason != "checksum":
            with self._lock:
                pool, self._pool = self._pool, None
                self._retry_at = self._clock() + self._retry_after_s
            if pool is not None:
                threading.Thread(target=_close_quietly, args=(pool,), daemon=True).start()
        return reason

    def warm(self, prefault: bool = True) -> dict[str, str]:
        """Open the pool now and have it map (and, with `prefault`, prefault) the same-host nodes' arenas, so the
        first load takes no connect and no page faults, and lookups find the nodes' host indexes: {node id: what
        was done}. A fault is noted like any other ({})."""
        pool = self.get()
        if pool is None:
            return {}
        try:
            report = pool.warm(prefault=prefault)
        except Exception as exc:  # noqa: BLE001 - a pool fault must never reach the engine
            self.fault(exc, "warm")
            return {}
        if report:
            log.info("kvpool connector: pool %s ready: %s", self._address, report)
        return report

    @property
    def backing_off(self) -> bool:
        with self._lock:
            return self._pool is None and self._clock() < self._retry_at

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            _close_quietly(pool)

    def _note(self, exc: BaseException, where: str) -> str:
        reason = fault_reason(exc)
        self._on_fault(reason, where)
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("kvpool connector: pool %s failed during %s (%s: %s); recomputing, retrying in %.1fs",
                        self._address, where, type(exc).__name__, exc, self._retry_after_s)
        return reason


def _close_quietly(pool) -> None:
    try:
        pool.close()
    except Exception:  # noqa: BLE001 - closing a broken client must not raise
        pass
