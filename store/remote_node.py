"""RemoteNodeOps: the master's `NodeOps` (store/node.py) for a node in another process, over its gRPC NodeService.

Demotions and drops run with the master's lock held (no distributed locking: one place decides), so every call
carries a short deadline: a node that does not answer makes the demotion fail (the master then drops the object, a
miss) instead of stalling every client of the master. Promotions run outside the lock; a failed call raises
NodeUnavailable, and the objects stay where they are. With authentication on the master presents a node token (and
with TLS its certificate): a node accepts Demote / Promote / Drop from node credentials only.

Every call names the node process it is meant for (`incarnation`, as that process registered): a node restarted at
the same address refuses a call the master made for the process before it (FAILED_PRECONDITION, nothing changed),
which could otherwise erase or overwrite, at the old process's offsets, SSD records the new one is about to report.
One channel per node address (`RemoteNodeOps`); each registration gets a view bound to its incarnation
(`bound`), so the calls for a process that left keep its incarnation while the new one's carry the new.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import grpc

from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import wire
from kvpool.store.auth import TokenSource, auth_channel
from kvpool.store.node import Drop, Move, NodeUnavailable, Publication

log = logging.getLogger(__name__)

# A peer that comes back (a restarted master, a node) is found again within ~1 s: gRPC's default reconnect back-off
# starts at 1 s and grows by 1.6x to 120 s, which left nodes 8-15 s behind a master back from a 30 s outage. Not
# grpc.min_reconnect_backoff_ms: C-core also takes it as the connect timeout (20 s by default), and a short one fails
# slow handshakes (a loaded host, TLS) and turns a silent listener's deadline into UNAVAILABLE. Servers ignore these.
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 250), ("grpc.max_reconnect_backoff_ms", 1000)]
# Batched calls carry up to max_batch_keys entries; the default 4 MiB gRPC limit is too small for 65,536 keys.
GRPC_OPTIONS = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20),
                *RECONNECT_OPTIONS]


class RemoteNodeOps:
    """NodeOps over one node's NodeService; `timeout` is the deadline of each call; `token` / `tls` (a TlsConfig)
    what the master presents."""

    def __init__(self, address: str, timeout: float, *, token: TokenSource | None = None, tls=None) -> None:
        self.address = address
        self.timeout = timeout
        self.incarnation = ""           # empty: any process (this object); `bound` views name one
        self._channel = auth_channel(address, token=token, tls=tls, options=GRPC_OPTIONS)
        self._stub = pbg.NodeServiceStub(self._channel)
        self._latest: RemoteNodeOps | None = None

    def bound(self, incarnation: str) -> "RemoteNodeOps":
        """The same channel, every call naming the node process `incarnation`: the same view as the last call's for
        the same process (registering again, it keeps its ops), a new one for a new process. Closing stays this
        object's."""
        if not isinstance(incarnation, str):
            raise ValueError(f"incarnation must be a str, got {incarnation!r}")
        view = self._latest
        if view is None or view.incarnation != incarnation:
            view = copy.copy(self)      # the same channel and stub
            view.incarnation, view._latest = incarnation, None
            self._latest = view
        return view

    def demote(self, moves: list[Move], drops: Sequence[Drop] = ()) -> list[bool]:
        try:
            return self._move(self._stub.Demote, moves, drops)
        except NodeUnavailable:
            return [False] * len(moves)

    def promote(self, moves: list[Move]) -> list[bool]:
        return self._move(self._stub.Promote, moves)

    def _move(self, rpc, moves: list[Move], drops: Sequence[Drop] = ()) -> list[bool]:
        try:
            msg = wire.moves_to_msg(moves, drops)
            msg.incarnation = self.incarnation
            ok = list(rpc(msg, timeout=self.timeout).ok)
        except grpc.RpcError as exc:
            log.warning("node %s: move of %d objects failed: %s", self.address, len(moves), exc.code())
            raise NodeUnavailable(f"node {self.address}: {exc.code().name}") from None
        if len(ok) != len(moves):
            raise NodeUnavailable(f"node {self.address}: answered {len(ok)} results for {len(moves)} moves")
        return ok

    def drop(self, drops: list[Drop]) -> int:
        try:
            msg = wire.drops_to_msg(drops)
            msg.incarnation = self.incarnation
            return self._stub.Drop(msg, timeout=self.timeout).dropped
        except grpc.RpcError as exc:
            log.warning("node %s: drop of %d extents failed: %s", self.address, len(drops), exc.code())
            return 0

    def objects_removed(self, keys: Sequence[bytes] | None = None) -> None:
        """Raises NodeUnavailable when the node did not answer (the master logs it: that node's same-host caches
        may serve a removed object until the reply to that get's use report forgets it, one linger). `keys`: see
        NodeOps.objects_removed."""
        request = pb.DropRequest(objects_removed=True, removed_keys_only=keys is not None, removed_keys=keys or (),
                                 incarnation=self.incarnation)
        try:
            self._stub.Drop(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise NodeUnavailable(f"node {self.address}: {exc.code().name}") from None

    def publish(self, publication: Publication) -> int:
        """Raises NodeUnavailable when the node did not answer (the feed logs it and drops the publication: those
        objects are found through the master, as if never published)."""
        try:
            msg = wire.publication_to_msg(publication)
            msg.incarnation = self.incarnation
            return self._stub.Publish(msg, timeout=self.timeout).published
        except grpc.RpcError as exc:
            raise NodeUnavailable(f"node {self.address}: {exc.code().name}") from None

    def close(self) -> None:
        self._channel.close()
