"""Moving bytes between caller buffers and storage nodes: the client half of the data path, used by PoolClient
(puts and gets) and by `kvpool drain` (object moves).

    write(batch, positions, keys, views, ns, deadline=)   / read(batch, positions, keys, views, corrupt=)
        batch: a `store.wire.ExtentBatch` (the master's reply: where each entry's bytes live, and the tokens)
        per entry, by its node's route:
          same host (node's host_id equals ours and its DRAM arena file is there), DRAM tier:
              memcpy straight into / out of the node's arena, mapped once (`DramArena.attach`)
          same host, a read of an SSD extent, the node shares its data file (`share_dram`) and we can open it:
              one preadv of the record straight into the caller's buffer (`tiers.ssd.SsdReader`: header and
              payload checked as the node would, the payload hashed once, in the caller's buffer); a record that
              fails here is read again through the node's data channel, which has the last word (a file replaced
              under an open reader, e.g. a node restarted on a fresh directory, costs a retry, never a false
              "corrupt" report; the reader is reopened then)
          otherwise, or transport "tcp", or an SSD write, or an HBM extent:
              the node's raw TCP data channel (store/data_channel.py), pipelined per node, `recv_into` the buffer
        -> the set of positions that failed (refused by the node, unreachable, or a read whose bytes do not hash to
           the committed checksum: a miss, never returned bytes)

The same-host fence (kvpool/fence.py says why it is this one): every read is checked against the committed xxh3_64
by default (`verify="all"`; same-host copies are hashed chunk by chunk as they land), so a stalled peer can never
make a read return another object's bytes; a same-host write claims the range it copies into before it checks its
grant's `deadline` and starts no copy past it (tiers/writer_claims.py: the node's heartbeats show the claim, and
the master gives no claimed extent out again, so a copy that began in time and stalled lands on its own extent), and
is failed (never committed) when the arena's owner died meanwhile. `verify="remote"` checks only bytes that crossed
the data channel, `"none"` nothing: both give up that guarantee (benchmarks, trusted single-tenant setups).
Zero-staging callers (kvpool/extents.py) use the pieces: `mapped_views` (same-host DRAM extents themselves, for the
caller's own copy; a put's through `claim_mapped`, claimed until its commit), `check_mapped` (the read fence on
them), `fenced` + `check_landed` (the same fence on the caller's own hash of its copy), `owners_gone` (the
write-side owner check), and `read`/`write` for the staged rest.
The location cache (kvpool/locations.py) takes `mapped_extents` and `ssd_locations` (the SSD records this client
reads itself, each with the node's arena that dates it) from a reply, and reads its SSD entries with
`read_located` (the record's checks and the committed checksum; a failure is stale, neither retried nor reported).
Over TCP it takes `tcp_locations` (the extents a read sends through a node's data channel, with their read tokens,
dated by the node's `NodeStamp`: its removal stamp as this client last heard it, `learn_stamps` after a located get)
and reads them with `read_dated` (one window of READ_DATED frames per node, hashed as they land; a refused date
makes the stamp unknown).
`pin_arenas = True` registers every mapped arena with CUDA (`DramArena.pin`). A read that failed its checksum is
added to `corrupt` so the caller can report it. A node that cannot be reached fails only its own entries; a write
where nothing could be written anywhere raises PoolUnavailable / PoolTimeout (an outage, not "no space").
Thread-safe: routes are shared read-mostly, data connections are pooled per caller.

TLS: a node that advertises `data_tls` is reached over TLS (`ssl_context`, else the system's CAs; `server_name`
overrides the name checked in its certificate). Shared memory needs none: it never leaves the machine.

One module of ~690 lines because it is one concept, the client's data movement with its read fence; the channels,
the arenas and the fence itself live in their own modules.
"""

from __future__ import annotations

import logging
import math
import os
import ssl
import threading
import time
from typing import Callable, Sequence

from kvpool import fence
from kvpool.errors import PoolTimeout, PoolUnavailable
from kvpool.locations import SsdLocation, TcpLocation
from kvpool.proto import kvpool_pb2 as pb
from kvpool.store import wire
from kvpool.store.data_channel import NOT_FOUND, STAMP_REFUSED, DataChannelError, DataClient, Extent
from kvpool.store.wire import ExtentBatch
from kvpool.tiers.host_index import HostIndex
from kvpool.tiers.types import Tier

log = logging.getLogger(__name__)

VERIFY_MODES = ("remote", "all", "none")
_CLAIMS_RETRY_S = 5.0     # a process that found every block of an arena's writer claims held asks again after this
_DRAM = int(Tier.DRAM)
_SSD = int(Tier.SSD)
STAMP_RETRY_S = 30.0    # a node that did not answer STAMP (an older node) is asked again this much later


class NodeStamp:
    """A node read through its data channel, as the location cache sees it: the TCP counterpart of a mapped arena
    (kvpool/locations.py). `generation` is the node's removal stamp as this client last heard it (None: not known;
    a located get asks for it after its read, `Transfers.learn_stamps`), and it dates the TcpLocations remembered
    from lookups sent while it was known. The node itself checks each dated read against its stamp now, so
    `owner_alive` has nothing to check here: a dead node fails the read, and the get asks the master."""

    __slots__ = ("node_id", "data", "generation", "retry_at")

    def __init__(self, node_id: str, data: DataClient) -> None:
        self.node_id, self.data = node_id, data
        self.generation: bytes | None = None
        self.retry_at = 0.0      # time.monotonic() before which a failed STAMP is not asked again

    def owner_alive(self) -> bool:
        return True

    def refused(self, stamp: bytes) -> None:
        """A dated read naming `stamp` was refused: the node's stamp moved (or it is another process)."""
        if self.generation == stamp:
            self.generation = None


class Route:
    """How to reach one node: its arena mapped here (same host) and/or its data channel."""

    __slots__ = ("node_id", "arena", "ssd", "data", "data_address", "owner_gone", "index", "stamp", "_claims",
                 "_claims_retry", "_claims_lock")

    def __init__(self, node_id: str, arena, data: DataClient | None, data_address: str, ssd=None) -> None:
        self.node_id, self.arena, self.data, self.data_address = node_id, arena, data, data_address
        self.ssd = ssd           # tiers.ssd.SsdReader of the node's data file (same host), else None
        self.owner_gone = False  # logged once: the arena's node died
        region = arena.index_region if arena is not None else None
        self.index = HostIndex(region) if region is not None else None    # the node's published objects
        self.stamp = NodeStamp(node_id, data) if data is not None else None   # dates what was read over TCP
        self._claims = None      # tiers.writer_claims.WriterClaims of the arena: taken at this route's first write
        self._claims_retry = 0.0
        self._claims_lock = threading.Lock()   # one block per mapping: the same description may re-lock a taken one

    def path(self, tier: int, *, write: bool = False) -> str:
        """Where an access to an extent on `tier` of this node goes: "ssd" (its data file, read here; reads only),
        "arena" (its DRAM arena, mapped here) or "channel" (its data channel): the one rule that `_move` follows and
        that `ssd_locations` and `tcp_locations` remember by. A write goes into the arena only while this process
        holds a block of its writers' claims (`claims`)."""
        if not write and self.ssd is not None and tier == _SSD:
            return "ssd"
        if self.arena is not None and tier == _DRAM and (not write or self.claims() is not None):
            return "arena"
        return "channel"

    def claims(self):
        """This process's block of writer claims on the arena (tiers/writer_claims.py), taken at the first write;
        None while every block is held (asked again after _CLAIMS_RETRY_S): such writes take the data channel."""
        claims = self._claims
        if claims is None and self.arena is not None and time.monotonic() >= self._claims_retry:
            with self._claims_lock:
                claims = self._claims
                if claims is None and time.monotonic() >= self._claims_retry:
                    try:
                        claims = self._claims = self.arena.writer_claims()
                    except ValueError:      # closed meanwhile
                        claims = None
                    if claims is None:
                        self._claims_retry = time.monotonic() + _CLAIMS_RETRY_S
                        log.info("node %s: no free block of writer claims in its arena; writing over its data "
                                 "channel", self.node_id)
        return claims

    def close(self) -> None:
        """Let go of this process's block of claims (before the arena closes the descriptor its lock is on), then
        of the arena, the data file and the channel."""
        with self._claims_lock:
            claims, self._claims = self._claims, None
            self._claims_retry = math.inf
        if claims is not None:
            claims.close()
        if self.data is not None:
            self.data.close()
        if self.arena is not None:
            self.arena.close()
        if self.ssd is not None:
            self.ssd.close()


class Transfers:
    def __init__(self, host_id: str, *, transport: str = "auto", timeout: float = 10.0,
                 verify: str = "all", ssl_context: ssl.SSLContext | None = None, server_name: str = "",
                 verify_threads: int = 1) -> None:
        if transport not in ("auto", "tcp"):
            raise ValueError(f"transport must be 'auto' (shared memory when same host, else TCP) or 'tcp', "
                             f"got {transport!r}")
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be 'remote', 'all' or 'none', got {verify!r}")
        if isinstance(verify_threads, bool) or not isinstance(verify_threads, int) or verify_threads not in (0, 1):
            raise ValueError(f"verify_threads must be 0 (hash same-host reads on the calling thread) or 1 (a helper "
                             f"thread hashes them while the next copy runs), got {verify_threads!r}")
        self.host_id = host_id
        self.transport = transport
        self.verify_threads = verify_threads
        self.timeout = timeout
        self.verify = verify
        self.checksum_failures = 0      # reads whose bytes did not match the committed checksum (misses)
        self.late_writes_skipped = 0    # same-host copies not started: the grant's deadline had passed
        # same-host copies not started: the arena's removal generation moved since the PutStart (its node registered
        # again, maybe with a restarted master that has placed something else there; or objects were removed)
        self.stale_writes_skipped = 0
        self.dead_owner_writes = 0      # same-host copies failed because the arena's node died meanwhile
        self.direct_ssd_reads = 0       # SSD records read here from a same-host node's data file (not its channel)
        self.direct_ssd_retries = 0     # ... of which failed here and were read again through the node's channel
        self.dated_reads = 0            # remembered TCP locations read (READ_DATED), good or not
        self.stamp_refusals = 0         # ... that a node refused: its removal stamp had moved
        self.ssl_context = ssl_context
        self.server_name = server_name
        self._routes: dict[tuple[str, str, str], Route] = {}
        self._mapped: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self.pin_arenas = False         # register mapped arenas as CUDA pinned memory (a GPU caller's DMA)

    def write(self, batch: ExtentBatch, positions: Sequence[int], keys: Sequence[bytes], views: Sequence[memoryview],
              ns: bytes, *, deadline: float = math.inf, landed: dict[int, int] | None = None,
              dated: dict[int, int | bytes] | None = None) -> set[int]:
        """Write views[i] to entry i of `batch` for i in `positions` (`ns`: the namespace an SSD record carries).
        `deadline` (fence.write_deadline): no same-host copy starts after it (that entry fails). `dated`
        (`generations()` read before the PutStart): nor into an arena whose removal generation has moved since. A
        node bumps it when it registers, so a writer that stalled across a master restart (on Redis, where its grant
        has not expired: the new master may have placed another object on that extent) writes nothing; the grants of
        a master that is gone are refused at commit anyway. `landed`: filled with {i: xxh3_64 of the bytes copied}
        for the same-host copies, hashed in the copy's pass (fence.copy_hashed), so the commit need not read them
        again."""
        return self._move(batch, positions, keys, views, ns, write=True, deadline=deadline, landed=landed,
                          dated=dated)

    def read(self, batch: ExtentBatch, positions: Sequence[int], keys: Sequence[bytes],
             views: Sequence[memoryview], *, corrupt: set[int] | None = None) -> set[int]:
        """Read entry i of `batch` into views[i] for i in `positions`, checked as `verify` says. Positions whose
        bytes are known bad (checksum mismatch here, or the node's SSD record check) are also added to `corrupt`."""
        return self._move(batch, positions, keys, views, b"", write=False, corrupt=corrupt)

    def mapped_views(self, batch: ExtentBatch, positions: Sequence[int]) -> dict[int, memoryview]:
        """{position: the extent itself} for the entries among `positions` that are DRAM extents of a node whose
        arena is mapped here (same host, transport "auto"). The others must go through `read`/`write`."""
        return {i: view for i, (_, view) in self.mapped_extents(batch, positions).items()}

    def mapped_extents(self, batch: ExtentBatch, positions: Sequence[int]) -> dict[int, tuple[object, memoryview]]:
        """`mapped_views` with each extent's arena: {position: (tiers.dram.DramArena, the extent)}."""
        arenas = [self._route(ep).arena for ep in batch.nodes]
        node_index, tiers = list(batch.node_index), list(batch.tiers)
        by_arena: dict[int, list[int]] = {}       # node position -> the positions to map there
        for i in positions:
            n = node_index[i]
            if arenas[n] is not None and tiers[i] == _DRAM:
                by_arena.setdefault(n, []).append(i)
        out: dict[int, tuple[object, memoryview]] = {}
        offsets, sizes = batch.offsets, batch.sizes
        for n, picked in by_arena.items():
            arena = arenas[n]
            views = arena.views([offsets[i] for i in picked], [sizes[i] for i in picked])
            out.update((i, (arena, view)) for i, view in zip(picked, views))
        return out

    def claim_mapped(self, batch: ExtentBatch, positions: Sequence[int],
                     dated: dict[int, int | bytes] | None = None) -> tuple[dict[int, memoryview], Callable]:
        """`mapped_views` for a caller that copies into the extents itself (a zero-staging put, kvpool/extents.py):
        each arena's extents under one writer claim (tiers/writer_claims.py: the range from the first to the end of
        the last) from now until the returned `release()` (the put's commit or abort, after the caller's copies), so
        that their node keeps them from being given out again while they may still be written. The caller checks
        its grants' deadline after this call, as a copy's deadline check follows its claim. An arena whose claims
        this process cannot take (every block or cell held), or whose removal generation has moved since `dated`
        (`generations()` before the PutStart: its node registered again, maybe with a master that does not know
        these grants), is left out: those entries go through `write`."""
        extents = self.mapped_extents(batch, positions)
        by_node: dict[int, list[int]] = {}
        node_index, offsets, sizes = batch.node_index, batch.offsets, batch.sizes
        for i in extents:
            by_node.setdefault(int(node_index[i]), []).append(i)
        held: list[tuple] = []
        out: dict[int, memoryview] = {}
        for n, picked in by_node.items():
            claims = self._route(batch.nodes[n]).claims()
            cell = claims.take() if claims is not None else None
            if cell is None:
                continue
            claims.hold(cell, min(int(offsets[i]) for i in picked), max(int(offsets[i]) + int(sizes[i])
                                                                         for i in picked))
            arena = extents[picked[0]][0]
            before = dated.get(id(arena)) if dated else None
            if before is not None and before != arena.generation:      # checked after the claim, as `_move` does
                claims.give(cell)
                continue
            held.append((claims, cell))
            out.update((i, extents[i][1]) for i in picked)

        def release() -> None:
            while held:
                claims, cell = held.pop()
                claims.give(cell)

        return out, release

    def ssd_locations(self, batch: ExtentBatch, positions: Sequence[int],
                      keys: Sequence[bytes]) -> dict[int, tuple[object, SsdLocation]]:
        """{position: (the node's mapped arena, SsdLocation)} for the entries among `positions` that are SSD records
        this client reads itself (a same-host node whose data file it has open) of a node whose arena is mapped here:
        that arena's removal generation dates them for the location cache. `keys`: the caller's keys (a tenant's
        batch carries the stored ones)."""
        routes, stored, node_index, tiers, offsets, sizes = self._columns(batch, keys)
        out: dict[int, tuple[object, SsdLocation]] = {}
        for i in positions:
            route = routes[node_index[i]]
            if route.path(tiers[i]) == "ssd" and route.arena is not None:
                out[i] = (route.arena, SsdLocation(route.ssd, offsets[i], sizes[i], bytes(stored[i])))
        return out

    def read_located(self, locations: Sequence[SsdLocation], views: Sequence[memoryview],
                     checksums: Sequence[int]) -> list[bool]:
        """Read each SSD record of `locations` into views[i] (the record's own checks, then `checksums[i]`, the
        committed one): which reads are good. A bad one is not retried or reported here: a remembered location may
        hold another record by now (the caller asks the master again)."""
        oks = [False] * len(locations)
        by_reader: dict[int, list[int]] = {}
        for i, loc in enumerate(locations):
            by_reader.setdefault(id(loc.reader), []).append(i)
        for group in by_reader.values():
            reader = locations[group[0]].reader
            try:
                digests = reader.read_many_into([locations[i].offset for i in group],
                                                [locations[i].key for i in group], [views[i] for i in group])
            except ValueError:      # closed meanwhile (the route was dropped): a miss here
                continue
            for i, digest in zip(group, digests):
                oks[i] = digest == checksums[i]
            self.direct_ssd_reads += len(group)
        return oks

    def generations(self) -> dict[int, int | bytes]:
        """{id(arena): its removal generation now} for every arena mapped here (tiers/dram.py), and {id(NodeStamp):
        the node's removal stamp as last heard} for every node read over TCP whose stamp is known. Read before a
        lookup, it dates what that lookup's answer may be remembered as (kvpool/locations.py)."""
        with self._lock:
            routes = list(self._routes.values())
        out: dict[int, int | bytes] = {id(r.arena): r.arena.generation for r in routes if r.arena is not None}
        for r in routes:
            if r.stamp is not None and r.stamp.generation is not None:
                out[id(r.stamp)] = r.stamp.generation
        return out

    def tcp_locations(self, batch: ExtentBatch, positions: Sequence[int], keys: Sequence[bytes],
                      dates: dict[int, int | bytes]) -> dict[int, tuple[NodeStamp, TcpLocation]]:
        """{position: (the node's NodeStamp, TcpLocation)} for the entries among `positions` that a read sends
        through the node's data channel, of a node whose stamp is in `dates` (`generations()` before the lookup):
        each extent is dated with that stamp. `keys`: the caller's keys (a tenant's batch carries the stored ones)."""
        routes, stored, node_index, tiers, offsets, sizes = self._columns(batch, keys)
        out: dict[int, tuple[NodeStamp, TcpLocation]] = {}
        for i in positions:
            route = routes[node_index[i]]
            stamp = route.stamp
            if stamp is None or id(stamp) not in dates or route.path(tiers[i]) != "channel":
                continue
            extent = Extent(batch.ids[i], tiers[i], offsets[i], sizes[i], batch.expires_ms, batch.tokens[i],
                            bytes(stored[i]), dates[id(stamp)])
            out[i] = (stamp, TcpLocation(stamp, extent))
        return out

    def forget_stamps(self) -> None:
        """Forget every node's removal stamp (this client's own remove moved them all)."""
        with self._lock:
            for route in self._routes.values():
                if route.stamp is not None:
                    route.stamp.generation = None

    def learn_stamps(self, batch: ExtentBatch) -> None:
        """Ask each node of `batch` read over TCP whose removal stamp this client does not know for it (one round
        trip each; a node that does not answer it is asked again STAMP_RETRY_S later). Called after a located
        get's read: what it learns dates the lookups sent from now on."""
        now = time.monotonic()
        for ep in batch.nodes:
            stamp = self._route(ep).stamp
            if stamp is None or stamp.generation is not None or stamp.retry_at > now:
                continue
            try:
                stamp.generation = stamp.data.removal_stamp()
            except (OSError, DataChannelError) as exc:
                stamp.retry_at = now + STAMP_RETRY_S
                log.info("node %s: no removal stamp (%s); its objects are not remembered for %.0f s", ep.node_id,
                         exc, STAMP_RETRY_S)

    def read_dated(self, locations: Sequence[TcpLocation], views: Sequence[memoryview],
                   checksums: Sequence[int]) -> list[bool]:
        """Read each remembered TCP location into views[i] as one window of dated reads per node, each hashed as it
        lands against `checksums[i]` (the committed one): which reads are good. A bad one is not retried or
        reported here (its extent may hold another object by now: the caller asks the master again); a refused
        date makes the node's stamp unknown, so every entry it dated is dropped at its next use."""
        oks = [False] * len(locations)
        by_node: dict[int, list[int]] = {}
        for i, loc in enumerate(locations):
            by_node.setdefault(id(loc.node), []).append(i)
        for group in by_node.values():
            node = locations[group[0]].node
            digests: list = [None] * len(group)
            self.dated_reads += len(group)
            try:
                results = node.data.read_dated_into([locations[i].extent for i in group], [views[i] for i in group],
                                                     digests=digests)
            except OSError as exc:
                log.info("node %s: a remembered read failed (%s); the get asks the master", node.node_id, exc)
                continue
            for j, (i, err) in enumerate(zip(group, results)):
                if err is None:
                    oks[i] = digests[j] == checksums[i]
                elif err.status == NOT_FOUND and err.message.startswith(STAMP_REFUSED):
                    node.refused(locations[i].extent.ns)
                    self.stamp_refusals += 1
        return oks

    def host_indexes(self) -> list[tuple[object, HostIndex, object]]:
        """(arena, its node's HostIndex, the node's SSD data file open here or None) of every mapped arena that has
        an index (tiers/host_index.py): an SSD row is read from that file (`read_located`)."""
        with self._lock:
            return [(r.arena, r.index, r.ssd) for r in self._routes.values() if r.index is not None]

    def mapped_nodes(self) -> tuple[str, ...]:
        """Ids of the nodes whose DRAM this client copies through their mapped arena (every route to them has it
        mapped): a lookup tells the master, which then signs no data-channel token for their DRAM hits."""
        return self._mapped

    def check_mapped(self, batch: ExtentBatch, views: dict[int, memoryview]) -> set[int]:
        """The read fence on mapped extents the caller copied from itself: positions whose bytes do not hash to the
        committed checksum now (only with verify "all"; counted in `checksum_failures`)."""
        if self.verify != "all":
            return set()
        positions = list(views)
        oks = fence.verify_many([views[i] for i in positions], [batch.checksums[i] for i in positions],
                                pipeline=self.verify_threads > 0)
        bad = {i for i, ok in zip(positions, oks) if not ok}
        if bad:
            self.checksum_failures += len(bad)
            log.warning("%d mapped read(s) did not match their committed checksum; served as misses", len(bad))
        return bad

    def fenced(self, positions) -> frozenset[int]:
        """Of `positions` (mapped extents a caller copies from itself), those the read fence covers: all of them
        with verify "all", none otherwise."""
        return frozenset(positions) if self.verify == "all" else frozenset()

    def check_landed(self, batch: ExtentBatch, i: int, digest: int) -> bool:
        """The read fence on a caller's own hash (`digest`, xxh3_64) of its copy of mapped extent i: whether it is
        the committed checksum (a mismatch is counted in `checksum_failures`)."""
        if digest == batch.checksums[i]:
            return True
        self.checksum_failures += 1
        log.warning("a mapped read did not match its committed checksum; served as a miss")
        return False

    def owners_gone(self, batch: ExtentBatch, positions: Sequence[int]) -> set[int]:
        """Positions among `positions` on a mapped arena whose node died (its lock is free): never commit those."""
        routes = [self._route(ep) for ep in batch.nodes]
        gone: set[int] = set()
        for i in positions:
            route = routes[batch.node_index[i]]
            if route.arena is not None and not route.arena.owner_alive():
                route.owner_gone = True
                gone.add(i)
        if gone:
            self.dead_owner_writes += len(gone)
            log.warning("%d direct write(s) landed in the arena of a node that died; not committed", len(gone))
        return gone

    def pin_report(self) -> dict[str, str]:
        """{node id: "pinned" or why not} for every route; pins mapped arenas first when `pin_arenas` is on."""
        with self._lock:
            routes = list(self._routes.values())
        out: dict[str, str] = {}
        for route in routes:
            if route.arena is None:
                out[route.node_id] = "not mapped here (data channel, staged)"
            elif self.pin_arenas and route.arena.pin():
                out[route.node_id] = "pinned"
            else:
                out[route.node_id] = f"not pinned: {route.arena.pin_error or 'not asked'}"
        return out

    def warm(self, endpoints: Sequence[pb.NodeEndpoint], *, prefault: bool) -> dict[str, str]:
        """Route every endpoint now (a same-host node's arena mapped, its SSD file opened), each mapped arena's
        pages prefaulted with `prefault`: {node id: what was done}. The routes are the ones later gets use."""
        out: dict[str, str] = {}
        for ep in endpoints:
            route = self._route(ep)
            if route.arena is None:
                out[ep.node_id] = "not mapped here (data channel)"
            elif prefault:
                out[ep.node_id] = f"mapped, {route.arena.prefault()} bytes prefaulted"
            else:
                out[ep.node_id] = "mapped"
        return out

    def close(self) -> None:
        with self._lock:
            routes, self._routes, self._mapped = list(self._routes.values()), {}, ()
        for route in routes:
            route.close()

    # ------------------------------------------------------------------ internals

    def _move(self, batch: ExtentBatch, positions: Sequence[int], keys, views, ns: bytes, *, write: bool,
              deadline: float = math.inf, corrupt: set[int] | None = None,
              landed: dict[int, int] | None = None, dated: dict[int, int | bytes] | None = None) -> set[int]:
        failed: set[int] = set()
        bad: set[int] = set()
        unreachable: list[tuple[Route, OSError]] = []
        remote: dict[int, list[int]] = {}
        local_writes: dict[int, list[int]] = {}
        routes = [self._route(ep) for ep in batch.nodes]
        node_index, tiers, offsets, sizes = batch.node_index, batch.tiers, batch.offsets, batch.sizes
        verify_local = not write and self.verify == "all"
        stored = batch.keys if len(batch.keys) else keys  # a tenant's objects: the keys the master stores
        direct_ssd: dict[int, list[int]] = {}
        cells: dict[int, tuple] = {}    # node position -> (its route's WriterClaims, the cell this call copies under)
        verified: list[int] = []    # same-host reads to copy and check in one call (fence.copy_verified_many)
        extents: list[memoryview] = []
        try:
            for i in positions:
                n = node_index[i]
                route = routes[n]
                path = route.path(tiers[i], write=write)
                if path == "ssd":
                    direct_ssd.setdefault(n, []).append(i)
                elif path == "arena":
                    if write:
                        entry = cells.get(n)
                        if entry is None:       # path() said "arena": this route holds a block of claims
                            claims = route.claims()
                            entry = cells[n] = (claims, claims.take())
                        claims, cell = entry
                        if cell is None:        # CELLS copies of this process in flight: over the channel
                            remote.setdefault(n, []).append(i)
                            continue
                        # the claim first, then the deadline: a node scanning after the grant's expiry sees the claim
                        # of any copy that passed this check until it is over (tiers/writer_claims.py)
                        claims.hold(cell, int(offsets[i]), int(offsets[i]) + int(sizes[i]))
                        if fence.now() >= deadline:  # the grant may be gone: the extent may be someone else's
                            claims.drop(cell)
                            self.late_writes_skipped += 1
                            failed.add(i)
                            continue
                        before = dated.get(id(route.arena)) if dated else None
                        if before is not None and before != route.arena.generation:
                            claims.drop(cell)
                            self.stale_writes_skipped += 1      # (`write`)
                            failed.add(i)
                            continue
                        try:
                            if landed is None:
                                route.arena.view(offsets[i], sizes[i])[:] = views[i]
                            else:
                                landed[i] = fence.copy_hashed(route.arena.view(offsets[i], sizes[i]), views[i])
                        finally:
                            claims.drop(cell)
                        local_writes.setdefault(n, []).append(i)
                    elif verify_local:
                        verified.append(i)
                        extents.append(route.arena.view(offsets[i], sizes[i]))
                    else:
                        views[i][:] = route.arena.view(offsets[i], sizes[i])
                else:
                    remote.setdefault(n, []).append(i)
        finally:
            for claims, cell in cells.values():
                if cell is not None:
                    claims.give(cell)
        if verified:
            oks = fence.copy_verified_many([views[i] for i in verified], extents,
                                           [batch.checksums[i] for i in verified], pipeline=self.verify_threads > 0)
            bad.update(i for i, ok in zip(verified, oks) if not ok)
        for n, group in direct_ssd.items():
            # the records' own checks (key, size, header and payload checksums), then the committed checksum
            reader = routes[n].ssd
            digests = reader.read_many_into([offsets[i] for i in group], [bytes(stored[i]) for i in group],
                                            [views[i][:sizes[i]] for i in group])
            retry = [i for i, digest in zip(group, digests) if digest != batch.checksums[i]]
            self.direct_ssd_reads += len(group)
            if retry:
                self.direct_ssd_retries += len(retry)
                remote.setdefault(n, []).extend(retry)
                self._reopen_if_replaced(routes[n])
        for n, group in local_writes.items():
            route = routes[n]
            if not route.arena.owner_alive():  # after the copies: the node may have died during them
                log.log(logging.DEBUG if route.owner_gone else logging.WARNING,
                        "node %s died (its arena %s is unlocked): %d write(s) failed", route.node_id,
                        route.arena.path, len(group))
                route.owner_gone = True
                self.dead_owner_writes += len(group)
                failed.update(group)
                unreachable.append((route, ConnectionError(f"node {route.node_id} is gone (arena unlocked)")))
        for n, group in remote.items():
            route = routes[n]
            if route.data is None:
                failed.update(group)
                continue
            extents = [Extent(batch.ids[i], tiers[i], offsets[i], sizes[i], batch.expires_ms, batch.tokens[i],
                              bytes(stored[i]), ns) for i in group]
            digests = None if write or self.verify == "none" else [None] * len(group)
            try:
                if write:
                    results = route.data.write_many(extents, [views[i] for i in group])
                else:
                    results = route.data.read_many_into(extents, [views[i] for i in group], digests=digests)
            except OSError as exc:  # includes timeouts: this node's keys fail, the other nodes' go on
                log.warning("node %s (%s) failed during a %s: %s", route.node_id, route.data_address,
                            "write" if write else "read", exc)
                failed.update(group)
                unreachable.append((route, exc))
                continue
            for j, (i, err) in enumerate(zip(group, results)):
                if err is not None:
                    log.info("node %s refused %s of key %s: %s", route.node_id, "write" if write else "read",
                             bytes(keys[i]).hex(), err)
                    failed.add(i)
                    if not write and err.status == NOT_FOUND:  # the node's SSD record check failed (not "unreachable")
                        bad.add(i)
                elif digests is not None and digests[j] != batch.checksums[i]:   # hashed as the bytes arrived
                    bad.add(i)
        if bad:
            self.checksum_failures += len(bad)
            log.warning("%d read(s) did not match their committed checksum (first key %s); served as misses",
                        len(bad), bytes(keys[min(bad)]).hex())
            failed |= bad
            if corrupt is not None:
                corrupt |= bad
        if write and unreachable and len(failed) == len(positions):
            # Nothing could be written anywhere: that is an outage, not "no space".
            route, exc = unreachable[0]
            kind = PoolTimeout if isinstance(exc, TimeoutError) else PoolUnavailable
            raise kind(f"node {route.node_id} ({route.data_address}): {exc}") from exc
        return failed

    def _columns(self, batch: ExtentBatch, keys: Sequence[bytes]) -> tuple:
        """(routes by node position, the stored keys, node_index, tiers, offsets, sizes) of a batch: what the
        location passes read (a tenant's batch carries the stored keys; else the caller's are)."""
        return ([self._route(ep) for ep in batch.nodes], batch.keys if len(batch.keys) else keys, batch.node_index,
                batch.tiers, batch.offsets, batch.sizes)

    def _reopen_if_replaced(self, route: Route) -> None:
        """A direct read failed: if the node's data file is another file now than the one this reader holds open,
        read the new one from now on."""
        old = route.ssd
        if old is None or not old.replaced():
            return
        from kvpool.tiers.ssd import SsdReader

        try:
            new = SsdReader(old.path)
        except OSError as exc:
            log.info("cannot reopen %s of node %s, reading its SSD records over TCP: %s", old.path, route.node_id,
                     exc)
            new = None
        with self._lock:
            if route.ssd is old:
                route.ssd = new     # not closed here: another thread may be reading it; it closes when dropped
            elif new is not None:
                new.close()

    def _route(self, ep: pb.NodeEndpoint) -> Route:
        local = self.transport == "auto" and ep.host_id == self.host_id
        path = wire.dram_path(ep) if local else ""
        ssd_path = wire.ssd_path(ep) if local else ""
        cache_key = (ep.node_id, ep.data_address, path, ssd_path)
        with self._lock:
            route = self._routes.get(cache_key)
            if route is not None:
                return route
        arena = None
        if path and os.path.exists(path):
            from kvpool.tiers.dram import DramArena

            try:
                arena = DramArena.attach(path)
            except (OSError, ValueError) as exc:
                log.info("cannot map %s of node %s, using TCP: %s", path, ep.node_id, exc)
            else:
                if self.pin_arenas:
                    arena.pin()   # logs why when it cannot; copies still work, staged by the driver
        ssd = None
        if ssd_path and os.path.isfile(ssd_path):   # (an older node advertised its SSD directory: not read)
            from kvpool.tiers.ssd import SsdReader

            try:
                ssd = SsdReader(ssd_path)
            except OSError as exc:   # e.g. another user's node (0600): its data channel checks every grant
                log.info("cannot open %s of node %s, reading its SSD records over TCP: %s", ssd_path, ep.node_id, exc)
        data = None
        if ep.data_address:
            ctx = None
            if ep.data_tls:
                ctx = self.ssl_context if self.ssl_context is not None else ssl.create_default_context()
            data = DataClient(ep.data_address, timeout=self.timeout, ssl_context=ctx, server_hostname=self.server_name)
        route = Route(ep.node_id, arena, data, ep.data_address, ssd)
        with self._lock:
            existing = self._routes.setdefault(cache_key, route)
            if existing is route:
                routes = self._routes.values()
                unmapped = {r.node_id for r in routes if r.arena is None}
                self._mapped = tuple(sorted({r.node_id for r in routes} - unmapped))
        if existing is not route:
            if data is not None:
                data.close()
            if arena is not None:
                arena.close()
            if ssd is not None:
                ssd.close()
        return existing


__all__ = ["Transfers", "Route", "NodeStamp", "VERIFY_MODES", "STAMP_RETRY_S"]
