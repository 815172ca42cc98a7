"""Retention hints: a put may ask the pool to keep its objects at least `pin_s` seconds (an agent or a multi-turn
chat knows its prefix comes back). A hint, never a reservation:

    put_start(keys, sizes, pin_s)  ──hold──▶  index.retained[slot] = now + ceil(pin_s)  (also for an EXISTS key:
                                              the pin is extended, so a chain's already-stored prefix is kept too)
                                   over the tenant's cap ─▶ not pinned, counted in `clipped`; the put goes on
    Placement._pick_victims        coldest first among UNPINNED victims; only when they cannot make the room, the
                                   pinned ones yield, coldest first, counted in `yielded` (never a refused put while
                                   any unpinned space could be freed, and never one because of pins at all);
                                   an orphan (store/chains.py) is not protected: no lookup reaches it. The pinned
                                   objects a pick passes over (when the unpinned made the room) go to the hot end
                                   of the policy, their order kept: a pass counts as a use, so pins yield in order
                                   of last use or pass, and no later pick walks the pinned set again (walking it at
                                   every pick made a full pool's put O(pinned): 138.7 ms per 32-object put with
                                   8,192 pinned objects, 0.8 ms with none)
    Quotas._pick (store/quota.py)  the same rule among a tenant's own objects when it is over its quota: its
                                   unpinned objects go first (every tier), its pinned ones yield only when those
                                   cannot make the room (`protects` is the one test both use); the pins it passes
                                   over go to the hot end likewise (`Placement.pass_over`)

Bounded: a tenant's pinned payload bytes stay within `max_fraction` of the pool's capacity (every tier of every node;
with authentication off the whole pool is one tenant). Expiry is lazy: a victim whose pin ended is unpinned when
the policy offers it, and `sweep` (the master's reaper, every few seconds) drops ended pins so the pinned-bytes
figures stay current. Time is whole seconds since the master started (`t0` on the master's clock); a journalled
record carries its pin's end as master-clock seconds (`end_of`, ObjectRecord.pinned_until), so a master restarted
on a persistent backend (Redis) reloads the pins that have not ended (`restore`, not re-checked against the tenant
cap: each was within it when granted). Memory: store/index.py `retained` (a dict over pinned slots only). Not
thread-safe: master lock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpool.store.chains import ORPHAN
from kvpool.store.index import Index


@dataclass(slots=True)
class RetentionCounters:
    clipped: int = 0        # keys whose pin was refused (their tenant at its pinned-bytes cap); stored unpinned
    yielded: int = 0        # pinned objects taken as victims (demoted or evicted) because nothing unpinned could go


class Retention:
    def __init__(self, index: Index, max_fraction: float = 0.5) -> None:
        self.index = index
        self.max_fraction = max_fraction
        self.now = 0                    # whole seconds since the master started (Master._tick keeps it current)
        self.t0 = 0.0                   # the master clock at its start (what `now` counts from)
        self.counters = RetentionCounters()

    def cap(self, capacity: int) -> int:
        """Pinned payload bytes one tenant may hold in a pool of `capacity` bytes."""
        return int(self.max_fraction * capacity)

    def until(self, pin_s: float) -> int:
        """The end of a pin of `pin_s` seconds from now. Computed once per put: every key of the batch shares the one
        int object (an int is 28 B; the dict entry is the rest of a pinned object's cost)."""
        return self.now + math.ceil(pin_s)

    def hold(self, slot: int, until: int, cap: int) -> bool:
        """Pin `slot` until `until` (extending a longer-lived pin never shortens it). False (and counted) when that
        would take its tenant past `cap` pinned bytes."""
        index = self.index
        if slot not in index.retained:
            tenant = int(index.tenant[slot])
            if index.retained_bytes(tenant) + int(index.size[slot]) > cap:
                self.counters.clipped += 1
                return False
        index.retain(slot, until)
        return True

    def live(self, slot: int) -> bool:
        """Whether `slot` holds a pin that has not ended (an ended one is dropped here)."""
        until = self.index.retained.get(slot)
        if until is None:
            return False
        if until > self.now:
            return True
        self.index.unretain(slot)
        return False

    def end_of(self, slot: int) -> float:
        """The end of `slot`'s pin as master-clock seconds (what the journal keeps), 0.0 if it has none."""
        until = self.index.retained.get(slot)
        return 0.0 if until is None else self.t0 + until

    def restore(self, slot: int, end: float) -> bool:
        """Re-pin a reloaded object until the journalled `end` (master-clock seconds); False if it has ended."""
        until = math.ceil(end - self.t0)
        if until <= self.now:
            return False
        self.index.retain(slot, until)
        return True

    def protects(self, slot: int) -> bool:
        """Whether `slot` is kept past unpinned victims: a live pin on an object a prefix lookup can still reach
        (an orphan's pin protects nothing)."""
        index = self.index
        return slot in index.retained and self.live(slot) and index.parent[slot] != ORPHAN

    def sweep(self) -> int:
        """Drop ended pins; returns how many. O(pinned slots), bounded by the caps."""
        index, now = self.index, self.now
        ended = [slot for slot, until in index.retained.items() if until <= now]
        for slot in ended:
            index.unretain(slot)
        return len(ended)


__all__ = ["Retention", "RetentionCounters"]
