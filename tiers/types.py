"""Shared records of the tier layer: which tier, and where an object's bytes live."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Tier(enum.IntEnum):
    """Storage tiers, fastest first. Values are stable (they travel in the protocol and in metrics labels)."""

    HBM = 0
    DRAM = 1
    SSD = 2

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(slots=True, frozen=True)
class Location:
    """Where one committed object lives: a node, a tier on it, and an extent of that tier."""

    node_id: str
    tier: Tier
    offset: int
    size: int
