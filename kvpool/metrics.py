"""Every Prometheus metric kvpool exports, defined once. Names, types and labels are the table in
docs/internals.md ("Metric names") and README ("Operating kvpool" -> "Metrics"); the Grafana dashboard and
tests/deploy check against what this module registers.

Two kinds of metric, on purpose:
  * Pool state the master already counts (tokens, objects, bytes, capacity, evictions, nodes alive) is exported by
    `PoolStatsCollector`, which reads the master's `PoolStats` at scrape time. One source of truth: /metrics,
    `kvpool stats` and the dashboard can never disagree, and a node that leaves drops its series by itself (a
    labelled Gauge would keep reporting its last value forever).
  * Events only the caller sees (op latency, RPC errors, TTFT, connector fallbacks) are ordinary prometheus_client
    objects in `PoolMetrics` / `EngineMetrics` / `ConnectorMetrics`, incremented where they happen.
  * A storage node's own counts (its write fence's writes cut by a re-registration, drained, refused at their
    deadline: store/write_fence.py; SSD records sent from its data file: store/node_data.py) are read at scrape
    time from `NodeServer.node_counts()` by `NodeCountsCollector`, as the master's stats are.

Every class takes a `registry` so tests use a fresh `CollectorRegistry`; processes pass `prometheus_client.REGISTRY`
or their own. Serve with `render_metrics(registry)` from an existing HTTP server (the dashboard does) or with
`start_metrics_server(port, registry)` in processes that have none (storage nodes).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any, Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, MetricsHandler, generate_latest
from prometheus_client.registry import Collector

from kvpool.store.stats import PoolStats

log = logging.getLogger(__name__)

# 50 us .. 10 s: a same-host DRAM get of a small block is tens of microseconds, an SSD miss path or a remote 2 MiB
# read is milliseconds, a stuck RPC is seconds.
OP_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# 10 ms .. 60 s: a pool hit on a short prompt vs a cold 4K-token prefill on a CPU.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
OPS = ("put", "get", "lookup")
FALLBACK_REASONS = ("unreachable", "timeout", "checksum", "partial_load", "slower_than_recompute", "error")

# name -> (type, labels, help). The single list of stats-derived metric families; PoolStatsCollector emits
# exactly these, and `describe()` announces them even before the first stats arrive.
STATS_FAMILIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "kvpool_requested_tokens": ("counter", ("namespace",), "Tokens asked for by prefix lookups (full blocks)."),
    "kvpool_hit_tokens": ("counter", ("namespace", "tier"), "Requested tokens found in the pool, by serving tier."),
    "kvpool_lookups": ("counter", (), "Prefix lookups answered by the master."),
    "kvpool_prefill_seconds_saved": ("counter", ("namespace",), "Hit tokens times the prefill seconds per token "
                                     "their connector measured: the prefill time pool hits stand for."),
    "kvpool_pinned_objects": ("gauge", (), "Objects holding a live retention hint (a put's pin_s)."),
    "kvpool_pinned_bytes": ("gauge", (), "Payload bytes of objects holding a retention hint."),
    "kvpool_pins_clipped": ("counter", (), "Keys stored unpinned because their tenant was at its pinned-bytes cap."),
    "kvpool_pinned_evictions": ("counter", (), "Pinned objects demoted or evicted because nothing unpinned could "
                                "make room (a pin yields rather than refuse a put)."),
    "kvpool_tenant_pinned_bytes": ("gauge", ("tenant",), "Payload bytes of a tenant's pinned objects."),
    "kvpool_tenant_prefill_seconds_saved": ("counter", ("tenant",), "A tenant's prefill seconds saved."),
    "kvpool_tier_objects": ("gauge", ("node", "tier"), "Committed objects held in a tier of a node."),
    "kvpool_tier_bytes": ("gauge", ("node", "tier"), "Bytes of committed objects held in a tier of a node."),
    "kvpool_tier_capacity_bytes": ("gauge", ("node", "tier"), "Capacity of a tier of a node."),
    "kvpool_evictions": ("counter", ("tier",), "Objects dropped from the pool, by the tier they were dropped from."),
    "kvpool_demotions": ("counter", ("tier",), "Objects moved to a slower tier, by the tier they left."),
    "kvpool_promotions": ("counter", ("tier",), "Objects moved to a faster tier on a hit, by the tier they left."),
    "kvpool_ssd_corrupt": ("counter", (), "SSD records failing header/checksum checks (served as misses)."),
    "kvpool_dram_corrupt": ("counter", (), "DRAM/HBM objects read back changed under their checksum (a late write; "
                                           "forgotten, served as misses)."),
    "kvpool_nodes_alive": ("gauge", (), "Storage nodes registered and heartbeating."),
    "kvpool_leaving_objects": ("gauge", (), "Objects of nodes taken out of the pool that the master has not "
                               "forgotten yet (misses already; 0 once a removal is done)."),
    "kvpool_tombstones": ("gauge", (), "Removal tombstones the master keeps: keys removed and namespaces evicted, so a "
                          "node that was away does not bring them back."),
    "kvpool_tombstones_folded": ("counter", (), "Tombstones folded past max_tombstones (or a tenant key space's past "
                                 "max_tenant_tombstones) into time slots by key: records of a key written before "
                                 "its slot's time are no longer re-adopted."),
    "kvpool_records_refused": ("counter", (), "SSD records a node reported that were written before a removal of their "
                               "key (or the floor): dropped and erased, not re-adopted."),
    "kvpool_tenant_objects": ("gauge", ("tenant",), "Objects a tenant holds (pending writes included)."),
    "kvpool_tenant_bytes": ("gauge", ("tenant", "tier"), "Payload bytes a tenant holds in a tier."),
    "kvpool_tenant_quota_bytes": ("gauge", ("tenant", "kind"), "A tenant's byte quota (kind dram or total); "
                                  "absent = no limit."),
    "kvpool_tenant_requested_tokens": ("counter", ("tenant",), "Tokens a tenant's prefix lookups asked for."),
    "kvpool_tenant_hit_tokens": ("counter", ("tenant", "tier"), "A tenant's requested tokens found, by tier."),
    "kvpool_tenant_quota_evictions": ("counter", ("tenant",), "A tenant's objects evicted to keep it within its "
                                      "quota."),
    "kvpool_tenant_no_space": ("counter", ("tenant",), "A tenant's puts refused for lack of room (its quota, "
                               "or the pool)."),
}


class PoolStatsCollector(Collector):
    """Exports the master's stats at scrape time. `stats_provider` returns the stats dict (`pool.stats()`).

    If the provider raises, the scrape still succeeds with every family empty (Prometheus then marks the series
    stale) instead of failing /metrics for the other metrics of the process.
    """

    def __init__(self, stats_provider: Callable[[], Mapping[str, Any]]):
        self._provider = stats_provider
        self._failing = False

    def describe(self) -> Iterator:
        for name, (kind, labels, doc) in STATS_FAMILIES.items():
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            yield cls(name, doc, labels=labels)

    def collect(self) -> Iterator:
        fams = {name: (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, doc, labels=labels)
                for name, (kind, labels, doc) in STATS_FAMILIES.items()}
        try:
            snap = PoolStats.from_dict(self._provider())
            self._failing = False
        except Exception:  # noqa: BLE001 - a broken provider must not take the other metrics down
            if not self._failing:  # once per outage, not once per scrape
                log.warning("metrics: stats provider failed; pool state families are empty", exc_info=True)
            self._failing = True
            snap = None
        if snap is not None:
            fill_families(fams, snap)
        yield from fams.values()


def fill_families(fams: dict, snap: PoolStats) -> None:
    """Put one snapshot's values into the metric families of STATS_FAMILIES (sorted, so output is stable)."""
    for ns in sorted(snap.namespaces):
        c = snap.namespaces[ns]
        fams["kvpool_requested_tokens"].add_metric([ns], c.requested_tokens)
        for tier in sorted(c.hit_tokens_by_tier):
            fams["kvpool_hit_tokens"].add_metric([ns, tier], c.hit_tokens_by_tier[tier])
    fams["kvpool_lookups"].add_metric([], snap.lookups)
    for ns in sorted(snap.namespaces):
        fams["kvpool_prefill_seconds_saved"].add_metric([ns], snap.namespaces[ns].prefill_seconds_saved)
    fams["kvpool_pinned_objects"].add_metric([], snap.pinned_objects)
    fams["kvpool_pinned_bytes"].add_metric([], snap.pinned_bytes)
    fams["kvpool_pins_clipped"].add_metric([], snap.pins_clipped)
    fams["kvpool_pinned_evictions"].add_metric([], snap.pinned_evictions)
    for node in sorted(snap.nodes):
        for tier in sorted(snap.nodes[node]):
            u = snap.nodes[node][tier]
            fams["kvpool_tier_objects"].add_metric([node, tier], u.objects)
            fams["kvpool_tier_bytes"].add_metric([node, tier], u.bytes)
            fams["kvpool_tier_capacity_bytes"].add_metric([node, tier], u.capacity)
    for name in ("evictions", "demotions", "promotions"):
        for tier, n in sorted(getattr(snap, name).items()):
            fams[f"kvpool_{name}"].add_metric([tier], n)
    fams["kvpool_ssd_corrupt"].add_metric([], snap.ssd_corrupt)
    fams["kvpool_dram_corrupt"].add_metric([], snap.dram_corrupt)
    fams["kvpool_nodes_alive"].add_metric([], snap.nodes_alive)
    fams["kvpool_leaving_objects"].add_metric([], snap.leaving_objects)
    fams["kvpool_tombstones"].add_metric([], snap.tombstones)
    fams["kvpool_tombstones_folded"].add_metric([], snap.tombstones_folded)
    fams["kvpool_records_refused"].add_metric([], snap.records_refused)
    for name in sorted(snap.tenants):
        t = snap.tenants[name]
        fams["kvpool_tenant_objects"].add_metric([name], t.objects)
        for tier, n in sorted(t.bytes_by_tier.items()):
            fams["kvpool_tenant_bytes"].add_metric([name, tier], n)
        for kind, limit in (("dram", t.quota_dram_bytes), ("total", t.quota_total_bytes)):
            if limit:
                fams["kvpool_tenant_quota_bytes"].add_metric([name, kind], limit)
        fams["kvpool_tenant_requested_tokens"].add_metric([name], t.requested_tokens)
        for tier, n in sorted(t.hit_tokens_by_tier.items()):
            fams["kvpool_tenant_hit_tokens"].add_metric([name, tier], n)
        fams["kvpool_tenant_quota_evictions"].add_metric([name], t.quota_evictions)
        fams["kvpool_tenant_no_space"].add_metric([name], t.no_space)
        fams["kvpool_tenant_pinned_bytes"].add_metric([name], t.pinned_bytes)
        fams["kvpool_tenant_prefill_seconds_saved"].add_metric([name], t.prefill_seconds_saved)


# name -> (counts key, help): a storage node's own counters, read at scrape time from `NodeServer.node_counts()`
# (its write fence's `WriteFence.counts()`, its data handler's `file_reads` and its SSD file's `corrupt_reads`) by
# NodeCountsCollector on the node's own /metrics.
NODE_FAMILIES: dict[str, tuple[str, str]] = {
    "kvpool_node_writes_cut": ("cut_writes", "Writes in flight cut because the node registered with its master "
                               "again: nothing of them lands after the cut, their writers' puts fail and retry."),
    "kvpool_node_writes_drained": ("drained_writes", "Writes in flight when the node registered with its master "
                                   "again that finished within its register_drain_s instead of being cut."),
    "kvpool_node_writes_late": ("late_writes", "Writes whose grant ran out with bytes still to come: refused, "
                                "nothing of them counts (a stalled writer)."),
    "kvpool_node_ssd_reads_from_file": ("ssd_reads_from_file", "SSD records sent straight from the node's data "
                                        "file (sendfile) to TCP clients that check the payload themselves: the "
                                        "node checked their headers and neither copied nor hashed them."),
    "kvpool_node_ssd_corrupt_reads": ("ssd_corrupt_reads", "SSD records this node found damaged when it read them "
                                      "(header or payload checksum, a short read, an I/O error): misses. Damage that "
                                      "a checking TCP client finds in a record sent from the file is counted by the "
                                      "master only (kvpool_ssd_corrupt_total counts every case once)."),
}


class NodeCountsCollector(Collector):
    """Exports a storage node's own counters at scrape time; `counts` returns `NodeServer.node_counts()` (a key per
    NODE_FAMILIES entry). A provider that raises leaves the families empty for that scrape (as PoolStatsCollector)."""

    def __init__(self, counts: Callable[[], Mapping[str, int]]):
        self._counts = counts

    def describe(self) -> Iterator:
        for name, (_key, doc) in NODE_FAMILIES.items():
            yield CounterMetricFamily(name, doc)

    def collect(self) -> Iterator:
        try:
            counts = self._counts()
        except Exception:  # noqa: BLE001 - a broken provider must not take the other metrics down
            log.warning("metrics: the node's counts failed; their families are empty", exc_info=True)
            counts = None
        for name, (key, doc) in NODE_FAMILIES.items():
            fam = CounterMetricFamily(name, doc)
            if counts is not None:
                fam.add_metric([], counts[key])
            yield fam


@dataclass(slots=True, frozen=True)
class PoolMetrics:
    """Metrics of the pool's servers and clients that are events, not stats (master, nodes, PoolClient)."""

    registry: CollectorRegistry
    op_seconds: Histogram  # labels: op (put, get, lookup); observe the whole batch call
    rpc_errors: Counter  # labels: method (RPC name), code (grpc.StatusCode name, e.g. INVALID_ARGUMENT)

    @classmethod
    def create(cls, registry: CollectorRegistry,
               stats_provider: Callable[[], Mapping[str, Any]] | None = None,
               node_counts: Callable[[], Mapping[str, int]] | None = None) -> PoolMetrics:
        """Register the event metrics, plus the stats collector when this process owns stats (the master), plus
        the node's own counters when it is a storage node (`node_counts`: its `NodeServer.node_counts`)."""
        if stats_provider is not None:
            registry.register(PoolStatsCollector(stats_provider))
        if node_counts is not None:
            registry.register(NodeCountsCollector(node_counts))
        return cls(
            registry=registry,
            op_seconds=Histogram("kvpool_op_seconds", "Latency of pool operations (one batch call).", ["op"],
                                 buckets=OP_BUCKETS, registry=registry),
            rpc_errors=Counter("kvpool_rpc_errors", "RPCs that ended with a non-OK gRPC status.", ["method", "code"],
                               registry=registry),
        )

    def time_op(self, op: str):
        """`with metrics.time_op("get"): ...` — rejects unknown ops so label values stay the documented set."""
        if op not in OPS:
            raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
        return self.op_seconds.labels(op=op).time()


@dataclass(slots=True, frozen=True)
class EngineMetrics:
    """Metrics of an inference engine process (`kvpool serve`)."""

    registry: CollectorRegistry
    ttft_seconds: Histogram  # labels: engine (the engine's instance name)

    @classmethod
    def create(cls, registry: CollectorRegistry) -> EngineMetrics:
        # The label is `engine`, not `instance`: Prometheus attaches its own `instance` target label to every
        # scraped series and would rename ours to `exported_instance`.
        return cls(registry=registry,
                   ttft_seconds=Histogram("kvpool_engine_ttft_seconds", "Time from request arrival to first token.",
                                          ["engine"], buckets=TTFT_BUCKETS, registry=registry))


@dataclass(slots=True, frozen=True)
class ConnectorMetrics:
    """Metrics of the engine-side connector: what the pool saved this engine, and when it fell back."""

    registry: CollectorRegistry
    requested_tokens: Counter  # labels: namespace
    hit_tokens: Counter  # labels: namespace, tier
    fallbacks: Counter  # labels: reason (FALLBACK_REASONS)
    saved_blocks: Counter
    save_dropped: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ConnectorMetrics:
        return cls(
            registry=registry,
            requested_tokens=Counter("kvpool_connector_requested_tokens", "Prefix tokens the connector asked the "
                                     "pool for (after the engine's local prefix cache).", ["namespace"],
                                     registry=registry),
            hit_tokens=Counter("kvpool_connector_hit_tokens", "Tokens the connector loaded from the pool instead of "
                               "recomputing, by serving tier.", ["namespace", "tier"], registry=registry),
            fallbacks=Counter("kvpool_connector_fallbacks", "Times the connector recomputed instead of loading.",
                              ["reason"], registry=registry),
            saved_blocks=Counter("kvpool_connector_saved_blocks", "Blocks the connector saved to the pool.",
                                 registry=registry),
            save_dropped=Counter("kvpool_connector_save_dropped", "Blocks not saved because the save queue was full.",
                                 registry=registry),
        )

    def fallback(self, reason: str, n: int = 1) -> None:
        if reason not in FALLBACK_REASONS:
            raise ValueError(f"reason must be one of {', '.join(FALLBACK_REASONS)}, got {reason!r}")
        self.fallbacks.labels(reason=reason).inc(n)


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Metric names as a PromQL query spells them (counters with `_total`, histograms by their base name)."""
    names: set[str] = set()
    for fam in registry.collect():
        names.add(fam.name + "_total" if fam.type == "counter" else fam.name)
    return names


def render_metrics(registry: CollectorRegistry) -> tuple[bytes, str]:
    """Prometheus text exposition of `registry`: (body, content type). For servers that route /metrics themselves."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


class MetricsServer:
    """/metrics on its own port, for processes without an HTTP server (storage nodes). Stop it with `stop()`."""

    def __init__(self, httpd: ThreadingHTTPServer, thread: threading.Thread):
        self._httpd = httpd
        self._thread = thread

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def start_metrics_server(port: int, registry: CollectorRegistry, host: str = "127.0.0.1") -> MetricsServer:
    """Serve `registry` at http://host:port/metrics in a daemon thread; port 0 picks a free port."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
    httpd = ThreadingHTTPServer((host, port), MetricsHandler.factory(registry))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="kvpool-metrics", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)
