"""The live dashboard: one small HTTP server in a thread, serving the page, its JSON feeds and /metrics.

    GET /                 the page (kvpool/static/index.html + dashboard.js + dashboard.css; no CDN, works offline)
    GET /api/stats        the pool's stats dict as `pool.stats()` returns it (the numbers `kvpool stats --json` prints),
                          plus hit_rate, nodes_alive, active_tiers (PoolStats.derived())
    GET /api/history      ring buffer of sampled points, oldest first; ?since=<unix time>&limit=<n>
    GET /metrics          Prometheus text of `registry`
    GET /health           {"status": "ok"}

A sampler thread calls `stats_provider` every `sample_interval` seconds and turns cumulative counters into rates
over the last `window` samples (one point per sample):

    point = {"t", "hit_rate": {"all", <each active tier>}, "requested_tokens_per_s", "hit_tokens_per_s",
             "lookups_per_s", "stored_per_s"}          (stored = objects stored by puts, when the stats carry it)

Access (authentication on, kvpool/services.py): `authorize(headers)` answers every route but /health: None = let
in, else the reason for a 401 that asks for credentials (`WWW-Authenticate: Basic`, so a browser prompts; the
password is the token, the user name is ignored; scrapers send `Authorization: Bearer <token>`). With an
`ssl_context` the server speaks HTTPS (the master's certificate), so a token never crosses the network in clear.

A hit rate is null when no token was requested in the window (0/0 is not 0%). Counters going backwards (master
restarted) restart the window instead of producing negative rates. Tests pass `sample_interval=None` and a fake
`clock` and call `sample()` themselves, so history is deterministic.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry

from kvpool.metrics import render_metrics
from kvpool.store.stats import PoolStats, counters, rates, went_backwards

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")
_CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                  ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}
MAX_HISTORY_LIMIT = 86_400  # a day of 1 s samples; larger asks are a client bug, not a wish for everything

StatsProvider = Callable[[], Mapping[str, Any]]


class _BadParam(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


class History:
    """Bounded ring of sampled points plus the cumulative counters needed to compute windowed rates."""

    def __init__(self, capacity: int, window: int):
        self._points: collections.deque[dict[str, Any]] = collections.deque(maxlen=capacity)
        # (t, counters) of the last `window` samples + 1, so point i compares against sample i - window.
        self._base: collections.deque[tuple[float, dict[str, Any]]] = collections.deque(maxlen=window + 1)
        self._lock = threading.Lock()
        self.capacity = capacity
        self.window = window

    def add(self, t: float, snap: PoolStats) -> dict[str, Any] | None:
        cur = counters(snap)
        with self._lock:
            if self._base and (t <= self._base[-1][0] or went_backwards(self._base[-1][1], cur)):
                self._base.clear()  # master restarted (or the clock stepped back): start a fresh window
            self._base.append((t, cur))
            if len(self._base) < 2:
                return None
            t0, old = self._base[0]
            point = rates(t0, old, t, cur)
            self._points.append(point)
            return point

    def points(self, since: float | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        with self._lock:
            pts = [p for p in self._points if since is None or p["t"] > since]
        return pts[-limit:] if limit else pts


class DashboardServer:
    """`DashboardServer(pool.stats, registry).start()`; `url` is where the page lives; `stop()` joins threads."""

    def __init__(self, stats_provider: StatsProvider, registry: CollectorRegistry, host: str = "127.0.0.1",
                 port: int = 0, *, sample_interval: float | None = 1.0, window: int = 5, history_points: int = 900,
                 clock: Callable[[], float] = time.time,
                 authorize: Callable[[Mapping[str, str]], str | None] | None = None,
                 ssl_context: ssl.SSLContext | None = None):
        if not callable(stats_provider):
            raise ValueError("stats_provider must be callable and return a stats dict")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
        if sample_interval is not None and not (isinstance(sample_interval, (int, float)) and sample_interval > 0):
            raise ValueError(f"sample_interval must be a positive number of seconds or None, got {sample_interval!r}")
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int (samples), got {window!r}")
        if not isinstance(history_points, int) or history_points < 1:
            raise ValueError(f"history_points must be a positive int, got {history_points!r}")
        self.stats_provider = stats_provider
        self.registry = registry
        self.history = History(history_points, window)
        self._host, self._port = host, port
        self._interval = sample_interval
        self._clock = clock
        self._static = {p.name: (p.read_bytes(), _CONTENT_TYPES[p.suffix])
                        for p in STATIC_DIR.iterdir() if p.suffix in _CONTENT_TYPES}
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._sampler_failing = False
        self._authorize = authorize
        self._ssl_context = ssl_context

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> DashboardServer:
        if self._httpd is not None:
            raise RuntimeError("DashboardServer already started")
        self._httpd = ThreadingHTTPServer((self._host, self._port), _handler_class(self))
        self._httpd.daemon_threads = True
        if self._ssl_context is not None:
            # The handshake runs on the request's own thread (first read), not in the accept loop.
            self._httpd.socket = self._ssl_context.wrap_socket(self._httpd.socket, server_side=True,
                                                               do_handshake_on_connect=False)
        self._threads = [threading.Thread(target=self._httpd.serve_forever, name="kvpool-dashboard", daemon=True)]
        if self._interval is not None:
            self._threads.append(threading.Thread(target=self._sample_loop, name="kvpool-dashboard-sampler",
                                                  daemon=True))
        for t in self._threads:
            t.start()
        log.info("dashboard at %s", self.url)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        for t in self._threads:
            t.join()
        self._threads = []

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("DashboardServer not started")
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{'https' if self._ssl_context is not None else 'http'}://{host}:{self.port}/"

    # -- sampling -------------------------------------------------------------------------------------------------
    def snapshot(self) -> PoolStats:
        return PoolStats.from_dict(self.stats_provider())

    def stats(self) -> dict[str, Any]:
        """What /api/stats answers: the provider's dict, unchanged, plus the derived values."""
        raw = self.stats_provider()
        return {**raw, **PoolStats.from_dict(raw).derived()}

    def sample(self) -> dict[str, Any] | None:
        """Take one sample now; returns the new history point (None for the first sample: no rate yet)."""
        return self.history.add(self._clock(), self.snapshot())

    def _sample_loop(self) -> None:
        assert self._interval is not None
        while not self._stop.is_set():
            try:
                self.sample()
                if self._sampler_failing:
                    log.info("dashboard sampler recovered")
                self._sampler_failing = False
            except Exception:  # noqa: BLE001 - the page must keep serving while the pool is unreachable
                if not self._sampler_failing:  # log the transition once, not every second
                    log.warning("dashboard sampler: stats_provider failed", exc_info=True)
                self._sampler_failing = True
            self._stop.wait(self._interval)

    # -- request handling (called from handler threads) -------------------------------------------------------------
    def handle(self, method: str, raw_path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes, str]:
        parts = urlsplit(raw_path)
        path, query = parts.path, parse_qs(parts.query, keep_blank_values=True)
        if self._authorize is not None and path != "/health":
            refused = self._authorize(headers or {})
            if refused:
                return _json(401, {"error": refused})
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": f"method {method} not allowed; use GET"})
        try:
            if path in ("/", "/index.html"):
                body, ctype = self._static["index.html"]
                return 200, body, ctype
            if path.startswith("/static/") and path[len("/static/"):] in self._static:
                body, ctype = self._static[path[len("/static/"):]]
                return 200, body, ctype
            if path == "/api/stats":
                _only_params(query, ())
                try:
                    stats = self.stats()
                except Exception as e:  # noqa: BLE001 - report, keep serving
                    return _json(503, {"error": f"stats unavailable: {e}"})
                return _json(200, stats)
            if path == "/api/history":
                _only_params(query, ("since", "limit"))
                since = _float_param(query, "since")
                limit = _int_param(query, "limit", 1, MAX_HISTORY_LIMIT)
                return _json(200, {"points": self.history.points(since, limit), "interval": self._interval,
                                   "window": self.history.window})
            if path == "/metrics":
                body, ctype = render_metrics(self.registry)
                return 200, body, ctype
            if path == "/health":
                return _json(200, {"status": "ok"})
        except _BadParam as e:
            return _json(400, {"error": str(e), "param": e.param})
        except Exception as e:  # noqa: BLE001 - answer 500 with the reason instead of dropping the connection
            log.exception("dashboard: %s failed", path)
            return _json(500, {"error": f"{type(e).__name__}: {e}"})
        return _json(404, {"error": f"not found: {path}",
                           "routes": ["/", "/api/stats", "/api/history", "/metrics", "/health"]})


def _json(status: int, payload: Any) -> tuple[int, bytes, str]:
    return status, json.dumps(payload, allow_nan=False).encode(), "application/json"


def _only_params(query: Mapping[str, list[str]], allowed: tuple[str, ...]) -> None:
    for name in query:
        if name not in allowed:
            raise _BadParam(name, f"unknown query parameter; allowed: {', '.join(allowed) or 'none'}")


def _one(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise _BadParam(name, "given more than once")
    return values[0]


def _float_param(query: Mapping[str, list[str]], name: str) -> float | None:
    raw = _one(query, name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise _BadParam(name, f"expected a unix time in seconds, got {raw!r}")
    return value


def _int_param(query: Mapping[str, list[str]], name: str, lo: int, hi: int) -> int | None:
    raw = _one(query, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise _BadParam(name, f"expected an integer in [{lo}, {hi}], got {raw!r}")
    return value


def _handler_class(server: DashboardServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _respond(self, method: str) -> None:
            status, body, ctype = server.handle(method, self.path, self.headers)
            if method not in ("GET", "HEAD"):
                self.close_connection = True  # the request body is not read; do not reuse this connection
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="kvpool", charset="UTF-8"')
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            self._respond("GET")

        def do_HEAD(self) -> None:  # noqa: N802
            self._respond("HEAD")

        def do_POST(self) -> None:  # noqa: N802
            self._respond("POST")

        def log_message(self, fmt: str, *args: Any) -> None:  # per-request lines only at DEBUG
            log.debug("%s " + fmt, self.address_string(), *args)

    return Handler
