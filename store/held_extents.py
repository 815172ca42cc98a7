"""Expired DRAM grants' extents that a same-host writer may still be copying into: kept from reuse until their node's
heartbeats show no writer claims them (tiers/writer_claims.py has the whole protocol and why it holds).

A same-host client copies a put's bytes straight into the node's arena, and no one can stop a copy that has begun:
a writer stopped in the middle of one (SIGSTOP, a long pause) past its grant's expiry would land the rest of its
bytes on whatever the master had placed on that extent since. So when a DRAM grant on a node that says
`writer_claims` expires, the master forgets the object (its key is free for a new put at once) but keeps its extent
allocated here, and frees it on the second heartbeat after the expiry whose scan names no claimed range over it. The
heartbeat just after the expiry may have scanned before it; the one after that was sent once the node had the reply
to the first, so its scan came after the expiry, when every writer whose deadline check passed had already stored
its claim. A writer still copying keeps its claim, and the extent stays held until a heartbeat after its copy.

Lock held by the caller (the master's). One owner of this state: the master calls `hold`, `beat`, `forget_node`.
"""

from __future__ import annotations

from kvpool.tiers.writer_claims import overlaps


class HeldExtents:
    def __init__(self) -> None:
        self._held: dict[int, list[tuple[int, int, int]]] = {}     # node number -> [(offset, size, beats at hold)]
        self._beats: dict[int, int] = {}                            # node number -> heartbeats answered

    def hold(self, number: int, offset: int, size: int) -> None:
        """An expired grant's DRAM extent on node `number`: not to be given out until `beat` returns it."""
        self._held.setdefault(number, []).append((offset, size, self._beats.get(number, 0)))

    def beat(self, number: int, claimed: list[tuple[int, int]]) -> list[int]:
        """A heartbeat of node `number` whose scan found `claimed` ([start, end) ranges): the offsets of the held
        extents to free now (the caller frees them in the node's DRAM allocator)."""
        beats = self._beats[number] = self._beats.get(number, 0) + 1
        held = self._held.get(number)
        if not held:
            return []
        keep, free = [], []
        for entry in held:
            offset, size, at = entry
            if beats >= at + 2 and not overlaps(claimed, offset, size):
                free.append(offset)
            else:
                keep.append(entry)
        if keep:
            self._held[number] = keep
        else:
            del self._held[number]
        return free

    def forget_node(self, number: int) -> None:
        """Node `number` left or restarted: its allocators (and so its held extents) went with it."""
        self._held.pop(number, None)
        self._beats.pop(number, None)

    def count(self) -> int:
        return sum(len(v) for v in self._held.values())

    def beats(self, number: int) -> int:
        """Heartbeats of node `number` answered (since it registered as this process)."""
        return self._beats.get(number, 0)


__all__ = ["HeldExtents"]
