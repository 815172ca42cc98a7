"""Drain a node with moves: the client half of store/migration.py (the master decides, this process moves bytes).

    BeginDrain(node)                      nothing new lands on the node; (objects, pending grants) still there
    MigrateStart(node, cursor) batches ─▶  read sources ─▶ write destinations
                                          ─▶ MigrateCommit(xxh3_64 of the bytes copied)  (failed: MigrateAbort)
    repeat until the node holds nothing and has no pending grant (bounded: passes and a deadline)
    DrainNode(node)                       the node leaves; whatever is still on it is dropped (counted)

Bytes travel through PoolClient's data path (`client.transfers`, kvpool/transfer.py; RPCs through `client.rpc`):
same-host arena memcpy, else the node's TCP data channel; SSD extents always through the node. So a drain is
exactly as fast and as checked as gets and puts are. The master only
switches an object whose copied bytes hash to its committed checksum, so a drain never makes wrong bytes visible:
every object ends either moved byte-exact or dropped (a miss). Objects that do not fit anywhere (`NO_ROOM`) stay
and are dropped with the node: a drain never evicts objects on the other nodes that were used more recently.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import xxhash

from kvpool import fence
from kvpool.client import PoolClient
from kvpool.proto import kvpool_pb2 as pb
from kvpool.store import wire

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
    rpc = client.rpc
    if migrate:
        end = time.monotonic() + deadline_s
        no_room: set[bytes] = set()
        while time.monotonic() < end:
            state = rpc.call("BeginDrain", pb.BeginDrainRequest(node_id=node_id), retry=True, what="begin_drain")
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
                sent_at = fence.now()
                reply = rpc.call("MigrateStart", request, what="migrate_start")
                _move_batch(client, reply, result, no_room, fence.write_deadline(sent_at, reply.ttl_ms))
                if not reply.next_cursor:
                    break
                cursor = reply.next_cursor
        result.no_room = len(no_room)
    result.dropped = rpc.call("DrainNode", pb.DrainNodeRequest(node_id=node_id), what="remove_node").objects_dropped
    log.info("drained %s: %d moved, %d dropped (%d found no room), %d pass(es)", node_id, result.moved,
             result.dropped, result.no_room, result.passes)
    return result


def _move_batch(client: PoolClient, reply, result: DrainResult, no_room: set[bytes], deadline: float) -> None:
    """Copy one MigrateStart batch (source -> buffer -> destination) and commit or abort each move."""
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
    src, dst = wire.moves_of(reply)
    try:
        failed = client.transfers.read(src, moving, keys, views)
        by_ns: dict[bytes, list[int]] = {}
        for i in moving:
            if i not in failed:
                by_ns.setdefault(bytes(reply.namespaces[i]), []).append(i)
        for ns, group in by_ns.items():  # an SSD destination record carries the object's namespace
            failed |= client.transfers.write(dst, group, keys, views, ns, deadline=deadline)
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
        # Sent again on UNAVAILABLE: move ids are never reused (store/leases.py first_id), so a second try of a
        # commit that did land finds its moves ended and answers False for them (counted failed, although the
        # objects moved: told less than happened, and the next pass finds them gone from the node).
        moved = client.rpc.call("MigrateCommit", commit, retry=True, what="migrate_commit").moved
        result.moved += sum(moved)
        result.failed += len(ok) - sum(moved)
        no_room.difference_update(keys[i] for i, done in zip(ok, moved) if done)


def _abort(client: PoolClient, move_ids: list[int]) -> None:
    try:
        client.rpc.call("MigrateAbort", pb.MigrateAbortRequest(move_ids=move_ids), retry=True, what="migrate_abort")
    except Exception as exc:  # noqa: BLE001 - the moves expire by themselves
        log.warning("migrate_abort failed (the moves expire by themselves): %s", exc)


__all__ = ["DrainResult", "drain"]
