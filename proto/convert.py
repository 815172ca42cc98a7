"""Conversions between the master's/node's plain records (store/records.py, store/node.py) and kvpool.v1 messages.

Column messages (MoveRequest, DropRequest, ReportObjectsRequest) are built column by column with `extend`, which
upb does in C, instead of one sub-message per object. Readers check that the columns have equal lengths and raise
ValueError naming the first column that disagrees (the servers map that to INVALID_ARGUMENT).
This module imports store/ records only; it holds no logic beyond field mapping.
"""

from __future__ import annotations

from typing import Sequence

from kvpool.proto import kvpool_pb2 as pb
from kvpool.store.node import Drop, Move
from kvpool.store.records import NodeInfo, ObjectRecord
from kvpool.tiers.types import Tier

_TIERS = {int(t) for t in Tier}


def check_columns(msg, base: str, *others: str) -> int:
    """Length of column `base`; ValueError naming the first of `others` with a different length."""
    n = len(getattr(msg, base))
    for name in others:
        if len(getattr(msg, name)) != n:
            raise ValueError(f"{name}: has {len(getattr(msg, name))} entries, {base} has {n}")
    return n


def tier_of(value: int, field: str) -> Tier:
    if value not in _TIERS:
        raise ValueError(f"{field}: unknown tier {value}")
    return Tier(value)


# ---------------------------------------------------------------- nodes

def endpoint_from_info(info: NodeInfo, *, host_id: str, data_address: str, ssd_path: str = "") -> pb.NodeEndpoint:
    tiers = []
    if info.hbm_bytes:
        tiers.append(pb.TierCapacity(tier=pb.HBM, capacity_bytes=info.hbm_bytes))
    if info.dram_bytes:
        tiers.append(pb.TierCapacity(tier=pb.DRAM, capacity_bytes=info.dram_bytes, path=info.dram_path))
    if info.ssd_bytes:
        tiers.append(pb.TierCapacity(tier=pb.SSD, capacity_bytes=info.ssd_bytes, path=ssd_path))
    return pb.NodeEndpoint(node_id=info.node_id, host_id=host_id, data_address=data_address,
                           control_address=info.address, tiers=tiers, ssd_record_overhead=info.ssd_record_overhead,
                           alignment=info.alignment, incarnation=info.incarnation)


def info_from_endpoint(ep: pb.NodeEndpoint) -> NodeInfo:
    sizes = {int(t.tier): t for t in ep.tiers}
    dram = sizes.get(int(Tier.DRAM))
    ssd = sizes.get(int(Tier.SSD))
    hbm = sizes.get(int(Tier.HBM))
    return NodeInfo(node_id=ep.node_id, address=ep.control_address,
                    dram_bytes=dram.capacity_bytes if dram else 0, ssd_bytes=ssd.capacity_bytes if ssd else 0,
                    ssd_record_overhead=ep.ssd_record_overhead, alignment=ep.alignment or 4096,
                    dram_path=dram.path if dram else "", incarnation=ep.incarnation,
                    hbm_bytes=hbm.capacity_bytes if hbm else 0)


def dram_path(ep: pb.NodeEndpoint) -> str:
    for t in ep.tiers:
        if t.tier == pb.DRAM:
            return t.path
    return ""


# ---------------------------------------------------------------- node control

def moves_to_msg(moves: Sequence[Move]) -> pb.MoveRequest:
    msg = pb.MoveRequest()
    msg.keys.extend(m.key for m in moves)
    msg.namespaces.extend(m.ns_digest for m in moves)
    msg.sizes.extend(m.size for m in moves)
    msg.checksums.extend(m.checksum for m in moves)
    msg.src_tiers.extend(int(m.src_tier) for m in moves)
    msg.src_offsets.extend(m.src_offset for m in moves)
    msg.dst_tiers.extend(int(m.dst_tier) for m in moves)
    msg.dst_offsets.extend(m.dst_offset for m in moves)
    return msg


def moves_from_msg(msg: pb.MoveRequest) -> list[Move]:
    n = check_columns(msg, "keys", "namespaces", "sizes", "checksums", "src_tiers", "src_offsets", "dst_tiers",
                      "dst_offsets")
    return [Move(msg.keys[i], msg.namespaces[i], msg.sizes[i], msg.checksums[i],
                 tier_of(msg.src_tiers[i], f"src_tiers[{i}]"), msg.src_offsets[i],
                 tier_of(msg.dst_tiers[i], f"dst_tiers[{i}]"), msg.dst_offsets[i]) for i in range(n)]


def drops_to_msg(drops: Sequence[Drop]) -> pb.DropRequest:
    msg = pb.DropRequest()
    msg.keys.extend(d.key for d in drops)
    msg.tiers.extend(int(d.tier) for d in drops)
    msg.offsets.extend(d.offset for d in drops)
    msg.sizes.extend(d.size for d in drops)
    return msg


def drops_from_msg(msg: pb.DropRequest) -> list[Drop]:
    n = check_columns(msg, "keys", "tiers", "offsets", "sizes")
    return [Drop(msg.keys[i], tier_of(msg.tiers[i], f"tiers[{i}]"), msg.offsets[i], msg.sizes[i]) for i in range(n)]


# ---------------------------------------------------------------- objects

def report_to_msg(node_id: str, records: Sequence[ObjectRecord]) -> pb.ReportObjectsRequest:
    msg = pb.ReportObjectsRequest(node_id=node_id)
    msg.keys.extend(r.key for r in records)
    msg.namespaces.extend(r.ns_digest for r in records)
    msg.tiers.extend(int(r.tier) for r in records)
    msg.offsets.extend(r.offset for r in records)
    msg.sizes.extend(r.size for r in records)
    msg.checksums.extend(r.checksum for r in records)
    return msg


def report_from_msg(msg: pb.ReportObjectsRequest) -> list[ObjectRecord]:
    n = check_columns(msg, "keys", "namespaces", "tiers", "offsets", "sizes", "checksums")
    return [ObjectRecord(key=msg.keys[i], ns_digest=msg.namespaces[i], node_id=msg.node_id,
                         tier=tier_of(msg.tiers[i], f"tiers[{i}]"), offset=msg.offsets[i], size=msg.sizes[i],
                         checksum=msg.checksums[i]) for i in range(n)]


def object_info(r: ObjectRecord, *, leases: int = 0) -> pb.ObjectInfo:
    return pb.ObjectInfo(key=r.key, namespace=r.ns_digest, node_id=r.node_id, tier=int(r.tier), offset=r.offset,
                         size=r.size, checksum=r.checksum, leases=leases)
