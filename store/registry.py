"""Node membership: which storage nodes belong to the pool, which process of each is current, and which are alive.

    register(info)   unknown node, or a new `incarnation` (the node process restarted, its DRAM is gone): a fresh
                     member; the caller drops what the old incarnation held. Same incarnation and capacities (the
                     MASTER restarted, or the node re-registers after a reregister answer): the same member, epoch+1,
                     objects kept.
    heartbeat        refreshes `last_heartbeat`; answers "register again" for an unknown node, a stale epoch, or a
                     node known only from the journal (`connected` False: its ops cannot move bytes yet).
    suspect(now)     members silent for suspect_after_s: no new placement lands on them (a SIGKILLed node stops
                     taking puts within that, long before it is dropped); a heartbeat clears it.
    reporting(now)   members that said `reports_ssd` and have not sent their report's last batch yet (for at most
                     `report_s`): nothing new is placed on them, since the master does not know yet which of their
                     SSD extents hold records (a put or a copy given one would overwrite a record about to be
                     adopted, and the report would then drop it: the restart would lose what it kept)
    silent(now)      members past node_ttl_s without a heartbeat (never the embedded pool's own node), or, for a node
                     known only from the journal, past its reload grace (a restarted master gives the nodes it
                     reloaded that long to find it again before dropping them and their objects).

The registry owns the membership fields; the node's tiers (allocators, policies, ops) are the Placement's
`NodeState`, which `register` creates and `remove` drops through Placement's interface. Owned by the Master; called
under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.store.node import NodeOps, NodeUnavailable
from kvpool.store.placement import NodeState, Placement
from kvpool.store.records import NodeInfo


class DisconnectedOps:
    """NodeOps of a node known from the journal that has not registered with this master yet, or of one removed
    (its calls must not reach whatever listens at its address now): every move fails, nothing is sent."""

    def demote(self, moves, drops=()):
        return [False] * len(moves)

    def promote(self, moves):
        raise NodeUnavailable("node has not registered with this master yet")

    def drop(self, drops):
        return 0

    def objects_removed(self, keys=None):
        pass


@dataclass(slots=True)
class Member:
    node_id: str
    epoch: int = 0
    last_heartbeat: float = 0.0
    expires: bool = True            # False: never dropped for silence (the embedded pool's own node)
    connected: bool = True          # False: known from the journal, not registered with this master process
    grace_until: float = 0.0        # a journal-reloaded node is not dropped before this (master clock)
    reporting_until: float = 0.0    # > now: its SSD records are being reported (`reporting_numbers`)
    # registered again as the process the master knew (its restart on the journal, or a re-registration): a record it
    # reports of a key the master does not know is stale (its erase was lost: a Drop that failed, or a removal of an
    # object still read when the master went down), never adopted
    reattached: bool = False


@dataclass(slots=True)
class Registration:
    """What `register` did: the node's epoch, and the old NodeState it replaced (a restarted node) or None."""

    epoch: int
    node: NodeState
    replaced: NodeState | None = None


class NodeRegistry:
    def __init__(self, placement: Placement) -> None:
        self.placement = placement
        self._members: dict[str, Member] = {}

    def member(self, node_id: str) -> Member | None:
        return self._members.get(node_id)

    def disconnected_numbers(self) -> set[int]:
        nodes = self.placement.nodes
        return {nodes[m.node_id].number for m in self._members.values() if not m.connected and m.node_id in nodes}

    def register(self, info: NodeInfo, ops: NodeOps, *, expires: bool, now: float,
                 report_s: float = 0.0) -> Registration:
        """`report_s`: how long a node that says `reports_ssd` may take to send its report's last batch."""
        placement = self.placement
        old = placement.nodes.get(info.node_id)
        member = self._members.get(info.node_id)
        reporting_until = now + report_s if info.reports_ssd and info.ssd_bytes else 0.0
        if old is not None and member is not None and old.info.incarnation == info.incarnation \
                and old.info.dram_bytes == info.dram_bytes and old.info.ssd_bytes == info.ssd_bytes \
                and old.info.hbm_bytes == info.hbm_bytes:
            old.ops, old.info = ops, info
            member.expires, member.last_heartbeat, member.connected, member.grace_until = expires, now, True, 0.0
            member.reporting_until, member.reattached = reporting_until, True
            member.epoch += 1
            return Registration(member.epoch, old)
        epoch = member.epoch + 1 if member is not None else 1
        if old is not None:     # a restarted node: its old process leaves first
            self._take_out(old)
        node = placement.add_node(info, ops)
        self._members[info.node_id] = Member(info.node_id, epoch, now, expires, True,
                                             reporting_until=reporting_until)
        return Registration(epoch, node, old)

    def reported(self, node_id: str) -> None:
        """The node's report is complete (its last batch): it may be placed on."""
        member = self._members.get(node_id)
        if member is not None:
            member.reporting_until = 0.0

    def reporting_numbers(self, now: float) -> set[int]:
        nodes = self.placement.nodes
        return {nodes[m.node_id].number for m in self._members.values()
                if m.reporting_until > now and m.node_id in nodes}

    def add_disconnected(self, info: NodeInfo, now: float, grace_s: float) -> NodeState:
        """A node known from the journal: placed (its objects can be indexed) but not connected; it has `grace_s`
        to register before it counts as silent."""
        node = self.placement.add_node(info, DisconnectedOps())
        self._members[info.node_id] = Member(info.node_id, 0, now, True, False, now + grace_s)
        return node

    def heartbeat(self, node_id: str, epoch: int, now: float) -> bool:
        """True when the node must register again."""
        member = self._members.get(node_id)
        if member is None or not member.connected or node_id not in self.placement.nodes \
                or (epoch and epoch != member.epoch):
            return True
        member.last_heartbeat = now
        return False

    def remove(self, node_id: str) -> tuple[NodeState, int]:
        """Forget a node and its objects; returns its last NodeState and how many committed objects it held."""
        node = self.placement.node(node_id)
        n = self._take_out(node)
        self._members.pop(node_id, None)
        return node, n

    def _take_out(self, node: NodeState) -> int:
        """The node's process leaves the pool: its objects go (Placement.remove_node: misses at once, forgotten a
        chunk at a time), and its calls nowhere (a call still queued for it, a put's deferred one, must not reach a
        new process at its address). Returns how many committed objects it held."""
        n = self.placement.remove_node(node.node_id)
        node.ops = DisconnectedOps()
        return n

    def silent(self, now: float, ttl: float) -> list[str]:
        nodes = self.placement.nodes
        return [m.node_id for m in self._members.values()
                if m.expires and max(m.last_heartbeat + ttl, m.grace_until) <= now and m.node_id in nodes]

    def suspect_numbers(self, now: float, after: float) -> set[int]:
        """Connected nodes without a heartbeat for `after` seconds: alive or not, nothing new is placed on them."""
        nodes = self.placement.nodes
        return {nodes[m.node_id].number for m in self._members.values()
                if m.expires and m.connected and m.last_heartbeat + after <= now and m.node_id in nodes}


__all__ = ["NodeRegistry", "Member", "Registration", "DisconnectedOps"]
