"""The one mapping between the pool's records and kvpool.v1 messages, for every RPC and both ends of it.

    server (store/master_servicer.py, store/node_server.py)   messages -> records -> Master / StorageNode
                                                               records -> reply messages
    client (kvpool/client.py, kvpool/drain.py)                 reply messages -> ExtentBatch (where bytes go)
    master -> node (store/remote_node.py)                      Move / Drop records <-> Move/DropRequest

Per-key results travel as parallel packed columns, built with `extend` (which upb does in C) instead of one
sub-message per object; node endpoints travel once per reply in a `nodes` table that `node_index` points into.
Readers check that columns have equal lengths and raise ValueError naming the first column that disagrees (the
servers map it to INVALID_ARGUMENT). This module holds no logic beyond field mapping: one module of ~400 lines
because both ends of every message must read the same mapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from kvpool.proto import kvpool_pb2 as pb
from kvpool.store.migration import MigrateStartResult, MigrateStatus
from kvpool.store.node import Drop, Move, Publication
from kvpool.store.records import (
    NO_NS,
    LookupResult,
    NodeInfo,
    NsRef,
    ObjectRecord,
    PutStartResult,
    PutStatus,
    ReportResult,
)
from kvpool.tiers.types import Tier

KEY_BYTES = 16
_TIERS = {int(t) for t in Tier}
PUT_STATUS = {PutStatus.STORED: pb.STORED, PutStatus.EXISTS: pb.EXISTS, PutStatus.NO_SPACE: pb.NO_SPACE}
PUT_STATUS_NAME = {pb.STORED: "stored", pb.EXISTS: "exists", pb.NO_SPACE: "no_space"}
MIGRATE_STATUS = {MigrateStatus.MOVING: pb.MOVING, MigrateStatus.GONE: pb.GONE, MigrateStatus.NO_SPACE: pb.NO_ROOM,
                  MigrateStatus.BUSY: pb.BUSY}

EndpointOf = Callable[[str], pb.NodeEndpoint]


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


MAX_LABEL = 128  # a namespace label is a stats key and a metric label value


def ns_from_msg(digest: bytes, block_tokens: int, label: str) -> NsRef:
    if len(label) > MAX_LABEL or not label.isprintable():
        raise ValueError(f"namespace_label: at most {MAX_LABEL} characters, printable, got {len(label)} characters")
    if not digest:
        return NsRef(block_tokens=block_tokens, label=label) if block_tokens or label else NO_NS
    if len(digest) != KEY_BYTES:
        raise ValueError(f"namespace: must be a 16-byte namespace digest, got {len(digest)} bytes")
    return NsRef(digest=bytes(digest), label=label or digest.hex()[:12], block_tokens=block_tokens)


# ---------------------------------------------------------------- nodes

def endpoint_from_info(info: NodeInfo, *, host_id: str, data_address: str, ssd_path: str = "",
                       data_tls: bool = False) -> pb.NodeEndpoint:
    tiers = []
    if info.hbm_bytes:
        tiers.append(pb.TierCapacity(tier=pb.HBM, capacity_bytes=info.hbm_bytes))
    if info.dram_bytes or info.dram_path:   # 0 bytes with a path: an SSD-only node's generation-only arena
        tiers.append(pb.TierCapacity(tier=pb.DRAM, capacity_bytes=info.dram_bytes, path=info.dram_path))
    if info.ssd_bytes:
        tiers.append(pb.TierCapacity(tier=pb.SSD, capacity_bytes=info.ssd_bytes, path=ssd_path))
    return pb.NodeEndpoint(node_id=info.node_id, host_id=host_id, data_address=data_address,
                           control_address=info.address, tiers=tiers, ssd_record_overhead=info.ssd_record_overhead,
                           alignment=info.alignment, incarnation=info.incarnation, data_tls=data_tls,
                           ssd_index_rows=info.ssd_index_rows, dram_pages=info.dram_pages,
                           move_drops=info.move_drops, removes_keys=info.removes_keys,
                           reports_ssd=info.reports_ssd, write_keys=info.write_keys,
                           writer_claims=info.writer_claims)


def info_from_endpoint(ep: pb.NodeEndpoint) -> NodeInfo:
    sizes: dict[int, pb.TierCapacity] = {}
    for i, t in enumerate(ep.tiers):
        tier = tier_of(int(t.tier), f"node.tiers[{i}].tier")
        if int(tier) in sizes:
            raise ValueError(f"node.tiers[{i}].tier: {tier.label} listed twice")
        sizes[int(tier)] = t
    dram = sizes.get(int(Tier.DRAM))
    ssd = sizes.get(int(Tier.SSD))
    hbm = sizes.get(int(Tier.HBM))
    return NodeInfo(node_id=ep.node_id, address=ep.control_address,
                    dram_bytes=dram.capacity_bytes if dram else 0, ssd_bytes=ssd.capacity_bytes if ssd else 0,
                    ssd_record_overhead=ep.ssd_record_overhead, alignment=ep.alignment or 4096,
                    dram_path=dram.path if dram else "", incarnation=ep.incarnation,
                    hbm_bytes=hbm.capacity_bytes if hbm else 0, ssd_index_rows=ep.ssd_index_rows,
                    dram_pages=ep.dram_pages, move_drops=ep.move_drops, removes_keys=ep.removes_keys,
                    reports_ssd=ep.reports_ssd, write_keys=ep.write_keys, writer_claims=ep.writer_claims)


def dram_path(ep: pb.NodeEndpoint) -> str:
    """The node's shared DRAM arena file ("" when it shares none)."""
    return _tier_path(ep, pb.DRAM)


def ssd_path(ep: pb.NodeEndpoint) -> str:
    """The node's SSD data file when it lets same-host clients read it ("" otherwise; nodes before 2026-11-26
    advertised their SSD directory here: a path that is not a regular file is never read)."""
    return _tier_path(ep, pb.SSD)


def _tier_path(ep: pb.NodeEndpoint, tier: int) -> str:
    for t in ep.tiers:
        if t.tier == tier:
            return t.path
    return ""


class NodeTable:
    """Builds a reply's `nodes` table: each distinct node once, `index(node_id)` its position."""

    def __init__(self, endpoint_of: EndpointOf) -> None:
        self._endpoint_of = endpoint_of
        self._pos: dict[str, int] = {}
        self.nodes: list[pb.NodeEndpoint] = []

    def index(self, node_id: str) -> int:
        i = self._pos.get(node_id)
        if i is None:
            i = self._pos[node_id] = len(self.nodes)
            self.nodes.append(self._endpoint_of(node_id))
        return i

    def indexes(self, node_ids: Sequence[str]) -> list[int]:
        """`index` of each of `node_ids` (a reply's column: many entries, few distinct nodes)."""
        for node_id in dict.fromkeys(node_ids):
            self.index(node_id)
        pos = self._pos
        return [pos[n] for n in node_ids]


# ---------------------------------------------------------------- client -> master -> client

def put_start_reply(results: Sequence[PutStartResult], endpoint_of: EndpointOf, *,
                    record_keys: bool = False) -> pb.PutStartResponse:
    """`record_keys`: send each grant's stored key (a tenant's key space; the client writes it into SSD headers)."""
    reply = pb.PutStartResponse()
    reply.statuses.extend(PUT_STATUS[r.status] for r in results)
    grants = [r.grant for r in results]
    table = NodeTable(endpoint_of)
    reply.node_index.extend(table.index(g.location.node_id) if g is not None else 0 for g in grants)
    reply.grant_ids.extend(g.grant_id if g is not None else 0 for g in grants)
    reply.tiers.extend(int(g.location.tier) if g is not None else 0 for g in grants)
    reply.offsets.extend(g.location.offset if g is not None else 0 for g in grants)
    reply.sizes.extend(g.location.size if g is not None else 0 for g in grants)
    reply.tokens.extend(g.token if g is not None else b"" for g in grants)
    reply.nodes.extend(table.nodes)
    if record_keys:
        reply.record_keys.extend(g.key if g is not None else b"" for g in grants)
    live = [g for g in grants if g is not None]
    reply.expires_unix_ms = int(live[0].expires_at * 1000) if live else 0
    return reply


def lookup_reply(result: LookupResult, endpoint_of: EndpointOf) -> pb.LookupResponse:
    reply = pb.LookupResponse(hits=result.hits, lease_id=result.lease_id,
                              expires_unix_ms=int(result.expires_at * 1000), released=result.released)
    if result.node_ids:
        table = NodeTable(endpoint_of)
        reply.node_index.extend(table.indexes(result.node_ids))
        reply.tiers.extend(result.tiers)
        reply.offsets.extend(result.offsets)
        reply.sizes.extend(result.sizes)
        reply.checksums.extend(result.checksums)
        reply.tokens.extend(result.tokens)
        reply.nodes.extend(table.nodes)
        reply.record_keys.extend(result.record_keys)
    elif result.tiers:      # a count_only lookup: the hits' tiers alone
        reply.tiers.extend(result.tiers)
    return reply


def migrate_start_reply(result: MigrateStartResult, endpoint_of: EndpointOf) -> pb.MigrateStartResponse:
    moves = result.moves
    moving = [m.status is MigrateStatus.MOVING for m in moves]
    table = NodeTable(endpoint_of)
    reply = pb.MigrateStartResponse(read_id=result.read_id if any(moving) else 0,
                                    expires_unix_ms=int(result.expires_at * 1000) if any(moving) else 0)
    reply.statuses.extend(MIGRATE_STATUS[m.status] for m in moves)
    reply.move_ids.extend(m.move_id for m in moves)
    reply.src_node_index.extend(table.index(m.source.node_id) if ok else 0 for m, ok in zip(moves, moving))
    reply.dst_node_index.extend(table.index(m.dest.node_id) if ok else 0 for m, ok in zip(moves, moving))
    reply.src_tiers.extend(int(m.source.tier) if ok else 0 for m, ok in zip(moves, moving))
    reply.src_offsets.extend(m.source.offset if ok else 0 for m, ok in zip(moves, moving))
    reply.src_tokens.extend(m.read_token for m in moves)
    reply.dst_tiers.extend(int(m.dest.tier) if ok else 0 for m, ok in zip(moves, moving))
    reply.dst_offsets.extend(m.dest.offset if ok else 0 for m, ok in zip(moves, moving))
    reply.dst_tokens.extend(m.write_token for m in moves)
    reply.sizes.extend(m.source.size if ok else 0 for m, ok in zip(moves, moving))
    reply.checksums.extend(m.checksum for m in moves)
    reply.namespaces.extend(m.ns_digest for m in moves)
    reply.nodes.extend(table.nodes)
    reply.keys.extend(result.keys)
    reply.next_cursor = result.next_cursor
    return reply


@dataclass(slots=True)
class ExtentBatch:
    """Where the bytes of a batch are written or read, as columns parallel to the caller's keys (a view over a
    reply's repeated fields, not a copy): entry i is `tiers[i]`/`offsets[i]`/`sizes[i]` on node
    `nodes[node_index[i]]`, authorised by `ids[i]` + `tokens[i]` until `expires_ms`; `checksums[i]` is the
    committed xxh3_64 of a read (empty for writes); `keys[i]` the key the object is stored under when the master
    says (a tenant's key space), else empty: the caller's own keys are the stored ones."""

    nodes: Sequence[pb.NodeEndpoint]
    node_index: Sequence[int]
    tiers: Sequence[int]
    offsets: Sequence[int]
    sizes: Sequence[int]
    ids: Sequence[int]
    tokens: Sequence[bytes]
    checksums: Sequence[int]
    expires_ms: int
    keys: Sequence[bytes] = ()


class _Same(Sequence[int]):
    """One id repeated for every entry (a lookup's lease id) without building a list."""

    __slots__ = ("value", "n")

    def __init__(self, value: int, n: int) -> None:
        self.value, self.n = value, n

    def __getitem__(self, i):  # type: ignore[override]
        return self.value

    def __len__(self) -> int:
        return self.n


def grants_of(reply: pb.PutStartResponse) -> ExtentBatch:
    return ExtentBatch(reply.nodes, reply.node_index, reply.tiers, reply.offsets, reply.sizes, reply.grant_ids,
                       reply.tokens, (), reply.expires_unix_ms, reply.record_keys)


def hits_of(reply: pb.LookupResponse) -> ExtentBatch:
    return ExtentBatch(reply.nodes, reply.node_index, reply.tiers, reply.offsets, reply.sizes,
                       _Same(reply.lease_id, reply.hits), reply.tokens, reply.checksums, reply.expires_unix_ms,
                       reply.record_keys)


def moves_of(reply: pb.MigrateStartResponse) -> tuple[ExtentBatch, ExtentBatch]:
    """(sources to read, destinations to write) of a MigrateStart batch."""
    src = ExtentBatch(reply.nodes, reply.src_node_index, reply.src_tiers, reply.src_offsets, reply.sizes,
                      _Same(reply.read_id, len(reply.statuses)), reply.src_tokens, reply.checksums,
                      reply.expires_unix_ms)
    dst = ExtentBatch(reply.nodes, reply.dst_node_index, reply.dst_tiers, reply.dst_offsets, reply.sizes,
                      reply.move_ids, reply.dst_tokens, (), reply.expires_unix_ms)
    return src, dst


# ---------------------------------------------------------------- master <-> node

def moves_to_msg(moves: Sequence[Move], drops: Sequence[Drop] = ()) -> pb.MoveRequest:
    """`drops`: a Demote's records to erase first (MoveRequest.drops)."""
    msg = pb.MoveRequest()
    if drops:
        msg.drops.CopyFrom(drops_to_msg(drops))
    msg.keys.extend(m.key for m in moves)
    msg.namespaces.extend(m.ns_digest for m in moves)
    msg.sizes.extend(m.size for m in moves)
    msg.checksums.extend(m.checksum for m in moves)
    msg.src_tiers.extend(int(m.src_tier) for m in moves)
    msg.src_offsets.extend(m.src_offset for m in moves)
    msg.dst_tiers.extend(int(m.dst_tier) for m in moves)
    msg.dst_offsets.extend(m.dst_offset for m in moves)
    return msg


def move_drops_from_msg(msg: pb.MoveRequest) -> list[Drop]:
    """A Demote's records to erase first; ValueError naming the `drops.` field."""
    if not msg.HasField("drops"):
        return []
    if msg.drops.objects_removed:
        raise ValueError("drops.objects_removed: only a Drop call says objects were removed")
    try:
        return drops_from_msg(msg.drops)
    except ValueError as exc:
        raise ValueError(f"drops.{exc}") from None


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


def removed_keys_from_msg(msg: pb.DropRequest) -> list[bytes] | None:
    """A removal's keys (NodeOps.objects_removed): None = every row of the host index."""
    if msg.removed_keys and not msg.removed_keys_only:
        raise ValueError("removed_keys: only with removed_keys_only")
    if msg.removed_keys_only and not msg.objects_removed:
        raise ValueError("removed_keys_only: only with objects_removed")
    return list(msg.removed_keys) if msg.removed_keys_only else None


def publication_to_msg(p: Publication) -> pb.PublishRequest:
    return pb.PublishRequest(keys=p.keys, offsets=p.offsets, sizes=p.sizes, checksums=p.checksums, gone=p.gone,
                             tiers=[int(t) for t in p.tiers])


def publication_from_msg(msg: pb.PublishRequest) -> Publication:
    """`tiers` empty (a master before SSD rows): every entry is a DRAM extent."""
    check_columns(msg, "keys", "offsets", "sizes", "checksums")
    if len(msg.tiers) not in (0, len(msg.keys)):
        raise ValueError(f"tiers must be empty or have one entry per key ({len(msg.keys)}), got {len(msg.tiers)}")
    tiers = tuple(tier_of(t, f"tiers[{i}]") for i, t in enumerate(msg.tiers))
    return Publication(tuple(msg.keys), tuple(msg.offsets), tuple(msg.sizes), tuple(msg.checksums), tuple(msg.gone),
                       tiers)


# ---------------------------------------------------------------- objects

def report_to_msg(node_id: str, records: Sequence[ObjectRecord]) -> pb.ReportObjectsRequest:
    msg = pb.ReportObjectsRequest(node_id=node_id)
    msg.keys.extend(r.key for r in records)
    msg.namespaces.extend(r.ns_digest for r in records)
    msg.tiers.extend(int(r.tier) for r in records)
    msg.offsets.extend(r.offset for r in records)
    msg.sizes.extend(r.size for r in records)
    msg.checksums.extend(r.checksum for r in records)
    msg.written_us.extend(r.written_us for r in records)
    return msg


def report_from_msg(msg: pb.ReportObjectsRequest) -> list[ObjectRecord]:
    n = check_columns(msg, "keys", "namespaces", "tiers", "offsets", "sizes", "checksums")
    written = msg.written_us
    if len(written) not in (0, n):      # a node from before written_us sends none: its records count as unknown (0)
        raise ValueError(f"written_us: has {len(written)} entries, keys has {n} (send one per key, or none)")
    return [ObjectRecord(key=msg.keys[i], ns_digest=msg.namespaces[i], node_id=msg.node_id,
                         tier=tier_of(msg.tiers[i], f"tiers[{i}]"), offset=msg.offsets[i], size=msg.sizes[i],
                         checksum=msg.checksums[i], written_us=written[i] if written else 0) for i in range(n)]


def report_reply(result: ReportResult) -> pb.ReportObjectsResponse:
    return pb.ReportObjectsResponse(adopted=result.adopted, known=result.known, dropped=len(result.dropped_keys),
                                    dropped_keys=result.dropped_keys)


def object_info(r: ObjectRecord, *, leases: int = 0) -> pb.ObjectInfo:
    return pb.ObjectInfo(key=r.key, namespace=r.ns_digest, node_id=r.node_id, tier=int(r.tier), offset=r.offset,
                         size=r.size, checksum=r.checksum, leases=leases, tenant=r.tenant)


def object_row(o: pb.ObjectInfo) -> dict:
    """An ObjectInfo as the admin CLI prints it (`kvpool ls/inspect --json`); "tenant" only when it has one."""
    row = {"key": o.key.hex(), "namespace": o.namespace.hex(), "node": o.node_id,
           "tier": pb.Tier.Name(o.tier).lower(), "offset": o.offset, "size": o.size, "checksum": f"{o.checksum:016x}"}
    if o.tenant:
        row["tenant"] = o.tenant
    return row


def recording_msg(status) -> pb.RecordingStatus:
    """A store.recorder.RecordingStatus as the StartRecording / StopRecording reply."""
    return pb.RecordingStatus(recording=status.recording, directory=status.directory, files=status.files,
                              rows=status.rows, dropped=status.dropped, duration_s=status.duration_s,
                              elapsed_s=status.elapsed_s, max_file_bytes=status.max_file_bytes,
                              max_files=status.max_files)


def recording_row(m: pb.RecordingStatus) -> dict:
    """A RecordingStatus reply as `kvpool trace record/stop --json` prints it (RecordingStatus.as_dict's shape)."""
    return {"recording": m.recording, "directory": m.directory, "files": list(m.files), "rows": m.rows,
            "dropped": m.dropped, "duration_s": m.duration_s, "elapsed_s": round(m.elapsed_s, 3),
            "max_file_bytes": m.max_file_bytes, "max_files": m.max_files}


__all__ = ["ExtentBatch", "NodeTable", "check_columns", "tier_of", "ns_from_msg", "endpoint_from_info",
           "info_from_endpoint", "dram_path", "ssd_path",
           "put_start_reply", "lookup_reply", "migrate_start_reply", "grants_of",
           "hits_of", "moves_of", "moves_to_msg", "moves_from_msg", "drops_to_msg", "drops_from_msg", "report_to_msg",
           "report_from_msg", "report_reply", "object_info", "object_row", "recording_msg", "recording_row",
           "PUT_STATUS", "PUT_STATUS_NAME"]
