"""kvpool/metrics.py and store/stats.py: exact exported values from a fresh registry, the documented name set,
validation of the stats dict, and /metrics over a real HTTP socket."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kvpool.metrics import (ConnectorMetrics, EngineMetrics, PoolMetrics, exported_names, render_metrics,
                            start_metrics_server)
from kvpool import EmbeddedPool, Namespace, block_keys
from kvpool.store.stats import NamespaceCounters, PoolStats, TierUsage

ROOT = Path(__file__).resolve().parents[2]

STATS = {  # the shape kvpool.store.stats.snapshot() returns (+ keys this module ignores)
    "tiers": {"hbm": {"objects": 0, "bytes": 0, "capacity": 0}},
    "nodes": {"node-a": {"dram": {"objects": 3, "bytes": 3072, "capacity": 65536},
                         "ssd": {"objects": 1, "bytes": 1024, "capacity": 1 << 20}},
              "node-b": {"dram": {"objects": 2, "bytes": 2048, "capacity": 65536}}},
    "objects": 6, "lookups": 5, "requested_keys": 6, "hit_keys": 2, "miss_keys": 4,
    "requested_tokens": 96, "hit_tokens": 32, "hit_tokens_by_tier": {"hbm": 0, "dram": 16, "ssd": 16},
    "namespaces": {"smollm2/default": {"requested_tokens": 64, "hit_tokens": 32,
                                       "hit_tokens_by_tier": {"hbm": 0, "dram": 16, "ssd": 16}},
                   "llama/tenant-a": {"requested_tokens": 32, "hit_tokens": 0, "hit_tokens_by_tier": {}}},
    "evictions": {"dram": 0, "ssd": 1}, "demotions": 4, "promotions": 2, "ssd_corrupt": 1,
    "grants_open": 0, "leases_open": 1, "leaving_objects": 7, "tombstones": 12, "tombstones_folded": 3,
    "records_refused": 5,
}


# NodeServer.node_counts()
FENCE = {"cut_writes": 2, "drained_writes": 4, "late_writes": 3, "ssd_reads_from_file": 7, "ssd_corrupt_reads": 1}


def full_registry(provider=lambda: STATS, fence=lambda: FENCE) -> tuple[CollectorRegistry, PoolMetrics,
                                                                         EngineMetrics, ConnectorMetrics]:
    reg = CollectorRegistry()
    return (reg, PoolMetrics.create(reg, provider, node_counts=fence), EngineMetrics.create(reg),
            ConnectorMetrics.create(reg))


def documented_names(path: Path, heading: str) -> set[str]:
    """Metric names from the markdown table under `heading` (a `a` / `b` cell lists two names)."""
    text = path.read_text()
    section = text[text.index(heading):]
    section = section[: section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `kvpool_"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`(kvpool_[a-z_]+)`", first_cell))
    return names


def test_exported_names_are_exactly_the_documented_table():
    reg, *_ = full_registry()
    assert exported_names(reg) == documented_names(ROOT / "docs" / "internals.md", "## Metric names")


def test_readme_metrics_table_lists_every_exported_metric():
    reg, *_ = full_registry()
    assert exported_names(reg) == documented_names(ROOT / "README.md", "### Metrics")


def test_stats_collector_exports_exact_values():
    reg, *_ = full_registry()
    v = reg.get_sample_value
    assert v("kvpool_requested_tokens_total", {"namespace": "smollm2/default"}) == 64
    assert v("kvpool_requested_tokens_total", {"namespace": "llama/tenant-a"}) == 32
    assert v("kvpool_hit_tokens_total", {"namespace": "smollm2/default", "tier": "dram"}) == 16
    assert v("kvpool_hit_tokens_total", {"namespace": "smollm2/default", "tier": "ssd"}) == 16
    assert v("kvpool_hit_tokens_total", {"namespace": "llama/tenant-a", "tier": "dram"}) is None
    assert v("kvpool_lookups_total") == 5
    assert v("kvpool_tier_objects", {"node": "node-a", "tier": "dram"}) == 3
    assert v("kvpool_tier_bytes", {"node": "node-b", "tier": "dram"}) == 2048
    assert v("kvpool_tier_capacity_bytes", {"node": "node-a", "tier": "ssd"}) == 1 << 20
    assert v("kvpool_tier_objects", {"node": "node-b", "tier": "ssd"}) is None
    assert v("kvpool_evictions_total", {"tier": "ssd"}) == 1
    assert v("kvpool_demotions_total", {"tier": "dram"}) == 4
    assert v("kvpool_promotions_total", {"tier": "ssd"}) == 2
    assert v("kvpool_ssd_corrupt_total") == 1
    assert v("kvpool_nodes_alive") == 2
    assert v("kvpool_leaving_objects") == 7
    assert (v("kvpool_tombstones"), v("kvpool_tombstones_folded_total"), v("kvpool_records_refused_total")) == \
        (12, 3, 5)
    body, ctype = render_metrics(reg)
    assert ctype.startswith("text/plain")
    assert b'kvpool_hit_tokens_total{namespace="smollm2/default",tier="ssd"} 16.0\n' in body


def test_node_that_leaves_drops_its_series_and_broken_provider_empties_only_stats():
    state = {"stats": STATS}

    def provider():
        if state["stats"] is None:
            raise ConnectionError("master gone")
        return state["stats"]

    reg, pool, *_ = full_registry(provider)
    pool.rpc_errors.labels(method="Lookup", code="UNAVAILABLE").inc()
    state["stats"] = {**STATS, "nodes": {"node-a": STATS["nodes"]["node-a"]}}
    assert reg.get_sample_value("kvpool_tier_objects", {"node": "node-b", "tier": "dram"}) is None
    assert reg.get_sample_value("kvpool_nodes_alive") == 1
    state["stats"] = None
    assert reg.get_sample_value("kvpool_nodes_alive") is None
    assert reg.get_sample_value("kvpool_rpc_errors_total", {"method": "Lookup", "code": "UNAVAILABLE"}) == 1
    assert "kvpool_nodes_alive" in exported_names(reg)  # families still announced, so Grafana queries resolve


def test_a_node_s_own_counts_are_read_at_scrape_time_and_a_broken_provider_empties_only_them():
    state = {"counts": dict(FENCE)}

    def fence():
        if state["counts"] is None:
            raise RuntimeError("fence gone")
        return state["counts"]

    reg, *_ = full_registry(fence=fence)
    v = reg.get_sample_value
    assert (v("kvpool_node_writes_cut_total"), v("kvpool_node_writes_drained_total"),
            v("kvpool_node_writes_late_total"), v("kvpool_node_ssd_reads_from_file_total"),
            v("kvpool_node_ssd_corrupt_reads_total")) == (2, 4, 3, 7, 1)
    state["counts"] = {"cut_writes": 5, "drained_writes": 6, "late_writes": 3, "ssd_reads_from_file": 9,
                       "ssd_corrupt_reads": 2}
    assert (v("kvpool_node_writes_cut_total"), v("kvpool_node_writes_drained_total"),
            v("kvpool_node_ssd_reads_from_file_total"), v("kvpool_node_ssd_corrupt_reads_total")) == (5, 6, 9, 2)
    state["counts"] = None
    assert v("kvpool_node_writes_cut_total") is None and v("kvpool_node_ssd_reads_from_file_total") is None
    assert v("kvpool_nodes_alive") == 2
    assert {"kvpool_node_writes_cut_total", "kvpool_node_writes_drained_total", "kvpool_node_writes_late_total",
            "kvpool_node_ssd_reads_from_file_total", "kvpool_node_ssd_corrupt_reads_total"} <= exported_names(reg)
    bare = CollectorRegistry()
    PoolMetrics.create(bare)                    # a client's or an engine's: no node families
    assert "kvpool_node_writes_cut_total" not in exported_names(bare)


def test_event_metrics_count_exactly_and_reject_undocumented_labels():
    reg, pool, engine, conn = full_registry()
    with pool.time_op("lookup"):
        pass
    assert reg.get_sample_value("kvpool_op_seconds_count", {"op": "lookup"}) == 1
    assert reg.get_sample_value("kvpool_op_seconds_count", {"op": "get"}) is None
    with pytest.raises(ValueError, match=r"op must be one of put, get, lookup, got 'scan'"):
        pool.time_op("scan")
    engine.ttft_seconds.labels(engine="engine-1").observe(0.3)
    assert reg.get_sample_value("kvpool_engine_ttft_seconds_bucket", {"engine": "engine-1", "le": "0.25"}) == 0
    assert reg.get_sample_value("kvpool_engine_ttft_seconds_bucket", {"engine": "engine-1", "le": "0.5"}) == 1
    conn.fallback("timeout", 3)
    with pytest.raises(ValueError, match=r"reason must be one of unreachable, timeout, checksum, "
                                         r"partial_load, slower_than_recompute, error, got 'oops'"):
        conn.fallback("oops")
    assert reg.get_sample_value("kvpool_connector_fallbacks_total", {"reason": "timeout"}) == 3
    assert reg.get_sample_value("kvpool_connector_fallbacks_total", {"reason": "oops"}) is None
    conn.hit_tokens.labels(namespace="smollm2/default", tier="dram").inc(48)
    conn.saved_blocks.inc(5)
    assert reg.get_sample_value("kvpool_connector_hit_tokens_total",
                                {"namespace": "smollm2/default", "tier": "dram"}) == 48
    assert reg.get_sample_value("kvpool_connector_saved_blocks_total") == 5


def test_snapshot_reads_the_master_shape():
    snap = PoolStats.from_dict(STATS)
    assert (snap.requested_tokens, snap.hit_tokens, snap.hit_rate) == (96, 32, 32 / 96)
    assert snap.nodes_alive == 2  # not in the master's dict: the nodes it lists are the live ones
    assert snap.demotions == {"dram": 4} and snap.promotions == {"ssd": 2}  # ints: the only possible source tier
    assert snap.nodes["node-a"]["ssd"] == TierUsage(objects=1, bytes=1024, capacity=1 << 20)
    assert snap.namespaces["smollm2/default"] == NamespaceCounters(64, {"hbm": 0, "dram": 16, "ssd": 16})
    assert snap.active_tiers() == ["dram", "ssd"]  # hbm has no capacity and no hits: not drawn
    assert snap.derived() == {"hit_rate": 32 / 96, "nodes_alive": 2, "active_tiers": ["dram", "ssd"]}
    empty = {"nodes": {}, "namespaces": {}, "lookups": 0, "requested_tokens": 0, "hit_tokens_by_tier": {}}
    assert PoolStats.from_dict(empty).hit_rate is None  # 0 of 0 tokens is "no data", not 0%


def test_metrics_of_a_real_embedded_pool_equal_its_stats(tmp_path):
    ns = Namespace(model="tiny", fingerprint="f0", kv_dtype="float32", block_tokens=4, num_layers=1,
                   num_kv_heads=1, head_dim=4)
    with EmbeddedPool(dram_bytes=64 * ns.block_bytes, ssd_path=str(tmp_path), ssd_bytes=1 << 20) as pool:
        keys = block_keys(ns, list(range(32)))  # 8 blocks
        assert pool.put_many(keys[:6], [bytes([i]) * ns.block_bytes for i in range(6)], namespace=ns) == \
            ["stored"] * 6
        assert pool.lookup_prefix(keys, namespace=ns) == 6  # 8 blocks asked, 6 hit: 32 tokens asked, 24 hit
        assert pool.lookup_prefix(block_keys(ns, [7] * 16), namespace=ns) == 0  # 16 asked, 0 hit
        reg, *_ = full_registry(pool.stats)
        v = reg.get_sample_value
        assert v("kvpool_requested_tokens_total", {"namespace": "tiny/default"}) == 48
        hits = {t: v("kvpool_hit_tokens_total", {"namespace": "tiny/default", "tier": t}) for t in ("dram", "ssd")}
        assert sum(hits.values()) == 24
        assert hits == {t: float(n) for t, n in pool.stats()["hit_tokens_by_tier"].items() if t in hits}
        assert v("kvpool_lookups_total") == 2
        # DRAM holds 2 (4 KiB extents); the inclusive SSD tier holds all 6: 4 demoted + the copies of the 2
        assert v("kvpool_tier_objects", {"node": "local", "tier": "dram"}) == 2
        assert v("kvpool_tier_objects", {"node": "local", "tier": "ssd"}) == 6
        assert v("kvpool_tier_capacity_bytes", {"node": "local", "tier": "dram"}) == 64 * ns.block_bytes
        assert v("kvpool_tier_capacity_bytes", {"node": "local", "tier": "ssd"}) == 1 << 20
        assert v("kvpool_nodes_alive") == 1


@pytest.mark.parametrize("bad, message", [
    ({"lookups": 1}, r"stats: missing field\(s\) \['nodes', 'namespaces', 'requested_tokens', 'hit_tokens_by_tier'\]"),
    ({"lookups": -1}, r"stats.lookups must be a non-negative int, got -1"),
    ({"lookups": True}, r"stats.lookups must be a non-negative int, got True"),
    ({"evictions": {"nvme": 1}}, r"stats.evictions: unknown tier 'nvme'; expected one of hbm, dram, ssd"),
    ({"demotions": 1.5}, r"stats.demotions must be a non-negative int, got 1.5"),
    ({"nodes": {"n1": {"dram": {"objects": -1}}}}, r"stats.nodes.n1.dram.objects must be a non-negative int, got -1"),
    ({"nodes": {"n1": {"disk": {}}}}, r"stats.nodes.n1: unknown tier 'disk'"),
    ({"nodes": []}, r"stats.nodes must be a mapping, got list"),
    ({"namespaces": {"m/t": {"requested_tokens": 1.5}}},
     r"stats.namespaces.m/t.requested_tokens must be a non-negative int, got 1.5"),
    ({"namespaces": {"m/t": {"hit_tokens_by_tier": {"dram": -2}}}},
     r"stats.namespaces.m/t.hit_tokens_by_tier.dram must be a non-negative int, got -2"),
    ({"puts": {"stored": "3"}}, r"stats.puts.stored must be a non-negative int, got '3'"),
])
def test_snapshot_rejects_bad_stats_naming_the_field(bad, message):
    base = {} if "missing" in message else {k: STATS[k] for k in ("nodes", "namespaces", "lookups",
                                                                     "requested_tokens", "hit_tokens_by_tier")}
    with pytest.raises(ValueError, match=message):
        PoolStats.from_dict({**base, **bad})
    with pytest.raises(ValueError, match=r"stats must be the mapping pool.stats\(\) returns, got list"):
        PoolStats.from_dict([])


def test_metrics_server_serves_registry_over_http():
    reg, *_ = full_registry()
    server = start_metrics_server(0, reg)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            body = r.read().decode()
            assert r.status == 200
        assert 'kvpool_tier_bytes{node="node-a",tier="ssd"} 1024.0' in body.splitlines()
    finally:
        server.stop()
    for bad in (-1, 70000, "80", True):
        with pytest.raises(ValueError, match=r"port must be an int in \[0, 65535\]"):
            start_metrics_server(bad, reg)
