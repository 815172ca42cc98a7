"""Argument checks of the Master's calls, done before its lock is taken and before anything changes. Each raises
ValueError (BatchTooLarge for an oversized batch: RESOURCE_EXHAUSTED on the wire) naming the argument."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

KEY_BYTES = 16
MAX_NODE_ID = 128           # a node id is a Redis key part and a metric label value
MAX_UNITS = 1 << 32         # extents per tier: the master's allocator keeps a bitmap of them (512 MiB at this bound)
MAX_RECORD_OVERHEAD = 1 << 20
MAX_IDLE_S = (2**32 - 1) / 10   # the index's atime column: u32 tenths of a second (13.6 years)


class BatchTooLarge(ValueError):
    """More keys in one call than max_batch_keys (RESOURCE_EXHAUSTED on the wire)."""


def keys(batch: Sequence[bytes], max_batch_keys: int, name: str = "keys") -> Sequence[bytes]:
    """Validate a batch of keys; returns them as hashable bytes (bytearray keys are copied)."""
    if len(batch) > max_batch_keys:
        raise BatchTooLarge(f"{name}: batch of {len(batch)} exceeds max_batch_keys={max_batch_keys}")
    convert = False
    for i, key in enumerate(batch):
        if type(key) is not bytes:
            if not isinstance(key, (bytes, bytearray)):
                raise ValueError(f"{name}[{i}] must be a {KEY_BYTES}-byte key, got {type(key).__name__}")
            convert = True
        if len(key) != KEY_BYTES:
            raise ValueError(f"{name}[{i}] must be a {KEY_BYTES}-byte key, got {len(key)}")
    return [bytes(k) for k in batch] if convert else batch


def ids(values: Sequence[int], name: str) -> None:
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name}[{i}] must be an id (int >= 0), got {v!r}")


def same_length(values: Sequence, name: str, other: Sequence, other_name: str) -> None:
    if len(values) != len(other):
        raise ValueError(f"{name} has {len(values)} entries, {other_name} has {len(other)}")


def put_sizes(sizes: Sequence[int], n_keys: int, max_object_bytes: int) -> None:
    same_length(sizes, "sizes", range(n_keys), "keys")
    for i, size in enumerate(sizes):
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0 or size > max_object_bytes:
            raise ValueError(f"sizes[{i}] must be an int in [1, max_object_bytes={max_object_bytes}], got {size!r}")


def namespace_digest(digest: bytes) -> None:
    if not isinstance(digest, bytes) or len(digest) != KEY_BYTES:
        raise ValueError(f"namespace must be a {KEY_BYTES}-byte namespace digest, got {digest!r}")


def list_args(ns_digest: bytes, start_after: bytes, limit: int) -> None:
    if ns_digest and len(ns_digest) != KEY_BYTES:
        raise ValueError(f"ns_digest must be a {KEY_BYTES}-byte namespace digest, got {len(ns_digest)} bytes")
    if start_after and len(start_after) != KEY_BYTES:
        raise ValueError(f"start_after must be a {KEY_BYTES}-byte key, got {len(start_after)} bytes")
    if not isinstance(limit, int) or limit <= 0:
        raise ValueError(f"limit must be an int > 0, got {limit!r}")


def evict_args(ns_digest, older_than_s) -> None:
    if not isinstance(ns_digest, (bytes, bytearray)) or len(ns_digest) not in (0, KEY_BYTES):
        raise ValueError(f"ns_digest must be empty or a {KEY_BYTES}-byte namespace digest, got {ns_digest!r}")
    if older_than_s is not None and (isinstance(older_than_s, bool) or not isinstance(older_than_s, (int, float))
                                     or not math.isfinite(older_than_s) or older_than_s < 0):
        raise ValueError(f"older_than_s must be None or a finite number of seconds >= 0, got {older_than_s!r}")
    if older_than_s is not None and older_than_s > MAX_IDLE_S:
        raise ValueError(f"older_than_s: at most {MAX_IDLE_S:.0f} s (13.6 years, the range of last-access times), "
                         f"got {older_than_s!r}")
    if not ns_digest and older_than_s is None:
        raise ValueError("ns_digest or older_than_s must be given (older_than_s=0 evicts every unleased object)")


def cursor_args(cursor: int, limit: int, max_bytes: int, max_batch_keys: int) -> None:
    for name, value in (("cursor", cursor), ("limit", limit), ("max_bytes", max_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if not 0 < limit <= max_batch_keys:
        raise ValueError(f"limit must be in [1, max_batch_keys={max_batch_keys}], got {limit}")


def node_info(info) -> None:
    """Everything register_node builds from a NodeInfo, checked before anything changes (a bad re-registration of a
    known node id must not drop the node it would have replaced)."""
    if not isinstance(info.node_id, str) or not info.node_id:
        raise ValueError(f"node_id must be a non-empty string, got {info.node_id!r}")
    if len(info.node_id) > MAX_NODE_ID or not info.node_id.isprintable():
        raise ValueError(f"node_id must be at most {MAX_NODE_ID} characters, printable, got {info.node_id[:40]!r}...")
    a = info.alignment
    if isinstance(a, bool) or not isinstance(a, int) or a < 64 or a > 1 << 30 or a & (a - 1):
        raise ValueError(f"alignment must be a power of two in [64, 2**30], got {a!r}")
    for name in ("dram_bytes", "ssd_bytes", "ssd_record_overhead", "hbm_bytes"):
        value = getattr(info, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    for name in ("dram_bytes", "ssd_bytes", "hbm_bytes"):
        value = getattr(info, name)
        if value // a > MAX_UNITS:
            raise ValueError(f"{name}: {value} bytes is more than 2**32 extents of {a} bytes (the master keeps a "
                             "bitmap of them); use a larger alignment")
    if info.ssd_record_overhead > MAX_RECORD_OVERHEAD:
        raise ValueError(f"ssd_record_overhead must be at most {MAX_RECORD_OVERHEAD}, got {info.ssd_record_overhead}")
    if info.ssd_bytes and a % 4096:
        raise ValueError(f"alignment must be a multiple of 4096 on a node with an SSD tier (records are page-aligned), "
                         f"got {a}")
    for name in ("address", "dram_path", "incarnation"):
        if not isinstance(getattr(info, name), str):
            raise ValueError(f"{name} must be a string, got {type(getattr(info, name)).__name__}")


def reported(records, node, max_object_bytes: int) -> None:
    """Records a node reports (its SSD scan) must describe extents of its own tiers: malformed ones raise before
    anything is adopted. (Well-formed records that conflict with the index, or exceed max_object_bytes, are the
    master's to drop one by one: they come back in dropped_keys.)"""
    for i, r in enumerate(records):
        if len(r.key) != KEY_BYTES:
            raise ValueError(f"keys[{i}] must be a {KEY_BYTES}-byte key, got {len(r.key)}")
        if len(r.ns_digest) != KEY_BYTES:
            raise ValueError(f"namespaces[{i}] must be a {KEY_BYTES}-byte namespace digest, got {len(r.ns_digest)}")
        space = node.spaces.get(r.tier)
        if space is None:
            raise ValueError(f"tiers[{i}]: node {node.node_id} has no {r.tier.label} tier")
        if not 1 <= r.size < 1 << 62:
            raise ValueError(f"sizes[{i}] must be an int >= 1, got {r.size}")
        if isinstance(r.written_us, bool) or not isinstance(r.written_us, int) or not 0 <= r.written_us < 1 << 64:
            raise ValueError(f"written_us[{i}] must be an int in [0, 2**64) (master clock µs; 0 = unknown), "
                             f"got {r.written_us!r}")
        alignment = space.allocator.alignment
        if r.offset % alignment:
            raise ValueError(f"offsets[{i}] must be a multiple of the node's alignment {alignment}, got {r.offset}")
        if r.offset + space.extent_size(r.size) > space.allocator.capacity:
            raise ValueError(f"offsets[{i}] + record size ({r.offset} + {space.extent_size(r.size)}) exceeds the "
                             f"{r.tier.label} capacity {space.allocator.capacity}")


MAX_PIN_S = 7 * 86400       # a retention hint longer than a week is a mistake, not a hint


def pin_seconds(pin_s, name: str = "pin_s") -> float:
    """A retention hint: seconds >= 0 (0 = none), finite, at most MAX_PIN_S; a bool is refused (True is not 1 s)."""
    if isinstance(pin_s, bool) or not isinstance(pin_s, (int, float, np.integer, np.floating)) \
            or not 0 <= pin_s <= MAX_PIN_S:
        raise ValueError(f"{name} must be a number of seconds in [0, {MAX_PIN_S}] (0 = no retention hint), "
                         f"got {pin_s!r}")
    return float(pin_s)


MAX_S_PER_TOKEN = 60.0      # one token's prefill taking a minute is a broken measurement


MAX_USES = 1 << 16   # gets one lookup may stand for (a location cache's coalesced report)


def uses(value, name: str = "uses") -> int:
    """How many gets a lookup reports: an int in [1, MAX_USES] (the wire's 0 means 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_USES:
        raise ValueError(f"{name} must be an int in [1, {MAX_USES}] (gets this lookup stands for), got {value!r}")
    return int(value)


def seconds_per_token(value, name: str = "prefill_s_per_token") -> float:
    """A connector's measured prefill seconds per token: finite, in [0, MAX_S_PER_TOKEN] (0 = not measured)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not 0 <= value <= MAX_S_PER_TOKEN:
        raise ValueError(f"{name} must be seconds per token in [0, {MAX_S_PER_TOKEN}] (0 = not measured), "
                         f"got {value!r}")
    return float(value)


__all__ = ["BatchTooLarge", "keys", "ids", "same_length", "put_sizes", "namespace_digest", "list_args",
           "evict_args", "cursor_args", "node_info", "reported", "pin_seconds", "seconds_per_token", "uses", "KEY_BYTES",
           "MAX_USES", "MAX_IDLE_S", "MAX_PIN_S", "MAX_S_PER_TOKEN"]
