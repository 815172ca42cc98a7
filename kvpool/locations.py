"""LocationCache: where a same-host client last found its objects, so a repeat get needs no master round trip.

On 2 cores a 64 KiB x 32 same-host get spends more time in its leased Lookup than in copying and hashing its 2 MiB:
measured 2026-11-27, 905 us per get of which the Lookup is 420 us (the master's handler 274 us in its thread, ~180 us
of it in-process; a bare socket round trip 26 us) and the copy + check 342 us, against a 223 us memcpy. The cache
takes that round trip off the get's path:

    remember   after a get read objects out of a mapped DRAM arena (same host), or a put committed them into one,
               the client keeps, per (namespace, key): the extent itself (a view into the mapped arena), its arena,
               the committed xxh3_64 and the arena's removal generation read before that lookup or put; entries
               live `ttl_s` from the master's last word on them
    run        a later get whose keys are all remembered, fresh and of the buffers' sizes copies them straight out
               of those extents through the read fence (fence.copy_verified_many) with no lease and no RPC; a get
               with any key not remembered goes to the master whole (one chain, as the master would have seen it)

SSD records (`SsdLocation`): where a same-host get read an SSD record straight from the node's data file
(kvpool/transfer.py), the entry is that location: the open reader of the file, the offset, the payload size and the
key the record stores. A repeat get reads it again with one preadv into the caller's buffer and keeps it only where
the record's own checks (key, size, header and payload checksums) and then the committed checksum hold, so an erased
record, or one whose space now holds another object, is a stale entry, never another object's bytes. It is dated and
vouched for by that node's arena like a DRAM entry (a node with no DRAM tier shares an arena that holds no objects,
for its tail page and its host index: store/node.py), so removals and a dead node are handled as below.

TCP (`TcpLocation`): where a get read objects through a node's data channel (another host, or transport "tcp"),
the entry is the extent the master named with the read token it signed (valid to the token's expiry, less
TOKEN_MARGIN_S for the clocks), and the entry's "arena" is that node's `transfer.NodeStamp`, which dates it with the
node's *removal stamp* as this client last heard it (store/data_channel.py STAMP). A repeat get sends one pipelined
window of READ_DATED frames carrying those dates, the bytes hashed as they land: the node refuses every read whose
date is not its stamp now (a removal since, or another node process), so the removal rule below holds over TCP too,
checked at the node instead of by an 8-byte load here. A refused date makes this client forget the node's stamp and
every entry dated by it; its next located get learns the stamp again (one round trip, after the read) and the one
after that is remembered. The first get of a node's objects is never remembered: nothing dated it before its lookup.

Why no lease is needed: the fence is the guarantee, as for every same-host read (kvpool/fence.py). A returned
buffer hashes to the checksum committed for its key, whatever happened to the extent since it was remembered
(evicted, moved, reused by another object, being rewritten): a mismatch means the entry is stale, and it is
forgotten and the get goes to the master the usual way, never reported as corrupt (an extent
legitimately holds another object once the master let it go). An arena whose node died (its lock is free) is
never read from the cache; its entries are dropped.

The master still hears of every get: PoolClient reports the chains it served from the cache off the get's path
(its background thread coalesces them into one Lookup per chain with `uses` = the gets it stands for and
`count_only`), so the eviction policy sees the chain used and the hit-rate statistics and the traffic recorder count
every get. The reply is the hit count and the hits' tiers alone: a key past it (the master no longer has it), or
remembered in another tier than it is in now (promoted, demoted), is forgotten then, and the other hits live
`ttl_s` longer where they are remembered (`refresh`; no locations travel, since every read is checked and the
entry's generation still dates the lookup that located it).

Removals: nothing removed is served once `remove` returned. Each node's DRAM arena carries a removal generation
in its tail page (tiers/dram.py); the master has every node bump it after a Remove or an admin Evict and before
it answers, and a node bumps it when it registers with a master (one that restarted without its index). An entry is
dated with its arena's generation read *before* the lookup that located it, and `run` drops an entry whose arena's
generation has moved since: one 8-byte load from the client's own mapping, no round trip. What is still served: an
object the master evicted for room (or that a tenant's quota pushed out) whose extent still holds its bytes, until
the master answers the report of that get (the reply forgets it, one linger later). Those are the committed bytes
of that key, never another's; a KV cache loses nothing by one more hit. A node the master could not reach at a
removal (logged) leaves its clients' entries as they are: such an object can be served as one evicted for room
can, until the reply to the report of the get that served it (one linger).

Ordering: a client's cached gets reach the master before its next put (which may evict), prefix lookup or stats
call (Releaser.flush_uses), so its eviction order, hit counts and recorded trace are as they would be without the
cache; another client sees them one linger later.

Why it is on by default (PoolClient location_cache_s=None: DEFAULT_TTL_S with verify "all"): a 64 KiB x 32
same-host get is ~0.3x memcpy through a Lookup and ~0.6-0.9x without one (bench/pool_remote.py); over TCP the
Lookup is a quarter of a 64 KiB x 32 get (bench/pool_remote.py prints the cached / uncached ratio).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from kvpool.tiers.types import Tier

_DRAM, _SSD = int(Tier.DRAM), int(Tier.SSD)
TOKEN_MARGIN_S = 2.0      # a TCP entry is not used this close to its read token's expiry (the node's clock decides)
MAX_ENTRIES = 65536      # remembered objects per client, oldest dropped first (a 4K-token prompt is 256 blocks)
MAX_TTL_S = 3600.0
DEFAULT_TTL_S = 10.0     # PoolClient's default: each cached get's report refreshes its entries well before that


@dataclass(frozen=True, slots=True)
class SsdLocation:
    """Where a same-host node's SSD record of an object is: `reader` (tiers.ssd.SsdReader of the node's data file)
    at `offset`, holding `nbytes` of payload under `key` (the key the master stores: a tenant's is scoped). A read
    checks the record as the node does (key, size, header and payload checksums), then the committed checksum."""

    reader: Any
    offset: int
    nbytes: int
    key: bytes


@dataclass(frozen=True, slots=True)
class TcpLocation:
    """Where a node reached over its data channel keeps an object: `extent` (store.data_channel.Extent: tier,
    offset, size, the read token the master signed and its expiry, the key an SSD record stores, and in `ns` the
    removal stamp that dates it), read through `node`'s data channel (transfer.NodeStamp) as a READ_DATED."""

    node: Any
    extent: Any

    @property
    def nbytes(self) -> int:
        return self.extent.size

    @property
    def tier(self) -> int:
        return self.extent.tier


def tier_of(extent: Any) -> int:
    """The tier (tiers.types.Tier value) a remembered extent is in."""
    kind = type(extent)
    return extent.tier if kind is TcpLocation else _SSD if kind is SsdLocation else _DRAM


@dataclass(slots=True)
class Cached:
    """One remembered object: `extent` is the object's bytes in `arena` (a mapped tiers.dram.DramArena), or the
    SsdLocation of its record in the data file of the node that owns `arena` (then the arena only dates and
    vouches: its removal generation and its owner's lock), or a TcpLocation on the node whose NodeStamp `arena` is
    (its `generation` is the stamp this client last heard from the node)."""

    arena: Any
    extent: memoryview | SsdLocation | TcpLocation
    checksum: int
    expires: float          # time.monotonic() after which the entry is not used
    generation: int | bytes  # the arena's removal generation (a node's stamp) read before the lookup that located it


class LocationCache:
    """(namespace digest, key) -> Cached, bounded, thread-safe. Counters: `gets` served wholly or partly from it,
    `objects` read from it, `stale` entries found not to hold their object any more, `removed` entries dropped
    because their arena's node was told of a removal after they were located."""

    def __init__(self, ttl_s: float, max_entries: int = MAX_ENTRIES) -> None:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not 0 < ttl_s <= MAX_TTL_S:
            raise ValueError(f"location_cache_s must be seconds in (0, {MAX_TTL_S:g}], got {ttl_s!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be an int >= 1, got {max_entries!r}")
        self.ttl_s = float(ttl_s)
        self.max_entries = max_entries
        self.gets = 0
        self.objects = 0
        self.stale = 0
        self.removed = 0
        self._entries: dict[tuple[bytes, bytes], Cached] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, ns: bytes, keys: Sequence[bytes], arenas: Sequence[Any],
                 extents: Sequence[memoryview | SsdLocation],
                 checksums: Sequence[int], generations: Sequence[int]) -> None:
        """The master just said keys[i] is `extents[i]` in `arenas[i]` with committed `checksums[i]`, answering a
        lookup sent when that arena's removal generation was `generations[i]`."""
        expires = time.monotonic() + self.ttl_s
        entries = self._entries
        with self._lock:
            for key, arena, extent, checksum, gen in zip(keys, arenas, extents, checksums, generations):
                k = (ns, key if type(key) is bytes else bytes(key))
                entries.pop(k, None)        # re-inserted last: the dict's order is the drop order
                entries[k] = Cached(arena, extent, int(checksum), expires, gen)
            while len(entries) > self.max_entries:
                del entries[next(iter(entries))]

    def refresh(self, ns: bytes, keys: Sequence[bytes], tiers: Sequence[int] | None = None) -> None:
        """The master just counted gets of `keys` it still has (a use report): those remembered live `ttl_s` from now
        and move to the back of the drop order. Their locations and generations stay as they were: each later read
        is checked, and the generation still dates the lookup that located them. `tiers` (the tier each key is in
        now, tiers.types.Tier values): an entry remembered in another tier is forgotten instead (a promoted
        object's next get locates it in DRAM)."""
        expires = time.monotonic() + self.ttl_s
        entries = self._entries
        with self._lock:
            for i, key in enumerate(keys):
                k = (ns, key if type(key) is bytes else bytes(key))
                entry = entries.pop(k, None)
                if entry is None:
                    continue
                if tiers is not None and tiers[i] != tier_of(entry.extent):
                    continue
                entry.expires = expires
                entries[k] = entry

    def run(self, ns: bytes, keys: Sequence[bytes], sizes: Sequence[int]) -> list[Cached]:
        """The remembered entries of the leading keys: fresh, each of the size the caller's buffer has, and located
        since the last removal its arena was told of (an entry older than that is forgotten, counted `removed`), a
        TCP entry's read token valid TOKEN_MARGIN_S longer."""
        now = time.monotonic()
        token_cutoff = 0            # a TCP entry's read token must be valid past this (unix ms), computed once
        out: list[Cached] = []
        entries = self._entries
        arena, gen = None, 0        # the last entry's arena and its generation now (a get's keys share few arenas)
        with self._lock:
            for key, size in zip(keys, sizes):
                k = (ns, key if type(key) is bytes else bytes(key))
                entry = entries.get(k)
                if entry is None or entry.expires <= now or entry.extent.nbytes != size:
                    break
                if type(entry.extent) is TcpLocation:
                    if not token_cutoff:
                        token_cutoff = int((time.time() + TOKEN_MARGIN_S) * 1000)
                    if entry.extent.extent.expires_ms <= token_cutoff:
                        del entries[k]
                        break
                if entry.arena is not arena:
                    arena = entry.arena
                    gen = arena.generation
                if gen != entry.generation:
                    del entries[k]
                    self.removed += 1
                    break
                out.append(entry)
        return out

    def count(self, objects: int) -> None:
        with self._lock:
            self.gets += 1
            self.objects += objects

    def forget(self, ns: bytes, keys: Sequence[bytes], *, stale: bool = False, removed: bool = False) -> None:
        """Drop these entries; `stale` / `removed` counts them as found not holding their object / dated before a
        removal (a node refused a TCP entry's date)."""
        with self._lock:
            for key in keys:
                if self._entries.pop((ns, bytes(key)), None) is not None:
                    self.stale += stale
                    self.removed += removed

    def forget_arena(self, arena: Any) -> None:
        """Drop every entry in `arena` (its node died)."""
        with self._lock:
            for k in [k for k, v in self._entries.items() if v.arena is arena]:
                del self._entries[k]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def report(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "gets": self.gets, "objects": self.objects, "stale": self.stale,
                    "removed": self.removed}


__all__ = ["LocationCache", "Cached", "SsdLocation", "TcpLocation", "tier_of", "MAX_ENTRIES", "MAX_TTL_S",
           "DEFAULT_TTL_S", "TOKEN_MARGIN_S"]
