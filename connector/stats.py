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
