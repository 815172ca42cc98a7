"""Counters of one connector, a plain record. Tokens are the unit of hit rate (DESIGN.md "Observability")."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ConnectorStats:
    requests: int = 0
    requested_tokens: int = 0                 # full-block prompt tokens that could have come from a cache
    local_hit_tokens: int = 0                 # served by the engine's own prefix cache
    pool_hit_tokens: dict[str, int] = field(default_factory=dict)   # loaded from the pool, by tier label
    lookups: int = 0
    loads: int = 0
    load_seconds: float = 0.0
    load_bytes: int = 0
    saved_blocks: int = 0                     # newly stored in the pool
    save_skipped_blocks: int = 0              # the pool already had them
    save_dropped_blocks: int = 0              # queue full or save failed
    fallbacks: dict[str, int] = field(default_factory=dict)         # reason -> count of recomputed lookups/loads

    def add_fallback(self, reason: str) -> None:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    def add_hit(self, tier: str, tokens: int) -> None:
        self.pool_hit_tokens[tier] = self.pool_hit_tokens.get(tier, 0) + tokens

    def as_dict(self) -> dict:
        return {name: (dict(v) if isinstance(v := getattr(self, name), dict) else v)
                for name in self.__slots__}  # type: ignore[attr-defined]


def counters_delta(new: dict, old: dict) -> dict:
    """`new - old` of two `as_dict()` snapshots (per key for the by-tier / by-reason dicts), zeros left out: what
    happened in between, for engines that report counters per interval (vLLM's connector stats)."""
    out: dict = {}
    for name, value in new.items():
        before = old.get(name)
        if isinstance(value, dict):
            before = before or {}
            d = {k: v - before.get(k, 0) for k, v in value.items() if v - before.get(k, 0)}
            if d:
                out[name] = d
        elif value - (before or 0):
            out[name] = value - (before or 0)
    return out


def counters_sum(a: dict, b: dict) -> dict:
    """Merge two delta dicts (workers and the scheduler side of one engine, or successive intervals)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in a.items()}
    for name, value in b.items():
        if isinstance(value, dict):
            merged = out.setdefault(name, {})
            for k, v in value.items():
                merged[k] = merged.get(k, 0) + v
        else:
            out[name] = out.get(name, 0) + value
    return out
