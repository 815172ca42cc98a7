"""Hit accounting (keys and tokens, by tier and by namespace) and the master's stats() snapshot.

Tokens are the unit DESIGN.md measures hit rate in: a hit on a key is `block_tokens` hit tokens. A lookup that did
not say its block size (NsRef.block_tokens == 0) counts keys only. The snapshot is a plain JSON-able dict: the same
dict EmbeddedPool.stats() returns and the Stats RPC ships.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.tiers.types import Tier

_TIERS = tuple(t.label for t in Tier)


def _by_tier() -> dict[str, int]:
    return {label: 0 for label in _TIERS}


@dataclass(slots=True)
class NamespaceStats:
    requested_tokens: int = 0
    hit_tokens: int = 0
    hit_tokens_by_tier: dict[str, int] = field(default_factory=_by_tier)


@dataclass(slots=True)
class LookupStats:
    lookups: int = 0
    requested_keys: int = 0
    hit_keys: int = 0
    hit_keys_by_tier: dict[str, int] = field(default_factory=_by_tier)
    requested_tokens: int = 0
    hit_tokens: int = 0
    hit_tokens_by_tier: dict[str, int] = field(default_factory=_by_tier)
    namespaces: dict[str, NamespaceStats] = field(default_factory=dict)

    def count(self, ns, requested: int, hit_tiers: list[int]) -> None:
        self.lookups += 1
        self.requested_keys += requested
        self.hit_keys += len(hit_tiers)
        for t in hit_tiers:
            self.hit_keys_by_tier[_TIERS[t]] += 1
        bt = ns.block_tokens
        if bt <= 0:
            return
        per_ns = self.namespaces.get(ns.label)
        if per_ns is None:
            per_ns = self.namespaces[ns.label] = NamespaceStats()
        self.requested_tokens += requested * bt
        per_ns.requested_tokens += requested * bt
        self.hit_tokens += len(hit_tiers) * bt
        per_ns.hit_tokens += len(hit_tiers) * bt
        for t in hit_tiers:
            self.hit_tokens_by_tier[_TIERS[t]] += bt
            per_ns.hit_tokens_by_tier[_TIERS[t]] += bt


def snapshot(master) -> dict:
    """Called with the master lock held."""
    tiers = {label: {"objects": 0, "bytes": 0, "capacity": 0} for label in _TIERS}
    nodes = {}
    for node in master.placement.nodes.values():
        per_node = {}
        for tier, space in node.spaces.items():
            a = space.allocator
            row = {"objects": a.num_allocations, "bytes": a.used_bytes, "capacity": a.capacity}
            per_node[tier.label] = row
            for name, value in row.items():
                tiers[tier.label][name] += value
        nodes[node.node_id] = per_node
    s = master.stats_counters
    c = master.placement.counters
    return {
        "tiers": tiers,
        "nodes": nodes,
        "objects": len(master.index),
        "lookups": s.lookups,
        "requested_keys": s.requested_keys,
        "hit_keys": s.hit_keys,
        "miss_keys": s.requested_keys - s.hit_keys,
        "hit_keys_by_tier": dict(s.hit_keys_by_tier),
        "requested_tokens": s.requested_tokens,
        "hit_tokens": s.hit_tokens,
        "hit_tokens_by_tier": dict(s.hit_tokens_by_tier),
        "namespaces": {label: {"requested_tokens": n.requested_tokens, "hit_tokens": n.hit_tokens,
                               "hit_tokens_by_tier": dict(n.hit_tokens_by_tier)}
                       for label, n in s.namespaces.items()},
        "evictions": dict(c.evictions),
        "demotions": c.demotions,
        "promotions": c.promotions,
        "ssd_corrupt": c.ssd_corrupt,
        "grants_open": len(master._grants),
        "leases_open": len(master._leases),
    }
