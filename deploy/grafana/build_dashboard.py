"""Writes deploy/grafana/kvpool-dashboard.json. The JSON is committed (Grafana provisions it as is); this script is
its source, so a panel is edited here and the file regenerated:  python deploy/grafana/build_dashboard.py

Only documented metric names are queried (README "Operating kvpool" -> "Metrics"); tests/deploy checks every name
in every expression against the registry kvpool/metrics.py builds, and that this script reproduces the file.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("kvpool-dashboard.json")
DS = {"type": "prometheus", "uid": "kvpool-prometheus"}
NS = 'namespace=~"$namespace"'
RI = "$__rate_interval"


def target(expr: str, legend: str, ref: str) -> dict:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def panel(pid: int, title: str, kind: str, grid: tuple[int, int, int, int], targets: list[tuple[str, str]],
          unit: str, description: str, **extra) -> dict:
    x, y, w, h = grid
    p = {
        "id": pid, "type": kind, "title": title, "description": description, "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [target(e, leg, chr(ord("A") + i)) for i, (e, leg) in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
    }
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {"lineWidth": 2, "fillOpacity": 10, "showPoints": "never",
                                                  "spanNulls": False}
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom"},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    if kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "textMode": "auto"}
    if kind == "bargauge":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True}
        p["fieldConfig"]["defaults"].update({"min": 0, "max": 1, "thresholds": {"mode": "absolute", "steps": [
            {"color": "green", "value": None}, {"color": "orange", "value": 0.85}, {"color": "red", "value": 0.97}]}})
    for key, value in extra.items():
        if key == "defaults":
            p["fieldConfig"]["defaults"].update(value)
        else:
            p[key] = value
    return p


def row(pid: int, title: str, y: int) -> dict:
    return {"id": pid, "type": "row", "title": title, "collapsed": False, "panels": [],
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}}


def build() -> dict:
    hit_rate_all = (f"sum(rate(kvpool_hit_tokens_total{{{NS}}}[{RI}])) / "
                    f"sum(rate(kvpool_requested_tokens_total{{{NS}}}[{RI}]))")
    panels = [
        row(100, "Does the pool pay off?", 0),
        panel(1, "Token hit rate", "stat", (0, 1, 6, 5), [(hit_rate_all, "hit rate")], "percentunit",
              "Hit tokens / requested tokens over the rate interval, all tiers.", defaults={"min": 0, "max": 1}),
        panel(2, "Requested tokens / s", "stat", (6, 1, 6, 5),
              [(f"sum(rate(kvpool_requested_tokens_total{{{NS}}}[{RI}]))", "requested")], "short",
              "Tokens asked for by prefix lookups (full blocks)."),
        panel(3, "Storage nodes alive", "stat", (12, 1, 6, 5), [("max(kvpool_nodes_alive)", "nodes")], "none",
              "Nodes registered with the master and heartbeating."),
        panel(4, "Pool used", "stat", (18, 1, 6, 5),
              [("sum(kvpool_tier_bytes) / sum(kvpool_tier_capacity_bytes)", "used")], "percentunit",
              "Bytes held / capacity, every node and tier.", defaults={"min": 0, "max": 1}),
        panel(5, "Token hit rate by tier", "timeseries", (0, 6, 12, 9),
              [(f"sum by (tier) (rate(kvpool_hit_tokens_total{{{NS}}}[{RI}])) / ignoring(tier) group_left "
                f"sum(rate(kvpool_requested_tokens_total{{{NS}}}[{RI}]))", "{{tier}}"),
               (hit_rate_all, "all tiers")], "percentunit",
              "Share of requested tokens served by each tier; the lines add up to the overall hit rate.",
              defaults={"min": 0, "max": 1}),
        panel(6, "Token hit rate by namespace", "timeseries", (12, 6, 12, 9),
              [(f"sum by (namespace) (rate(kvpool_hit_tokens_total{{{NS}}}[{RI}])) / sum by (namespace) "
                f"(rate(kvpool_requested_tokens_total{{{NS}}}[{RI}]))", "{{namespace}}")], "percentunit",
              "Per model/tenant: which workloads reuse prefixes.", defaults={"min": 0, "max": 1}),
        row(101, "Capacity and movement", 15),
        panel(7, "Capacity used by node and tier", "bargauge", (0, 16, 8, 9),
              [("kvpool_tier_bytes / kvpool_tier_capacity_bytes", "{{node}} {{tier}}")], "percentunit",
              "Used / capacity of every tier of every node. DRAM full is normal (it demotes to SSD)."),
        panel(8, "Bytes by tier", "timeseries", (8, 16, 8, 9),
              [("sum by (tier) (kvpool_tier_bytes)", "{{tier}} used"),
               ("sum by (tier) (kvpool_tier_capacity_bytes)", "{{tier}} capacity")], "bytes",
              "Bytes held and capacity per tier, all nodes."),
        panel(9, "Objects by tier", "timeseries", (16, 16, 8, 9),
              [("sum by (tier) (kvpool_tier_objects)", "{{tier}}")], "short", "Committed objects per tier."),
        panel(10, "Evictions, demotions, promotions", "timeseries", (0, 25, 16, 8),
              [(f"sum by (tier) (rate(kvpool_evictions_total[{RI}]))", "evicted from {{tier}}"),
               (f"sum by (tier) (rate(kvpool_demotions_total[{RI}]))", "demoted from {{tier}}"),
               (f"sum by (tier) (rate(kvpool_promotions_total[{RI}]))", "promoted from {{tier}}")], "ops",
              "Objects per second leaving a tier. Sustained SSD evictions mean the pool is too small."),
        panel(11, "Lookups / s and corrupt SSD records", "timeseries", (16, 25, 8, 8),
              [(f"sum(rate(kvpool_lookups_total[{RI}]))", "lookups"),
               (f"sum(rate(kvpool_ssd_corrupt_total[{RI}]))", "corrupt SSD records")], "ops",
              "A corrupt record is served as a miss; any sustained rate points at a failing disk."),
        row(102, "Latency and errors", 33),
        panel(12, "Pool op latency p50 / p99", "timeseries", (0, 34, 12, 8),
              [(f"histogram_quantile(0.5, sum by (le, op) (rate(kvpool_op_seconds_bucket[{RI}])))", "{{op}} p50"),
               (f"histogram_quantile(0.99, sum by (le, op) (rate(kvpool_op_seconds_bucket[{RI}])))", "{{op}} p99")],
              "s", "One batch call of put, get or lookup."),
        panel(13, "RPC errors by method and code, refused writes", "timeseries", (12, 34, 12, 8),
              [(f"sum by (method, code) (rate(kvpool_rpc_errors_total[{RI}]))", "{{method}} {{code}}"),
               (f"sum by (instance) (rate(kvpool_node_writes_cut_total[{RI}]))", "{{instance}} writes cut"),
               (f"sum by (instance) (rate(kvpool_node_writes_late_total[{RI}]))", "{{instance}} writes late")], "ops",
              "RPCs that ended with a non-OK gRPC status; writes a node cut when it registered again (its master "
              "restarted or it lost it a while) or refused at their grant's end (a stalled writer). Both fail the "
              "put, never land a byte late."),
        row(103, "Engines and connector", 42),
        panel(14, "Time to first token p50 / p99", "timeseries", (0, 43, 12, 8),
              [(f"histogram_quantile(0.5, sum by (le, engine) (rate(kvpool_engine_ttft_seconds_bucket[{RI}])))",
                "{{engine}} p50"),
               (f"histogram_quantile(0.99, sum by (le, engine) (rate(kvpool_engine_ttft_seconds_bucket[{RI}])))",
                "{{engine}} p99")], "s", "Request arrival to first token, per engine instance."),
        panel(15, "Connector token hit rate by tier", "timeseries", (12, 43, 12, 8),
              [(f"sum by (tier) (rate(kvpool_connector_hit_tokens_total{{{NS}}}[{RI}])) / ignoring(tier) "
                f"group_left sum(rate(kvpool_connector_requested_tokens_total{{{NS}}}[{RI}]))", "{{tier}}")],
              "percentunit", "Tokens the engines loaded instead of recomputing (after their local prefix cache).",
              defaults={"min": 0, "max": 1}),
        panel(16, "Connector fallbacks by reason", "timeseries", (0, 51, 12, 8),
              [(f"sum by (reason) (rate(kvpool_connector_fallbacks_total[{RI}]))", "{{reason}}")], "ops",
              "Times a connector recomputed instead of loading; the request never fails."),
        panel(17, "Blocks saved / dropped by connectors", "timeseries", (12, 51, 12, 8),
              [(f"sum(rate(kvpool_connector_saved_blocks_total[{RI}]))", "saved"),
               (f"sum(rate(kvpool_connector_save_dropped_total[{RI}]))", "dropped (save queue full)")], "ops",
              "Dropped saves mean the pool cannot keep up with prefill."),
        row(104, "Tenants (authentication on or quotas configured)", 59),
        panel(18, "Tenant bytes / total quota", "bargauge", (0, 60, 8, 8),
              [('sum by (tenant) (kvpool_tenant_bytes) / on(tenant) kvpool_tenant_quota_bytes{kind="total"}',
                "{{tenant}}")], "percentunit", "Bytes a tenant holds against its total quota (tenants with one)."),
        panel(19, "Token hit rate by tenant", "timeseries", (8, 60, 8, 8),
              [(f"sum by (tenant) (rate(kvpool_tenant_hit_tokens_total[{RI}])) / sum by (tenant) "
                f"(rate(kvpool_tenant_requested_tokens_total[{RI}]))", "{{tenant}}")], "percentunit",
              "Each tenant's own hits (it can only hit its own objects).", defaults={"min": 0, "max": 1}),
        panel(20, "Quota evictions and refused puts by tenant", "timeseries", (16, 60, 8, 8),
              [(f"sum by (tenant) (rate(kvpool_tenant_quota_evictions_total[{RI}]))", "{{tenant}} evicted"),
               (f"sum by (tenant) (rate(kvpool_tenant_no_space_total[{RI}]))", "{{tenant}} no space")], "ops",
              "A tenant at its quota evicts its own coldest objects; no space: nothing of its own could go."),
        row(105, "Removals and returning nodes", 68),
        panel(21, "Removal tombstones and objects of removed nodes", "timeseries", (0, 69, 12, 8),
              [("max(kvpool_tombstones)", "tombstones kept"),
               ("max(kvpool_leaving_objects)", "objects of removed nodes not yet forgotten")], "short",
              "Keys removed and namespaces evicted the master remembers, so a node that was away cannot bring them "
              "back; objects of nodes taken out of the pool, forgotten a chunk at a time."),
        panel(22, "Tombstones folded and SSD records refused", "timeseries", (12, 69, 12, 8),
              [(f"sum(rate(kvpool_tombstones_folded_total[{RI}]))", "folded past max_tombstones"),
               (f"sum(rate(kvpool_records_refused_total[{RI}]))", "SSD records refused")], "ops",
              "Folded: the oldest tombstones merged into time slots by key (a record of a key sharing a slot, written "
              "before it, is refused too: a miss). Refused: records returning nodes reported, written before a "
              "removal of their key."),
    ]
    return {
        "uid": "kvpool-overview",
        "title": "kvpool",
        "description": "Tiered KV-cache pool: token hit rate, capacity, movement, latency, engines.",
        "tags": ["kvpool"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{
            "name": "namespace", "label": "namespace", "type": "query", "datasource": DS,
            "query": {"query": "label_values(kvpool_requested_tokens_total, namespace)", "refId": "ns"},
            "definition": "label_values(kvpool_requested_tokens_total, namespace)",
            "multi": True, "includeAll": True, "allValue": ".*", "refresh": 2, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        }]},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
