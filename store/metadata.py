"""Metadata backends: where the master persists committed objects and node registrations so a restarted (or standby)
master can reload them. The master's `Index` stays the working copy; a backend is a write-through journal.

Contract (batched, plain records, called under the master lock in the order the master changes its index):
    put_objects(records)   upsert committed objects (also on every tier move: the location changed)
    delete_objects(keys)   objects gone (removed, evicted, dropped with their node)
    put_node(info) / delete_node(node_id)
    load_objects() / load_nodes()   everything persisted, for a master starting up
    put_tombstones(changes) / load_tombstones()   removal tombstones (store/tombstones.py)
`persistent` False means "nothing survives this process anyway": the master then skips the journal entirely, which
is what the embedded pool wants (a second in-memory copy of every object would double master memory for nothing).
"""

from __future__ import annotations

from typing import Iterable, Protocol, runtime_checkable

from kvpool.store.records import NodeInfo, ObjectRecord
from kvpool.store.tombstones import TombstoneChanges, TombstoneState


class MetadataUnavailable(RuntimeError):
    """The metadata backend could not take a write (or read) even after its retries: Redis down, a fail-over longer
    than its timeout, fewer replicas than `wait_replicas`. The RPC that needed it answers UNAVAILABLE; the journal
    keeps the batch and writes it with the next call."""


@runtime_checkable
class MetadataBackend(Protocol):
    persistent: bool

    def put_objects(self, records: Iterable[ObjectRecord]) -> None: ...

    def delete_objects(self, keys: Iterable[bytes]) -> None: ...

    def load_objects(self) -> list[ObjectRecord]: ...

    def put_node(self, info: NodeInfo) -> None: ...

    def delete_node(self, node_id: str) -> None: ...

    def delete_node_objects(self, node_id: str) -> None: ...

    def load_nodes(self) -> list[NodeInfo]: ...

    def put_tombstones(self, changes: TombstoneChanges) -> None: ...

    def load_tombstones(self) -> TombstoneState: ...

    def close(self) -> None: ...


class MemoryMetadata:
    """In-process backend. Default `persistent=False`: the master's index is the only copy. With `persistent=True` it
    keeps every record, which lets tests hand one instance to a second `Master` to exercise the reload path that
    `RedisMetadata` relies on."""

    def __init__(self, persistent: bool = False) -> None:
        self.persistent = persistent
        self._objects: dict[bytes, ObjectRecord] = {}
        self._nodes: dict[str, NodeInfo] = {}
        self._tombstones = TombstoneState()

    def put_objects(self, records: Iterable[ObjectRecord]) -> None:
        for record in records:
            self._objects[record.key] = record

    def delete_objects(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            self._objects.pop(key, None)

    def load_objects(self) -> list[ObjectRecord]:
        return list(self._objects.values())

    def put_node(self, info: NodeInfo) -> None:
        self._nodes[info.node_id] = info

    def delete_node(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)
        self.delete_node_objects(node_id)

    def delete_node_objects(self, node_id: str) -> None:
        self._objects = {k: r for k, r in self._objects.items() if r.node_id != node_id}

    def load_nodes(self) -> list[NodeInfo]:
        return list(self._nodes.values())

    def put_tombstones(self, changes: TombstoneChanges) -> None:
        kept = self._tombstones
        for table, gone, upserts in ((kept.keys, changes.gone_keys, changes.keys),
                                     (kept.namespaces, changes.gone_namespaces, changes.namespaces),
                                     (kept.scoped, changes.gone_scoped, changes.scoped)):
            for k in gone:
                table.pop(k, None)
            table.update(upserts)
        kept.buckets.update(changes.buckets)
        if changes.floor is not None:
            kept.floor = changes.floor

    def load_tombstones(self) -> TombstoneState:
        kept = self._tombstones
        return TombstoneState(dict(kept.keys), dict(kept.namespaces), kept.floor, dict(kept.scoped),
                              dict(kept.buckets))

    def close(self) -> None:
        pass
