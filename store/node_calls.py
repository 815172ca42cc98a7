"""NodeCalls: the drops and demotions one locked master operation decides, sent per node in as few calls as their
order allows.

Making room for a put on a full tier used to cost a node call per victim: one Demote (and, with the SSD tier full
too, one Drop) for every object placed, each a gRPC round trip to a node in another process, all under the master's
lock. `Placement.batched_ops()` collects them here instead and sends them when the operation ends: per node, every
pending drop, then every pending move, in the order they were decided: one Demote call that carries the drops
(MoveRequest.drops; the node erases them before it moves), or a Drop call and then a Demote call to a node from
before 2026-12-05 (one that does not say `NodeInfo.move_drops`), or one Drop call when nothing moves.

Why that order is the per-object order: a drop erases an SSD record and frees its extent, which a later move may
write; so drops must precede the moves that follow them, and sending all drops first keeps that. The other way
round (a move writes an extent a later drop erases) happens only when an object moved in this batch leaves again in
it; Placement sends the node's batch, and settles it, before such an object can be a victim (`Placement.allocate`),
so that drop is never queued behind the move it must follow, and a refused move's object is never evicted twice.

When the calls are sent: when the operation ends, with the master's lock held, except a put_start's calls whose
every extent the put has handed out again (`Placement.batched_ops(defer=True)`, `Deferred`), which it sends after
letting go of the lock and before it answers:
- a Drop alone whose every record's extent is used again (a put on a full pool with the inclusive SSD tier: its
  objects' copies, or its grants);
- a Demote whose every move's source extent is used again, and whose drops are such erases (a put on a full DRAM
  tier whose victims' SSD copies are not written yet: each victim's bytes are copied into its copy, then its DRAM
  extent is the new object's grant).
Those extents are written only after the answer (by its client, or by a copy round after the client's commit), and
no other operation can be given them while they are in use, so each erase and each move's read of its source still
land before anything that reuses them, and other clients' lookups do not wait on the round trip. A deferred move's
object is "in flight" until the put settles it under the lock again: pinned (nothing evicts, demotes, promotes or
drains it; a removal only unlinks it), and a lookup misses it, since its target extent does not hold its bytes yet.

The state a move brings (the object indexed at its new tier and extent) is applied when the move is decided, as if
it succeeded, so the rest of the batch is decided exactly as the per-object calls decided it; the node's answers
settle it afterwards (`Placement._send`: a refused move evicts its object, as a refused per-object move did;
what the batch decided after it may then differ from what the per-object calls would have decided, never its
consistency).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.store.node import Drop, Move
from kvpool.tiers.types import Tier


@dataclass(slots=True)
class Demotion:
    """One queued move and what settling its answer needs: the slot it moved (already indexed at the target) and
    the tier it left."""

    slot: int
    move: Move
    src_tier: Tier


@dataclass(slots=True)
class NodeCalls:
    """One node's queued calls (see the module docstring). `slots`: the objects a queued move has moved."""

    node: object                    # placement.NodeState
    drops: list[Drop] = field(default_factory=list)
    demotions: list[Demotion] = field(default_factory=list)
    slots: set[int] = field(default_factory=set)

    def add_move(self, demotion: Demotion) -> None:
        self.demotions.append(demotion)
        self.slots.add(demotion.slot)

    def take(self) -> tuple[list[Drop], list[Demotion]]:
        """The queued drops and moves, in sending order; empties the queue."""
        drops, demotions = self.drops, self.demotions
        self.drops, self.demotions = [], []
        self.slots.clear()
        return drops, demotions


@dataclass(slots=True)
class DeferredCall:
    """One node's Demote a put_start sends after the lock (its drops carried or sent first, as `Placement._send`
    does), then settles under the lock again; `results`: the node's answer per move, once sent."""

    node: object                    # placement.NodeState
    drops: list[Drop]
    demotions: list[Demotion]
    results: list[bool] | None = None


@dataclass(slots=True)
class Deferred:
    """The node calls a batch left to its caller (`Placement.batched_ops(defer=True)`): `erases`, (node, drops) per
    node that only drops; `moves`, the Demote calls, whose objects are in flight until settled."""

    erases: list[tuple[object, list[Drop]]] = field(default_factory=list)
    moves: list[DeferredCall] = field(default_factory=list)

    def slots(self) -> list[int]:
        """The objects the deferred moves carry (in flight until `Placement.settle_deferred`)."""
        return [d.slot for call in self.moves for d in call.demotions]
