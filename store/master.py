"""Master: the pool's metadata authority. One lock over the owners of its state, one method per MasterService RPC.

    Master ── lock, validation, the put / lookup protocol
      ├─ Index            store/index.py      key -> slot columns (node, tier, state, offset, size, checksum, ...)
      ├─ Placement        store/placement.py  every node's tiers: allocators, policies, eviction/demotion, byte moves
      ├─ Leases           store/leases.py     write grants, read leases, pins, ids, tokens
      ├─ NodeRegistry     store/registry.py   membership: registration, epochs, heartbeats, silent nodes
      ├─ Drains           store/migration.py  draining nodes and the object moves in flight
      ├─ Promotions       store/promotion.py  slow-tier hits moved up after the lookup, outside the lock
      ├─ WriteBehind      store/writebehind.py  fast-tier objects copied to their reserved SSD extent, outside the lock
      ├─ Journal          store/journal.py    write-through to a persistent metadata backend, reload at start
      ├─ Tenants, Quotas  store/tenants.py,   each tenant's key space (stored keys), usage, quota enforcement
      │                   store/quota.py
      ├─ LookupStats      store/stats.py      hit accounting (pool-wide and per tenant); `stats_record()`
      ├─ HostIndexFeed    store/host_feed.py  DRAM/SSD commits published to their nodes' host indexes, off the lock
      └─ Recorder         store/recorder.py   traffic recording (None = off: one attribute check per call)

Plain records in and out (store/records.py), no callables; caller mistakes raise ValueError naming the argument
before anything changes. Client calls take `tenant` (the name from the caller's credential; "" = the unscoped space,
every object when auth is off): keys are looked up in that tenant's space, grants and leases of another tenant
are unknown to it, and its stats are its own. Node byte moves for eviction and demotion (NodeOps) run under the
lock, so the master never races itself; promotions copy outside it (`promote_pending`). What needs no state runs after
the lock: a full put's node call on extents it handed out again (Placement.batched_ops(defer=True): the erases of its
copies' extents, or the copies of dirty victims out of its grants' extents, those settled under the lock again),
the tokens of grants and reads, and telling nodes of a removal. A removal (`remove`, an admin `evict`) holds the lock
1,024 objects at a time (`_in_chunks`), and so does forgetting a removed node's objects (`_forget_leaving`), so a
lookup never waits out a removal of any size.

Why one module of ~1,390 lines: the Master IS the RPC surface, one method per MasterService call (put, lookup,
release, nodes, drain moves, admin queries, recording), each a few lines of argument checks (store/checks.py) and
a call to the owner of the state, under the one lock. The state and its logic live in the owners above; splitting
the surface across classes would split the lock or make them reach into each other again.

Object life:   put_start ──▶ PENDING ──put_commit──▶ COMMITTED ──remove/evict──▶ gone
                              │ put_abort / grant expiry      │ remove while leased ──▶ DOOMED ──last release──▶ gone
                              ▼                               ├ demote / promote / drain move: same key, new extent
                             gone                             └ its node removed ──▶ LEAVING ──a chunk later──▶ gone
                                                                                  (or DOOMED, if leased)
Removing a leased object is accepted (counted) and makes it invisible at once; its extent is freed when the last
lease on it ends, so a reader mid-copy never sees its bytes reused. Time comes from an injectable clock; `reap(now)`
reclaims expired grants, leases and silent nodes (tests drive it with a fake clock, nothing sleeps).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
from typing import Callable, Collection, Mapping, Sequence

import numpy as np

from kvpool.store import checks, queries, tokens
from kvpool.store import stats as stats_mod
from kvpool.store.checks import BatchTooLarge
from kvpool.store.config import MasterConfig
from kvpool.store.held_extents import HeldExtents
from kvpool.store.host_feed import HostIndexFeed
from kvpool.store.index import COMMITTED, NO_COPY, PENDING, Index, State
from kvpool.store.journal import Journal
from kvpool.store.leases import Leases
from kvpool.store.metadata import MemoryMetadata, MetadataBackend
from kvpool.store.migration import Drains, MigrateStartResult
from kvpool.store.node import NodeOps, PublishOps
from kvpool.store.node_calls import Deferred
from kvpool.store.placement import NodeState, Placement
from kvpool.store.promotion import Promotions
from kvpool.store.quota import ANY_TIER, Quotas
from kvpool.store.recorder import DEFAULT_MAX_FILE_BYTES, Recorder, RecordingStatus
from kvpool.store.records import (
    NO_NS,
    Grant,
    Location,
    LookupResult,
    NodeInfo,
    NsRef,
    ObjectRecord,
    PutStartResult,
    PutStatus,
    Registered,
    ReportResult,
    Tier,
)
from kvpool.store.registry import NodeRegistry
from kvpool.store.tenants import UNSCOPED, Quota, Tenants
from kvpool.store.tombstones import Tombstones
from kvpool.store.writebehind import ROUND_BYTES, WriteBehind

log = logging.getLogger(__name__)

_STORED, _EXISTS, _NO_SPACE = PutStatus.STORED, PutStatus.EXISTS, PutStatus.NO_SPACE
_TIERS = tuple(Tier)        # the index's tier column -> Tier, without an enum call per object
REPUBLISH_SLOTS = 1 << 14   # index slots a republication scans per hold of the lock (~15 ms when all are published)
ATIME_TICKS_PER_S = 10      # the index's last-access column counts tenths of a second since the master started
YIELD_S = 0.0005             # let_others_in: the GIL given up between two chunks of a removal
_ATIME_MAX = 2**32 - 1


class SizeMismatch(ValueError):
    """lookup(expect_sizes=...) found an object whose size differs from what the caller expects."""

    def __init__(self, position: int, expected: int, actual: int) -> None:
        super().__init__(f"expect_sizes[{position}] is {expected} bytes, object has {actual}")
        self.position, self.expected, self.actual = position, expected, actual


class RecordingActive(RuntimeError):
    """start_recording while a recording runs (the wire answers FAILED_PRECONDITION)."""



def _tell_node(node_id: str, ops: NodeOps, keys: list[bytes] | None) -> None:
    """One node's part of `Master._tell_removed`; a node that does not answer is logged."""
    try:
        if keys is None:
            ops.objects_removed()
        else:
            ops.objects_removed(keys)
    except Exception as exc:  # noqa: BLE001 - the removal itself is done and stays done
        log.warning("node %s not told of a removal (a location cache may serve a "
                    "removed object until its use report's reply, one linger): %s", node_id, exc)


def let_others_in() -> None:
    """Between two chunks of a removal (lock not held): `Master.between_chunks`' default. CPython's Lock lets the
    thread that lets go take it straight back while a waiter is still waking, so a lookup could wait out twenty chunks
    in a row (239 ms in an in-process evict of 50,000 objects, one chunk ~12 ms). Half a millisecond off the GIL lets
    a woken waiter in first (10-33 ms; `sleep(0)` 25-72 ms): ~25 ms more for that evict. A FIFO lock written in
    Python did as well, but its `__exit__`, being Python, cannot be made safe against a signal raised in the main
    thread (an embedded pool's caller pressing Ctrl-C could leave it held), which CPython's Lock is."""
    time.sleep(YIELD_S)


class Master:
    def __init__(self, config: MasterConfig | None = None, metadata: MetadataBackend | None = None, *,
                 clock: Callable[[], float] = time.time, token_secret: bytes | None = None,
                 quotas: Mapping[str, Quota] | None = None, tenants: Sequence[str] = ()) -> None:
        """`quotas`: bytes per tenant ("*" = the others). `tenants`: the tenants known from the start (the client
        credentials'), so objects re-adopted from a journal or an SSD are attributed to their owner."""
        self.config = config or MasterConfig()
        self.metadata = metadata if metadata is not None else MemoryMetadata()
        self.clock = clock
        # None: grants/leases carry no tokens (in-process pool, where there is no one to check them). Else it signs
        # read tokens, and the write grants of nodes without keys of their own (`write_key`); tenants' key spaces
        # derive from it
        self.token_secret = token_secret
        self._lock = threading.Lock()
        self.index = Index()
        self.journal = Journal(self.metadata, self.index)
        self.placement = Placement(self.index, self.config.policy, self.journal,
                                   write_behind=self.config.write_behind)
        self.retention = self.placement.retention
        self.retention.max_fraction = self.config.pin_max_fraction
        self.leases = Leases(self.index, token_secret)
        self.held = HeldExtents()   # expired DRAM grants' extents a same-host writer may still fill (heartbeats free)
        # removed keys a node that was away must not bring back (store/tombstones.py); persisted with the journal
        self.tombstones = Tombstones(self.config.max_tombstones, scope_limit=self.config.max_tenant_tombstones,
                                     track=self.journal.persistent)
        self.registry = NodeRegistry(self.placement)
        self.drains = Drains(self.index, self.placement, self.leases)
        self.promotions = Promotions(self.index, self.placement, self.leases)
        self.write_behind = WriteBehind(self.index, self.placement, self.leases)
        self._stopping: set[str] = set()            # nodes flushed for a clean stop: nothing new goes there
        self._copy_lock = threading.Lock()          # one write-behind round at a time (writer thread, flush)
        self.promotion_wanted = threading.Event()   # set when a lookup queued promotions (the server's promoter)
        self.leaving_wanted = threading.Event()     # set when a call's own reap dropped a node (the server's reaper)
        # set by a stopping server once its RPCs ended: a removal's remaining chunks are left to the process's end
        # (nothing to write: a leaving node's records left the journal with it), so its reaper ends at once
        self.closing = threading.Event()
        # called between two chunks of a removal, the lock not held (`let_others_in`); tests put other clients'
        # calls there, as other threads would make them
        self.between_chunks: Callable[[], None] = let_others_in
        # called between two chunks of a host index backfill, on the feed's backfill thread (`_republish`)
        self.between_republish_chunks: Callable[[], None] = let_others_in
        self.host_feed = HostIndexFeed()            # what same-host clients find without a Lookup (host_feed.py)
        self.lookup_stats = stats_mod.LookupStats(max_namespaces=self.config.max_namespaces)
        # Key spaces derive from the token secret (shared through Redis, so stable across masters); an in-process
        # master has none and its tenants (if any) get a random one.
        self.tenants = Tenants(token_secret or os.urandom(32), quotas)
        for name in sorted(tenants):
            self.tenants.intern(name)
        self.tenant_lookups: list[stats_mod.LookupStats] = []
        self.placement.owner_of = self.tenants.owner_of
        self.placement.tenant_name = self.tenants.name
        self.quotas = (Quotas(self.index, self.placement, self.tenants, self.write_behind.pinned_alone)
                       if self.tenants.has_quotas else None)
        if self.quotas is not None:
            self.promotions.allowed = self.quotas.may_promote
            self.drains.skip_tiers = self.quotas.move_skip
        # Traffic recording (store/recorder.py): None = off. Lookups and put_starts hand it their rows under the
        # lock (an append); its writer thread writes the files without the lock.
        self.recorder: Recorder | None = None
        self._last_recording: Recorder | None = None
        self._record_lock = threading.Lock()        # one start / stop at a time
        self._next_reap = 0.0
        self._t0 = clock()          # atime 0; a reloaded object counts as accessed when the master started
        self.retention.t0 = self._t0
        self._load()

    # ------------------------------------------------------------------ nodes

    def register_node(self, info: NodeInfo, ops: NodeOps, *, expires: bool = True) -> int:
        """`register`, returning the node's epoch."""
        return self.register(info, ops, expires=expires).epoch

    def register(self, info: NodeInfo, ops: NodeOps, *, expires: bool = True,
                 claimed: Sequence[tuple[int, int]] = ()) -> Registered:
        """Add (or re-attach) a node; returns its epoch and the key of its write grants. A node re-registering
        with the same `incarnation` kept its memory (the master restarted, or it was told to register again): its
        objects stay, and so does its key while this master process knows it. A new incarnation means the node
        restarted: everything it held is dropped, and it re-adopts its SSD objects with `report_objects`."""
        checks.node_info(info)
        with self._lock:
            old = self.placement.nodes.get(info.node_id)
            restarted = old is not None and not self._same_process(old.info, info)
            if restarted:
                self._node_leaves(old.number, info.node_id, leaving=False)
                # its old records go with its old objects, in one call: they are forgotten a chunk at a time below,
                # and a master restarting meanwhile must not take them for the new process's
                self.journal.node_gone(info.node_id)
            self.host_feed.reset(info.node_id)     # its index starts empty (the node clears it as it registers)
            reg = self.registry.register(info, ops, expires=expires, now=self.clock(), report_s=self.config.grace_s)
            self._stopping.discard(info.node_id)
            self.journal.put_node(info)  # addresses may have changed
            self._flush()
            if claimed and info.writer_claims:
                self._hold_claimed(reg.node, claimed)
            holds = self.placement.holds_shared(reg.node)
        if restarted:
            self._forget_leaving()  # before the answer: the node reports its SSD records after it
        elif holds:
            self._republish([info.node_id])         # what a node that kept its memory holds: after the answer
        return Registered(reg.epoch, reg.node.write_key if self.leases.signs and info.write_keys else b"")

    @staticmethod
    def _same_process(a: NodeInfo, b: NodeInfo) -> bool:
        return (a.incarnation, a.dram_bytes, a.ssd_bytes, a.hbm_bytes) == (b.incarnation, b.dram_bytes, b.ssd_bytes,
                                                                           b.hbm_bytes)

    def heartbeat(self, node_id: str, epoch: int = 0) -> bool:
        """Returns True when the node must register again (unknown to this master, or a stale epoch)."""
        return self.heartbeat_stamped(node_id, epoch)[0]

    def heartbeat_stamped(self, node_id: str, epoch: int = 0,
                          claimed: Sequence[tuple[int, int]] = ()) -> tuple[bool, int]:
        """`heartbeat` and `time_us` under one hold of the lock (the Heartbeat reply carries both): (reregister,
        the master time the node stamps its next SSD records with). `claimed`: the [start, end) DRAM ranges the
        node's scan found same-host writers claiming right before the call (NodeInfo.writer_claims): the expired
        grants' extents it held that none covers are freed from the second heartbeat after their expiry on
        (store/held_extents.py)."""
        with self._lock:
            reregister = self.registry.heartbeat(node_id, epoch, self.clock())
            node = self.placement.nodes.get(node_id)
            if not reregister and node is not None:
                if offsets := self.held.beat(node.number, list(claimed)):
                    self.placement.free_held(node.number, offsets)
            return reregister, self.tombstones.now_us()

    def time_us(self) -> int:
        """The master's time for a node's SSD record stamps (registration and heartbeat replies): wall-clock µs,
        strictly increasing, later than every removal so far (store/tombstones.py)."""
        with self._lock:
            return self.tombstones.now_us()

    def report_objects(self, node_id: str, records: Sequence[ObjectRecord], corrupt: int = 0, *,
                       last: bool = False) -> ReportResult:
        """Index objects a node found on its own tiers (SSD scan after a restart) as committed. Malformed records
        raise ValueError before anything is adopted; conflicting ones (indexed elsewhere, repeated, overlapping,
        larger than max_object_bytes) come back in `dropped_keys`. `corrupt`: records the node's scan found with a
        damaged header (counted in ssd_corrupt). `last`: the registration's report is complete; a node that
        registered saying `reports_ssd` gets no placement before it (store/registry.py `reporting`). A node that
        registered again as the process this master knew (`Member.reattached`: the master restarted on its journal,
        or the node re-registered) adopts no key the master does not know: such a record is one whose erase was lost
        (a removal of an object still read when the master went down, a Drop that failed), dropped, not revived.
        Nor does any node adopt a record written before a removal of its key (`written_us` against the removal
        tombstones, store/tombstones.py): the node was away when the key was removed, or its erase was lost."""
        if isinstance(corrupt, bool) or not isinstance(corrupt, int) or corrupt < 0:
            raise ValueError(f"corrupt must be an int >= 0, got {corrupt!r}")
        if not isinstance(last, bool):
            raise ValueError(f"last must be a bool, got {last!r}")
        with self._lock:
            node = self.placement.node(node_id)
            checks.reported(records, node, self.config.max_object_bytes)
            self.placement.forget_leaving_keys([r.key for r in records])    # a removed node's: gone, not conflicts
            member = self.registry.member(node_id)
            stale = member is not None and member.reattached    # a key this master does not know: a lost erase
            result = ReportResult()
            fresh: list[ObjectRecord] = []
            seen: set[bytes] = set()
            for r in records:
                slot = self.index.slot_of(r.key)
                placement = self.placement
                if slot >= 0 and (placement.same_place(slot, node, r) or placement.copies.adopt(slot, node, r)):
                    result.known += 1
                elif slot >= 0 or stale or r.key in seen or r.size > self.config.max_object_bytes \
                        or self.tombstones.refuses(r.key, r.ns_digest, r.written_us):
                    result.dropped_keys.append(r.key)
                else:
                    seen.add(r.key)
                    fresh.append(r)
            result.adopted = self.placement.adopt(node, fresh, result.dropped_keys, self._ticks(self.clock()))
            self.placement.counters.ssd_corrupt += corrupt
            if last:
                self.registry.reported(node_id)
            self._flush()
            return result

    def remove_node(self, node_id: str) -> int:
        """Forget a node and its objects (they become misses). Returns the number of committed objects dropped.
        Moving them elsewhere first is `begin_drain` + `migrate_*` (store/migration.py).

        Its objects are misses for every caller from the first hold of the lock, whatever their number
        (Placement.remove_node); they are then forgotten `queries.REMOVAL_CHUNK` per hold (`_forget_leaving`), all
        of them before this returns."""
        with self._lock:
            node = self.placement.node(node_id)
            self._node_leaves(node.number, node_id, leaving=True)
            _, n = self.registry.remove(node_id)
            self._stopping.discard(node_id)
            self.journal.delete_node(node_id)
            self._flush()
        self._forget_leaving()
        return n

    # ------------------------------------------------------------------ drain (moves: store/migration.py)

    def begin_drain(self, node_id: str) -> tuple[int, int]:
        """Mark a node draining: nothing new is placed on it, its objects are still served. Idempotent. Returns
        (committed objects still on it, uncommitted grants on it): a drain is complete when both are 0."""
        with self._lock:
            self._tick()
            return self.drains.begin(node_id)

    def migrate_start(self, keys: Sequence[bytes]) -> MigrateStartResult:
        """Per key: a move of a committed object on a draining node to another node (MigrateStatus per key)."""
        keys = checks.keys(keys, self.config.max_batch_keys)
        with self._lock:
            now = self._tick()
            with self.placement.batched_ops():     # the room made on destinations: one Demote / Drop per node
                result = self.drains.start(keys, now + self.config.grant_ttl_s, self._no_destination(now))
            self._flush()  # placing may have evicted or demoted objects on the destination
            ssd_nodes = self._ssd_numbers(m.dest for m in result.moves)
        self.placement.erasures.flush_nodes(ssd_nodes)     # its client writes the SSD destinations after the answer
        return result

    def migrate_next(self, node_id: str, cursor: int = 0, limit: int = 256, max_bytes: int = 0
                     ) -> MigrateStartResult:
        """migrate_start on the next batch of a draining node's objects in index order from `cursor` (0 = the
        start): up to `limit` keys and (beyond the first) `max_bytes` bytes, 0 = no byte bound. `result.keys` are
        the keys picked, `result.next_cursor` continues the pass (0 = done). KeyError for an unknown node,
        ValueError if it is not draining."""
        checks.cursor_args(cursor, limit, max_bytes, self.config.max_batch_keys)
        with self._lock:
            now = self._tick()
            keys, next_cursor = self.drains.pick(node_id, int(cursor), int(limit), int(max_bytes))
            result = self.drains.start(keys, now + self.config.grant_ttl_s, self._no_destination(now))
            result.next_cursor = next_cursor
            self._flush()
            ssd_nodes = self._ssd_numbers(m.dest for m in result.moves)
        self.placement.erasures.flush_nodes(ssd_nodes)     # as migrate_start
        return result

    def migrate_commit(self, move_ids: Sequence[int], checksums: Sequence[int]) -> list[bool]:
        """Switch moved objects to their destination. False = the move is gone (unknown, expired, the object was
        removed meanwhile, the destination left) or `checksums[i]` is not the object's: nothing moved, cleaned up."""
        checks.same_length(checksums, "checksums", move_ids, "move_ids")
        checks.ids(move_ids, "move_ids")
        with self._lock:
            self._tick()
            ok = self.drains.commit(move_ids, checksums)
            self._flush()
            return ok

    def migrate_abort(self, move_ids: Sequence[int]) -> int:
        checks.ids(move_ids, "move_ids")
        with self._lock:
            n = self.drains.abort(move_ids)
            self._flush()
            return n

    # ------------------------------------------------------------------ put

    def put_start(self, keys: Sequence[bytes], sizes: Sequence[int], ns: NsRef = NO_NS, *,
                  prefer_node: str | None = None, tenant: str = "", pin_s: float = 0.0) -> list[PutStartResult]:
        """Grants (`grant.key` is the stored key), EXISTS or NO_SPACE per key. A tenant over its quota makes room
        among its own objects first (store/quota.py). `pin_s` > 0: a retention hint for every key, granted or
        EXISTS (store/retention.py); past the tenant's pinned-bytes cap the key is stored unpinned."""
        keys = checks.keys(keys, self.config.max_batch_keys)
        checks.put_sizes(sizes, len(keys), self.config.max_object_bytes)
        checks.namespace_digest(ns.digest)
        pin_s = checks.pin_seconds(pin_s)
        deferred = Deferred()
        try:
            with self._lock:
                now = self._tick()
                hold = self.retention.hold if pin_s > 0 else None
                pin_cap = self.retention.cap(self.placement.capacity()) if hold is not None else 0
                pin_until = self.retention.until(pin_s)
                expires_at = now + self.config.grant_ttl_s
                ns_id = self.index.intern_ns(ns.digest)
                tid = self.tenants.intern(tenant)
                keys = self.tenants.stored_keys(tid, keys)
                self.placement.forget_leaving_keys(keys)    # a removed node's objects: gone, not EXISTS
                exclude = self._unplaceable()
                # The demotions and drops that making room takes (a tenant's quota too) are sent per node when the
                # loop ends, not per object (store/node_calls.py); a node's calls whose extents this put has handed
                # out again wait until the lock is let go (Placement.batched_ops): on a full pool, the put's one node
                # call (a Drop of its copies' extents, or a Demote of dirty victims whose extents are its grants).
                held: list[np.ndarray] = []    # this put's own objects, pinned while it makes room (`_grant`)
                try:
                    with self.placement.batched_ops(defer=True, pin=self.leases.pin) as deferred:
                        out = self._grant(keys, sizes, ns_id, tid, prefer_node, exclude, hold, pin_cap, pin_until,
                                          expires_at, held)
                finally:
                    for slots in held:
                        self._free(self.leases.unpin_array(slots))
                if (rec := self.recorder) is not None:
                    rec.put(now, ns, list(keys), out)
                self._flush()
                ssd_nodes = self._ssd_numbers(r.grant.location for r in out if r.grant is not None)
                write_keys = self._write_keys(r.grant.location.node_id for r in out if r.grant is not None)
        finally:
            # before the answer: its client writes those extents after it (sent also if the rest raised: the
            # extents were freed for reuse all the same)
            self._send_deferred(deferred)
        # its client writes its SSD grants after the answer: the erases queued before them land first
        self.placement.erasures.flush_nodes(ssd_nodes)
        self._sign_grants(out, write_keys)
        return out

    def _write_keys(self, node_ids) -> dict[str, bytes]:
        """{node_id: the key its write grants are signed with} for `node_ids` (none where this master signs nothing).
        Under the lock: signed after it, a grant must still name the node process its extent was placed on."""
        if not self.leases.signs:
            return {}
        nodes, key = self.placement.nodes, self.leases.write_key
        return {n: key(nodes[n]) for n in set(node_ids)}

    def _ssd_numbers(self, locations) -> list[int]:
        """The node numbers of the SSD extents among `locations` that a client will write (store/erasures.py); none
        while erases are not queued. Under the lock."""
        if not self.placement.erasures.background:
            return []
        nodes = self.placement.nodes
        return [nodes[loc.node_id].number for loc in locations
                if loc is not None and loc.tier == Tier.SSD and loc.node_id in nodes]

    def _send_deferred(self, deferred: Deferred) -> None:
        """put_start's node calls left until after the lock (Placement.batched_ops(defer=True)): sent, then the
        moves among them settled under the lock again (their objects land, or are evicted; their pins go)."""
        self.placement.send_deferred(deferred)
        if deferred.moves:
            with self._lock:
                self.placement.settle_deferred(deferred, self.leases.unpin)
                self._flush()

    def _sign_grants(self, out: list[PutStartResult], keys: dict[str, bytes]) -> None:
        """The write tokens of put_start's grants, signed after the lock with `keys` (`_write_keys`, taken under it):
        pure CPU on the grants' own fields, 1.6 us an HMAC, 51 us for 32 grants, which every other call waited for
        when they were signed under it."""
        if not self.leases.signs:
            return
        sign = self.leases.sign
        for r in out:
            g = r.grant
            if g is not None:
                loc = g.location
                r.grant = Grant(g.grant_id, g.key, loc, g.expires_at, sign(keys[loc.node_id], tokens.WRITE,
                                                                           g.grant_id, loc.tier, loc.offset, loc.size,
                                                                           g.expires_at))

    def _grant(self, keys: list[bytes], sizes: Sequence[int], ns_id: int, tid: int, prefer_node: str | None,
               exclude: set[int], hold, pin_cap: int, pin_until: float, expires_at: float,
               held: list[np.ndarray]) -> list[PutStartResult]:
        """put_start's placements and grants, key by key, under the lock. Before the first key whose placement may
        take objects out (a tenant's quota, or no free room left), the put's committed objects are pinned (`held`,
        unpinned by the caller): making room never evicts or moves the keys it answers EXISTS for. A chain's new
        blocks hang from its existing prefix: taking that prefix out for them stored blocks nothing can reach."""
        placement, quotas, find, leases = self.placement, self.quotas, self.index.find, self.leases
        # The new objects that fit in free room, placed in one step (a quota admits object by object); the rest, one
        # by one below. Nothing moved meanwhile, so every key's EXISTS answer is as it was.
        limited = quotas is not None and quotas.limits(tid)
        fast = placement.place_new(keys, sizes, prefer_node, exclude) if not limited else []
        taken = 0
        copies = placement.copies.enabled
        out: list[PutStartResult] = []
        prev = -1   # the slot of the key before this one: a batch is one chain (store/chains.py)
        prev_key = b""
        for key, size in zip(keys, sizes):
            if (slot := find(key, -1)) >= 0:
                out.append(PutStartResult(_EXISTS))
                prev, prev_key = slot, key
                if hold is not None and hold(slot, pin_until, pin_cap) and self.index.state[slot] == COMMITTED:
                    self.journal.touched(slot)      # its journalled record carries the pin's new end
                continue
            if (limited or taken >= len(fast)) and not held:
                held.append(leases.pin_committed(keys))     # making room from here on: never out of its own chain
            skip = ANY_TIER if quotas is None else quotas.admit(tid, size)
            if taken < len(fast):
                placed = fast[taken]
                taken += 1
            else:
                placed = None if skip is None else placement.place(size, prefer_node, exclude, skip=skip)
                if prev >= 0 and placed is not None and find(prev_key, -1) != prev:
                    # Not expected: the put's committed keys are held while it makes room (`pin_committed`), and
                    # a pending one is never a victim. Were the key before this one gone, this key could not be
                    # reached (an orphan, not a root); its slot might even be the one this key is about to get.
                    prev = find(prev_key, -1)
                    if prev < 0:
                        prev = -2
            if placed is None:
                if skip is not None:
                    self.tenants.counters[tid].no_space += 1
                out.append(PutStartResult(_NO_SPACE))
                prev = -2   # the chain has a hole here: the keys after it cannot be reached
                continue
            node, tier, offset = placed
            slot = self.index.add(key, node=node.number, tier=tier, state=PENDING, offset=offset, size=size,
                                  ns=ns_id, tenant=tid)
            if prev != -1:
                placement.chains.link(slot, prev if prev >= 0 else None)
            if copies:
                placement.copies.reserve(slot, node)
            prev, prev_key = slot, key
            if hold is not None:
                hold(slot, pin_until, pin_cap)
            grant_id = leases.grant(slot, expires_at)      # its token is signed after the lock (`_sign_grants`)
            out.append(PutStartResult(_STORED, Grant(grant_id, bytes(key), Location(node.node_id, tier, offset,
                                                                                   size), expires_at)))
        return out

    def put_commit(self, grant_ids: Sequence[int], checksums: Sequence[int], *, tenant: str = "") -> list[bool]:
        """Make granted objects visible. False for a grant that is unknown or expired (the key is not stored), or
        another tenant's."""
        checks.same_length(checksums, "checksums", grant_ids, "grant_ids")
        with self._lock:
            owner = self.tenants.id_of(tenant) if tenant else None  # "": auth off, one space
            now = self._tick()
            atime = self._ticks(now)
            index = self.index
            ok: list[bool] = []
            slots: list[int] = []
            keys: list[bytes] = []
            expired: list[int] = []
            for grant_id, checksum in zip(grant_ids, checksums):
                entry = self.leases.take_grant(grant_id, owner)
                if entry is None:
                    ok.append(False)
                    continue
                slot, expires_at = entry
                if expires_at <= now:
                    # Expired but not reaped yet (the reaper runs every ttl/4): refuse exactly as a reaped grant
                    # is refused, since the node already refuses writes under it.
                    expired.append(slot)
                    ok.append(False)
                    continue
                index.state[slot] = State.COMMITTED
                index.checksum[slot] = checksum
                index.atime[slot] = atime
                slots.append(slot)
                keys.append(key := index.key_at(slot))
                if index.copy[slot] != NO_COPY:
                    self.placement.copies.dirty[key] = None     # its SSD copy is written behind
                self.journal.touched(slot)
                ok.append(True)
            if expired:
                with self.placement.batched_ops():  # their SSD copies' erases: one call per node
                    for slot in expired:
                        self.placement.forget(slot)
            self.placement.insert_committed(slots, keys)
            if owner is None and slots:     # with auth on, clients cannot name stored keys: nothing to publish
                self._publish(slots, keys)
            self._flush()
            return ok

    def _publish(self, slots: list[int], keys: list[bytes]) -> None:
        """Queue these committed objects' locations (DRAM extents, SSD records) for their nodes' host indexes (lock
        held; sent off it). A node with a shared arena shares its SSD file too (store/node.py ssd_share_path)."""
        index = self.index
        arr = np.array(slots, dtype=np.int64)
        tiers = index.tier[arr].tolist()
        numbers, offsets = index.node[arr].tolist(), index.offset[arr].tolist()
        sizes, sums = index.size[arr].tolist(), index.checksum[arr].tolist()
        by_node: dict[int, list[int]] = {}
        for i, tier in enumerate(tiers):
            if tier == Tier.DRAM or tier == Tier.SSD:
                by_node.setdefault(numbers[i], []).append(i)
        by_number = self.placement.by_number
        for number, picked in by_node.items():
            node = by_number[number] if number < len(by_number) else None
            if not self._indexed(node):
                continue
            if not node.info.ssd_index_rows:    # a node from before SSD rows would take them as DRAM extents
                picked = [i for i in picked if tiers[i] == Tier.DRAM]
                if not picked:
                    continue
            self.host_feed.committed(node.node_id, node.ops, [keys[i] for i in picked], [offsets[i] for i in picked],
                                     [sizes[i] for i in picked], [int(sums[i]) for i in picked],
                                     [_TIERS[tiers[i]] for i in picked])

    @staticmethod
    def _indexed(node) -> bool:
        """Whether `node` keeps a host index same-host clients read (it shares an arena and takes publications)."""
        return node is not None and bool(node.info.dram_path) and isinstance(node.ops, PublishOps)

    def _publish_moved(self) -> None:
        """Queue for the nodes' host indexes (lock held) where the objects that changed extent since the last call
        are now (a promoted object's DRAM extent, a demoted one's SSD record, a drained one's new node) and which
        objects were evicted for room (forgotten), so a same-host client's next get reads the right place or asks
        the master at once, instead of paying a stale row (a failed read, then a Lookup)."""
        evicted = self.placement.take_evicted()
        if evicted:
            by_number = self.placement.by_number
            gone: dict[int, list[bytes]] = {}
            for number, tenant, key in evicted:
                if tenant == UNSCOPED:
                    gone.setdefault(number, []).append(key)
            for number, keys in gone.items():
                node = by_number[number] if number < len(by_number) else None
                if self._indexed(node):
                    self.host_feed.gone(node.node_id, node.ops, keys)
        index = self.index
        slots = [slot for slot in self.placement.take_moved()
                 if index.state[slot] == COMMITTED and index.tenant[slot] == UNSCOPED]
        if slots:
            self._publish(slots, [index.key_at(slot) for slot in slots])

    def put_abort(self, grant_ids: Sequence[int], *, tenant: str = "") -> int:
        with self._lock:
            owner = self.tenants.id_of(tenant) if tenant else None  # "": auth off, one space
            n = 0
            with self.placement.batched_ops():      # the erases of their SSD extents / copies: one call per node
                for grant_id in grant_ids:
                    entry = self.leases.take_grant(grant_id, owner)
                    if entry is not None:
                        self.placement.forget(entry[0])
                        n += 1
            self._flush()
            return n

    # ------------------------------------------------------------------ get

    def lookup(self, keys: Sequence[bytes], ns: NsRef = NO_NS, *, lease: bool = True,
               expect_sizes: Sequence[int] | None = None, tenant: str = "",
               s_per_token: float = 0.0, mapped_nodes: Collection[str] = (),
               release: Sequence[int] = (), uses: int = 1, optimistic: bool = False,
               unpublish_misses: bool = False, index_stale: bool = False, count_only: bool = False,
               continued: bool = False) -> LookupResult:
        """Leading committed hits of a chain. With `lease`, pins them until `release` (or lease expiry) and returns
        their locations as columns: where each object is NOW. A leased hit on a slower tier than its node's fastest
        is queued for promotion (`promote_pending`, outside this call) when `promote_on_hit`. `expect_sizes` (one
        per key) makes a size disagreement a `SizeMismatch` raised before anything changes. A tenant's hits carry
        their stored keys (`record_keys`); its namespace label names the tenant of the credential. `s_per_token`:
        the caller's measured prefill seconds per token; a counting lookup (ns.block_tokens > 0) adds its hit tokens
        times that to the prefill seconds saved (store/stats.py). `mapped_nodes`: nodes whose DRAM the caller maps
        and copies itself; their DRAM hits get no read token (b""), which only the data channel checks. `release`:
        read leases the caller is done with, released as `release` does once the lookup has passed its checks (a
        lookup refused for bad arguments releases nothing). `uses`: how many gets this lookup stands for (a client's
        location-cache report, kvpool/locations.py): stats and the traffic recorder count it that many times.
        `optimistic` (with `lease`): when every hit is a DRAM extent of a node in `mapped_nodes`, their locations come
        back with no lease (lease_id 0): nothing is pinned and nothing needs releasing. The caller copies them itself
        and keeps only what hashes to the committed checksum after the copy (the read fence), so an extent reused
        meanwhile is a miss there, and it asks again with a lease from that key on. Any other hit: a lease as usual.
        `count_only` (with `lease`; a use report, whose gets were served already): counted and shown to the policy
        as a leased lookup is, but the answer is `hits` and each hit's tier alone: no lease, no token, no location
        (the tiers let the caller drop what it remembers in another tier: a promoted object is read from DRAM).
        `unpublish_misses` (a use report of gets served without asking): the keys after the hits leave the host
        index of every node in `mapped_nodes` (tiers/host_index.py), where the caller may have found them.
        `index_stale` (the caller's copy from a host index row failed the fence): those nodes' indexes forget the
        chain's keys and get the current DRAM locations of its hits, so the next reader finds them right.
        `continued` (with `lease`): the lookup continues a read whose first lookup asked for these keys already (a
        load reading a long hit one ring of staging rows at a time): answered as usual, counted nowhere (stats,
        per-tenant counts, the traffic recorder), since that first lookup counted them."""
        keys = checks.keys(keys, self.config.max_batch_keys)
        s_per_token = checks.seconds_per_token(s_per_token)
        uses = checks.uses(uses)
        if expect_sizes is not None:
            checks.same_length(expect_sizes, "expect_sizes", keys, "keys")
        if continued and (not lease or count_only):
            raise ValueError("continued: only a leased read's lookup continues an earlier one (lease=True, "
                             "count_only=False)")
        reads: tuple[int, float] | None = None     # (lease id, expiry) of read tokens to sign after the lock
        with self._lock:
            now = self._tick()
            index = self.index
            tid = self.tenants.intern(tenant)
            if tid != UNSCOPED:
                keys = self.tenants.stored_keys(tid, keys)
                ns = NsRef(ns.digest, f"{ns.label.rsplit('/', 1)[0]}/{tenant}" if ns.label else tenant,
                           ns.block_tokens)
            found = index.committed_prefix(keys)
            if (n := self.placement.landed(found)) < len(found):   # in flight: not where the index says yet
                found = found[:n]
            slots = np.array(found, dtype=np.int64)
            if lease and len(found) and (n := self.leases.leasable(slots)) < len(found):
                found, slots = found[:n], slots[:n]
            sizes = index.size[slots].tolist()
            if expect_sizes is not None and len(found):
                expected = [int(n) for n in expect_sizes[: len(found)]]
                if sizes != expected:
                    i = next(i for i, (have, want) in enumerate(zip(sizes, expected)) if have != want)
                    raise SizeMismatch(i, expected[i], sizes[i])
            tiers = index.tier[slots].tolist()
            if (rec := self.recorder) is not None and not continued:
                chain, hit_tiers = list(keys), list(tiers)   # its own lists: read by its writer
                for _ in range(uses):   # a trace has a row per get: a location cache's report is `uses` gets
                    rec.lookup(now, ns, chain, hit_tiers, lease)
            index.atime[slots] = self._ticks(now)  # a probe without a lease is a use too (someone wants it)
            if not continued:
                self.lookup_stats.count(ns, len(keys), tiers, s_per_token, uses)
                if tid != UNSCOPED:
                    self._lookups_of(tid).count(ns, len(keys), tiers, s_per_token, uses)
            if release:
                self._release_all(release, tenant)
                self._flush()
            if mapped_nodes and tid == UNSCOPED and (index_stale or (unpublish_misses and len(found) < len(keys))):
                gone = [bytes(k) for k in keys[0 if index_stale else len(found):]]
                for node_id in mapped_nodes:
                    node = self.placement.nodes.get(node_id)
                    if node is not None and isinstance(node.ops, PublishOps):
                        self.host_feed.gone(node_id, node.ops, gone)
                if index_stale and len(found):      # after the `gone` above: a Publication applies gone first
                    self._publish(found, [bytes(k) for k in keys[: len(found)]])
            if not lease or not len(slots):
                return LookupResult(hits=len(found), released=bool(release))
            self.placement.touch(slots, tiers)
            if count_only:     # a use report: its gets were served, nothing is read through this answer
                result = LookupResult(hits=len(found), released=bool(release), tiers=tiers)
            else:
                by_number = self.placement.by_number
                node_ids = [by_number[n].node_id for n in index.node[slots].tolist()]
                offsets = index.offset[slots].tolist()
                # optimistic, all DRAM in arenas the caller maps: the caller's read fence stands in for a pin
                if optimistic and mapped_nodes and min(tiers) == max(tiers) == Tier.DRAM \
                        and all(n in mapped_nodes for n in set(node_ids)):
                    result = LookupResult(hits=len(found), released=bool(release), node_ids=node_ids, tiers=tiers,
                                          offsets=offsets, sizes=sizes, checksums=index.checksum[slots].tolist(),
                                          tokens=[b""] * len(found) if self.leases.signs else [])
                else:
                    expires_at = now + self.config.lease_ttl_s
                    lease_id = self.leases.lease(slots, expires_at)
                    result = LookupResult(hits=len(found), lease_id=lease_id, expires_at=expires_at,
                                          released=bool(release), node_ids=node_ids, tiers=tiers, offsets=offsets,
                                          sizes=sizes, checksums=index.checksum[slots].tolist())
                    if self.leases.signs:
                        reads = (lease_id, expires_at)
                if tid != UNSCOPED:
                    result.record_keys = list(keys[: len(found)])
            if self.config.promote_on_hit and self.promotions.want(slots, tiers):
                self.promotion_wanted.set()
        if reads is not None:
            # Signed after the lock (1.6 us an HMAC: ~100 us for a 64-key TCP read, which every other call waited
            # for when signed under it). A hit in DRAM the caller maps gets none: it reads it itself.
            sign, (lease_id, expires_at), secret = self.leases.sign, reads, self.leases.read_key
            result.tokens = [b"" if t == Tier.DRAM and n in mapped_nodes else
                             sign(secret, tokens.READ, lease_id, t, o, z, expires_at)
                             for n, t, o, z in zip(result.node_ids, result.tiers, result.offsets, result.sizes)]
        return result

    def release(self, lease_ids: Sequence[int], *, tenant: str = "") -> int:
        with self._lock:
            n = self._release_all(lease_ids, tenant)
            self._flush()
            return n

    def _release_all(self, lease_ids: Sequence[int], tenant: str) -> int:
        if not lease_ids:
            return 0
        owner = self.tenants.id_of(tenant) if tenant else None  # "": auth off, one space
        n, free = 0, []
        for lease_id in lease_ids:
            n += self._release(lease_id, owner, free)
        self._free(free)
        return n

    def report_corrupt(self, lease_id: int, keys: Sequence[bytes], *, tenant: str = "") -> int:
        """A reader found these objects' bytes bad (checksum) while `lease_id` held them: forget them (a miss for
        everyone; the next put restores them) and count them by tier, `ssd_corrupt` or `dram_corrupt` (a DRAM/HBM
        extent changed under a committed object: a writer that outlived its grant). A report under a lease that has
        ended is ignored: the extent may legitimately hold another object by now. `keys` are the reader's own (in
        `tenant`'s key space), and only objects its lease holds count."""
        keys = checks.keys(keys, self.config.max_batch_keys)
        with self._lock:
            keys = self.tenants.stored_keys(self.tenants.intern(tenant), keys)
            leased = self.leases.slots_of(lease_id)
            slots = set(leased.tolist()) if leased is not None else set()
            counters = self.placement.counters
            n = 0
            with self.placement.batched_ops():
                for key in keys:
                    slot = self.index.slot_of(key)
                    if slot in slots and self.index.state[slot] == COMMITTED:
                        if int(self.index.tier[slot]) == Tier.SSD:
                            counters.ssd_corrupt += 1
                        else:
                            counters.dram_corrupt += 1
                        self.placement.forget(slot)
                        n += 1
            if n:
                log.warning("%d object(s) read back wrong under lease %d (first key %s): forgotten", n, lease_id,
                            bytes(keys[0]).hex())
            self._flush()
            return n

    def promote_pending(self) -> int:
        """Move the queued slow-tier hits up (store/promotion.py): targets reserved under the lock, one batched
        copy per node without it, then the switch under the lock again. Returns how many objects moved."""
        self.promotion_wanted.clear()
        with self._lock:
            with self.placement.batched_ops():     # the room made: one Demote call per node (its drops inside), sent here
                batches = self.promotions.start(self._unplaceable(), self._busy)
            self._flush()  # making room may have demoted or evicted objects
        moved = 0
        for batch in batches:
            try:
                results = batch.ops.promote(batch.moves)
            except Exception as exc:  # noqa: BLE001 - a failing node leaves its objects where they are
                log.warning("promotion on node %s failed: %s", batch.node.node_id, exc)
                results = None
            with self._lock:
                moved += self.promotions.finish(batch, results)
                self._flush()
        return moved

    def copy_pending(self, max_bytes: int = ROUND_BYTES) -> int:
        """One write-behind round (store/writebehind.py): the oldest un-copied objects, up to `max_bytes`, copied to
        their reserved SSD extents with one batched NodeOps call per node, outside the lock. Returns how many copies
        became clean; call again while it returns objects to drain the backlog."""
        with self._copy_lock:
            with self._lock:
                batches = self.write_behind.start(self._no_copies(), self._busy, max_bytes)
            return self._copy(batches)

    def erase_in_background(self) -> None:
        """From now on a put's SSD erases are queued and sent after its answer (store/erasures.py) by a thread that
        calls `erase_pending` when `erase_wanted` is set (a master process's eraser, `erasures.erase_loop`)."""
        self.placement.erasures.background = True

    @property
    def erase_wanted(self) -> threading.Event:
        return self.placement.erasures.wanted

    def erase_pending(self) -> None:
        """Send every queued SSD erase (store/erasures.py), without the lock."""
        self.placement.erasures.flush_all()

    def flush_node(self, node_id: str, deadline_s: float = 60.0,
                   max_bytes: int = ROUND_BYTES) -> tuple[int, int]:
        """A clean stop of a node: nothing new is placed on it from now on (until it registers again), and every
        object of it whose SSD copy is not written yet is copied now. Returns (copied, left): left > 0 only if
        copies failed or the deadline passed. KeyError for an unknown node."""
        end = time.monotonic() + deadline_s
        copied = 0
        with self._copy_lock:
            with self._lock:
                number = self.placement.node(node_id).number
                self._stopping.add(node_id)
            while time.monotonic() < end:
                with self._lock:
                    if node_id not in self.placement.nodes or self.placement.nodes[node_id].number != number:
                        break
                    batches = self.write_behind.start(self._no_copies(), self._busy, max_bytes, only=number)
                if not batches:
                    break
                done = self._copy(batches)
                copied += done
                if not done:
                    break        # the node refused every copy of a round: do not spin on it
            with self._lock:
                left = self.write_behind.pending_on(number) if node_id in self.placement.nodes else 0
        log.info("node %s flushed for a clean stop: %d copies written, %d left", node_id, copied, left)
        return copied, left

    def _copy(self, batches) -> int:
        clean = 0
        for batch in batches:
            self.placement.erasures.flush(batch.node.number)    # the copies write SSD extents: queued erases first
            try:
                results = batch.ops.demote(batch.moves)
            except Exception as exc:  # noqa: BLE001 - a failing node keeps its objects dirty; the next round retries
                log.warning("write-behind on node %s failed: %s", batch.node.node_id, exc)
                results = None
            with self._lock:
                clean += self.write_behind.finish(batch, results)
                self._flush()
        return clean

    # ------------------------------------------------------------------ client queries

    def contains(self, keys: Sequence[bytes], *, tenant: str = "") -> list[bool]:
        keys = checks.keys(keys, self.config.max_batch_keys)
        with self._lock:
            return self.index.committed(self.tenants.stored_keys(self.tenants.intern(tenant), keys))

    def remove(self, keys: Sequence[bytes], *, tenant: str = "") -> int:
        """Remove committed objects; returns how many. Leased ones vanish now and free their space on release.
        A tenant removes only its own; tenant "" (an admin, or auth off) removes by stored key, anyone's.
        `queries.REMOVAL_CHUNK` keys per hold of the lock, the nodes told after each chunk (a lookup meanwhile waits
        one chunk; a chain cut in its middle is still a prefix hit up to the cut)."""
        keys = checks.keys(keys, self.config.max_batch_keys)
        return self._in_chunks(len(keys), lambda start, end: self._remove_chunk(keys[start:end], tenant))

    def _remove_chunk(self, keys: Sequence[bytes], tenant: str) -> tuple[int, list[bytes]]:
        """One chunk of `remove` (lock held): (removed, the unscoped stored keys removed: what a host index may
        hold)."""
        tid = self.tenants.intern(tenant)
        tenant_col = self.index.tenant
        n = 0
        published: list[bytes] = []
        stored = list(self.tenants.stored_keys(tid, keys))
        gone: list[bytes] = []
        with self.placement.batched_ops():  # the erases of their SSD records and copies: one call per node
            for key in stored:
                slot = self.index.slot_of(key)
                mine = tid == UNSCOPED or tenant_col[slot] == tid  # defence in depth: the key space is its own
                if slot >= 0 and self.index.state[slot] == COMMITTED and mine:
                    if tenant_col[slot] == UNSCOPED:
                        published.append(bytes(key))
                    self.placement.forget(slot)
                    gone.append(key)
                    n += 1
        # Tombstones (store/tombstones.py; still under the lock, so no node heard a later time meanwhile) for every
        # key given, known here or not (a node out of the pool may hold the only record of one). A tenant's go to
        # its own key space, bounded and folded there: naming keys it never stored costs only its own records.
        if tid == UNSCOPED:
            self.tombstones.bury(stored)
        else:
            self.tombstones.bury_scoped(stored)
        self._flush()
        return n, published

    def _republish(self, node_ids: Collection[str]) -> None:
        """Publish again every committed unscoped DRAM or SSD object of these nodes into their host indexes, which a
        removal or a registration has just cleared: a backfill on the feed's thread (store/host_feed.py), so the
        call that asked returns at once (a node of 1,000,000 objects took its RegisterNode ~1-3.5 s, and one of a few
        million would have run past the node's RPC deadline and registered again forever). `REPUBLISH_SLOTS` index
        slots per hold of the lock, `between_republish_chunks` between two; an object committed, moved or removed
        meanwhile is published or told gone by that call itself, so the host index ends as the master's."""
        for node_id in node_ids:
            self.host_feed.backfill(node_id, functools.partial(self._republish_chunk, node_id),
                                    room=REPUBLISH_SLOTS, pause=self._between_republish_chunks)

    def _between_republish_chunks(self) -> None:
        self.between_republish_chunks()

    def _republish_chunk(self, node_id: str, first: int) -> int | None:
        """One chunk of `_republish` from slot `first`: where the next starts, or None when done (or the node left)."""
        with self._lock:
            if not self._indexed(self.placement.nodes.get(node_id)):
                return None
            end = first + REPUBLISH_SLOTS
            self._republish_slots(node_id, first, end)
            return end if end < self.index.capacity else None

    def _republish_slots(self, node_id: str, first: int, end: int) -> None:
        """One chunk of `_republish` (lock held): `node_id`'s objects in index slots [first, end)."""
        node = self.placement.nodes.get(node_id)
        if not self._indexed(node):
            return
        index = self.index
        slots = index.slots(first, end)
        mask = (index.state[slots] == COMMITTED) & (index.node[slots] == node.number) \
            & (index.tenant[slots] == UNSCOPED)
        tiers = index.tier[slots]
        mask &= (tiers == Tier.DRAM) | (tiers == Tier.SSD)
        picked = list(itertools.filterfalse(self.placement.in_flight, slots[mask].tolist()))  # published on landing
        if picked:
            self._publish(picked, list(map(index.key_at, picked)))

    def _in_chunks(self, count: int, chunk: Callable[[int, int], tuple[int, list[bytes]]]) -> int:
        """A removal of `count` objects, `queries.REMOVAL_CHUNK` per hold of the lock: `chunk(start, end)` (lock held)
        removes those and returns (how many, the unscoped stored keys removed). After each chunk the nodes that
        forget removed keys only are told its keys; a node from before `removes_keys` clears its whole host index and
        gets everything published again, so it is told once, after the last chunk. Returns how many were removed."""
        total = 0
        cleared: dict[str, tuple[str, NodeOps, bool]] = {}
        for start in range(0, count, queries.REMOVAL_CHUNK):
            if start:
                self.between_chunks()
            with self._lock:
                n, keys = chunk(start, start + queries.REMOVAL_CHUNK)
                told = self._told_nodes() if n else []
            self._tell_removed([t for t in told if t[2]], keys)
            cleared.update((t[0], t) for t in told if not t[2])
            total += n
        self._tell_removed(list(cleared.values()))
        return total

    def _forget_leaving(self) -> int:
        """Forget the objects of removed nodes (Placement.remove_node: misses already), `queries.REMOVAL_CHUNK` per
        hold of the lock, until none is left (lock not held). Several callers may share the work. No node is told:
        the removed node's host index went with it, and no other node's holds its objects. Returns the slots
        passed."""
        total = 0
        while True:
            with self._lock:
                n, more = self.placement.forget_leaving(queries.REMOVAL_CHUNK)
                self._flush()
            total += n
            if not more:
                return total
            self.between_chunks()
            if self.closing.is_set():
                return total

    def _told_nodes(self) -> list[tuple[str, NodeOps, bool]]:
        """(id, ops, whether it forgets removed keys only) of every node: each dates what location caches remember of
        it, same-host ones by its arena's removal generation, TCP ones by its removal stamp (lock held)."""
        return [(node_id, node.ops, node.info.removes_keys) for node_id, node in self.placement.nodes.items()]

    def _tell_removed(self, nodes: list[tuple[str, NodeOps, bool]], keys: list[bytes] | None = None) -> None:
        """After a removal (outside the lock): every node bumps its arena's removal generation and its removal stamp
        before the caller hears back, so no location cache (same-host or TCP) serves a removed object after `remove`
        returned. Every node, not just the ones that held the objects: an extent an object left (a drain, a
        promotion) can still hold its bytes. A node that does not answer is logged: a location cache may serve a
        removed object of it until the reply to that get's use report forgets it (one linger), as for an object
        evicted for room.

        `keys` (the unscoped stored keys a `remove`, or one chunk of an admin `evict`, took) go to the nodes that
        say `removes_keys`: their host indexes forget those rows only. A node from before `removes_keys` clears its
        host index and the master publishes again every object it still holds, a backfill after the removal returned
        (`_republish`): one scan of the index and a publication of every row, ~86 ms of the master's lock in chunks
        and ~250 ms of feed per removal at 100,000 objects on one node (scratch, 2-core box, 2026-12-06).

        The nodes are told at once, one thread per node past the first, so a removal waits one round trip, not one
        per node (each call is bounded by the node RPC deadline)."""
        again: list[str] = []
        calls: list[tuple[str, NodeOps, list[bytes] | None]] = []
        for node_id, ops, selective in nodes:
            only = keys if selective else None
            self.host_feed.removed(node_id, only)
            calls.append((node_id, ops, only))
            if only is None:
                again.append(node_id)
        threads = [threading.Thread(target=_tell_node, args=call, name="kvpool-removal", daemon=True)
                   for call in calls[1:]]
        for t in threads:
            t.start()
        if calls:
            _tell_node(*calls[0])
        for t in threads:
            t.join()
        if again:                   # those nodes cleared their host indexes: what they still hold goes back in
            self._republish(again)

    # ------------------------------------------------------------------ admin queries (store/queries.py)

    def inspect(self, keys: Sequence[bytes]) -> list[ObjectRecord | None]:
        keys = checks.keys(keys, self.config.max_batch_keys)
        with self._lock:
            return queries.inspect(self.index, self.placement, keys)

    def list_objects(self, ns_digest: bytes = b"", start_after: bytes = b"", limit: int = 1000, *,
                     node_id: str = "", tenant: str | None = None) -> tuple[list[ObjectRecord], bytes]:
        """Committed objects in (stored) key order after `start_after` (empty = from the start), optionally of one
        namespace, one node (KeyError if it is not registered) and/or one tenant (KeyError if unknown; "" = the
        unscoped space); returns (records, next_start_after) with next empty when there are no more. An admin call:
        one pass over the index per page, `queries.LIST_CHUNK` slots per hold of the lock (another client's call
        waits one chunk). Not a snapshot: an object present for the whole call is listed, one put or removed
        meanwhile may or may not be."""
        checks.list_args(ns_digest, start_after, limit)
        start_after = bytes(start_after)
        with self._lock:
            number = self.placement.node(node_id).number if node_id else None
            tid = None
            if tenant is not None:
                tid = self.tenants.id_of(tenant)
                if tid < 0:
                    raise KeyError(f"tenant {tenant!r} is not known to this master")
            ns_id = self.index.ns_id_of(ns_digest) if ns_digest else None
        if ns_id == -1:
            return [], b""                  # no object ever had that namespace
        listing = queries.ListFilter(ns_id, number, tid)
        best: list[bytes] = []
        first = 0
        while True:
            with self._lock:
                end = first + queries.LIST_CHUNK
                best = queries.list_smallest(self.index, first, end, listing, start_after, best, limit)
                if end >= self.index.capacity:
                    return queries.list_page(self.index, self.placement, best, listing, limit)
            first = end
            self.between_chunks()

    def evict(self, ns_digest: bytes = b"", older_than_s: float | None = None) -> int:
        """Evict committed objects of one namespace (`ns_digest`, empty = any) and/or idle for at least
        `older_than_s` seconds since their last commit or lookup hit (resolution 1 / ATIME_TICKS_PER_S). At least one
        filter is required (older_than_s=0 with no namespace evicts everything). Leased, uncommitted and already
        removed objects are never touched. Returns how many were evicted (counted in stats()["evictions"]).

        The candidates are chosen once, then evicted `queries.REMOVAL_CHUNK` at a time, each chunk under one hold of
        the lock and checked again there (an object hit meanwhile is no longer idle; one leased is skipped). After
        each chunk the nodes that forget removed rows only are told its unscoped keys, as after a `remove`; a node
        from before `removes_keys` is told once, at the end (`_in_chunks`). Every node is told before `evict`
        returns, so no location cache serves an evicted object after it."""
        checks.evict_args(ns_digest, older_than_s)
        older = None if older_than_s is None else queries.idle_ticks(older_than_s, ATIME_TICKS_PER_S)
        with self._lock:
            if not older_than_s:            # a purge of a namespace, or of everything: nothing from before comes back
                if ns_digest:
                    self.tombstones.bury_namespace(ns_digest)
                else:
                    self.tombstones.bury_all()
            ns_id = self.index.ns_id_of(ns_digest) if ns_digest else None
            if ns_id == -1:
                self._flush()               # its tombstone
                return 0                    # no object ever had that namespace
            candidates = queries.evict_candidates(self.index, ns_id, older, self._ticks(self._tick()))
            self._flush()                   # what a reap run by _tick changed, and the tombstone

        def chunk(start: int, end: int) -> tuple[int, list[bytes]]:
            out = queries.evict(self.index, self.placement, candidates[start:end], ns_id, older,
                                self._ticks(self._tick()))
            self._flush()
            return out

        return self._in_chunks(len(candidates), chunk)

    def stats_record(self, *, tenant: str | None = None) -> stats_mod.PoolStats:
        """The pool's stats; with `tenant` (a client's), that tenant's view only (store/stats.py)."""
        with self._lock:
            if tenant is not None:
                tid = self.tenants.intern(tenant)
                return stats_mod.tenant_view(tenant, self._tenant_stats(tid), self._lookups_of(tid))
            leaving = self.placement.leaving
            record = stats_mod.snapshot(self.placement, self.lookup_stats, len(self.index) - leaving)
            record.leaving_objects = leaving
            record.tombstones, record.tombstones_folded = len(self.tombstones), self.tombstones.folded
            record.records_refused = self.tombstones.refused
            index, rc = self.index, self.retention.counters
            record.pinned_objects, record.pinned_bytes = index.retained_slots(), index.retained_bytes()
            record.pins_clipped, record.pinned_evictions = rc.clipped, rc.yielded
            record.extra = {"grants_open": self.leases.open_grants, "leases_open": self.leases.open_leases,
                            "grants_held": self.held.count(),
                            "heartbeats": {node_id: self.held.beats(node.number)
                                           for node_id, node in self.placement.nodes.items()},
                            "draining": sorted(self.drains.draining), "moves_open": self.drains.pinned(),
                            "write_behind": self.write_behind.counters.as_dict(self.write_behind.pending),
                            "orphaned": self.placement.counters.orphaned, "stopping": sorted(self._stopping),
                            "reporting": sorted(self.placement.by_number[n].node_id
                                                for n in self.registry.reporting_numbers(self.clock())),
                            "host_index": self.host_feed.as_dict(),
                            "erasures": self.placement.erasures.as_dict()}
            record.tenants = {self.tenants.name(t): self._tenant_stats(t) for t in range(1, len(self.tenants))}
            if (rec := self.recorder) is not None:       # only while one runs: `kvpool status` says so
                record.extra["recording"] = rec.status.as_dict()
            return record

    def stats(self) -> dict:
        return self.stats_record().to_dict()

    def free_dram(self, node_id: str) -> int:
        """Free DRAM bytes of a node (-1 if unknown): a placement hint, read without the lock."""
        node = self.placement.nodes.get(node_id)
        return self.placement.free_dram(node) if node is not None else -1

    def is_connected(self, node_id: str) -> bool:
        member = self.registry.member(node_id)
        return member is not None and member.connected and node_id in self.placement.nodes

    def node_ids(self) -> list[str]:
        return list(self.placement.nodes)

    # ------------------------------------------------------------------ traffic recording (store/recorder.py)

    def start_recording(self, directory: str, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                        duration_s: float = 0.0, max_files: int = 0) -> RecordingStatus:
        """Record every lookup and put_start to rolling Parquet files in `directory` (on this host) for `duration_s`
        seconds (0 = until `stop_recording`). ValueError naming the argument (unwritable directory included) before
        anything starts; RecordingActive while a recording runs."""
        with self._record_lock:
            if self.recorder is not None:
                raise RecordingActive(f"already recording to {self.recorder.status.directory}: stop that first")
            rec = Recorder(directory, max_file_bytes=max_file_bytes, duration_s=duration_s, max_files=max_files,
                           on_end=self._recording_ended)
            with self._lock:
                self.recorder = rec
            rec.start()
            return _snapshot(rec.status)

    def stop_recording(self) -> RecordingStatus:
        """End the recording (if one runs) and wait for its files; returns its final status, or the last
        recording's (`recording` False, empty when there never was one). Idempotent."""
        with self._record_lock:
            with self._lock:
                rec, self.recorder = self.recorder, None
            if rec is None:
                rec = self._last_recording
                if rec is None:
                    return RecordingStatus()
            self._last_recording = rec
            return _snapshot(rec.stop())

    def recording_status(self) -> RecordingStatus:
        rec = self.recorder or self._last_recording
        return _snapshot(rec.status) if rec is not None else RecordingStatus()

    def _recording_ended(self, rec: Recorder) -> None:
        """The recorder's writer thread, when its duration is over: no row is appended after this returns."""
        with self._lock:
            if self.recorder is rec:
                self.recorder = None
                self._last_recording = rec

    # ------------------------------------------------------------------ time

    def reap(self, now: float | None = None) -> dict[str, int]:
        """Reclaim expired grants and leases and drop nodes silent past node_ttl_s."""
        self.leaving_wanted.clear()
        with self._lock:
            out = self._reap(self.clock() if now is None else now)
            self._flush()
        self._forget_leaving()      # the objects of the nodes dropped here, or by a reap an earlier call ran
        return out

    # ------------------------------------------------------------------ internals (lock held)

    def _ticks(self, now: float) -> int:
        """`now` as the index's atime: ticks (1 / ATIME_TICKS_PER_S s) since the master started, saturating."""
        return min(max(int((now - self._t0) * ATIME_TICKS_PER_S), 0), _ATIME_MAX)

    def _tick(self) -> float:
        now = self.clock()
        self.retention.now = max(int(now - self._t0), 0)
        if now >= self._next_reap:
            self._reap(now)
        return now

    def _reap(self, now: float) -> dict[str, int]:
        cfg = self.config
        self.retention.now = max(int(now - self._t0), 0)
        self._next_reap = now + min(cfg.lease_ttl_s, cfg.grant_ttl_s, cfg.node_ttl_s) / 4
        grants = self.leases.expired_grants(now)
        leases = self.leases.expired_leases(now)
        free = self._expire_grants(grants)
        for lease_id in leases:
            self._release(lease_id, None, free)
        self._free(free)                        # the erases their freed SSD extents need: one call per node
        silent = self.registry.silent(now, cfg.node_ttl_s)
        for node_id in silent:
            log.warning("node %s silent for %.1fs: dropping it and its objects", node_id, cfg.node_ttl_s)
            self._node_leaves(self.placement.nodes[node_id].number, node_id, leaving=True)
            self.registry.remove(node_id)
            self.journal.node_gone(node_id)     # its records at once: its objects are forgotten a chunk at a time
        if silent:
            self.leaving_wanted.set()           # by `reap()`: the server's reaper wakes for it
        if moves := self.drains.reap(now):
            log.info("%d drain move(s) expired before their commit: destinations freed, sources unpinned", moves)
        if self.index.retained:
            self.retention.sweep()
        return {"grants": len(grants), "leases": len(leases), "nodes": len(silent)}

    def _hold_claimed(self, node: NodeState, claimed: Sequence[tuple[int, int]]) -> None:
        """A registering node's writers' claims (its scan, after it bumped its arena's removal generation): a writer
        may be copying there under a grant this master does not know (it restarted meanwhile), so the free parts of
        those ranges are reserved and held like expired grants' extents (store/held_extents.py) until a heartbeat
        shows them unclaimed. Writers that claim after that scan see the new generation and copy nothing."""
        space = node.spaces.get(Tier.DRAM)
        if space is None:
            return
        merged: list[list[int]] = []
        for start, end in sorted((int(s), int(e)) for s, e in claimed if int(e) > int(s)):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        pieces = [p for start, end in merged for p in space.allocator.free_within(start, end)]
        if pieces:
            space.allocator.reserve_many(pieces)
            for offset, size in pieces:
                self.held.hold(node.number, offset, size)
            log.info("node %s registered with %d claimed range(s): %d free piece(s) held until unclaimed",
                     node.node_id, len(merged), len(pieces))

    def _expire_grants(self, slots: list[int]) -> list[int]:
        """Expired grants' slots: those to free now. One in the DRAM of a node whose same-host writers claim what
        they copy into (NodeInfo.writer_claims) is forgotten now (its key free for a new put) while its extent is
        held until that node's heartbeats show it unclaimed (store/held_extents.py)."""
        free, held = [], []
        index, by_number = self.index, self.placement.by_number
        for slot in slots:
            node = by_number[int(index.node[slot])]
            if node is not None and node.info.writer_claims and int(index.tier[slot]) == Tier.DRAM \
                    and int(index.offset[slot]) >= 0:
                self.held.hold(node.number, int(index.offset[slot]), int(index.size[slot]))
                held.append(slot)
            else:
                free.append(slot)
        if held:
            with self.placement.batched_ops():      # a write-behind copy's SSD reservation: its erase, batched
                for slot in held:
                    self.placement.forget(slot, keep_extent=True)
        return free

    def _node_leaves(self, number: int, node_id: str, *, leaving: bool) -> None:
        """A node is dropped (`leaving`) or restarted: end its moves and its uncommitted grants (their slots are
        freed with the node, so a late commit must find no grant rather than a reused slot)."""
        self.held.forget_node(number)           # its held extents go with its allocators
        self.drains.forget_node(number, node_id, leaving=leaving)
        node_col = self.index.node
        self.leases.drop_grants_where(lambda slot: int(node_col[slot]) == number)

    def _lookups_of(self, tid: int) -> stats_mod.LookupStats:
        while len(self.tenant_lookups) <= tid:
            self.tenant_lookups.append(stats_mod.LookupStats())
        return self.tenant_lookups[tid]

    def _tenant_stats(self, tid: int) -> stats_mod.TenantStats:
        index, lookups, c = self.index, self._lookups_of(tid), self.tenants.counters[tid]
        quota = self.tenants.quota(tid) or Quota()
        return stats_mod.TenantStats(
            objects=index.tenant_slots(tid), bytes_by_tier={t.label: index.tenant_bytes(tid, t) for t in Tier},
            quota_dram_bytes=quota.dram_bytes, quota_total_bytes=quota.total_bytes, lookups=lookups.lookups,
            requested_tokens=lookups.requested_tokens, hit_tokens_by_tier=dict(lookups.hit_tokens_by_tier),
            quota_evictions=c.quota_evictions, quota_demotions=c.quota_demotions, no_space=c.no_space,
            pinned_objects=index.retained_slots(tid), pinned_bytes=index.retained_bytes(tid),
            prefill_seconds_saved=lookups.prefill_seconds_saved)

    def _release(self, lease_id: int, owner: int | None, free: list[int]) -> int:
        """End one lease; the slots it was the last to hold (objects removed while read) are appended to `free`."""
        slots = self.leases.release(lease_id, owner)
        if slots is None:
            return 0
        free.extend(slots)
        return 1

    def _free(self, slots: list[int]) -> None:
        """Forget slots whose last lease ended (rare: only objects removed while read): their SSD records' erases
        in one call per node. Nothing to free, as almost always: no batch is opened (lookups carry releases)."""
        if slots:
            with self.placement.batched_ops():
                for slot in slots:
                    self.placement.forget(slot)

    def _busy(self, slot: int) -> bool:
        """Moved by something else: a drain, or a put's deferred move (Placement.in_flight; an HBM victim moved to
        DRAM keeps its dirty copy, which a copy round must not write from a DRAM extent its move has not filled)."""
        return self.drains.moving(slot) or self.placement.in_flight(slot)

    def _unplaceable(self) -> set[int]:
        """Node numbers nothing new may land on: draining, stopping (flushed for a clean stop), known from the journal
        but not connected, silent for suspect_after_s (perhaps dead: a put acknowledged there could be lost), or
        still reporting its SSD records (store/registry.py)."""
        nodes = self.placement.nodes
        stopping = {nodes[n].number for n in self._stopping if n in nodes}
        return self._no_copies() | stopping | self.registry.reporting_numbers(self.clock())

    def _no_destination(self, now: float) -> set[int]:
        """Node numbers a drain's move may not go to (besides the draining ones): not connected, or still reporting
        its SSD records."""
        return self.registry.disconnected_numbers() | self.registry.reporting_numbers(now)

    def _no_copies(self) -> set[int]:
        """Node numbers the write-behind leaves alone: draining (leaving), not connected or suspect (a copy would
        wait out an RPC deadline)."""
        registry = self.registry
        return (self.drains.draining_numbers() | registry.disconnected_numbers()
                | registry.suspect_numbers(self.clock(), self.config.suspect_s))

    def _flush(self) -> None:
        """After each change under the lock: moved objects to the host indexes, changed slots to the journal."""
        self._publish_moved()
        self.journal.flush(self.placement.record)
        self.journal.flush_tombstones(self.tombstones)

    def _load(self) -> None:
        """A master starting on a persistent backend re-indexes what it persisted; nodes stay disconnected until
        they register again with the same incarnation."""
        infos, by_node = self.journal.load()
        self.tombstones.load(self.journal.load_tombstones())
        now = self.clock()
        for info in infos:
            self.registry.add_disconnected(info, now, self.config.grace_s)
        for node_id, records in by_node.items():
            node = self.placement.nodes.get(node_id)
            if node is not None:
                kept = [r for r in records if Tier(r.tier) in node.spaces]
                self.placement.adopt(node, kept, [])
                for r in kept:
                    if r.pinned_until > now and (slot := self.index.find(r.key, -1)) >= 0:
                        self.retention.restore(slot, r.pinned_until)
        self.journal.forget_changes()


def _snapshot(status: RecordingStatus) -> RecordingStatus:
    return RecordingStatus(status.recording, status.directory, list(status.files), status.rows, status.dropped,
                           status.duration_s, status.elapsed_s, status.max_file_bytes, status.max_files)


__all__ = ["Master", "SizeMismatch", "BatchTooLarge", "RecordingActive"]
