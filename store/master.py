"""Master: the pool's metadata authority. Index, placement over nodes and tiers, write grants, read leases, stats.

Every public method is one batched call that maps 1:1 onto a MasterService RPC (proto/kvpool.proto): plain records
in and out (store/records.py), no callables, caller mistakes raise ValueError naming the argument before anything
changes. One lock serialises them; node byte moves (NodeOps) run under it, so the master never races itself.

Object life:   put_start ──▶ PENDING ──put_commit──▶ COMMITTED ──remove/evict/evict()──▶ gone
                              │ put_abort / grant expiry      │ remove while leased ──▶ DOOMED ──last release──▶ gone
                              ▼                               └ demote / promote: same key, new tier+offset
                             gone
Removing a leased object is accepted (counted) and makes it invisible at once; its extent is freed when the last
lease on it ends, so a reader mid-copy never sees its bytes reused. Time comes from an injectable clock; `reap(now)`
reclaims expired grants, leases and silent nodes (tests drive it with a fake clock, nothing sleeps).
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from typing import Callable, Sequence

import numpy as np

from kvpool.store import stats as stats_mod
from kvpool.store import tokens
from kvpool.store.config import MasterConfig
from kvpool.store.index import Index, State
from kvpool.store.metadata import MemoryMetadata, MetadataBackend
from kvpool.store.migration import Drains, MigrateStartResult
from kvpool.store.node import NodeOps
from kvpool.store.placement import NodeState, Placement
from kvpool.store.records import (NO_NS, Grant, Location, LookupResult, NodeInfo, NsRef, ObjectRecord, PutStartResult,
                                  PutStatus, ReportResult, Tier)

log = logging.getLogger(__name__)

KEY_BYTES = 16
_COMMITTED, _DOOMED, _SSD = int(State.COMMITTED), int(State.DOOMED), int(Tier.SSD)
_TIERS = tuple(Tier)  # Tier(int) through the enum machinery costs ~1 us; a tuple index does not
_PENDING = int(State.PENDING)
_PLACE_ORDER = (Tier.HBM, Tier.DRAM, Tier.SSD)  # fastest first: a put lands on the fastest tier with room
_STORED, _EXISTS, _NO_SPACE = PutStatus.STORED, PutStatus.EXISTS, PutStatus.NO_SPACE
ATIME_TICKS_PER_S = 10      # the index's last-access column counts tenths of a second since the master started
_ATIME_MAX = 2**32 - 1


class SizeMismatch(ValueError):
    """lookup(expect_sizes=...) found an object whose size differs from what the caller expects."""

    def __init__(self, position: int, expected: int, actual: int) -> None:
        super().__init__(f"expect_sizes[{position}] is {expected} bytes, object has {actual}")
        self.position, self.expected, self.actual = position, expected, actual


class BatchTooLarge(ValueError):
    """More keys in one call than max_batch_keys (RESOURCE_EXHAUSTED on the wire)."""


class _Disconnected:
    """NodeOps of a node known from the metadata backend that has not re-registered yet: every move fails."""

    def demote(self, moves):
        return [False] * len(moves)

    def promote(self, moves):
        return [False] * len(moves)

    def drop(self, drops):
        return 0


class Master:
    def __init__(self, config: MasterConfig | None = None, metadata: MetadataBackend | None = None, *,
                 clock: Callable[[], float] = time.time, token_secret: bytes | None = None) -> None:
        self.config = config or MasterConfig()
        self.metadata = metadata if metadata is not None else MemoryMetadata()
        self.clock = clock
        # None: grants/leases carry no tokens (in-process pool, where there is no one to check them).
        self.token_secret = token_secret
        self._lock = threading.Lock()
        self.index = Index()
        self.placement = Placement(self.index, self.config.policy)
        self.stats_counters = stats_mod.LookupStats()
        self._grants: dict[int, tuple[int, float]] = {}         # grant_id -> (slot, expires_at)
        self._leases: dict[int, tuple[np.ndarray, float]] = {}  # lease_id -> (slots, expires_at)
        self._next_id = 1
        self._next_reap = 0.0
        self._t0 = clock()          # atime 0; a reloaded object counts as accessed when the master started
        self.drains = Drains(self)  # draining nodes and the object moves in flight (store/migration.py)
        self._load()

    # ------------------------------------------------------------------ nodes

    def register_node(self, info: NodeInfo, ops: NodeOps, *, expires: bool = True) -> int:
        """Add (or re-attach) a node; returns its epoch. A node re-registering with the same `incarnation` kept its
        memory (the master restarted): its objects stay. A new incarnation means the node restarted: everything it
        held is dropped, and it re-adopts its SSD objects with `report_objects`."""
        if not isinstance(info.node_id, str) or not info.node_id:
            raise ValueError(f"node_id must be a non-empty string, got {info.node_id!r}")
        for name in ("dram_bytes", "ssd_bytes", "ssd_record_overhead", "hbm_bytes"):
            if getattr(info, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(info, name)}")
        with self._lock:
            now = self.clock()
            old = self.placement.nodes.get(info.node_id)
            if old is not None and old.info.incarnation == info.incarnation and old.info.dram_bytes == info.dram_bytes \
                    and old.info.ssd_bytes == info.ssd_bytes and old.info.hbm_bytes == info.hbm_bytes:
                old.ops, old.info, old.expires, old.last_heartbeat = ops, info, expires, now
                old.epoch += 1
                if self.metadata.persistent:
                    self.metadata.put_node(info)  # addresses may have changed
                return old.epoch
            epoch = 1
            if old is not None:
                epoch = old.epoch + 1
                self.drains.forget_node(old.number, info.node_id, leaving=False)
                self.placement.remove_node(info.node_id)
            state = self.placement.add_node(info, ops, expires=expires, now=now)
            state.epoch = epoch
            if self.metadata.persistent:
                self.metadata.put_node(info)
            self._flush()
            return epoch

    def heartbeat(self, node_id: str, epoch: int = 0) -> bool:
        """Returns True when the node must register again (unknown to this master, or a stale epoch)."""
        with self._lock:
            node = self.placement.nodes.get(node_id)
            if node is None or isinstance(node.ops, _Disconnected) or (epoch and epoch != node.epoch):
                return True
            node.last_heartbeat = self.clock()
            return False

    def report_objects(self, node_id: str, records: Sequence[ObjectRecord]) -> ReportResult:
        """Index objects a node found on its own tiers (SSD scan after a restart) as committed."""
        with self._lock:
            node = self._node(node_id)
            result = ReportResult()
            fresh: list[ObjectRecord] = []
            seen: set[bytes] = set()
            for r in records:
                slot = self.index.slot_of(r.key)
                if slot >= 0 and self.placement.same_place(slot, node, r):
                    result.known += 1
                elif slot >= 0 or r.key in seen or r.tier not in node.spaces or len(r.key) != KEY_BYTES:
                    result.dropped_keys.append(r.key)
                else:
                    seen.add(r.key)
                    fresh.append(r)
            result.adopted = self.placement.adopt(node, fresh, result.dropped_keys, self._ticks(self.clock()))
            self._flush()
            return result

    def drain_node(self, node_id: str) -> int:
        """Forget a node and its objects (they become misses). Returns the number of committed objects dropped.
        Moving them elsewhere first is `begin_drain` + `migrate_*` (store/migration.py)."""
        with self._lock:
            node = self._node(node_id)
            self.drains.forget_node(node.number, node_id)
            n = self.placement.remove_node(node_id)
            if self.metadata.persistent:
                self.metadata.delete_node(node_id)
            self._flush()
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
        keys = self._check_batch(keys)
        with self._lock:
            result = self.drains.start(keys)
            self._flush()  # placing may have evicted or demoted objects on the destination
            return result

    def migrate_next(self, node_id: str, cursor: int = 0, limit: int = 256, max_bytes: int = 0
                     ) -> MigrateStartResult:
        """migrate_start on the next batch of a draining node's objects in index order from `cursor` (0 = the
        start): up to `limit` keys and (beyond the first) `max_bytes` bytes, 0 = no byte bound. `result.keys` are
        the keys picked, `result.next_cursor` continues the pass (0 = done). KeyError for an unknown node,
        ValueError if it is not draining."""
        for name, value in (("cursor", cursor), ("limit", limit), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if not 0 < limit <= self.config.max_batch_keys:
            raise ValueError(f"limit must be in [1, max_batch_keys={self.config.max_batch_keys}], got {limit}")
        with self._lock:
            keys, next_cursor = self.drains.pick(node_id, int(cursor), int(limit), int(max_bytes))
            result = self.drains.start(keys)
            result.next_cursor = next_cursor
            self._flush()
            return result

    def migrate_commit(self, move_ids: Sequence[int], checksums: Sequence[int]) -> list[bool]:
        """Switch moved objects to their destination. False = the move is gone (unknown, expired, the object was
        removed meanwhile, the destination left) or `checksums[i]` is not the object's: nothing moved, cleaned up."""
        if len(checksums) != len(move_ids):
            raise ValueError(f"checksums has {len(checksums)} entries, move_ids has {len(move_ids)}")
        self._check_ids(move_ids, "move_ids")
        with self._lock:
            self._tick()
            ok = self.drains.commit(move_ids, checksums)
            self._flush()
            return ok

    def migrate_abort(self, move_ids: Sequence[int]) -> int:
        self._check_ids(move_ids, "move_ids")
        with self._lock:
            n = self.drains.abort(move_ids)
            self._flush()
            return n

    # ------------------------------------------------------------------ put

    def put_start(self, keys: Sequence[bytes], sizes: Sequence[int], ns: NsRef = NO_NS, *,
                  prefer_node: str | None = None) -> list[PutStartResult]:
        keys = self._check_batch(keys)
        if len(sizes) != len(keys):
            raise ValueError(f"sizes has {len(sizes)} entries, keys has {len(keys)}")
        if not isinstance(ns.digest, bytes) or len(ns.digest) != KEY_BYTES:
            raise ValueError(f"namespace must be a {KEY_BYTES}-byte namespace digest, got {ns.digest!r}")
        limit = self.config.max_object_bytes
        for i, size in enumerate(sizes):
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0 or size > limit:
                raise ValueError(f"sizes[{i}] must be an int in [1, max_object_bytes={limit}], got {size!r}")
        with self._lock:
            now = self._tick()
            expires_at = now + self.config.grant_ttl_s
            ns_id = self.index.intern_ns(ns.digest)
            out: list[PutStartResult] = []
            for key, size in zip(keys, sizes):
                if self.index.slot_of(key) >= 0:
                    out.append(PutStartResult(_EXISTS))
                    continue
                placed = self._place(size, prefer_node)
                if placed is None:
                    out.append(PutStartResult(_NO_SPACE))
                    continue
                node, tier, offset = placed
                slot = self.index.add(key, node=node.number, tier=tier, state=_PENDING, offset=offset, size=size,
                                      ns=ns_id)
                grant_id = self._new_id()
                self._grants[grant_id] = (slot, expires_at)
                token = b""
                if self.token_secret is not None:
                    token = tokens.sign(self.token_secret, tokens.WRITE, grant_id, tier, offset, size,
                                        int(expires_at * 1000))
                out.append(PutStartResult(_STORED, Grant(grant_id, bytes(key),
                                                                   Location(node.node_id, tier, offset, size),
                                                                   expires_at, token)))
            self._flush()
            return out

    def put_commit(self, grant_ids: Sequence[int], checksums: Sequence[int]) -> list[bool]:
        """Make granted objects visible. False for a grant that is unknown or expired (the key is not stored)."""
        if len(checksums) != len(grant_ids):
            raise ValueError(f"checksums has {len(checksums)} entries, grant_ids has {len(grant_ids)}")
        with self._lock:
            now = self._tick()
            atime = self._ticks(now)
            index = self.index
            ok: list[bool] = []
            chains: dict[tuple[int, int], tuple[list[int], list[bytes]]] = {}
            for grant_id, checksum in zip(grant_ids, checksums):
                entry = self._grants.pop(grant_id, None)
                if entry is None:
                    ok.append(False)
                    continue
                slot, expires_at = entry
                if expires_at <= now:
                    # Expired but not reaped yet (the reaper runs every ttl/4): refuse exactly as a reaped grant
                    # is refused, since the node already refuses writes under it.
                    self.placement.forget(slot)
                    ok.append(False)
                    continue
                index.state[slot] = State.COMMITTED
                index.checksum[slot] = checksum
                index.atime[slot] = atime
                chain = chains.get((n_t := (int(index.node[slot]), int(index.tier[slot]))))
                if chain is None:
                    chain = chains[n_t] = ([], [])
                chain[0].append(slot)
                chain[1].append(index.key_at(slot))
                self.placement.touched.add(slot)
                ok.append(True)
            for (number, tier), (slots, keys) in chains.items():
                self.placement.by_number[number].spaces[_TIERS[tier]].policy.insert_chain(slots, keys)
            self._flush()
            return ok

    def put_abort(self, grant_ids: Sequence[int]) -> int:
        with self._lock:
            n = 0
            for grant_id in grant_ids:
                entry = self._grants.pop(grant_id, None)
                if entry is not None:
                    self.placement.forget(entry[0])
                    n += 1
            self._flush()
            return n

    # ------------------------------------------------------------------ get

    def lookup(self, keys: Sequence[bytes], ns: NsRef = NO_NS, *, lease: bool = True,
               expect_sizes: Sequence[int] | None = None) -> LookupResult:
        """Leading committed hits of a chain. With `lease`, pins them until `release` (or lease expiry) and returns
        their locations; an SSD hit nobody else is reading moves to DRAM first when `promote_on_hit`. A hit whose
        SSD copy fails verification during that move is dropped and ends the prefix. `expect_sizes` (one per key)
        makes a size disagreement a `SizeMismatch` raised before anything changes."""
        keys = self._check_batch(keys)
        if expect_sizes is not None and len(expect_sizes) != len(keys):
            raise ValueError(f"expect_sizes has {len(expect_sizes)} entries, keys has {len(keys)}")
        with self._lock:
            now = self._tick()
            index = self.index
            find, state = index._slot_of.get, index.state
            found: list[int] = []
            for key in keys:
                slot = find(key, -1)
                if slot < 0 or state[slot] != _COMMITTED:
                    break
                found.append(slot)
            slots = np.array(found, dtype=np.int64)
            if expect_sizes is not None and len(found):
                wrong = np.flatnonzero(index.size[slots] != np.asarray(expect_sizes[: len(found)], dtype=np.int64))
                if len(wrong):
                    i = int(wrong[0])
                    raise SizeMismatch(i, int(expect_sizes[i]), int(index.size[found[i]]))
            index.atime[slots] = self._ticks(now)  # a probe without a lease is a use too (someone wants it)
            if not lease:
                self.stats_counters.count(ns, len(keys), index.tier[slots].tolist())
                return LookupResult(hits=len(found))
            np.add.at(index.leases, slots, 1)
            found_tiers = index.tier[slots].tolist()  # a hit counts where it was FOUND, before any promotion
            if self.config.promote_on_hit:
                slots = self._promote_hits(slots)
            tiers = index.tier[slots].tolist()
            self.stats_counters.count(ns, len(keys), found_tiers[: len(slots)])
            self._touch(slots)
            result = LookupResult(hits=len(slots))
            if len(slots):
                lease_id = self._new_id()
                expires_at = now + self.config.lease_ttl_s
                self._leases[lease_id] = (slots, expires_at)
                result.lease_id, result.expires_at = lease_id, expires_at
                by_number = self.placement.by_number
                offsets, sizes = index.offset[slots].tolist(), index.size[slots].tolist()
                result.checksums = index.checksum[slots].tolist()
                result.locations = [Location(by_number[n].node_id, _TIERS[t], o, z)
                                    for n, t, o, z in zip(index.node[slots].tolist(), tiers, offsets, sizes)]
                if self.token_secret is not None:
                    exp_ms = int(expires_at * 1000)
                    result.tokens = [tokens.sign(self.token_secret, tokens.READ, lease_id, t, o, z, exp_ms)
                                     for t, o, z in zip(tiers, offsets, sizes)]
            self._flush()
            return result

    def release(self, lease_ids: Sequence[int]) -> int:
        with self._lock:
            n = sum(self._release(lease_id) for lease_id in lease_ids)
            self._flush()
            return n

    def report_corrupt(self, lease_id: int, keys: Sequence[bytes]) -> int:
        """A reader found these leased objects' bytes bad (SSD checksum): forget them and count it."""
        with self._lock:
            slots = set(self._leases.get(lease_id, ((), 0))[0].tolist()) if lease_id in self._leases else set()
            n = 0
            for key in keys:
                slot = self.index.slot_of(key)
                if slot in slots and self.index.state[slot] == State.COMMITTED:
                    self.placement.forget(slot)
                    n += 1
            self.placement.counters.ssd_corrupt += n
            self._flush()
            return n

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        keys = self._check_batch(keys)
        with self._lock:
            index = self.index
            find, state = index._slot_of.get, index.state
            return [(s := find(k, -1)) >= 0 and state[s] == _COMMITTED for k in keys]

    def remove(self, keys: Sequence[bytes]) -> int:
        """Remove committed objects; returns how many. Leased ones vanish now and free their space on release."""
        keys = self._check_batch(keys)
        with self._lock:
            n = 0
            for key in keys:
                slot = self.index.slot_of(key)
                if slot >= 0 and self.index.state[slot] == State.COMMITTED:
                    self.placement.forget(slot)
                    n += 1
            self._flush()
            return n

    def inspect(self, keys: Sequence[bytes]) -> list[ObjectRecord | None]:
        keys = self._check_batch(keys)
        with self._lock:
            return [self._record(s) if (s := self.index.slot_of(k)) >= 0 and self.index.state[s] == State.COMMITTED
                    else None for k in keys]

    def list_objects(self, ns_digest: bytes = b"", start_after: bytes = b"", limit: int = 1000, *,
                     node_id: str = "") -> tuple[list[ObjectRecord], bytes]:
        """Committed objects in key order after `start_after` (empty = from the start), optionally of one namespace
        and/or one node (KeyError if it is not registered); returns (records, next_start_after) with next empty when
        there are no more. Sorts the matching keys: an admin call, O(n log n) in the index size."""
        if ns_digest and len(ns_digest) != KEY_BYTES:
            raise ValueError(f"ns_digest must be a {KEY_BYTES}-byte namespace digest, got {len(ns_digest)} bytes")
        if start_after and len(start_after) != KEY_BYTES:
            raise ValueError(f"start_after must be a {KEY_BYTES}-byte key, got {len(start_after)} bytes")
        if not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"limit must be an int > 0, got {limit!r}")
        with self._lock:
            index = self.index
            slots = index.slots()
            mask = index.state[slots] == _COMMITTED
            if ns_digest:
                ns_id = index._ns_ids.get(bytes(ns_digest), -1)
                mask &= index.ns[slots] == ns_id
            if node_id:
                mask &= index.node[slots] == self._node(node_id).number
            keys = sorted(index.key_at(s) for s in slots[mask].tolist())
            start = bisect.bisect_right(keys, bytes(start_after)) if start_after else 0
            page = keys[start:start + limit]
            more = start + limit < len(keys)
            return [self._record(index.slot_of(k)) for k in page], (page[-1] if more and page else b"")

    def evict(self, ns_digest: bytes = b"", older_than_s: float | None = None) -> int:
        """Evict committed objects of one namespace (`ns_digest`, empty = any) and/or idle for at least
        `older_than_s` seconds since their last commit or lookup hit (resolution 1 / ATIME_TICKS_PER_S). At least one filter
        is required (older_than_s=0 with no namespace evicts everything). Leased, uncommitted and already removed
        objects are never touched. Returns how many were evicted (counted in stats()["evictions"])."""
        if not isinstance(ns_digest, (bytes, bytearray)) or len(ns_digest) not in (0, KEY_BYTES):
            raise ValueError(f"ns_digest must be empty or a {KEY_BYTES}-byte namespace digest, got {ns_digest!r}")
        if older_than_s is not None and (isinstance(older_than_s, bool) or not isinstance(older_than_s, (int, float))
                                         or not math.isfinite(older_than_s) or older_than_s < 0):
            raise ValueError(f"older_than_s must be None or a finite number of seconds >= 0, got {older_than_s!r}")
        if not ns_digest and older_than_s is None:
            raise ValueError("ns_digest or older_than_s must be given (older_than_s=0 evicts every unleased object)")
        with self._lock:
            now = self._tick()
            index = self.index
            slots = index.slots()
            mask = (index.state[slots] == _COMMITTED) & (index.leases[slots] == 0)
            if ns_digest:
                ns_id = index._ns_ids.get(bytes(ns_digest), -1)
                mask &= index.ns[slots] == ns_id
            if older_than_s is not None:
                need = math.ceil(older_than_s * ATIME_TICKS_PER_S - 1e-9)
                idle = self._ticks(now) - index.atime[slots].astype(np.int64)
                mask &= idle >= need
            drops: dict[int, list] = {}
            for slot in slots[mask].tolist():
                number, tier = int(index.node[slot]), _TIERS[int(index.tier[slot])]
                self.placement.forget(slot, drops=drops.setdefault(number, []))
                self.placement.count_evictions(tier, 1)
            for number, node_drops in drops.items():
                if node_drops:
                    self.placement.by_number[number].ops.drop(node_drops)
            self._flush()
            return int(mask.sum())

    def stats(self) -> dict:
        with self._lock:
            out = stats_mod.snapshot(self)
            out["draining"] = sorted(self.drains.draining)
            out["moves_open"] = self.drains.pinned()
            return out

    # ------------------------------------------------------------------ time

    def reap(self, now: float | None = None) -> dict[str, int]:
        """Reclaim expired grants and leases and drop nodes silent past node_ttl_s."""
        with self._lock:
            out = self._reap(self.clock() if now is None else now)
            self._flush()
            return out

    # ------------------------------------------------------------------ internals (lock held)

    def _ticks(self, now: float) -> int:
        """`now` as the index's atime: ticks (1 / ATIME_TICKS_PER_S s) since the master started, saturating."""
        return min(max(int((now - self._t0) * ATIME_TICKS_PER_S), 0), _ATIME_MAX)

    def _tick(self) -> float:
        now = self.clock()
        if now >= self._next_reap:
            self._reap(now)
        return now

    def _reap(self, now: float) -> dict[str, int]:
        cfg = self.config
        self._next_reap = now + min(cfg.lease_ttl_s, cfg.grant_ttl_s, cfg.node_ttl_s) / 4
        grants = [g for g, (_, exp) in self._grants.items() if exp <= now]
        for grant_id in grants:
            self.placement.forget(self._grants.pop(grant_id)[0])
        leases = [lease for lease, (_, exp) in self._leases.items() if exp <= now]
        for lease_id in leases:
            self._release(lease_id)
        silent = [n.node_id for n in self.placement.nodes.values()
                  if n.expires and n.last_heartbeat + cfg.node_ttl_s <= now]
        for node_id in silent:
            log.warning("node %s silent for %.1fs: dropping it and its objects", node_id, cfg.node_ttl_s)
            self.drains.forget_node(self.placement.nodes[node_id].number, node_id)
            self.placement.remove_node(node_id)
        if moves := self.drains.reap(now):
            log.info("%d drain move(s) expired before their commit: destinations freed, sources unpinned", moves)
        return {"grants": len(grants), "leases": len(leases), "nodes": len(silent)}

    def _release(self, lease_id: int) -> int:
        entry = self._leases.pop(lease_id, None)
        if entry is None:
            return 0
        index, slots = self.index, entry[0]
        np.subtract.at(index.leases, slots, 1)
        for slot in slots[(index.leases[slots] == 0) & (index.state[slots] == _DOOMED)].tolist():
            self.placement.forget(slot)
        return 1

    def _promote_hits(self, slots: np.ndarray) -> np.ndarray:
        index = self.index
        # Only an object nobody else is reading may move (leases == 1: ours). SSD hits move up; DRAM hits too once
        # some node has HBM (Placement.promote leaves an object already on its node's fastest tier where it is).
        slow = index.tier[slots] >= (int(Tier.DRAM) if self.placement.has_hbm else _SSD)
        movable = np.flatnonzero(slow & (index.leases[slots] == 1)).tolist()
        for i in movable:
            slot = int(slots[i])
            if self.placement.promote(slot) is False:
                np.subtract.at(index.leases, slots[i:], 1)
                self.placement.forget(slot)
                return slots[:i]
        return slots

    def _touch(self, slots: np.ndarray) -> None:
        if not len(slots):
            return
        index = self.index
        nodes, tiers = index.node[slots], index.tier[slots]
        by_number = self.placement.by_number
        if (nodes == nodes[0]).all() and (tiers == tiers[0]).all():  # the common case: one chain, one tier
            by_number[int(nodes[0])].spaces[_TIERS[int(tiers[0])]].policy.touch_chain(slots)  # numpy: see LRUPolicy
            return
        chains: dict[tuple[int, int], list[int]] = {}
        for slot, n, t in zip(slots.tolist(), nodes.tolist(), tiers.tolist()):
            chains.setdefault((n, t), []).append(slot)
        for (number, tier), chain in chains.items():
            by_number[number].spaces[_TIERS[tier]].policy.touch_chain(chain)

    def _place(self, size: int, prefer_node: str | None, *, max_atime: int | None = None
               ) -> tuple[NodeState, Tier, int] | None:
        """The fastest tier first (HBM where a node has it, then DRAM, then SSD): on the preferred node, else on the
        node with the most free DRAM (evicting/demoting there if needed), else the same order one tier down, down to
        SSD (objects larger than any DRAM tier, or DRAM full of leased/uncommitted objects). Never on a draining node.
        `max_atime`: see Placement.allocate."""
        draining = self.drains.draining
        nodes = [n for n in self.placement.nodes.values() if n.node_id not in draining]
        if len(nodes) > 1:
            nodes.sort(key=lambda n: (n.node_id != prefer_node, -self._free(n)))
        for tier in _PLACE_ORDER:
            for node in nodes:
                if isinstance(node.ops, _Disconnected):
                    continue
                offset = self.placement.allocate(node, tier, size, max_atime)
                if offset is not None:
                    return node, tier, offset
        return None

    @staticmethod
    def _free(node: NodeState) -> int:
        space = node.spaces.get(Tier.DRAM)
        return space.allocator.free_bytes if space is not None else 0

    def _node(self, node_id: str) -> NodeState:
        node = self.placement.nodes.get(node_id)
        if node is None:
            raise KeyError(f"node_id {node_id!r} is not registered")
        return node

    def _record(self, slot: int) -> ObjectRecord:
        i = self.index
        return ObjectRecord(key=i.key_at(slot), ns_digest=i.ns_digest(int(i.ns[slot])),
                            node_id=self.placement.by_number[int(i.node[slot])].node_id, tier=Tier(int(i.tier[slot])),
                            offset=int(i.offset[slot]), size=int(i.size[slot]), checksum=int(i.checksum[slot]))

    def _flush(self) -> None:
        """Write this call's index changes through to a persistent metadata backend, deletions first."""
        p = self.placement
        if self.metadata.persistent:
            if p.gone:
                self.metadata.delete_objects(p.gone)
            live = [s for s in p.touched if self.index.state[s] == State.COMMITTED]
            if live:
                self.metadata.put_objects([self._record(s) for s in live])
        p.gone.clear()
        p.touched.clear()

    def _load(self) -> None:
        """A master starting on a persistent backend re-indexes what it persisted; nodes stay disconnected until
        they register again with the same incarnation."""
        if not self.metadata.persistent:
            return
        now = self.clock()
        for info in self.metadata.load_nodes():
            self.placement.add_node(info, _Disconnected(), expires=True, now=now)
        by_node: dict[str, list[ObjectRecord]] = {}
        for r in self.metadata.load_objects():
            by_node.setdefault(r.node_id, []).append(r)
        for node_id, records in by_node.items():
            node = self.placement.nodes.get(node_id)
            if node is None:
                continue
            self.placement.adopt(node, [r for r in records if Tier(r.tier) in node.spaces], [])
        self.placement.touched.clear()

    def _check_batch(self, keys: Sequence[bytes]) -> Sequence[bytes]:
        """Validate a batch of keys; returns them as hashable bytes (bytearray keys are copied)."""
        if len(keys) > self.config.max_batch_keys:
            raise BatchTooLarge(f"keys: batch of {len(keys)} exceeds max_batch_keys={self.config.max_batch_keys}")
        convert = False
        for i, key in enumerate(keys):
            if type(key) is not bytes:
                if not isinstance(key, (bytes, bytearray)):
                    raise ValueError(f"keys[{i}] must be a {KEY_BYTES}-byte key, got {type(key).__name__}")
                convert = True
            if len(key) != KEY_BYTES:
                raise ValueError(f"keys[{i}] must be a {KEY_BYTES}-byte key, got {len(key)}")
        return [bytes(k) for k in keys] if convert else keys

    @staticmethod
    def _check_ids(ids: Sequence[int], name: str) -> None:
        for i, v in enumerate(ids):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{name}[{i}] must be an id (int >= 0), got {v!r}")

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1


__all__ = ["Master", "SizeMismatch", "BatchTooLarge"]
