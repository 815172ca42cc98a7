"""The master against a model of what it promises, under random steps that mix every way an object leaves or comes
back: puts by tenants at their quotas onto full tiers, leases held across steps, promotions and copy rounds (other
clients' calls running while a round's node call is out), an admin's and tenants' removals, evicts, a node removed
(`kvpool drain --no-migrate`) or drained with its objects moved, a node restarting as a new process (its SSD
records reported again), a silent node reaped, and the master itself restarting on its journal. Removals are
forgotten a few objects per hold of the lock, and between two holds another client's call runs (a put, a lookup, a
removal), as it would from another thread.

After every step and between every two chunks, for every key ever stored:
- a hit (inspect, or a lookup's location) reads back exactly the bytes put under that key (never another object's);
- a key an admin or its tenant removed (or evicted with everything) is a miss until it is put again, even after a
  node that held it restarts and reports its SSD records, and even when that node was out of the pool when the key
  was removed (removal tombstones, store/tombstones.py; half the runs keep only 5, and half only 3 per tenant key
  space, so the oldest fold into the floors);
- a put answered EXISTS is a hit at once (never EXISTS for a miss); a restarted node's report drops only keys that
  are hits elsewhere, or records written before a removal of their key (or before the floor of the pool or of
  their key space);
- the index's own invariants hold (store/index.py `check_invariants`: counts, bytes per tenant and tier, links);
- once a call returns, no removed node has objects left to forget.
Real StorageNodes in this process (tests/store/test_node_calls.py's Pool); REMOVAL_CHUNK is 3. Nodes hear the
master's time when they register and at random heartbeats, so some records carry a time older than their write.
Half the runs queue a put's SSD erases as a master process does (store/erasures.py) and send them only at random
later moments, so an erase lands after copy rounds, drains, removals, restarts and other puts: one that landed on a
record written after its extent was freed would turn that hit into a failed read."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import xxhash

from kvpool.store import queries
from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.master import Master
from kvpool.store.metadata import MemoryMetadata
from kvpool.store.migration import MigrateStatus
from kvpool.store.node import Drop, StorageNode
from kvpool.store.records import PutStatus
from kvpool.store.tenants import Quota
from kvpool.tiers.types import Tier
from tests.store.test_node_calls import K, Counted, Pool, chain_key, payload

NODES = {"n1": (10, 24), "n2": (8, 0), "n3": (0, 16)}     # DRAM objects, SSD objects (x K)
TENANTS = ("", "acme", "beta")
QUOTAS = {"acme": Quota(total_bytes=9 * K), "beta": Quota(dram_bytes=3 * K, total_bytes=14 * K)}
TTL = 10.0


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(queries, "REMOVAL_CHUNK", 3)


class Model:
    """A Pool, the stored keys ever put, and those an admin removed since (misses until put again)."""

    def __init__(self, tmp_path, rng: random.Random, write_behind: bool, erase_later: bool = False) -> None:
        self.rng = rng
        self.erase_later = erase_later
        self.meta = MemoryMetadata(persistent=True)
        self.cfg = dict(write_behind=write_behind, node_ttl_s=TTL, max_tombstones=rng.choice([5, 100_000]),
                        max_tenant_tombstones=rng.choice([3, 10_000]))
        self.pool = Pool(tmp_path, "m", [], batched=True, quotas=QUOTAS, metadata=self.meta, **self.cfg)
        self.keys: list[bytes] = []
        self.known: set[bytes] = set()
        self.removed: set[bytes] = set()
        self.held: list[tuple[int, str]] = []      # leases held across steps (lease id, tenant)
        self.depth = 0                              # > 0: inside a call (a removal's chunks): probes do not nest
        self.probes = 0
        self.most_hits = 0
        self.trace: list[str] = []                  # the steps so far (named in a failure)
        self.restored: set[bytes] = set()          # keys stored again during the current removal
        self.queued_erases = 0                      # the most SSD erases seen queued at once (erase_later)
        # the master's time once each key's last removal returned, and once the last evict of everything did: a
        # report may drop a record written before it (store/tombstones.py)
        self.purged: dict[bytes, int] = {}
        self.purged_all = 0
        for name, (dram, ssd) in NODES.items():
            self._start(name, NodeConfig(node_id=name, dram_bytes=dram * K, shm_dir=str(tmp_path / "m"),
                                         ssd_path=str(tmp_path / "m" / f"ssd-{name}") if ssd else None,
                                         ssd_bytes=ssd * 2 * K))
        self._hook()

    @property
    def master(self) -> Master:
        return self.pool.master

    def _hook(self) -> None:
        self.master.between_chunks = self._between_chunks
        if self.erase_later:
            self.master.erase_in_background()

    def _start(self, name: str, config: NodeConfig) -> None:
        """A node process (a new incarnation) registers and reports its SSD records."""
        self.trace.append(f"start {name}")
        node = StorageNode(config)
        self.pool.nodes[name], self.pool.ops[name] = node, Counted(node)
        self._register(name)

    def _register(self, name: str, *, again: bool = False) -> None:
        """As store/node_server.py registers, after its own start or a master's (`again`: the same process): with
        `reports_ssd` (nothing is placed on it until its report's last batch), then its SSD records reported, the
        dropped ones erased."""
        node = self.pool.nodes[name]
        info = dataclasses.replace(node.info(), reports_ssd=node.ssd is not None)
        self.master.register_node(info, self.pool.ops[name], expires=True)
        node.heard_master_time(self.master.time_us())        # the registration's reply carries it
        if node.ssd is not None:
            records = {r.key: r for r in node.scan_ssd()}
            result = self.master.report_objects(name, list(records.values()), last=True)
            where = self.master.inspect(result.dropped_keys)
            # a record is dropped only where its key is indexed at another place (put again while the node was away;
            # or a stale record: a master that died holding a lease on a promoted object's old extent never erased
            # it), or, from the same process registering again, where the master does not know its key (a stale
            # record too: a removal's erase lost with the master), or where it was written before a removal of its
            # key or the floor; the node erases it then (store/node_server.py)
            tombstones = self.master.tombstones
            assert all((r is None and (again or self._predates_removal(k, records[k].written_us,
                                                                      tombstones.floor_of(k)))) or
                       (r is not None and (r.node_id, r.tier, r.offset) != (name, Tier.SSD, records[k].offset))
                       for k, r in zip(result.dropped_keys, where)), \
                f"{name}'s report dropped {[k.hex() for k in result.dropped_keys]} after {self.trace[-6:]}"
            node.drop([Drop(k, Tier.SSD, records[k].offset, records[k].size) for k in result.dropped_keys])

    def _predates_removal(self, key: bytes, written_us: int, floor: int) -> bool:
        return written_us < max(self.purged.get(key, 0), self.purged_all, floor)

    def heartbeats(self) -> None:
        """Every node hears the master's time (its SSD records written from now on carry it)."""
        for node in self.pool.nodes.values():
            node.heard_master_time(self.master.time_us())

    # ---- checks

    def check(self) -> None:
        master = self.master
        master.index.check_invariants()
        where = master.inspect(self.keys)
        self.most_hits = max(self.most_hits, sum(r is not None for r in where))
        for key, r in zip(self.keys, where):
            if r is None:
                continue
            assert key not in self.removed, f"removed {key.hex()} is a hit again at {r} after {self.trace[-4:]}"
            out = bytearray(r.size)
            assert self.pool.nodes[r.node_id].read_into(r.tier, r.offset, key, r.size, out), key.hex()
            assert bytes(out) == payload(key, r.size).tobytes(), f"wrong bytes for {key.hex()} at {r}"
            self._check_copy(key, r)

    def _check_copy(self, key: bytes, r) -> None:
        """A DRAM object's copy that the master holds written (not dirty, no round writing it) is its record on the
        node's SSD: a demotion makes it the object without moving a byte."""
        master = self.master
        slot = master.index.find(key, -1)
        copies = master.placement.copies
        at = copies.offset(slot) if r.tier != Tier.SSD else None
        if at is None or key in copies.dirty or master.write_behind.copying(slot):
            return
        out = bytearray(r.size)
        assert self.pool.nodes[r.node_id].read_into(Tier.SSD, at, key, r.size, out), \
            f"{key.hex()}'s clean copy at {at} does not read after {self.trace[-6:]}"
        assert bytes(out) == payload(key, r.size).tobytes(), f"wrong bytes in {key.hex()}'s copy at {at}"

    def _between_chunks(self) -> None:
        """Another client's call while a removal lets the lock go."""
        self.probes += 1
        self.check()
        if self.depth > 1:
            return
        self.depth += 1
        try:
            self.rng.choice([self.put, self.lookup, self.remove_some, lambda: None])()
            self.check()
        finally:
            self.depth -= 1

    def _call(self, fn, *args, **kwargs):
        self.trace.append(fn.__name__)
        self.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            self.depth -= 1

    # ---- steps

    def put(self) -> None:
        self.trace.append("put")
        rng = self.rng
        tenant = rng.choice(TENANTS)
        chain = rng.randrange(10)
        ks = [chain_key(chain, i) for i in range(rng.choice([0, 0, rng.randrange(6)]), rng.randint(1, 12))]
        if not ks:
            return
        live = self.master.node_ids()
        prefer = rng.choice(live + [None]) if live else None
        master = self.master
        out = master.put_start(ks, [K] * len(ks), prefer_node=prefer, tenant=tenant)
        stored = self.pool.stored(ks, tenant)
        ids, sums = [], []
        for key, r in zip(stored, out):
            if key not in self.known:
                self.known.add(key)
                self.keys.append(key)
            if r.grant is not None:
                data = payload(key, K)
                loc = r.grant.location
                self.pool.nodes[loc.node_id].write(loc.tier, loc.offset, key, b"\0" * 16, data, None)
                ids.append(r.grant.grant_id)
                sums.append(xxhash.xxh3_64_intdigest(data))
        committed = master.put_commit(ids, sums, tenant=tenant)
        assert committed == [True] * len(ids)
        for key, r in zip(stored, out):
            if r.status == PutStatus.STORED:
                self.removed.discard(key)
                self.restored.add(key)
        exists = [key for key, r in zip(stored, out) if r.status == PutStatus.EXISTS]
        index = master.index
        misses = [(k.hex(), [int(c[index.find(k)]) if index.find(k, -1) >= 0 else None for c in
                             (index.state, index.node, index.tier, index.leases)])
                  for k, r in zip(exists, master.inspect(exists)) if r is None]
        assert not misses, f"EXISTS for a miss: {misses} of {[r.status.value for r in out]} tenant {tenant!r}"

    def lookup(self) -> None:
        rng = self.rng
        tenant = rng.choice(TENANTS)
        ks = [chain_key(rng.randrange(10), i) for i in range(rng.randint(1, 12))]
        result = self.master.lookup(ks, tenant=tenant)
        stored = self.pool.stored(ks, tenant)
        for key, loc in zip(stored, result.locations[:result.hits]):
            out = bytearray(loc.size)
            assert self.pool.nodes[loc.node_id].read_into(loc.tier, loc.offset, key, loc.size, out)
            assert bytes(out) == payload(key, loc.size).tobytes(), f"lookup of {key.hex()}: wrong bytes"
        if rng.random() < 0.3:
            self.held.append((result.lease_id, tenant))
        else:
            self.master.release([result.lease_id], tenant=tenant)

    def release_all(self) -> None:
        for lease, tenant in self.held:
            self.master.release([lease], tenant=tenant)
        self.held.clear()

    def remove_some(self) -> None:
        """An admin removes stored keys, or a tenant its own keys (some perhaps never put, or only on a node that is
        away)."""
        rng = self.rng
        tenant = rng.choice(TENANTS)
        if tenant:
            chain = rng.randrange(12)
            mine = [chain_key(chain, i) for i in range(rng.randrange(6), rng.randint(6, 12))]
            gone = self.pool.stored(mine, tenant)
        elif self.keys:
            gone = rng.sample(self.keys, min(len(self.keys), rng.randint(1, 6)))
        else:
            return
        # keys stored during this removal; one nested between two chunks of another keeps that one's too
        outer, self.restored = self.restored, set()
        if tenant:
            self._call(self.master.remove, mine, tenant=tenant)
        else:
            self._call(self.master.remove, gone)
        now = self.master.time_us()
        self.purged.update((k, now) for k in gone)
        # a miss now, unless a put between two chunks stored it again (before or after its own chunk)
        where = self.master.inspect(gone)
        assert all(r is None or k in self.restored for k, r in zip(gone, where))
        # what it removed stays removed, even a key that was a miss already (perhaps on a node that was leaving
        # and reports its SSD records again when it restarts)
        self.removed.update(k for k, r in zip(gone, where) if r is None)
        self.restored = outer | self.restored if self.depth else set()

    def evict_all(self) -> None:
        self._call(self.master.evict, b"", 0.0)     # every unleased object
        self.purged_all = self.master.time_us()
        # every miss now stays one until put again (a leased object was skipped; one put meanwhile is a hit)
        self.removed.update(k for k, r in zip(self.keys, self.master.inspect(self.keys)) if r is None)

    def remove_node(self) -> None:
        live = self.master.node_ids()
        if not live:
            return
        name = self.rng.choice(live)
        before = [k for k, r in zip(self.keys, self.master.inspect(self.keys)) if r is not None and r.node_id == name]
        self._call(self.master.remove_node, name)
        self._after_leaving(name, before)
        self.pool.nodes[name].close()
        self._start(name, self.pool.nodes[name].config)

    def restart_node(self) -> None:
        """A node process restarts: the new incarnation registers (its old objects leave), then reports."""
        name = self.rng.choice(list(self.pool.nodes))
        config = self.pool.nodes[name].config
        self.pool.nodes[name].close()
        self._call(self._start, name, config)

    def reap_silent_node(self) -> None:
        """Every node but one heartbeats; the clock passes node_ttl_s; the reaper drops the silent one."""
        live = self.master.node_ids()
        if len(live) < 2:
            return
        name = self.rng.choice(live)
        before = [k for k, r in zip(self.keys, self.master.inspect(self.keys)) if r is not None and r.node_id == name]
        self.pool.clock.now += TTL + 1
        for other in live:
            if other != name:
                assert self.master.heartbeat(other) is False
        self.held.clear()                   # their leases expired with the clock
        assert self._call(self.master.reap)["nodes"] == 1
        self._after_leaving(name, before)
        self.pool.nodes[name].close()
        self._start(name, self.pool.nodes[name].config)

    def drain_node(self) -> None:
        """begin_drain, every object moved as a client moves it, then the empty node removed and started again."""
        live = self.master.node_ids()
        if len(live) < 2:
            return
        name = self.rng.choice(live)
        master, nodes = self.master, self.pool.nodes
        master.begin_drain(name)
        cursor = 0
        for _ in range(50):
            result = master.migrate_next(name, cursor, limit=4)
            ids, sums = [], []
            for key, mv in zip(result.keys, result.moves):
                if mv.status != MigrateStatus.MOVING:
                    continue
                buf = np.zeros(mv.source.size, np.uint8)
                assert nodes[mv.source.node_id].read_into(mv.source.tier, mv.source.offset, key, mv.source.size,
                                                          buf)
                assert buf.tobytes() == payload(key, mv.source.size).tobytes(), f"drain source of {key.hex()}"
                nodes[mv.dest.node_id].write(mv.dest.tier, mv.dest.offset, key, mv.ns_digest, buf,
                                             xxhash.xxh3_64_intdigest(buf))
                ids.append(mv.move_id)
                sums.append(xxhash.xxh3_64_intdigest(buf))
            master.migrate_commit(ids, sums)
            self.check()
            cursor = result.next_cursor
            if not cursor:
                break
        before = [k for k, r in zip(self.keys, master.inspect(self.keys)) if r is not None and r.node_id == name]
        self._call(master.remove_node, name)
        self._after_leaving(name, before)
        nodes[name].close()
        self._start(name, nodes[name].config)

    def restart_master(self) -> None:
        """A new master on the journal; every node registers again with the same incarnation (they kept their
        memory) and reports its SSD records (the SSD copies of DRAM objects are known from those reports, not from
        the journal). Leases of the old master are gone with it."""
        self.held.clear()
        pool = self.pool
        pool.master = Master(MasterConfig(**self.cfg), self.meta, clock=pool.clock, token_secret=b"s" * 32,
                             quotas=QUOTAS)
        self._hook()
        for name in pool.nodes:
            self._register(name, again=True)

    def _after_leaving(self, name: str, held: list[bytes]) -> None:
        """A node's removal returned: nothing of it left to forget, and what it held is a miss unless put again
        (elsewhere) meanwhile."""
        master = self.master
        assert master.placement.leaving == 0
        assert master.stats()["leaving_objects"] == 0
        assert all(r is None or r.node_id != name for r in master.inspect(held))

    def copy_round(self) -> None:
        """A write-behind round (`copy_pending`); half the time other clients' calls run while its node call is out
        (the lock let go, as from other threads): their puts at the quotas may evict the objects being copied
        (store/quota.py), their removals remove them, and each such object leaves when the round ends."""
        self.trace.append("copy_round")
        rng = self.rng

        def during(moves) -> None:
            if self.depth:
                return
            self.depth += 1
            try:
                for _ in range(rng.randint(1, 3)):
                    rng.choice([self.put, self.put, self.lookup, self.remove_some])()
                    self.check()
            finally:
                self.depth -= 1

        ops = list(self.pool.ops.values()) if rng.random() < 0.5 else []
        for o in ops:
            o.on_demote = during
        try:
            self.master.copy_pending()
        finally:
            for o in ops:
                o.on_demote = None

    def _steps(self) -> list:
        """(cumulative probability, step): each step's share of the random steps."""
        return [(0.45, self.put), (0.62, self.lookup), (0.68, self.master.promote_pending),
                (0.74, self.copy_round), (0.80, self.remove_some), (0.83, self.evict_all),
                (0.87, self.remove_node), (0.91, self.restart_node), (0.94, self.reap_silent_node),
                (0.97, self.drain_node), (1.0, self.restart_master)]

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        next(step for bound, step in self._steps() if roll < bound)()
        if self.held and rng.random() < 0.3:
            self.release_all()
        if rng.random() < 0.5:
            self.heartbeats()
        if self.erase_later and rng.random() < 0.3:
            self.queued_erases = max(self.queued_erases, self.master.placement.erasures.pending())
            self.master.erase_pending()
        self.check()

    def close(self) -> None:
        self.pool.close()


@pytest.mark.parametrize("erase_later", [False, True])
@pytest.mark.parametrize("write_behind", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_every_hit_is_the_bytes_put_and_every_removed_key_a_miss(tmp_path, seed, write_behind, erase_later):
    tag = f"model-{seed}-{write_behind}" + ("-later" if erase_later else "")
    model = Model(tmp_path, random.Random(tag), write_behind, erase_later)
    try:
        for _ in range(250):
            model.step()
        model.release_all()
        model.check()
        assert model.probes > 20                    # removals ran in several chunks, with calls between them
        assert model.most_hits >= 10                # the pool held objects (it is evicted empty at times)
        hits = sum(r is not None for r in model.master.inspect(model.keys))
        assert model.master.stats()["objects"] == len(model.master.index) == hits
        if erase_later and write_behind:
            assert model.queued_erases >= 2         # erases did wait for a later step
    finally:
        model.close()
