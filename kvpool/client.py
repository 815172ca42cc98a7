"""PoolClient: the public pool API (exactly EmbeddedPool's, `kvpool.pool.Pool`) through a master and its nodes.

    put_many:      PutStart (one RPC) ─▶ bytes to each granted extent ─▶ PutCommit (one RPC; xxh3_64 per object)
    get_many_into: Lookup with lease + expect_sizes (one RPC) ─▶ bytes from each location, checked against the
                   committed xxh3_64 ─▶ the lease ends with the next Lookup (it carries the finished leases) or
                   a Release ~5 ms later if none comes (not awaited; keys whose bytes were wrong: a Release at once)
                   Optimistic (default): hits that are all in arenas mapped here come with no lease; the copy is
                   kept where it hashes to the committed checksum, and a mismatch asks again with a lease
                   A Lookup also names the nodes whose arena is mapped here: their DRAM hits come without the
                   data-channel token (an HMAC per hit the master need not compute)
                   The location cache (kvpool/locations.py, on by default): a get of keys it read or put before
                   copies them from the remembered extents through the same check (an SSD record it read from a
                   same-host node's file: read there again, with the record's checks), with no Lookup, while their
                   arena's removal generation is unchanged; the gets are reported later (counted, no lease)
    reserve_many / acquire_many (kvpool/extents.py): the same RPCs, but the caller copies into / out of same-host
                   arena extents itself; the rest is staged through the data channel. A read that stops at its
                   staging rows goes on under the same lease (`ExtentRead.rest`); acquire_many(lease=False) of a
                   chain a same-host node's host index holds takes no Lookup at all (the caller checks each copy)

The layers it is built from, each usable on its own:
  kvpool/pool.py       PoolFront: argument checks, namespace, put counters (shared with EmbeddedPool)
  kvpool/rpc.py        MasterRpc: the channel, deadlines, retries of idempotent calls, the fault map
  kvpool/transfer.py   Transfers: same-host arena memcpy or the node's TCP data channel, read verification
  kvpool/releaser.py   Releaser: the background thread that ends read leases and sends the location cache's reports
  kvpool/locations.py  LocationCache: where same-host gets and puts found their objects (`location_cache_s`)
`kvpool drain` moves objects with the same `rpc` and `transfers` (public attributes).
One module of ~870 lines because it is one concept, the pool API over RPC: a backend method per PoolFront call,
each a few lines over the layers above, but for acquire_many's ExtentRead builders (leased, and from the host index:
~150 lines of closures over this client's transfers, releaser and lookups; a module of their own would need all
three handed over).

Faults: what is left after retries raises PoolUnavailable / PoolTimeout / PoolError (PoolAuthError: the master
refused the credential); caller mistakes raise ValueError before anything is sent. A node failing mid-put fails
only its keys ("no_space"); a get whose transfer fails stops at that key (a miss), like a get that hits a missing key.
A PutCommit is retried like the reads: a retry after a try that landed answers "no_space" for an object that is
stored (told less than happened, never more), and a retry reaching a restarted master names grant ids it never gave
out (store/leases.py), so it commits nothing there.

Credentials (kvpool/credentials.py): `token` (file:PATH / env:NAME or a TokenSource) and `tls` (a TlsConfig), else
KVPOOL_AUTH_TOKEN / KVPOOL_TLS_*: the master channel is TLS when configured and every call presents the token; a
node whose data channel speaks TLS (NodeEndpoint.data_tls) is reached over TLS with the same CA / certificate.
With authentication on, the master keeps this client's objects in its tenant's key space and sends their stored
keys back (`record_keys`); Transfers writes those into SSD record headers. Same-host shared memory is unchanged.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Sequence

import xxhash

from kvpool import fence
from kvpool.buffers import as_writable_bytes
from kvpool.credentials import Credentials
from kvpool.extents import REST_MARGIN_S, ExtentRead, ExtentWrite, SharedLease, Staging
from kvpool.keys import KEY_BYTES
from kvpool.locations import DEFAULT_TTL_S, MAX_TTL_S, LocationCache, SsdLocation, TcpLocation, tier_of
from kvpool.pool import PoolFront
from kvpool.proto import kvpool_pb2 as pb
from kvpool.releaser import Releaser
from kvpool.rpc import MasterRpc
from kvpool.store import wire
from kvpool.store.hostid import host_id
from kvpool.store.records import NO_NS, NsRef
from kvpool.tiers.host_index import SSD_ROW
from kvpool.tiers.types import Tier
from kvpool.transfer import Transfers

log = logging.getLogger(__name__)

_STALE = -1     # _get_cached / _get_published: a remembered or published extent no longer held its object


class PoolClient(PoolFront):
    def __init__(self, address: str, *, transport: str = "auto", timeout: float = 10.0, retries: int = 2,
                 max_object_bytes: int = 64 << 20, connect_timeout: float | None = None,
                 verify: str = "all", token=None, tls=None, credentials: Credentials | None = None,
                 control_channel: bool = True, release_linger_s: float = 0.005, verify_threads: int = 1,
                 location_cache_s: float | None = None, optimistic_reads: bool = True,
                 host_index_reads: bool = True) -> None:
        """`verify`: which reads are checked against the object's committed xxh3_64 before they count as hits
        (a mismatch is a miss at that key, never returned bytes, and is reported so the master forgets the object).
        "all" (default): every read, same-host copies out of a mapped arena included (hashed chunk by chunk as they
        land, kvpool/fence.py): no stalled reader or late writer can make a read return wrong bytes; "remote": only
        bytes that crossed the data channel; "none". The last two give that guarantee up.
        `control_channel`: send the hot calls over the master's control channel when it has one (kvpool/rpc.py);
        False: every call by gRPC. `release_linger_s`: how long a finished read lease waits for the next lookup to
        carry it before a Release of its own is sent (the object stays unevictable that long; 0: at once).
        `verify_threads`: 1 (default): a helper thread hashes the chunks of a same-host read that have landed while
        this one copies the next (fence.copy_verified_many; one more core busy during big reads); 0: the calling
        thread copies and hashes alone.
        `location_cache_s`: > 0 remembers where same-host gets found their objects for that many seconds after the
        master last confirmed them, and serves repeat gets of them with no master round trip, checked by the read
        fence and by the node's removal generation (kvpool/locations.py: nothing removed is served once `remove`
        returned; an object evicted for room whose extent is intact can be, until the master answers that get's
        report). None (default): DEFAULT_TTL_S with verify "all", else off. 0: off, every get asks the master.
        > 0 needs verify "all".
        `optimistic_reads`: True (default, with verify "all"): a get whose hits are all DRAM extents of arenas mapped
        here takes them without a lease (`LookupRequest.optimistic`): no pin, no release, less master work. The read
        fence is the guard: bytes that do not hash to the committed checksum after the copy (the extent was reused
        meanwhile) are never returned, and that key onwards is asked again with a lease. What a get returns is what
        it returned before: the objects committed when the master answered. False: every get takes a lease.
        `host_index_reads`: True (default, with verify "all" and no credentials): a get whose chain a same-host
        node published in its host index (tiers/host_index.py) is copied from there through the read fence with no
        Lookup at all, and reported to the master afterwards as a location-cache get is; a lookup_prefix of such a
        chain is answered there too, its Lookup sent afterwards (the master counts it as before). False: such gets
        and lookups ask the master first. With authentication on the index never holds a client's keys (tenants'
        stored keys), so it is not probed."""
        if not isinstance(address, str) or ":" not in address:
            raise ValueError(f"address must be host:port of a kvpool master, got {address!r}")
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        if not isinstance(control_channel, bool):
            raise ValueError(f"control_channel must be True or False, got {control_channel!r}")
        if isinstance(release_linger_s, bool) or not isinstance(release_linger_s, (int, float)) \
                or not 0 <= release_linger_s <= 60:
            raise ValueError(f"release_linger_s must be a number of seconds in [0, 60], got {release_linger_s!r}")
        if location_cache_s is None:
            location_cache_s = DEFAULT_TTL_S if verify == "all" else 0.0
        if isinstance(location_cache_s, bool) or not isinstance(location_cache_s, (int, float)) \
                or not 0 <= location_cache_s <= MAX_TTL_S:
            raise ValueError(f"location_cache_s must be seconds in [0, {MAX_TTL_S:g}] (0 = off), "
                             f"got {location_cache_s!r}")
        if not isinstance(optimistic_reads, bool):
            raise ValueError(f"optimistic_reads must be True or False, got {optimistic_reads!r}")
        if not isinstance(host_index_reads, bool):
            raise ValueError(f"host_index_reads must be True or False, got {host_index_reads!r}")
        if location_cache_s and verify != "all":
            raise ValueError(f"location_cache_s needs verify='all' (cached locations are trusted only through the "
                             f"read fence), got verify={verify!r}")
        creds = credentials if credentials is not None else Credentials.resolve(token, tls)
        self.transfers = Transfers(host_id(), transport=transport, timeout=float(timeout), verify=verify,
                                   ssl_context=creds.data_context(), server_name=creds.server_name,
                                   verify_threads=verify_threads)
        super().__init__(max_object_bytes)
        self.address = address
        self.transport = transport
        self.verify = verify
        self.host_id = self.transfers.host_id
        self.rpc = MasterRpc(address, timeout=timeout, retries=retries, credentials=creds, control=control_channel)
        self.locations = LocationCache(location_cache_s) if location_cache_s else None
        self.optimistic_reads = optimistic_reads and verify == "all"   # the fence is the guard: no fence, a lease
        self.optimistic_retries = 0     # unleased reads that found an extent reused and asked again with a lease
        self.host_index_reads = host_index_reads and verify == "all" and creds.token is None and creds.tls is None
        self.host_index_gets = 0        # gets served from a node's host index with no Lookup
        self.host_index_stale = 0       # gets and acquires whose published extent no longer held the object
        self.host_index_acquires = 0    # acquire_many reads served from a node's host index with no Lookup
        self.host_index_lookups = 0     # lookup_prefix calls answered from a node's host index (sent afterwards)
        self._acquire_index_stale = False   # a published acquire found a stale row: the next asks the master
        self._releaser = Releaser(self.rpc, float(release_linger_s), self._report_uses, self._send_lookup)
        try:
            self.rpc.wait_ready(connect_timeout or self.rpc.timeout)
        except BaseException:
            self._releaser.close(0.0)
            self.rpc.close()
            raise

    @property
    def timeout(self) -> float:
        return self.rpc.timeout

    @property
    def checksum_failures(self) -> int:
        return self.transfers.checksum_failures

    # ------------------------------------------------------------------ backend of PoolFront

    def _put(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef, pin_s: float) -> list[str]:
        digest = _wire_digest(ns)
        req = pb.PutStartRequest(namespace=digest, block_tokens=ns.block_tokens, namespace_label=ns.label,
                                 client_host_id=self.host_id, pin_s=pin_s)
        req.keys.extend(bytes(k) for k in keys)
        req.sizes.extend(v.nbytes for v in views)
        self._releaser.flush_uses(self.timeout)     # a put may evict: the master first hears of the cached gets
        gens = self.transfers.generations()     # dates the location cache's entries and the same-host copies
        sent_at = fence.now()
        reply = self.rpc.call("PutStart", req, what="put_start")
        statuses = [wire.PUT_STATUS_NAME.get(s, "no_space") for s in reply.statuses]
        granted = [i for i, s in enumerate(reply.statuses) if s == pb.STORED]
        grants = wire.grants_of(reply)
        failed: set[int] = set()
        landed: dict[int, int] = {}     # same-host copies: their checksums, taken in the copy's pass
        try:
            failed = self.transfers.write(grants, granted, keys, views, digest,
                                          deadline=fence.write_deadline(sent_at, reply.ttl_ms), landed=landed,
                                          dated=gens)
        except BaseException:
            self._abort([reply.grant_ids[i] for i in granted])
            raise
        sums = self._commit(reply.grant_ids, granted, failed, views, statuses, landed)
        if gens and self.locations is not None:
            self._remember_put(digest, keys, grants, [i for i in granted if statuses[i] == "stored"], sums, gens)
        return statuses

    def _lookup(self, keys: Sequence[bytes], ns: NsRef, s_per_token: float) -> int:
        if self.host_index_reads and self._published(keys):
            chain = [bytes(k) for k in keys]
            if self._releaser.report_lookup(ns, chain, s_per_token):
                self.host_index_lookups += 1
                return len(keys)
        self._releaser.flush_uses(self.timeout)     # the master (and its traffic recorder) in this client's order
        return self._send_lookup(ns, keys, s_per_token)

    def _send_lookup(self, ns: NsRef, keys: Sequence[bytes], s_per_token: float) -> int:
        """The Lookup of lookup_prefix (no lease): the master's hits; also a lookup answered from the host index,
        sent afterwards by the releaser so the master counts it (stats, prefill seconds saved, its trace) as
        before."""
        req = pb.LookupRequest(namespace=_wire_digest(ns), block_tokens=ns.block_tokens, namespace_label=ns.label,
                               lease=False, prefill_s_per_token=s_per_token)
        req.keys.extend(bytes(k) for k in keys)
        return self.rpc.call("Lookup", req, retry=True, what="lookup").hits

    def _published(self, keys: Sequence[bytes]) -> bool:
        """Whether one same-host node's host index holds the whole chain (DRAM extents or SSD records) and its
        node is alive: then lookup_prefix answers len(keys) with no round trip (a fresh client's first Lookup took
        0.3-0.6 ms, the index ~15 us for 255 keys). An entry the master has dropped since is a shorter load for the
        caller, as a lookup answered just before an eviction is; what is read is checked as every read is."""
        if not keys or any(len(k) != KEY_BYTES for k in keys):
            return False
        n = len(keys)
        for arena, index, _ssd in self.transfers.host_indexes():
            if len(index.find(keys)[0]) == n:
                return arena.owner_alive()
        return False

    def _get_into(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef,
                  tiers_out: list[str] | None) -> int:
        cached = self._get_cached(keys, views, ns, tiers_out) if self.locations is not None else 0
        if cached > 0:
            return len(keys)
        # after a stale cache entry the node's index most likely names the same reused extent: ask the master
        published = self._get_published(keys, views, ns, tiers_out) if self.host_index_reads and not cached else 0
        if published > 0:
            return len(keys)
        if cached == _STALE and self.host_index_reads:
            published = _STALE      # the lookup has the node's index set right too
        return self._get_located(keys, views, ns, tiers_out, optimistic=self.optimistic_reads,
                                 index_stale=published == _STALE)

    def _get_published(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef,
                       tiers_out: list[str] | None) -> int:
        """Read the whole chain from where one same-host node's host index says it is (DRAM extents through the read
        fence, SSD records from the node's data file with their own checks and the committed checksum):
        len(keys), or 0 and the get goes to the master whole (as `_get_cached`, all or nothing), or _STALE when a
        row no longer held its object (the lookup that follows then has the master set the index right). The
        master hears of a get served here from the use report, off this path; a report that finds keys gone has
        the node forget them."""
        indexes = self.transfers.host_indexes()
        if not indexes or any(len(k) != KEY_BYTES for k in keys):
            return 0
        n = len(keys)
        for arena, index, ssd in indexes:
            gen = arena.generation      # read before the probe: dates what the location cache may remember
            offsets, sizes, checksums, places = index.find(keys)
            if len(offsets) < n:
                continue
            if any(size != view.nbytes for size, view in zip(sizes, views)) or not arena.owner_alive():
                return 0        # another size: the master's answer names the buffer; a dead node: it says so
            on_ssd = [i for i, place in enumerate(places) if place == SSD_ROW]
            if on_ssd and ssd is None:
                return 0        # its data file is not open here: the master's answer routes those reads
            try:
                if on_ssd:
                    extents: list = [SsdLocation(ssd, offsets[i], sizes[i], bytes(keys[i])) for i in range(n)]
                    in_dram = [i for i in range(n) if places[i] != SSD_ROW]
                    for i, view in zip(in_dram, arena.views([offsets[i] for i in in_dram],
                                                            [sizes[i] for i in in_dram])):
                        extents[i] = view
                else:
                    extents = arena.views(offsets, sizes)
            except ValueError:
                return 0
            if self._read_run(views, extents, checksums) < n:
                self.host_index_stale += 1
                return _STALE
            self.host_index_gets += 1
            self._releaser.report_uses(ns, [bytes(k) for k in keys])
            if tiers_out is not None:
                tiers_out.extend(Tier.SSD.label if place == SSD_ROW else Tier.DRAM.label for place in places)
            if self.locations is not None:
                self.locations.remember(_wire_digest(ns), keys, [arena] * n, extents, checksums, [gen] * n)
            return n
        return 0

    def _get_cached(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef,
                    tiers_out: list[str] | None) -> int:
        """Copy every key of the get from where the location cache remembers it, through the read fence: len(keys),
        or 0 and the get goes to the master whole. All or nothing, so the master hears of each get as one chain
        (one lookup or one use report: one stats lookup, one recorded row, the whole chain shown to the policy),
        never a cached prefix and a looked-up rest. A mismatch means the extent holds something else now: that
        entry is forgotten, and _STALE sends the get to the master (a host index row names the same extent)."""
        cache = self.locations
        digest = _wire_digest(ns)
        run = cache.run(digest, keys, [v.nbytes for v in views])
        if not run or len(run) < len(keys):
            return 0
        arenas = {id(entry.arena): entry.arena for entry in run}
        dead = [arena for arena in arenas.values() if not arena.owner_alive()]
        if dead:
            for arena in dead:
                cache.forget_arena(arena)
            return 0
        n = len(run)
        good = self._read_run(views, [entry.extent for entry in run], [entry.checksum for entry in run])
        if good < n:
            bad = run[good]
            if type(bad.extent) is not TcpLocation:
                cache.forget(digest, keys[good:good + 1], stale=True)
                return _STALE       # the node's host index most likely names that extent too: the lookup says so
            refused = bad.arena.generation != bad.generation    # the node's stamp moved: a removal since
            cache.forget(digest, keys[good:good + 1], stale=not refused, removed=refused)
            return 0
        cache.count(good)
        self._releaser.report_uses(ns, [bytes(k) for k in keys])
        if tiers_out is not None:
            tiers_out.extend(Tier(tier_of(entry.extent)).label for entry in run)
        return good

    def _read_run(self, views: list[memoryview], extents: list, checksums: list[int]) -> int:
        """Read extents[i] into views[i]: a DRAM extent (a view of a mapped arena) copied through the read fence, an
        SsdLocation read from the node's data file with the record's own checks, a TcpLocation as a dated read
        through the node's data channel, each against the committed checksums[i]. How many leading reads are
        good."""
        ssd = [i for i, extent in enumerate(extents) if type(extent) is SsdLocation]
        tcp = [i for i, extent in enumerate(extents) if type(extent) is TcpLocation]
        if not ssd and not tcp:
            return self._copy_fenced(views, extents, checksums)
        oks = [True] * len(extents)
        if tcp:
            for i, ok in zip(tcp, self.transfers.read_dated([extents[i] for i in tcp], [views[i] for i in tcp],
                                                            [checksums[i] for i in tcp])):
                oks[i] = ok
        picked = set(ssd) | set(tcp)
        dram = [i for i in range(len(extents)) if i not in picked]
        if dram:
            copied = fence.copy_verified_many([views[i] for i in dram], [extents[i] for i in dram],
                                              [checksums[i] for i in dram], pipeline=self.transfers.verify_threads > 0)
            for i, ok in zip(dram, copied):
                oks[i] = ok
        if ssd:
            read = self.transfers.read_located([extents[i] for i in ssd], [views[i] for i in ssd],
                                               [checksums[i] for i in ssd])
            for i, ok in zip(ssd, read):
                oks[i] = ok
        return oks.index(False) if False in oks else len(extents)

    def _copy_fenced(self, views: list[memoryview], extents: list[memoryview], checksums: list[int]) -> int:
        """Copy extents[i] into views[i] through the read fence (the copy hashed against checksums[i]): how many
        leading copies are good. Where nothing pins the extents, a bad one means reused, not corrupt."""
        oks = fence.copy_verified_many(views[:len(extents)], extents, checksums,
                                       pipeline=self.transfers.verify_threads > 0)
        return oks.index(False) if False in oks else len(extents)

    def _get_located(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef,
                     tiers_out: list[str] | None, *, optimistic: bool, index_stale: bool = False,
                     continued: bool = False) -> int:
        """One Lookup, then the bytes: unleased when the master found every hit in an arena mapped here and
        `optimistic` (copied and fenced here; a mismatch asks again with a lease from that key), else leased.
        `index_stale`: a host index row of this chain did not hold its object (LookupRequest.index_stale).
        `continued`: these keys' use was counted already (LookupRequest.continued; only with optimistic False)."""
        req = pb.LookupRequest(namespace=_wire_digest(ns), block_tokens=ns.block_tokens, namespace_label=ns.label,
                               lease=True, client_host_id=self.host_id, optimistic=optimistic,
                               index_stale=index_stale, continued=continued)
        req.keys.extend(bytes(k) for k in keys)
        req.expect_sizes.extend(v.nbytes for v in views)
        gens = self.transfers.generations() if self.locations is not None else None
        self._releaser.flush_lookups(self.timeout)
        try:
            reply = self._leased_lookup(req)
        except ValueError as exc:
            msg = str(exc)
            if msg.startswith("expect_sizes["):  # "expect_sizes[i] is X bytes, object has Y" -> the caller's words
                raise ValueError("buffers" + msg[len("expect_sizes"):].replace(" is ", " has ", 1)) from None
            raise
        if not reply.hits:
            return 0
        if not reply.lease_id:      # hits with no lease: only ever the answer to an optimistic lookup
            return self._read_unleased(keys, views, ns, tiers_out, reply, gens) if optimistic else 0
        corrupt: set[int] = set()
        try:
            failed = self.transfers.read(wire.hits_of(reply), range(reply.hits), keys, views, corrupt=corrupt)
        finally:
            # Not awaited: the bytes are already in the caller's buffers, so the caller need not wait a round trip
            # for the master to unpin them (a lost release only delays eviction until the lease expires). Keys read
            # back wrong ride along: the master forgets those objects so the next put restores them.
            self._releaser.release(reply.lease_id, [bytes(keys[i]) for i in sorted(corrupt)])
        filled = min(failed) if failed else reply.hits
        if tiers_out is not None:
            tiers_out.extend(Tier(int(t)).label for t in reply.tiers[:filled])
        if self.locations is not None and filled:
            self._remember(_wire_digest(ns), keys, reply, filled, gens)
            self.transfers.learn_stamps(wire.hits_of(reply))    # dates the next lookups of TCP-read nodes
        return filled

    def _read_unleased(self, keys: Sequence[bytes], views: list[memoryview], ns: NsRef,
                       tiers_out: list[str] | None, reply: pb.LookupResponse, gens: dict[int, int] | None) -> int:
        """The hits of an optimistic lookup, all DRAM extents of arenas mapped here, copied straight from the arenas
        and kept only where the copy hashes to the committed checksum. Nothing pins them, so a mismatch may be an
        extent reused since the lookup, not a corrupt object: that key onwards is read again under a lease (which
        tells a truly corrupt object from a moved one and reports it)."""
        n = reply.hits
        extents = self.transfers.mapped_extents(wire.hits_of(reply), range(n))
        arenas = {id(arena): arena for arena, _ in extents.values()}.values()
        good = 0
        if len(extents) == n and all(arena.owner_alive() for arena in arenas):     # a dead node's arena: leased
            good = self._copy_fenced(views, [extents[i][1] for i in range(n)], list(reply.checksums))
        if good:
            if tiers_out is not None:
                tiers_out.extend([Tier.DRAM.label] * good)
            if self.locations is not None:
                self._remember(_wire_digest(ns), keys, reply, good, gens, extents)
        if good == n:
            return n
        self.optimistic_retries += 1
        return good + self._get_located(keys[good:], views[good:], ns, tiers_out, optimistic=False)

    def _reserve(self, keys: Sequence[bytes], sizes: list[int], ns: NsRef, staging: Staging,
                 pin_s: float) -> ExtentWrite:
        digest = _wire_digest(ns)
        req = pb.PutStartRequest(namespace=digest, block_tokens=ns.block_tokens, namespace_label=ns.label,
                                 client_host_id=self.host_id, pin_s=pin_s)
        req.keys.extend(bytes(k) for k in keys)
        req.sizes.extend(sizes)
        self._releaser.flush_uses(self.timeout)
        gens = self.transfers.generations()     # dates the same-host copies, as put_many's do
        sent_at = fence.now()
        reply = self.rpc.call("PutStart", req, what="put_start")
        deadline = fence.write_deadline(sent_at, reply.ttl_ms)
        statuses = [wire.PUT_STATUS_NAME.get(s, "no_space") for s in reply.statuses]
        granted = [i for i, s in enumerate(reply.statuses) if s == pb.STORED]
        grants = wire.grants_of(reply)
        release = None
        try:
            # claimed until commit or abort: their node gives none of them out again meanwhile, whatever the
            # deadline (tiers/writer_claims.py); claimed past the deadline, they are staged instead
            mapped, release = self.transfers.claim_mapped(grants, granted, gens)
            if mapped and fence.now() >= deadline:
                release()
                mapped = {}
            buffers: list = [None] * len(keys)
            for i in granted:
                buffers[i] = mapped.get(i)
                if buffers[i] is None:
                    buffers[i] = as_writable_bytes(staging(sizes[i]), f"staging({sizes[i]})")
        except BaseException:
            if release is not None:
                release()
            self._abort([reply.grant_ids[i] for i in granted])
            raise
        for i in granted:
            statuses[i] = "granted"
        staged = [i for i in granted if i not in mapped]

        def commit() -> list[str]:
            out = [s if s != "granted" else "no_space" for s in statuses]
            failed: set[int] = set()
            release()       # the caller's copies are over
            if mapped and fence.now() >= deadline:
                # The caller's copies may have landed after the grant lapsed: never commit them.
                self.transfers.late_writes_skipped += len(mapped)
                failed |= set(mapped)
            try:
                failed |= self.transfers.owners_gone(grants, [i for i in mapped if i not in failed])
                if staged:
                    failed |= self.transfers.write(grants, staged, keys, buffers, digest, deadline=deadline,
                                                   dated=gens)
            except BaseException:
                self._abort([reply.grant_ids[i] for i in granted])
                raise
            self._commit(reply.grant_ids, granted, failed, buffers, out)
            with self._puts_lock:
                for status in out:
                    self._puts[status] += 1
            return out

        def abort() -> None:
            release()
            self._abort([reply.grant_ids[i] for i in granted])

        return ExtentWrite(keys, statuses, buffers, [i in mapped for i in range(len(keys))], commit, abort)

    def _acquire(self, keys: Sequence[bytes], sizes: list[int], ns: NsRef, staging: Staging,
                 max_staged: int | None, continued: bool, lease: bool = True) -> ExtentRead:
        if not lease and self.host_index_reads and not continued and not self._acquire_index_stale:
            published = self._acquire_published(keys, sizes, ns, staging, max_staged)
            if published is not None:
                return published
        index_stale, self._acquire_index_stale = self._acquire_index_stale, False
        req = pb.LookupRequest(namespace=_wire_digest(ns), block_tokens=ns.block_tokens, namespace_label=ns.label,
                               lease=True, client_host_id=self.host_id, continued=continued, index_stale=index_stale)
        req.keys.extend(bytes(k) for k in keys)
        req.expect_sizes.extend(sizes)
        self._releaser.flush_lookups(self.timeout)
        try:
            reply = self._leased_lookup(req)
        except ValueError as exc:
            msg = str(exc)
            if msg.startswith("expect_sizes["):
                raise ValueError("sizes" + msg[len("expect_sizes"):]) from None
            raise
        if not reply.lease_id:
            return ExtentRead(keys, [], [], [], lambda n: n, lambda: None)
        batch = wire.hits_of(reply)
        corrupt: set[int] = set()       # positions read back wrong, by any read under the lease: reported at its end
        lease = SharedLease(lambda: self._releaser.release(reply.lease_id, [bytes(keys[i]) for i in sorted(corrupt)]))
        try:
            every_mapped = self.transfers.mapped_views(batch, range(reply.hits))
            return self._read_leased(keys, sizes, ns, batch, reply.hits, every_mapped, corrupt, lease, 0, staging,
                                     max_staged)
        except BaseException:
            lease.leave()
            raise

    def _acquire_published(self, keys: Sequence[bytes], sizes: list[int], ns: NsRef, staging: Staging,
                           max_staged: int | None) -> ExtentRead | None:
        """acquire_many(lease=False) with no Lookup, when one same-host node's host index publishes the whole
        chain: its DRAM extents handed out as they are (covered by the read fence: `needs_check`, the caller's hash
        of its copy must be the published checksum), its SSD records read here from the node's data file (the
        record's own checks, then the checksum). Nothing is pinned, so there is no lease: a mismatch means the
        extent was reused (or the object is corrupt): the read ends before it, and its release asks the master
        under a lease (`index_stale`, so the master sets the node's index right), which tells the two apart and
        reports a corrupt object. The master hears of the read from the use report, as of a get served from the
        index, once the last read of the chain is released. None: the index does not hold the whole chain (or
        cannot be read here): the caller asks the master."""
        indexes = self.transfers.host_indexes()
        if not indexes or any(len(k) != KEY_BYTES for k in keys):
            return None
        n = len(keys)
        for arena, index, ssd in indexes:
            offsets, found, checksums, places = index.find(keys)
            if len(offsets) < n:
                continue
            if found != sizes or not arena.owner_alive() or (ssd is None and SSD_ROW in places):
                return None     # another size (the master's answer names it), a dead node, records not readable here
            in_dram = [i for i in range(n) if places[i] != SSD_ROW]
            try:
                views = dict(zip(in_dram, arena.views([offsets[i] for i in in_dram], [sizes[i] for i in in_dram])))
            except ValueError:
                return None
            self.host_index_acquires += 1
            chain = [bytes(k) for k in keys]
            # The use report goes when the caller's copies are done (the last read of the chain released): the
            # master may promote the chain's slow-tier entries on it, making room by moving other DRAM objects,
            # and nothing pins the DRAM extents handed out here. Reported at acquire, a reader's own report had a
            # promotion round reuse the extents it was still copying (its copy failed the fence: a shorter hit).
            report = SharedLease(lambda: self._releaser.report_uses(ns, chain))
            locations = {i: SsdLocation(ssd, offsets[i], sizes[i], bytes(keys[i])) for i in range(n) if i not in views}
            try:
                return self._read_published(keys, sizes, ns, views, locations, checksums, 0, staging, max_staged,
                                            report)
            except BaseException:
                report.leave()
                raise
        return None

    def _read_published(self, keys: Sequence[bytes], sizes: list[int], ns: NsRef, views: dict[int, memoryview],
                        locations: dict[int, SsdLocation], checksums: list[int], start: int, staging: Staging,
                        max_staged: int | None, report: SharedLease) -> ExtentRead:
        """The published chain from position `start` on, as an ExtentRead with no lease (see _acquire_published).
        `report` (joined by the caller) sends the chain's use report when the last of its reads is released."""
        n = len(keys)
        staged = [i for i in range(start, n) if i in locations]
        end = n
        if max_staged is not None and len(staged) > max_staged:    # the read ends before the next staged entry
            end = staged[max_staged]
            staged = staged[:max_staged]
        buffers: list = [views.get(i) for i in range(start, end)]
        for i in staged:
            buffers[i - start] = as_writable_bytes(staging(sizes[i]), f"staging({sizes[i]})")
        oks = self.transfers.read_located([locations[i] for i in staged], [buffers[i - start] for i in staged],
                                          [checksums[i] for i in staged]) if staged else []
        bad = [i for i, ok in zip(staged, oks) if not ok]
        stop = bad[0] if bad else end
        mismatch: list[int] = bad[:1]   # the first position whose bytes were not the object's: asked again at release

        def miss(i: int) -> None:
            if not mismatch or i < mismatch[0]:
                mismatch[:] = [i]

        def verify(count: int) -> int:
            picked = [i for i in range(start, start + count) if i in views]
            oks = fence.verify_many([views[i] for i in picked], [checksums[i] for i in picked],
                                    pipeline=self.transfers.verify_threads > 0)
            if False in oks:
                miss(picked[oks.index(False)])
                return picked[oks.index(False)] - start
            return count

        def verify_one(i: int) -> bool:
            view = views.get(start + i)
            if view is None:
                return True     # an SSD record: checked as it was read
            ok = fence.verify_many([view], [checksums[start + i]])[0]
            if not ok:
                miss(start + i)
            return ok

        def landed(i: int, digest: int) -> bool:
            if digest == checksums[start + i]:
                return True
            miss(start + i)
            return False

        def release() -> None:
            report.leave()      # queued before a stale entry's re-read, whose corrupt report wakes the releaser
            if mismatch:
                stale()

        def stale() -> None:
            self.host_index_stale += 1
            self._acquire_index_stale = True
            at = mismatch[0]
            # Under a lease: a reused extent reads right, a corrupt object is reported and forgotten. `continued`:
            # the use report sent when this read was made counted the key already.
            try:
                self._get_located(keys[at:at + 1], [memoryview(bytearray(sizes[at]))], ns, None, optimistic=False,
                                  index_stale=True, continued=True)
            except Exception as exc:  # noqa: BLE001 - the read itself is over; the next acquire asks the master
                log.warning("re-reading key %s after a stale host index row failed: %s", bytes(keys[at]).hex(), exc)

        def rest(staging: Staging, max_staged: int | None) -> ExtentRead:
            try:
                report.join()
                holder = report
            except ValueError:      # every read before it was released: the chain was reported then
                holder = SharedLease(lambda: None)
            try:
                return self._read_published(keys, sizes, ns, views, locations, checksums, end, staging, max_staged,
                                            holder)
            except BaseException:
                holder.leave()
                raise

        return ExtentRead(keys[start:], buffers[:stop - start], [i in views for i in range(start, stop)],
                          [Tier.DRAM.label if i in views else Tier.SSD.label for i in range(start, stop)], verify,
                          release, verify_one, landed,
                          frozenset(i - start for i in self.transfers.fenced(i for i in views if start <= i < stop)),
                          pipeline=self.transfers.verify_threads > 0, staging_full=stop < n and not bad, rest=rest)

    def _read_leased(self, keys: Sequence[bytes], sizes: list[int], ns: NsRef, batch: wire.ExtentBatch, hits: int,
                     every_mapped: dict[int, memoryview], corrupt: set[int], lease: SharedLease, start: int,
                     staging: Staging, max_staged: int | None) -> ExtentRead:
        """The hits of one leased lookup from position `start` on, as an ExtentRead holding `lease` (joined by the
        caller): mapped extents handed out as they are, at most `max_staged` others read into `staging` (checked
        as they arrive). Its `rest` reads on from where it ends, under the same lease while the lease has
        REST_MARGIN_S to run, else with a lookup of the remaining keys of its own."""
        mapped = {i: v for i, v in every_mapped.items() if i >= start}
        staged = [i for i in range(start, hits) if i not in mapped]
        end = hits
        if max_staged is not None and len(staged) > max_staged:    # the read ends before the next staged hit
            end = staged[max_staged]
            staged = staged[:max_staged]
            mapped = {i: v for i, v in mapped.items() if i < end}
        buffers: list = [None] * end    # by position in the lookup: transfers.read fills buffers[i]
        for i, view in mapped.items():
            buffers[i] = view
        for i in staged:
            buffers[i] = as_writable_bytes(staging(batch.sizes[i]), f"staging({batch.sizes[i]})")
        failed = self.transfers.read(batch, staged, keys, buffers, corrupt=corrupt) if staged else set()
        stop = min(failed) if failed else end

        def verify(n: int) -> int:
            bad = self.transfers.check_mapped(batch, {i: v for i, v in mapped.items() if i < start + n})
            corrupt.update(bad)
            return min(bad) - start if bad else n

        def verify_one(i: int) -> bool:
            view = mapped.get(start + i)
            if view is None:
                return True     # staged: checked as it arrived
            bad = self.transfers.check_mapped(batch, {start + i: view})
            corrupt.update(bad)
            return not bad

        def landed(i: int, digest: int) -> bool:
            ok = self.transfers.check_landed(batch, start + i, digest)
            if not ok:
                corrupt.add(start + i)
            return ok

        def rest(staging: Staging, max_staged: int | None) -> ExtentRead:
            # the clock the node checks the read tokens by, against the lease's end the master signed into them
            if time.time() * 1000 >= batch.expires_ms - REST_MARGIN_S * 1000:
                return self._acquire(keys[end:], sizes[end:], ns, staging, max_staged, True)
            lease.join()
            try:
                return self._read_leased(keys, sizes, ns, batch, hits, every_mapped, corrupt, lease, end, staging,
                                         max_staged)
            except BaseException:
                lease.leave()
                raise

        tiers = [Tier(int(t)).label for t in batch.tiers[start:stop]]
        return ExtentRead(keys[start:], buffers[start:stop], [i in mapped for i in range(start, stop)], tiers, verify,
                          lease.leave, verify_one, landed,
                          frozenset(i - start for i in self.transfers.fenced(i for i in mapped if i < stop)),
                          pipeline=self.transfers.verify_threads > 0,
                          staging_full=stop < hits and not failed, rest=rest)

    def _pin(self) -> dict[str, str]:
        self.transfers.pin_arenas = True
        return self.transfers.pin_report()

    def _warm(self, prefault: bool) -> dict[str, str]:
        nodes = self.rpc.call("Hello", pb.HelloRequest(), retry=True, what="hello").nodes
        self.rpc.warm_control()
        return self.transfers.warm(nodes, prefault=prefault)

    def _contains(self, keys: Sequence[bytes]) -> list[bool]:
        return list(self.rpc.call("Contains", pb.ContainsRequest(keys=[bytes(k) for k in keys]), retry=True,
                                  what="contains").present)

    def _remove(self, keys: Sequence[bytes]) -> int:
        if self.locations is not None:
            self.locations.clear()      # no namespace comes with a remove: forget everything, not just these keys
        self._releaser.flush_lookups(self.timeout)     # lookups answered before it are counted before the keys go
        removed = self.rpc.call("Remove", pb.RemoveRequest(keys=[bytes(k) for k in keys]), retry=True,
                                what="remove").removed
        if self.locations is not None and removed:
            self.transfers.forget_stamps()  # every node's stamp moved: the next located get of each asks anew
        return removed

    def _stats(self) -> dict:
        self._releaser.flush_uses(self.timeout)     # the hit counts include this client's cached gets
        out = json.loads(self.rpc.call("Stats", pb.StatsRequest(), retry=True, what="stats").json)
        out["client_checksum_failures"] = self.checksum_failures
        out["client_late_writes_skipped"] = self.transfers.late_writes_skipped
        out["client_stale_writes_skipped"] = self.transfers.stale_writes_skipped
        out["client_dead_owner_writes"] = self.transfers.dead_owner_writes
        out["client_optimistic_retries"] = self.optimistic_retries
        out["client_dated_reads"] = {"reads": self.transfers.dated_reads, "refused": self.transfers.stamp_refusals}
        out["client_host_index"] = {"gets": self.host_index_gets, "acquires": self.host_index_acquires,
                                    "lookups": self.host_index_lookups, "stale": self.host_index_stale}
        if self.locations is not None:
            out["client_location_cache"] = self.locations.report()
        return out

    def stats(self) -> dict:
        self._check_open()
        return super().stats()

    def _close(self) -> None:
        self._releaser.close(min(self.timeout, 2.0))  # let queued releases land, so leases do not linger
        if self.locations is not None:
            self.locations.clear()      # its views into the mapped arenas go before the arenas
        self.transfers.close()
        self.rpc.close()

    # ------------------------------------------------------------------ helpers

    def _leased_lookup(self, req: pb.LookupRequest) -> pb.LookupResponse:
        """A Lookup with lease that also ends this client's finished leases and names the nodes whose DRAM it
        maps (no read tokens for those hits). A lookup that fails hands its leases back to the releaser."""
        req.mapped_nodes.extend(self.transfers.mapped_nodes())
        ids = self._releaser.take()
        req.release_lease_ids.extend(ids)
        try:
            reply = self.rpc.call("Lookup", req, retry=True, what="lookup")
        except BaseException:
            self._releaser.give_back(ids)
            raise
        if ids and not reply.released:
            self._releaser.give_back(ids)       # a master that predates release_lease_ids
        return reply

    def _remember(self, digest: bytes, keys: Sequence[bytes], reply: pb.LookupResponse, count: int,
                  gens: dict[int, int] | None, mapped: dict[int, tuple[object, memoryview]] | None = None) -> None:
        """Keep the locations of the first `count` hits of a leased lookup's reply: the leading run of them that
        are DRAM extents, or SSD records read here (Transfers.ssd_locations), of arenas that were mapped here when
        the lookup was sent (`gens`, their removal generations then: an entry is dated by them, never by a later
        read, or a removal the master made between its answer and that read would go unseen). The rest of the
        `count` keys are forgotten (on a node whose files this client cannot read, an arena mapped by this very
        get, say). `mapped`: the reply's `mapped_extents`, where the caller has them."""
        gens = gens or {}
        if mapped is None:
            batch = wire.hits_of(reply)
            mapped = self.transfers.mapped_extents(batch, range(count))
            if len(mapped) < count:     # SSD records read here, dated by their node's arena
                mapped.update(self.transfers.ssd_locations(batch, [i for i in range(count) if i not in mapped], keys))
            if len(mapped) < count:     # read over TCP, dated by the node's removal stamp as last heard
                mapped.update(self.transfers.tcp_locations(batch, [i for i in range(count) if i not in mapped], keys,
                                                           gens))
        n = 0
        while n < count and n in mapped and id(mapped[n][0]) in gens:
            n += 1
        self._keep(digest, keys, range(n), mapped, reply.checksums, gens)
        if n < count:
            self.locations.forget(digest, keys[n:count])

    def _remember_put(self, digest: bytes, keys: Sequence[bytes], grants, stored: list[int], sums: dict[int, int],
                      gens: dict[int, int]) -> None:
        """Keep where this client's put just committed objects in arenas mapped here (before the PutStart: `gens`
        dates them): the process that stores a block is the likeliest to read it back (an engine's own offloaded
        prefix), and that get then needs no round trip either."""
        mapped = self.transfers.mapped_extents(grants, stored)
        self._keep(digest, keys, [i for i in stored if i in mapped and id(mapped[i][0]) in gens], mapped, sums,
                   gens)

    def _keep(self, digest: bytes, keys: Sequence[bytes], picked: Sequence[int], mapped: dict, checksums,
              gens: dict[int, int]) -> None:
        """Remember keys[i] for i in `picked` at mapped[i] = (arena, extent) with checksums[i], dated by the
        arena's generation in `gens` (read before the call that located them)."""
        if picked:
            self.locations.remember(digest, [keys[i] for i in picked], [mapped[i][0] for i in picked],
                                    [mapped[i][1] for i in picked], [checksums[i] for i in picked],
                                    [gens[id(mapped[i][0])] for i in picked])

    def _report_uses(self, ns: NsRef, keys: list[bytes], uses: int) -> None:
        """Tell the master about `uses` gets of the chain `keys` served from the location cache (the releaser's
        thread, off every get's path): one `count_only` Lookup that counts them and shows the policy the chain used,
        answered with the hits and their tiers alone. The keys past them are forgotten (the master no longer has
        them), and so are hits remembered in another tier than the one they are in now (a promoted object: the next
        get locates it anew); the others live `location_cache_s` longer. A lease from a master that predates
        count_only goes back at once."""
        digest = _wire_digest(ns)
        req = pb.LookupRequest(namespace=digest, block_tokens=ns.block_tokens, namespace_label=ns.label, lease=True,
                               client_host_id=self.host_id, uses=uses, optimistic=True, count_only=True,
                               unpublish_misses=self.host_index_reads)
        req.keys.extend(keys)
        reply = self._leased_lookup(req)
        if reply.lease_id:
            self._releaser.release(reply.lease_id, [])
        if self.locations is not None and not self._closed:    # closing: its arenas are about to go
            if reply.hits < len(keys):
                self.locations.forget(digest, keys[reply.hits:])
            if reply.hits:
                self.locations.refresh(digest, keys[:reply.hits], list(reply.tiers[:reply.hits]) or None)

    def _commit(self, grant_ids, granted: list[int], failed: set[int], buffers, out: list[str],
                landed: dict[int, int] | None = None) -> dict[int, int]:
        """End a put's grants: abort the failed ones, commit the rest with the checksums of their bytes (`landed`:
        those already taken while copying, by position). Sets out[i] to "stored" or "no_space" for every granted i
        (a grant that expired before the commit stored nothing). Returns {i: the checksum committed} for the ones
        it asked to commit."""
        if failed:
            self._abort([grant_ids[i] for i in failed])
        for i in failed:
            out[i] = "no_space"
        ok = [i for i in granted if i not in failed]
        landed = landed or {}
        sums = {i: landed[i] if i in landed else xxhash.xxh3_64_intdigest(buffers[i]) for i in ok}
        if ok:
            request = pb.PutCommitRequest()
            request.grant_ids.extend(grant_ids[i] for i in ok)
            request.checksums.extend(sums[i] for i in ok)
            # retried: a commit whose first try did land is then answered "no_space" (the grant is gone), which
            # under-reports a stored object and loses none; grant ids never repeat across master processes
            # (store/leases.py first_id), so a retry sent to a restarted master ends none of its grants
            reply = self.rpc.call("PutCommit", request, retry=True, what="put_commit")
            for i, status in zip(ok, reply.statuses):
                out[i] = "stored" if status == pb.COMMITTED else "no_space"
        return sums

    def _abort(self, grant_ids: list[int]) -> None:
        if not grant_ids:
            return
        try:
            self.rpc.call("PutAbort", pb.PutAbortRequest(grant_ids=grant_ids), retry=True, what="put_abort")
        except Exception as exc:  # noqa: BLE001 - the grants expire by themselves
            log.warning("put_abort failed: %s", exc)


def _wire_digest(ns: NsRef) -> bytes:
    """No namespace travels as an empty digest (the master's NO_NS), never as sixteen zero bytes."""
    return b"" if ns is NO_NS else ns.digest


__all__ = ["PoolClient"]
