"""Reading the master's stats dict: the one shape `pool.stats()`, `kvpool stats`, the dashboard and /metrics share.

The master builds the dict (`kvpool.store.stats.snapshot`, shipped unchanged by the Stats RPC; `EmbeddedPool.stats`
adds a few keys). Everything downstream reads it through `StatsSnapshot.from_dict`, so a renamed or mistyped field
fails loudly in one place (ValueError naming it) instead of showing zeros on a dashboard. Keys this module does
not use (grants_open, leases_open, recovered, ...) are allowed and ignored.

Counters are cumulative since the master started (readers take differences; a restart resets them). Gauges
(objects, bytes, capacity, nodes) are current values. Hit rate is measured in TOKENS:

    hit_rate = sum(hit_tokens_by_tier) / requested_tokens            (None before the first requested token)

Fields read (tier labels are `Tier.label`; namespace labels are `store.records.NsRef.label`, "model/tenant"):

    nodes:              {node_id: {tier: {"objects", "bytes", "capacity"}}}     required; only the tiers a node has
    namespaces:         {label: {"requested_tokens", "hit_tokens_by_tier": {tier: n}, "hit_tokens"}}   required
    lookups:            int                                                       required
    requested_tokens:   int;  hit_tokens_by_tier: {tier: int}                     required
    requested_keys, hit_keys: int                                                 optional (0)
    evictions:          {tier: int}  (tier the object was dropped from)          optional
    demotions, promotions: int (DRAM->SSD, SSD->DRAM) or {source tier: int}       optional
    ssd_corrupt:        int                                                       optional
    nodes_alive:        int                                                       optional (default: len(nodes))
    puts:               {"stored"|"exists"|"no_space": int}                       optional (EmbeddedPool adds it)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from kvpool.tiers.types import Tier

TIER_LABELS: tuple[str, ...] = tuple(t.label for t in Tier)
_REQUIRED = ("nodes", "namespaces", "lookups", "requested_tokens", "hit_tokens_by_tier")
# An int `demotions` / `promotions` has one possible source tier: objects only move DRAM -> SSD and SSD -> DRAM.
_IMPLIED_SOURCE = {"demotions": "dram", "promotions": "ssd"}


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"stats.{where} must be a non-negative int, got {value!r}")
    return value


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

    @property
    def hit_tokens(self) -> int:
        return sum(self.hit_tokens_by_tier.values())


@dataclass(slots=True)
class StatsSnapshot:
    """The parts of the master's stats dict that metrics and the dashboard use, validated."""

    nodes: dict[str, dict[str, TierUsage]] = field(default_factory=dict)
    namespaces: dict[str, NamespaceCounters] = field(default_factory=dict)
    lookups: int = 0
    requested_keys: int = 0
    hit_keys: int = 0
    requested_tokens: int = 0
    hit_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    evictions: dict[str, int] = field(default_factory=dict)
    demotions: dict[str, int] = field(default_factory=dict)
    promotions: dict[str, int] = field(default_factory=dict)
    ssd_corrupt: int = 0
    nodes_alive: int = 0
    puts: dict[str, int] = field(default_factory=dict)

    @property
    def hit_tokens(self) -> int:
        return sum(self.hit_tokens_by_tier.values())

    @property
    def hit_rate(self) -> float | None:
        """Token hit rate in [0, 1]; None before the first requested token (0 of 0 is not 0%)."""
        return self.hit_tokens / self.requested_tokens if self.requested_tokens else None

    @property
    def stored(self) -> int:
        return self.puts.get("stored", 0)

    def active_tiers(self) -> list[str]:
        """Tiers some node has, or that ever served a hit (fastest first) — the tiers worth drawing."""
        present = {t for tiers in self.nodes.values() for t, u in tiers.items() if u.capacity}
        present |= {t for t, n in self.hit_tokens_by_tier.items() if n}
        return [t for t in TIER_LABELS if t in present]

    def derived(self) -> dict[str, Any]:
        """Values the raw dict lacks, added to /api/stats (and to `kvpool stats --json` if it wants them)."""
        return {"hit_rate": self.hit_rate, "nodes_alive": self.nodes_alive, "active_tiers": self.active_tiers()}

    @classmethod
    def from_dict(cls, d: Any) -> StatsSnapshot:
        """Validate and convert the master's stats dict; raises ValueError naming the offending field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"stats must be the mapping pool.stats() returns, got {type(d).__name__}")
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(f"stats: missing field(s) {missing}; is this the dict pool.stats() returns?")
        snap = cls()
        for node, tiers in _mapping(d["nodes"], "nodes").items():
            row: dict[str, TierUsage] = {}
            for tier, usage in _mapping(tiers, f"nodes.{node}").items():
                where = f"nodes.{node}.{_tier(tier, f'nodes.{node}')}"
                u = _mapping(usage, where)
                row[tier] = TierUsage(*(_count(u.get(k, 0), f"{where}.{k}") for k in ("objects", "bytes", "capacity")))
            snap.nodes[str(node)] = row
        for label, c in _mapping(d["namespaces"], "namespaces").items():
            where = f"namespaces.{label}"
            c = _mapping(c, where)
            snap.namespaces[str(label)] = NamespaceCounters(
                _count(c.get("requested_tokens", 0), f"{where}.requested_tokens"),
                _tier_counts(c.get("hit_tokens_by_tier", {}), f"{where}.hit_tokens_by_tier"))
        for name in ("lookups", "requested_tokens", "requested_keys", "hit_keys", "ssd_corrupt"):
            setattr(snap, name, _count(d.get(name, 0), name))
        snap.hit_tokens_by_tier = _tier_counts(d["hit_tokens_by_tier"], "hit_tokens_by_tier")
        snap.evictions = _tier_counts(d.get("evictions", {}), "evictions")
        for name, source in _IMPLIED_SOURCE.items():
            value = d.get(name, 0)
            setattr(snap, name, _tier_counts(value, name) if isinstance(value, Mapping)
                    else {source: _count(value, name)})
        snap.nodes_alive = _count(d.get("nodes_alive", len(snap.nodes)), "nodes_alive")
        puts = _mapping(d.get("puts", {}), "puts")
        snap.puts = {str(k): _count(v, f"puts.{k}") for k, v in puts.items()}
        return snap
