"""Drain a node with moves: the client half of store/migration.py (the master decides, this process moves bytes).

    BeginDrain(node)                      nothing new lands on the node; (objects, pending grants) still there
    MigrateStart(node, cursor) batches ─▶  read sources ─▶ write destinations
                                          ─▶ MigrateCommit(xxh3_64 of the bytes copied)  (failed: MigrateAbort)
    repeat until the node holds nothing and has no pending grant (bounded: passes and a deadline)
    DrainNode(node)                       the node leaves; whatever is still on it is dropped (counted)

Bytes travel through PoolClient's data path (same-host arena memcpy, else the node's TCP data channel; SSD extents
always through the node), so a drain is exactly as fast and as checked as gets and puts are. The master only
switches an object whose copied bytes hash to its committed checksum, so a drain never makes wrong bytes visible:
every object ends either moved byte-exact or dropped (a miss). Objects that do not fit anywhere (`NO_ROOM`) stay
and are dropped with the node: a drain never evicts objects on the other nodes that were used more recently.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import xxhash

from kvpool.client import PoolClient
from kvpool.proto import kvpool_pb2 as pb

log = logging.getLogger(__name__)

BATCH_KEYS = 256
BATCH_BYTES = 64 << 20   # bytes held in this process per batch (each object is copied through one buffer)


@dataclass(slots=True)
class DrainResult:
    node: str
    moved: int = 0       # objects now on another node, byte-exact
    dropped: int = 0     # committed objects the node still held when it left (misses from now on)
    no_room: int = 0     # of those, how many no other node had room for
    failed: int = 0      # copies that failed (node refused / unreachable / checksum), each retried next pass
    passes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def drain(client: PoolClient, node_id: str, *, migrate: bool = True, max_passes: int = 5,
          deadline_s: float = 120.0, batch_keys: int = BATCH_KEYS, batch_bytes: int = BATCH_BYTES) -> DrainResult:
    """Move `node_id`'s objects to the other nodes (unless `migrate` is False), then remove the node. Each pass
    moves everything listed on the node; objects that failed to copy (or were busy) are retried on the next pass,
    at most `max_passes` passes; uncommitted writes to the node are waited for until `deadline_s`."""
    if not isinstance(node_id, str) or not node_id:
        raise ValueError(f"node_id must be a non-empty string, got {node_id!r}")
    if not isinstance(max_passes, int) or max_passes < 1:
        raise ValueError(f"max_passes must be an int >= 1, got {max_passes!r}")
    if not deadline_s > 0:
        raise ValueError(f"deadline_s must be > 0 seconds, got {deadline_s!r}")
    result = DrainResult(node_id)
    master = client._master  # noqa: SLF001 - the drain is part of the client: same stub, same deadlines
    if migrate:
        end = time.monotonic() + deadline_s
        no_room: set[bytes] = set()
        while time.monotonic() < end:
            state = client._call(master.BeginDrain, pb.BeginDrainRequest(node_id=node_id), "begin_drain")
            movable = state.objects - len(no_room)
            if movable <= 0 and state.pending == 0:
                break  # nothing movable left and nothing can arrive (no grants, no placements on a draining node)
            if movable <= 0 or result.passes >= max_passes:
                if state.pending == 0:
                    break
                time.sleep(0.05)  # an uncommitted write to the node: it commits (moved next pass) or expires
                continue
            result.passes += 1
            cursor = 0
            while time.monotonic() < end:  # one pass: the node's objects in the master's index order
                request = pb.MigrateStartRequest(node_id=node_id, cursor=cursor, limit=batch_keys,
                                                 max_bytes=batch_bytes)
                reply = client._call(master.MigrateStart, request, "migrate_start", retry=False)
                _move_batch(client, reply, result, no_room)
                if not reply.next_cursor:
                    break
                cursor = reply.next_cursor
        result.no_room = len(no_room)
    result.dropped = client._call(master.DrainNode, pb.DrainNodeRequest(node_id=node_id), "drain_node",
                                  retry=False).objects_dropped
    log.info("drained %s: %d moved, %d dropped (%d found no room), %d pass(es)", node_id, result.moved,
             result.dropped, result.no_room, result.passes)
    return result


def _move_batch(client: PoolClient, reply, result: DrainResult, no_room: set[bytes]) -> None:
    """Copy one MigrateStart batch (source -> buffer -> destination) and commit or abort each move."""
    stub = client._master  # noqa: SLF001
    keys = [bytes(k) for k in reply.keys]
    moving = []
    for i, status in enumerate(reply.statuses):
        if status == pb.MOVING:
            moving.append(i)
        elif status == pb.NO_ROOM:
            no_room.add(keys[i])
    if not moving:
        return
    views: list[memoryview | None] = [None] * len(keys)
    for i in moving:
        views[i] = memoryview(bytearray(reply.sizes[i]))
    common = dict(nodes=reply.nodes, sizes=reply.sizes, expires_unix_ms=reply.expires_unix_ms,
                  checksums=reply.checksums)
    src = SimpleNamespace(node_index=reply.src_node_index, tiers=reply.src_tiers, offsets=reply.src_offsets,
                          tokens=reply.src_tokens, lease_id=reply.read_id, **common)
    dst = SimpleNamespace(node_index=reply.dst_node_index, tiers=reply.dst_tiers, offsets=reply.dst_offsets,
                          tokens=reply.dst_tokens, grant_ids=reply.move_ids, **common)
    try:
        failed = client._transfer(src, moving, keys, views, b"", write=False)  # noqa: SLF001
        by_ns: dict[bytes, list[int]] = {}
        for i in moving:
            if i not in failed:
                by_ns.setdefault(bytes(reply.namespaces[i]), []).append(i)
        for ns, group in by_ns.items():  # an SSD destination record carries the object's namespace
            failed |= client._transfer(dst, group, keys, views, ns, write=True)  # noqa: SLF001
    except BaseException:
        _abort(client, [reply.move_ids[i] for i in moving])
        raise
    ok = [i for i in moving if i not in failed]
    if failed:
        _abort(client, [reply.move_ids[i] for i in failed])
        result.failed += len(failed)
    if ok:
        commit = pb.MigrateCommitRequest(move_ids=[reply.move_ids[i] for i in ok],
                                         checksums=[xxhash.xxh3_64_intdigest(views[i]) for i in ok])
        moved = client._call(stub.MigrateCommit, commit, "migrate_commit", retry=False).moved
        result.moved += sum(moved)
        result.failed += len(ok) - sum(moved)
        no_room.difference_update(keys[i] for i, done in zip(ok, moved) if done)


def _abort(client: PoolClient, move_ids: list[int]) -> None:
    try:
        stub = client._master  # noqa: SLF001
        client._call(stub.MigrateAbort, pb.MigrateAbortRequest(move_ids=move_ids), "migrate_abort")
    except Exception as exc:  # noqa: BLE001 - the moves expire by themselves
        log.warning("migrate_abort failed (the moves expire by themselves): %s", exc)


__all__ = ["DrainResult", "drain"]
