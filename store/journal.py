"""The journal: the master's write-through of index changes to a persistent metadata backend (store/metadata.py).

During one master call, whoever changes an object's location or existence says so (`touched(slot)`, `gone(key)`);
at the end of the call `flush` writes the batch, deletions first, so a backend never holds a record of an extent
that was reused. With a non-persistent backend (the embedded default) every method is a no-op and nothing is
collected: the journal costs the hot path one attribute test.

`load()` is the other half: what a master starting on a persistent backend re-indexes (node registrations and the
committed objects of each). Owned by the Master; called under its lock.
"""

from __future__ import annotations

from typing import Callable

from kvpool.store.index import COMMITTED, Index
from kvpool.store.metadata import MetadataBackend
from kvpool.store.records import NodeInfo, ObjectRecord
from kvpool.store.tombstones import Tombstones, TombstoneState


class Journal:
    def __init__(self, metadata: MetadataBackend, index: Index) -> None:
        self.metadata = metadata
        self.index = index
        self.persistent = bool(metadata.persistent)
        self._touched: set[int] = set()   # slots whose location changed this call
        self._gone: list[bytes] = []      # keys that left the index this call
        self._gone_nodes: list[str] = []  # nodes whose every record goes (they left the pool, or restarted)

    def touched(self, slot: int) -> None:
        if self.persistent:
            self._touched.add(slot)

    def gone(self, key: bytes, slot: int) -> None:
        if self.persistent:
            self._gone.append(key)
            self._touched.discard(slot)

    def node_gone(self, node_id: str) -> None:
        """Every record of a node goes with this call's flush, first (one call per node, whatever its size): its
        objects are forgotten a chunk at a time after it (Placement.remove_node)."""
        if self.persistent:
            self._gone_nodes.append(node_id)

    def flush(self, record_of: Callable[[int], ObjectRecord]) -> None:
        if not self.persistent:
            return
        while self._gone_nodes:
            self.metadata.delete_node_objects(self._gone_nodes[0])
            self._gone_nodes.pop(0)
        if self._gone:
            self.metadata.delete_objects(self._gone)
        state = self.index.state
        live = [s for s in self._touched if state[s] == COMMITTED]
        if live:
            self.metadata.put_objects([record_of(s) for s in live])
        self._gone.clear()
        self._touched.clear()

    def flush_tombstones(self, tombstones: Tombstones) -> None:
        """Write what changed in the removal tombstones (a failed write goes again with the next call)."""
        if not self.persistent:
            return
        changes = tombstones.take_changes()
        if not changes:
            return
        try:
            self.metadata.put_tombstones(changes)
        except BaseException:
            tombstones.restore_changes(changes)
            raise

    def load_tombstones(self) -> TombstoneState:
        """The persisted removal tombstones (none for a non-persistent backend)."""
        return self.metadata.load_tombstones() if self.persistent else TombstoneState()

    def forget_changes(self) -> None:
        """Drop what was collected without writing it (objects just loaded from the backend are already there)."""
        self._gone.clear()
        self._gone_nodes.clear()
        self._touched.clear()

    def put_node(self, info: NodeInfo) -> None:
        if self.persistent:
            self.metadata.put_node(info)

    def delete_node(self, node_id: str) -> None:
        if self.persistent:
            self.metadata.delete_node(node_id)

    def load(self) -> tuple[list[NodeInfo], dict[str, list[ObjectRecord]]]:
        """Persisted nodes and their committed objects (by node id); empty for a non-persistent backend."""
        if not self.persistent:
            return [], {}
        by_node: dict[str, list[ObjectRecord]] = {}
        for r in self.metadata.load_objects():
            by_node.setdefault(r.node_id, []).append(r)
        return self.metadata.load_nodes(), by_node


__all__ = ["Journal"]
