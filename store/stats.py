"""The pool's stats: one typed record (`PoolStats`), how the master counts into it, and every value derived from it.

    master   LookupStats (counted per lookup) + Placement counters + tier usage ──snapshot──▶ PoolStats
    wire     PoolStats.to_dict() as JSON in StatsResponse (the shape `pool.stats()` has always returned)
    readers  PoolStats.from_dict(d) validates (ValueError naming the field) ─▶ hit rates, active tiers,
             windowed rates (`rates`): the ONE derivation that `kvpool stats/status`, the dashboard and /metrics use

Tokens are the unit DESIGN.md measures hit rate in: a hit on a key is `block_tokens` hit tokens; a lookup that did
not say its block size (NsRef.block_tokens == 0) counts keys only. Counters are cumulative since the master started
(readers take differences; a restart resets them). Gauges (objects, bytes, capacity, nodes) are current values.

    hit_rate = sum(hit_tokens_by_tier) / requested_tokens            (None before the first requested token)

Prefill seconds saved (pool-wide, per namespace, per tenant): a hit rate is not a speed-up, so a counting lookup may
carry its connector's measured prefill seconds per token, and its hit tokens times that are added up. Retention
hints (store/retention.py): pinned_objects / pinned_bytes (gauges), pins_clipped / pinned_evictions (counters).
leaving_objects (gauge): objects of nodes taken out of the pool that the master is still forgetting (not in
`objects`). Removal tombstones (store/tombstones.py): tombstones (gauge: removed keys and evicted namespaces
remembered), tombstones_folded (counter: the oldest folded into time slots by key past `max_tombstones`, or a
tenant key space's past `max_tenant_tombstones`), records_refused
(counter: SSD records a node reported that were written before a removal of their key, dropped and erased).

Movements (evictions, demotions, promotions) are counted by the tier the object LEFT. The dict keeps `demotions` and
`promotions` as totals (ints) beside `demotions_by_tier` / `promotions_by_tier`; a dict without the by-tier fields
(an older master) implies DRAM -> SSD demotions and SSD -> DRAM promotions, the only moves a pool without HBM makes.
Keys a reader does not interpret (grants_open, recovered, endpoints, ...) are carried in `extra`.

Tenants (store/tenants.py): with authentication on or quotas configured, `tenants` has one entry per named tenant:
its usage by tier (payload bytes held, pending writes included), its quota, its own token counters and what its
quota did (`quota_evictions`, `quota_demotions`, `no_space`). The dict has no "tenants" key when there are none (auth
off, no quotas: today's shape). A CLIENT calling Stats gets its tenant's VIEW: its own counters, namespaces and
`tenants` entry, no nodes, nothing of other tenants (`PoolStats.tenant_view`).

Why one module of ~440 lines: the record, its counting (LookupStats) and its one derivation belong together, so
every reader derives the same numbers; splitting them would bring back the three derivations this replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from kvpool.tiers.types import Tier

TIER_LABELS: tuple[str, ...] = tuple(t.label for t in Tier)
_REQUIRED = ("nodes", "namespaces", "lookups", "requested_tokens", "hit_tokens_by_tier")
_IMPLIED_SOURCE = {"demotions": "dram", "promotions": "ssd"}
# Keys `to_dict` writes from typed fields (everything else in a dict goes to `extra`).
_TYPED = {"tiers", "nodes", "objects", "lookups", "requested_keys", "hit_keys", "miss_keys", "hit_keys_by_tier",
          "requested_tokens", "hit_tokens", "hit_tokens_by_tier", "namespaces", "evictions", "demotions",
          "promotions", "demotions_by_tier", "promotions_by_tier", "ssd_corrupt", "dram_corrupt", "nodes_alive",
          "puts", "tenants", "prefill_seconds_saved", "pinned_objects", "pinned_bytes", "pins_clipped",
          "pinned_evictions", "leaving_objects", "tombstones", "tombstones_folded", "records_refused"}


def _by_tier() -> dict[str, int]:
    return {label: 0 for label in TIER_LABELS}


# ---------------------------------------------------------------------------------------------- the record


@dataclass(slots=True)
class TierUsage:
    """One tier of one node (gauges)."""

    objects: int = 0
    bytes: int = 0
    capacity: int = 0


@dataclass(slots=True)
class NamespaceCounters:
    """Token counters of one namespace label (cumulative)."""

    requested_tokens: int = 0
    hit_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    prefill_seconds_saved: float = 0.0

    @property
    def hit_tokens(self) -> int:
        return sum(self.hit_tokens_by_tier.values())


@dataclass(slots=True)
class TenantStats:
    """One tenant: usage gauges, quota (0 = none), cumulative counters."""

    objects: int = 0
    bytes_by_tier: dict[str, int] = field(default_factory=dict)
    quota_dram_bytes: int = 0
    quota_total_bytes: int = 0
    lookups: int = 0
    requested_tokens: int = 0
    hit_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    quota_evictions: int = 0
    quota_demotions: int = 0
    no_space: int = 0
    pinned_objects: int = 0         # objects holding a retention hint (store/retention.py), and their payload bytes
    pinned_bytes: int = 0
    prefill_seconds_saved: float = 0.0

    @property
    def bytes(self) -> int:
        return sum(self.bytes_by_tier.values())

    @property
    def hit_tokens(self) -> int:
        return sum(self.hit_tokens_by_tier.values())

    @property
    def hit_rate(self) -> float | None:
        return self.hit_tokens / self.requested_tokens if self.requested_tokens else None

    def to_dict(self) -> dict[str, Any]:
        return {"objects": self.objects, "bytes": self.bytes, "bytes_by_tier": dict(self.bytes_by_tier),
                "quota": {"dram_bytes": self.quota_dram_bytes, "total_bytes": self.quota_total_bytes},
                "lookups": self.lookups, "requested_tokens": self.requested_tokens, "hit_tokens": self.hit_tokens,
                "hit_tokens_by_tier": dict(self.hit_tokens_by_tier), "hit_rate": self.hit_rate,
                "quota_evictions": self.quota_evictions, "quota_demotions": self.quota_demotions,
                "no_space": self.no_space, "pinned_objects": self.pinned_objects, "pinned_bytes": self.pinned_bytes,
                "prefill_seconds_saved": self.prefill_seconds_saved}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "TenantStats":
        d = _mapping(d, where)
        quota = _mapping(d.get("quota", {}), f"{where}.quota")
        return cls(objects=_count(d.get("objects", 0), f"{where}.objects"),
                   bytes_by_tier=_tier_counts(d.get("bytes_by_tier", {}), f"{where}.bytes_by_tier"),
                   quota_dram_bytes=_count(quota.get("dram_bytes", 0), f"{where}.quota.dram_bytes"),
                   quota_total_bytes=_count(quota.get("total_bytes", 0), f"{where}.quota.total_bytes"),
                   **{k: _count(d.get(k, 0), f"{where}.{k}") for k in ("lookups", "requested_tokens",
                                                                        "quota_evictions", "quota_demotions",
                                                                        "no_space", "pinned_objects",
                                                                        "pinned_bytes")},
                   prefill_seconds_saved=_seconds(d.get("prefill_seconds_saved", 0.0),
                                                  f"{where}.prefill_seconds_saved"),
                   hit_tokens_by_tier=_tier_counts(d.get("hit_tokens_by_tier", {}), f"{where}.hit_tokens_by_tier"))


@dataclass(slots=True)
class PoolStats:
    nodes: dict[str, dict[str, TierUsage]] = field(default_factory=dict)
    namespaces: dict[str, NamespaceCounters] = field(default_factory=dict)
    objects: int = 0
    lookups: int = 0
    requested_keys: int = 0
    hit_keys: int = 0
    hit_keys_by_tier: dict[str, int] = field(default_factory=dict)
    requested_tokens: int = 0
    hit_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    evictions: dict[str, int] = field(default_factory=dict)
    demotions: dict[str, int] = field(default_factory=dict)
    promotions: dict[str, int] = field(default_factory=dict)
    ssd_corrupt: int = 0
    dram_corrupt: int = 0                 # DRAM/HBM objects found changed under their checksum (late writes)
    nodes_alive: int | None = None        # None: every listed node (the master lists only live ones)
    puts: dict[str, int] | None = None    # a pool's own put outcomes (EmbeddedPool, PoolClient)
    tenants: dict[str, TenantStats] = field(default_factory=dict)
    prefill_seconds_saved: float = 0.0    # hit tokens x the prefill seconds per token their connector measured
    pinned_objects: int = 0               # retention hints (store/retention.py): objects pinned now, their bytes,
    pinned_bytes: int = 0                 # keys stored unpinned past their tenant's cap, pinned objects that
    pins_clipped: int = 0                 # yielded (demoted or evicted) because nothing unpinned could make room
    pinned_evictions: int = 0
    leaving_objects: int = 0              # objects of removed nodes not forgotten yet (misses already)
    tombstones: int = 0                   # removal tombstones kept (store/tombstones.py), the ones folded into the
    tombstones_folded: int = 0            # floor, and reported SSD records refused as written before a removal
    records_refused: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    # ---- derived values (the one place they are computed)

    @property
    def hit_tokens(self) -> int:
        return sum(self.hit_tokens_by_tier.values())

    @property
    def hit_rate(self) -> float | None:
        """Token hit rate in [0, 1]; None before the first requested token (0 of 0 is not 0%)."""
        return self.hit_tokens / self.requested_tokens if self.requested_tokens else None

    def hit_rate_by_tier(self) -> dict[str, float | None]:
        req = self.requested_tokens
        return {t: (n / req if req else None) for t, n in sorted(self.hit_tokens_by_tier.items())}

    @property
    def alive(self) -> int:
        return len(self.nodes) if self.nodes_alive is None else self.nodes_alive

    @property
    def stored(self) -> int:
        return (self.puts or {}).get("stored", 0)

    def tier_totals(self) -> dict[str, dict[str, int]]:
        totals = {label: {"objects": 0, "bytes": 0, "capacity": 0} for label in TIER_LABELS}
        for tiers in self.nodes.values():
            for tier, u in tiers.items():
                row = totals[tier]
                row["objects"] += u.objects
                row["bytes"] += u.bytes
                row["capacity"] += u.capacity
        return totals

    def active_tiers(self) -> list[str]:
        """Tiers some node has, or that ever served a hit (fastest first) — the tiers worth drawing."""
        present = {t for tiers in self.nodes.values() for t, u in tiers.items() if u.capacity}
        present |= {t for t, n in self.hit_tokens_by_tier.items() if n}
        return [t for t in TIER_LABELS if t in present]

    def derived(self) -> dict[str, Any]:
        """What /api/stats adds to the dict: hit_rate, nodes_alive, active_tiers."""
        return {"hit_rate": self.hit_rate, "nodes_alive": self.alive, "active_tiers": self.active_tiers()}

    def with_hit_rates(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """`raw` (this record's dict) plus the derived values and the TOKEN hit rate of each tier: what
        `kvpool stats|status --json` print."""
        return {**raw, **self.derived(), "hit_tokens": self.hit_tokens, "hit_rate_by_tier": self.hit_rate_by_tier()}

    # ---- the dict (wire and public API shape)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tiers": self.tier_totals(),
            "nodes": {n: {t: {"objects": u.objects, "bytes": u.bytes, "capacity": u.capacity}
                          for t, u in tiers.items()} for n, tiers in self.nodes.items()},
            "objects": self.objects,
            "lookups": self.lookups,
            "requested_keys": self.requested_keys,
            "hit_keys": self.hit_keys,
            "miss_keys": self.requested_keys - self.hit_keys,
            "hit_keys_by_tier": dict(self.hit_keys_by_tier),
            "requested_tokens": self.requested_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_tokens_by_tier": dict(self.hit_tokens_by_tier),
            "namespaces": {label: {"requested_tokens": n.requested_tokens, "hit_tokens": n.hit_tokens,
                                   "hit_tokens_by_tier": dict(n.hit_tokens_by_tier),
                                   "prefill_seconds_saved": n.prefill_seconds_saved}
                           for label, n in self.namespaces.items()},
            "prefill_seconds_saved": self.prefill_seconds_saved,
            "pinned_objects": self.pinned_objects,
            "pinned_bytes": self.pinned_bytes,
            "pins_clipped": self.pins_clipped,
            "pinned_evictions": self.pinned_evictions,
            "leaving_objects": self.leaving_objects,
            "tombstones": self.tombstones,
            "tombstones_folded": self.tombstones_folded,
            "records_refused": self.records_refused,
            "evictions": dict(self.evictions),
            "demotions": sum(self.demotions.values()),
            "promotions": sum(self.promotions.values()),
            "demotions_by_tier": dict(self.demotions),
            "promotions_by_tier": dict(self.promotions),
            "ssd_corrupt": self.ssd_corrupt,
            "dram_corrupt": self.dram_corrupt,
        }
        if self.nodes_alive is not None:
            out["nodes_alive"] = self.nodes_alive
        if self.puts is not None:
            out["puts"] = dict(self.puts)
        if self.tenants:
            out["tenants"] = {name: t.to_dict() for name, t in self.tenants.items()}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: Any) -> "PoolStats":
        """Validate and convert a stats dict; raises ValueError naming the offending field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"stats must be the mapping pool.stats() returns, got {type(d).__name__}")
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(f"stats: missing field(s) {missing}; is this the dict pool.stats() returns?")
        s = cls()
        for node, tiers in _mapping(d["nodes"], "nodes").items():
            row: dict[str, TierUsage] = {}
            for tier, usage in _mapping(tiers, f"nodes.{node}").items():
                where = f"nodes.{node}.{_tier(tier, f'nodes.{node}')}"
                u = _mapping(usage, where)
                row[tier] = TierUsage(*(_count(u.get(k, 0), f"{where}.{k}") for k in ("objects", "bytes", "capacity")))
            s.nodes[str(node)] = row
        for label, c in _mapping(d["namespaces"], "namespaces").items():
            where = f"namespaces.{label}"
            c = _mapping(c, where)
            s.namespaces[str(label)] = NamespaceCounters(
                _count(c.get("requested_tokens", 0), f"{where}.requested_tokens"),
                _tier_counts(c.get("hit_tokens_by_tier", {}), f"{where}.hit_tokens_by_tier"),
                _seconds(c.get("prefill_seconds_saved", 0.0), f"{where}.prefill_seconds_saved"))
        for name in ("objects", "lookups", "requested_tokens", "requested_keys", "hit_keys", "ssd_corrupt",
                     "dram_corrupt", "pinned_objects", "pinned_bytes", "pins_clipped", "pinned_evictions",
                     "leaving_objects", "tombstones", "tombstones_folded", "records_refused"):
            setattr(s, name, _count(d.get(name, 0), name))
        s.prefill_seconds_saved = _seconds(d.get("prefill_seconds_saved", 0.0), "prefill_seconds_saved")
        s.hit_tokens_by_tier = _tier_counts(d["hit_tokens_by_tier"], "hit_tokens_by_tier")
        s.hit_keys_by_tier = _tier_counts(d.get("hit_keys_by_tier", {}), "hit_keys_by_tier")
        s.evictions = _tier_counts(d.get("evictions", {}), "evictions")
        for name, source in _IMPLIED_SOURCE.items():
            if f"{name}_by_tier" in d:
                setattr(s, name, _tier_counts(d[f"{name}_by_tier"], f"{name}_by_tier"))
                continue
            value = d.get(name, 0)
            setattr(s, name, _tier_counts(value, name) if isinstance(value, Mapping)
                    else {source: _count(value, name)})
        s.nodes_alive = _count(d.get("nodes_alive", len(s.nodes)), "nodes_alive")
        if "puts" in d:
            puts = _mapping(d["puts"], "puts")
            s.puts = {str(k): _count(v, f"puts.{k}") for k, v in puts.items()}
        s.tenants = {str(name): TenantStats.from_dict(t, f"tenants.{name}")
                     for name, t in _mapping(d.get("tenants", {}), "tenants").items()}
        s.extra = {k: v for k, v in d.items() if k not in _TYPED}
        return s


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"stats.{where} must be a non-negative int, got {value!r}")
    return value


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"stats.{where} must be a non-negative number of seconds, got {value!r}")
    return float(value)


def _mapping(value: Any, where: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ValueError(f"stats.{where} must be a mapping, got {type(value).__name__}")
    return value


def _tier(tier: Any, where: str) -> str:
    if tier not in TIER_LABELS:
        raise ValueError(f"stats.{where}: unknown tier {tier!r}; expected one of {', '.join(TIER_LABELS)}")
    return tier


def _tier_counts(value: Any, where: str) -> dict[str, int]:
    return {_tier(t, where): _count(n, f"{where}.{t}") for t, n in _mapping(value, where).items()}


# ---------------------------------------------------------------------------------------------- rates over a window

RATE_COUNTERS = ("requested_tokens", "hit_tokens", "lookups", "stored")


def counters(s: PoolStats) -> dict[str, Any]:
    """The cumulative values `rates` compares (kept per sample by the dashboard's history)."""
    c: dict[str, Any] = {name: getattr(s, name) for name in RATE_COUNTERS}
    c["hit_tokens_by_tier"] = dict(s.hit_tokens_by_tier)
    c["tiers"] = s.active_tiers()
    return c


def went_backwards(old: Mapping[str, Any], cur: Mapping[str, Any]) -> bool:
    """A counter decreased: the master restarted, so a window must start afresh (no negative rates)."""
    return any(cur[name] < old[name] for name in RATE_COUNTERS)


def rates(t0: float, old: Mapping[str, Any], t: float, cur: Mapping[str, Any]) -> dict[str, Any]:
    """Rates between two `counters` samples: hit rate overall and per active tier (None when no token was
    requested in the window), and <counter>_per_s for each of RATE_COUNTERS."""
    dt = t - t0
    d_req = cur["requested_tokens"] - old["requested_tokens"]
    hit_rate: dict[str, float | None] = {"all": (cur["hit_tokens"] - old["hit_tokens"]) / d_req if d_req else None}
    for tier in TIER_LABELS:
        if tier in cur["tiers"]:
            d_hit = cur["hit_tokens_by_tier"].get(tier, 0) - old["hit_tokens_by_tier"].get(tier, 0)
            hit_rate[tier] = d_hit / d_req if d_req else None
    point: dict[str, Any] = {"t": t, "hit_rate": hit_rate}
    for name in RATE_COUNTERS:
        point[f"{name}_per_s"] = (cur[name] - old[name]) / dt
    return point


# ---------------------------------------------------------------------------------------------- counting (master)


OTHER_LABEL = "(other)"


@dataclass(slots=True)
class LookupStats:
    """Lookup counters. Namespace labels come from clients, so at most `max_namespaces` are counted apart (each is a
    stats entry and a metric series for the master's lifetime); the first max_namespaces - 1 labels seen keep their
    own entry, every later one is counted under OTHER_LABEL."""

    max_namespaces: int = 256
    lookups: int = 0
    requested_keys: int = 0
    hit_keys: int = 0
    hit_keys_by_tier: dict[str, int] = field(default_factory=_by_tier)
    requested_tokens: int = 0
    hit_tokens_by_tier: dict[str, int] = field(default_factory=_by_tier)
    namespaces: dict[str, NamespaceCounters] = field(default_factory=dict)
    prefill_seconds_saved: float = 0.0

    def count(self, ns, requested: int, hit_tiers: list[int], s_per_token: float = 0.0, times: int = 1) -> None:
        """`s_per_token`: the caller's measured prefill seconds per token (0 = none): its hit tokens times that
        are counted as prefill seconds saved. `times`: this lookup stands for that many identical ones (a client's
        location-cache report, LookupRequest.uses): every figure counts it that many times."""
        self.lookups += times
        requested *= times
        self.requested_keys += requested
        self.hit_keys += len(hit_tiers) * times
        # Hits per tier with one C-level count per tier, not a Python step per hit (a 1,000-key chain per lookup).
        by_tier = [(label, n * times) for t, label in enumerate(TIER_LABELS) if (n := hit_tiers.count(t))] \
            if hit_tiers else ()
        for label, n in by_tier:
            self.hit_keys_by_tier[label] += n
        bt = ns.block_tokens
        if bt <= 0:
            return
        per_ns = self.namespaces.get(ns.label)
        if per_ns is None:
            label = ns.label if len(self.namespaces) < self.max_namespaces - 1 else OTHER_LABEL
            per_ns = self.namespaces.get(label)
            if per_ns is None:
                per_ns = self.namespaces[label] = NamespaceCounters(0, _by_tier())
        self.requested_tokens += requested * bt
        per_ns.requested_tokens += requested * bt
        for label, n in by_tier:
            self.hit_tokens_by_tier[label] += n * bt
            per_ns.hit_tokens_by_tier[label] += n * bt
        if s_per_token and hit_tiers:
            saved = len(hit_tiers) * times * bt * s_per_token
            self.prefill_seconds_saved += saved
            per_ns.prefill_seconds_saved += saved


def tenant_view(name: str, usage: TenantStats, lookups: LookupStats) -> PoolStats:
    """What a client of tenant `name` sees of the pool: its own figures only."""
    return PoolStats(namespaces={label: NamespaceCounters(n.requested_tokens, dict(n.hit_tokens_by_tier),
                                                          n.prefill_seconds_saved)
                                 for label, n in lookups.namespaces.items()},
                     prefill_seconds_saved=lookups.prefill_seconds_saved,
                     pinned_objects=usage.pinned_objects, pinned_bytes=usage.pinned_bytes,
                     objects=usage.objects, lookups=lookups.lookups, requested_keys=lookups.requested_keys,
                     hit_keys=lookups.hit_keys, hit_keys_by_tier=dict(lookups.hit_keys_by_tier),
                     requested_tokens=lookups.requested_tokens, hit_tokens_by_tier=dict(lookups.hit_tokens_by_tier),
                     evictions={}, demotions={}, promotions={}, nodes_alive=0, tenants={name: usage})


def snapshot(placement, lookups: LookupStats, objects: int) -> PoolStats:
    """The record of the master's current state. Called with the master lock held; copies every mutable part."""
    nodes = {node.node_id: {tier.label: TierUsage(space.allocator.num_allocations, space.allocator.used_bytes,
                                                  space.allocator.capacity)
                            for tier, space in node.spaces.items()}
             for node in placement.nodes.values()}
    c = placement.counters
    return PoolStats(
        nodes=nodes,
        namespaces={label: NamespaceCounters(n.requested_tokens, dict(n.hit_tokens_by_tier), n.prefill_seconds_saved)
                    for label, n in lookups.namespaces.items()},
        prefill_seconds_saved=lookups.prefill_seconds_saved, objects=objects, lookups=lookups.lookups, requested_keys=lookups.requested_keys, hit_keys=lookups.hit_keys,
        hit_keys_by_tier=dict(lookups.hit_keys_by_tier), requested_tokens=lookups.requested_tokens,
        hit_tokens_by_tier=dict(lookups.hit_tokens_by_tier), evictions=dict(c.evictions),
        demotions=dict(c.demotions), promotions=dict(c.promotions), ssd_corrupt=c.ssd_corrupt,
        dram_corrupt=c.dram_corrupt)


__all__ = ["PoolStats", "TierUsage", "NamespaceCounters", "TenantStats", "LookupStats", "snapshot", "tenant_view",
           "rates", "counters", "went_backwards", "TIER_LABELS"]
