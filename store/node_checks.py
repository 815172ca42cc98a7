"""Argument checks of the byte moves a node serves over NodeService (Demote, Promote, Drop, Publish).

The master sends only extents its allocators handed out, but the wire carries whatever a caller sends: every move
and drop of a request is checked against this node's own tiers before the node touches anything, so a malformed
request is INVALID_ARGUMENT naming the field (never an exception deep in a copy, answered UNKNOWN after some of the
batch was applied).

    key, namespace      16 bytes each
    tiers               tiers this node has; a move's two tiers differ
    size                in [1, the smaller of the two tiers' capacities]
    offset              SSD: a multiple of 4096 (records are page-aligned); the extent (an SSD record is its header
                        plus the payload) ends inside the tier
"""

from __future__ import annotations

from typing import Sequence

from kvpool.store.node import Drop, Move, Publication, StorageNode
from kvpool.tiers.ssd import ALIGN, record_size
from kvpool.tiers.types import Tier

KEY_BYTES = 16


def _capacity(node: StorageNode, tier: Tier, field: str) -> int:
    arena = {Tier.DRAM: node.dram, Tier.SSD: node.ssd, Tier.HBM: node.hbm}.get(tier)
    if arena is None:
        raise ValueError(f"{field}: node {node.node_id} has no {tier.label} tier")
    return int(arena.capacity)


def _extent(node: StorageNode, tier: Tier, offset: int, size: int, i: int, prefix: str, tiers_field: str) -> None:
    capacity = _capacity(node, tier, f"{tiers_field}[{i}]")
    field = f"{prefix}offsets[{i}]"
    if tier == Tier.SSD:
        if offset % ALIGN:
            raise ValueError(f"{field} must be a multiple of {ALIGN} (an SSD record offset), got {offset}")
        extent, what = record_size(size), "record size"
    else:
        extent, what = size, f"sizes[{i}]"
    if offset + extent > capacity:
        raise ValueError(f"{field} + {what} ({offset} + {extent}) exceeds the {tier.label} capacity {capacity}")


def _key(value: bytes, field: str) -> None:
    if len(value) != KEY_BYTES:
        raise ValueError(f"{field} must be {KEY_BYTES} bytes, got {len(value)}")


def moves(node: StorageNode, batch: Sequence[Move]) -> None:
    for i, m in enumerate(batch):
        _key(m.key, f"keys[{i}]")
        _key(m.ns_digest, f"namespaces[{i}]")
        if m.src_tier == m.dst_tier:
            raise ValueError(f"dst_tiers[{i}]: a move needs two tiers, got {m.src_tier.label} twice")
        limit = min(_capacity(node, m.src_tier, f"src_tiers[{i}]"), _capacity(node, m.dst_tier, f"dst_tiers[{i}]"))
        if not 1 <= m.size <= limit:
            raise ValueError(f"sizes[{i}] must be in [1, {limit}], got {m.size}")
        _extent(node, m.src_tier, m.src_offset, m.size, i, "src_", "src_tiers")
        _extent(node, m.dst_tier, m.dst_offset, m.size, i, "dst_", "dst_tiers")


def drops(node: StorageNode, batch: Sequence[Drop], prefix: str = "") -> None:
    """`prefix`: the field the entries sit in ("drops." in a Demote's request)."""
    for i, d in enumerate(batch):
        _key(d.key, f"{prefix}keys[{i}]")
        _extent(node, d.tier, d.offset, d.size, i, prefix, f"{prefix}tiers")


def removed_keys(keys: Sequence[bytes] | None) -> None:
    for i, key in enumerate(keys or ()):
        _key(key, f"removed_keys[{i}]")


def publication(node: StorageNode, p: Publication) -> None:
    n = len(p.keys)
    for name, col in (("offsets", p.offsets), ("sizes", p.sizes), ("checksums", p.checksums)):
        if len(col) != n:
            raise ValueError(f"{name} must have one entry per key ({n}), got {len(col)}")
    if len(p.tiers) not in (0, n):
        raise ValueError(f"tiers must be empty or have one entry per key ({n}), got {len(p.tiers)}")
    for i, key in enumerate(p.keys):
        _key(key, f"keys[{i}]")
        if p.sizes[i] < 1:
            raise ValueError(f"sizes[{i}] must be >= 1, got {p.sizes[i]}")
        tier = p.tiers[i] if p.tiers else Tier.DRAM
        if tier not in (Tier.DRAM, Tier.SSD):
            raise ValueError(f"tiers[{i}] must be DRAM or SSD (what a host index names), got {tier!r}")
        _extent(node, tier, p.offsets[i], p.sizes[i], i, "", "tiers" if p.tiers else "keys")
    for i, key in enumerate(p.gone):
        _key(key, f"gone[{i}]")


__all__ = ["moves", "drops", "publication"]
