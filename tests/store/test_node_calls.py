"""Node calls batched per locked operation (store/node_calls.py, Placement.batched_ops): a put on a full tier makes its
room with one Demote call per node carrying its drops (one Drop and one Demote call to a node from before
`move_drops`) instead of one per object, and ends exactly where the per-object
calls ended: the same objects on the same tiers at the same offsets, the same copies, the same counters, after every
step of random workloads (chains with shared prefixes, lookups that promote, leases held across puts, removals, the
inclusive SSD tier, several policies, a tiny SSD tier whose victims are objects demoted in the same batch) over real
StorageNodes, whose bytes are read back and compared; drains onto full nodes. A node that refuses moves loses exactly
those objects; one whose call raises loses what it was to move, and the put goes on."""

from __future__ import annotations

import contextlib
import dataclasses
import random

import numpy as np
import pytest
import xxhash

from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.index import COMMITTED
from kvpool.store.master import Master
from kvpool.store.migration import MigrateStatus
from kvpool.store.node import StorageNode
from kvpool.store.node_calls import Deferred
from kvpool.store.records import PutStatus
from kvpool.store.tenants import Quota
from kvpool.tiers.types import Tier
from tests.store.fakes import Clock

K = 4096


class Counted:
    """A real StorageNode whose Demote / Drop calls are counted, and the drops a Demote carried; `refuse(key)` True:
    that move is answered False without being made (a node whose write failed)."""

    def __init__(self, node: StorageNode, refuse=lambda key: False) -> None:
        self.node = node
        self.refuse = refuse
        self.demote_calls = 0
        self.drop_calls = 0
        self.moves = 0
        self.carried = 0            # drops that came inside Demote calls
        self.dropped = 0            # drops that came in Drop calls
        self.broken = False         # True: every Demote / Drop call raises (a node whose handler failed)
        self.on_drop = None         # called with the drops at the start of each Drop call
        self.per_call: list[int] = []   # moves of each Demote call, in order
        self.on_removed = None      # called with the keys at the start of each objects_removed call
        self.on_demote = None       # called with the moves at the start of each Demote call

    def demote(self, moves, drops=()):
        self.demote_calls += 1
        if self.on_demote is not None:
            self.on_demote(moves)
        if self.broken:
            raise RuntimeError("the node's handler failed")
        self.moves += len(moves)
        self.per_call.append(len(moves))
        self.carried += len(drops)
        keep = [m for m in moves if not self.refuse(m.key)]
        done = iter(self.node.demote(keep, drops))
        return [False if self.refuse(m.key) else next(done) for m in moves]

    def promote(self, moves):
        return self.node.promote(moves)

    def drop(self, drops):
        self.drop_calls += 1
        if self.on_drop is not None:
            self.on_drop(drops)
        if self.broken:
            raise RuntimeError("the node's handler failed")
        self.dropped += len(drops)
        return self.node.drop(drops)

    def objects_removed(self, keys=None):
        if self.on_removed is not None:
            self.on_removed(keys)
        self.node.objects_removed(keys)


def payload(key: bytes, size: int) -> np.ndarray:
    return np.frombuffer(np.random.default_rng(int.from_bytes(key[:8], "big")).bytes(size), np.uint8)


class Pool:
    """A master over real nodes (name, DRAM objects, SSD objects); `batched` False: every node call is made per
    object, as before batching."""

    def __init__(self, tmp_path, tag: str, nodes, *, batched: bool, refuse=lambda key: False, quotas=None,
                 metadata=None, **cfg) -> None:
        (tmp_path / tag).mkdir()
        self.clock = Clock()
        self.master = Master(MasterConfig(**cfg), metadata, clock=self.clock, token_secret=b"s" * 32, quotas=quotas)
        if not batched:
            self.master.placement.batched_ops = lambda **_: contextlib.nullcontext(Deferred())
        self.nodes: dict[str, StorageNode] = {}
        self.ops: dict[str, Counted] = {}
        for name, dram, ssd in nodes:
            node = StorageNode(NodeConfig(node_id=name, dram_bytes=dram * K, shm_dir=str(tmp_path / tag),
                                          ssd_path=str(tmp_path / tag / f"ssd-{name}") if ssd else None,
                                          ssd_bytes=ssd * 2 * K))
            self.nodes[name] = node
            self.ops[name] = Counted(node, refuse)
            self.master.register_node(node.info(), self.ops[name], expires=False)

    def put(self, keys: list[bytes], size: int = K, prefer: str | None = None, tenant: str = "") -> list[PutStatus]:
        """A client's put; the bytes are those of the stored key (`stored`), written under it as a client does."""
        out = self.master.put_start(keys, [size] * len(keys), prefer_node=prefer, tenant=tenant)
        ids, sums = [], []
        for r in out:
            if r.grant is not None:
                data = payload(r.grant.key, size)
                loc = r.grant.location
                self.nodes[loc.node_id].heard_master_time(self.master.time_us())     # as a heartbeat reply does
                self.nodes[loc.node_id].write(loc.tier, loc.offset, r.grant.key, b"\0" * 16, data, None)
                ids.append(r.grant.grant_id)
                sums.append(xxhash.xxh3_64_intdigest(data))
        assert self.master.put_commit(ids, sums, tenant=tenant) == [True] * len(ids)
        return [r.status for r in out]

    def stored(self, keys: list[bytes], tenant: str) -> list[bytes]:
        """The keys a tenant's objects are indexed (and inspected, and removed by an admin) under."""
        return list(self.master.tenants.stored_keys(self.master.tenants.intern(tenant), keys))

    def check_records(self) -> None:
        """Each node's SSD records are exactly the objects the index has on its SSD tier (write-behind off): no
        record of an object that left, none missing."""
        index = self.master.index
        for name, node in self.nodes.items():
            number = self.master.placement.node(name).number
            records = sorted((r.key, r.offset) for r in node.scan_ssd())
            indexed = sorted((index.key_at(slot), int(index.offset[slot])) for slot in index.slots()
                             if index.state[slot] == COMMITTED and index.node[slot] == number
                             and index.tier[slot] == Tier.SSD)
            assert records == indexed, name

    def state(self, keys: list[bytes]) -> list:
        index = self.master.index
        rows = []
        for k, r in zip(keys, self.master.inspect(keys)):
            slot = index.find(k, -1)
            rows.append(None if r is None else (r.node_id, r.tier.label, r.offset, r.size, int(index.copy[slot]),
                                                int(index.parent[slot]) < -1))
        stats = self.master.stats()
        return [rows, stats["evictions"], stats["demotions"], stats["promotions"], stats.get("tenants")]

    def check_bytes(self, keys: list[bytes]) -> int:
        """Every stored object's bytes, read from where the master says it is, are the bytes put. Returns how many."""
        n = 0
        for k, r in zip(keys, self.master.inspect(keys)):
            if r is None:
                continue
            out = bytearray(r.size)
            assert self.nodes[r.node_id].read_into(r.tier, r.offset, k, r.size, out), k.hex()
            assert bytes(out) == payload(k, r.size).tobytes(), k.hex()
            n += 1
        return n

    def calls(self) -> tuple[int, int, int]:
        return (sum(o.demote_calls for o in self.ops.values()), sum(o.drop_calls for o in self.ops.values()),
                sum(o.moves for o in self.ops.values()))

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()


def chain_key(chain: int, i: int) -> bytes:
    return chain.to_bytes(8, "big") + i.to_bytes(8, "big")


def workload(a: Pool, b: Pool, rng: random.Random, steps: int, sizes=(K,), tenants=("",)) -> list[bytes]:
    """The same random steps on both pools, compared after each one, each step by one of `tenants`. Returns every
    stored key used."""
    keys: list[bytes] = []
    held: list[tuple[Pool, int, str]] = []
    for step in range(steps):
        roll = rng.random()
        chain = rng.randrange(12)
        tenant = rng.choice(tenants)
        if roll < 0.6:      # a chain of KV blocks, often extending one put before (its prefix: EXISTS)
            length = rng.randint(1, 24)
            start = rng.choice([0, 0, rng.randrange(8)])
            ks = [chain_key(chain * 1000 + step // 40, i) for i in range(start, start + length)]
            size = rng.choice(sizes)
            keys.extend(k for k in a.stored(ks, tenant) if k not in keys)
            assert a.put(ks, size, tenant=tenant) == b.put(ks, size, tenant=tenant)
        elif roll < 0.8:    # a lookup: touches the hits (and queues the slow-tier ones for promotion)
            ks = [chain_key(chain * 1000 + rng.randrange(max(1, step // 40 + 1)), i) for i in range(rng.randint(1, 16))]
            ra, rb = a.master.lookup(ks, tenant=tenant), b.master.lookup(ks, tenant=tenant)
            assert (ra.hits, ra.tiers, ra.offsets) == (rb.hits, rb.tiers, rb.offsets)
            if rng.random() < 0.3:
                held.append((a, ra.lease_id, tenant))
                held.append((b, rb.lease_id, tenant))      # leased objects are skipped as victims until released
            else:
                a.master.release([ra.lease_id], tenant=tenant)
                b.master.release([rb.lease_id], tenant=tenant)
        elif roll < 0.88:
            assert a.master.promote_pending() == b.master.promote_pending()
        elif roll < 0.94:
            assert a.master.copy_pending() == b.master.copy_pending()
        elif keys:          # an admin's removal, by stored key
            gone = rng.sample(keys, min(len(keys), rng.randint(1, 6)))
            assert a.master.remove(gone) == b.master.remove(gone)
        if held and rng.random() < 0.3:
            for pool, lease, owner in held:
                pool.master.release([lease], tenant=owner)
            held.clear()
        assert a.state(keys) == b.state(keys), f"step {step}"
    for pool, lease, owner in held:
        pool.master.release([lease], tenant=owner)
    return keys


NODES = [("n1", 12, 20), ("n2", 8, 28)]


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "clru"])
@pytest.mark.parametrize("write_behind", [False, True])
def test_batched_calls_end_exactly_where_per_object_calls_end(tmp_path, policy, write_behind):
    a = Pool(tmp_path, "a", NODES, batched=True, policy=policy, write_behind=write_behind)
    b = Pool(tmp_path, "b", NODES, batched=False, policy=policy, write_behind=write_behind)
    try:
        keys = workload(a, b, random.Random(f"{policy}-{write_behind}"), 400)
        assert a.check_bytes(keys) == b.check_bytes(keys) > 0
        a.master.index.check_invariants()
        demotes_a, drops_a, moves_a = a.calls()
        demotes_b, drops_b, moves_b = b.calls()
        assert moves_a == moves_b > 0                       # the same bytes moved ...
        assert demotes_a < demotes_b and drops_a < drops_b  # ... in fewer calls
    finally:
        a.close()
        b.close()


QUOTAS = {"acme": Quota(total_bytes=10 * K), "beta": Quota(dram_bytes=4 * K, total_bytes=16 * K)}


@pytest.mark.parametrize("write_behind", [False, True])
def test_with_tenant_quotas_batched_calls_end_exactly_where_per_object_calls_end(tmp_path, write_behind):
    """Tenants over their total quota (own victims evicted) and DRAM quota (own victims demoted), a tenant without one
    (the free-room fast path) and the unscoped space, on full nodes: the same end state after every step."""
    a = Pool(tmp_path, "a", NODES, batched=True, quotas=QUOTAS, write_behind=write_behind)
    b = Pool(tmp_path, "b", NODES, batched=False, quotas=QUOTAS, write_behind=write_behind)
    try:
        keys = workload(a, b, random.Random(f"quotas-{write_behind}"), 400, tenants=("", "acme", "beta", "gamma"))
        assert a.check_bytes(keys) == b.check_bytes(keys) > 0
        a.master.index.check_invariants()
        tenants = a.master.stats()["tenants"]
        assert tenants["acme"]["quota_evictions"] > 0 and tenants["beta"]["quota_demotions"] > 0
        demotes_a, drops_a, moves_a = a.calls()
        demotes_b, drops_b, moves_b = b.calls()
        assert moves_a == moves_b > 0
        assert demotes_a < demotes_b and drops_a < drops_b
        if not write_behind:
            a.check_records()
            b.check_records()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("batched", [True, False])
def test_a_put_of_a_tenant_at_both_its_quotas_makes_one_demote_call(tmp_path, batched):
    """beta (DRAM quota 4 objects, total 8) holds 4 objects in DRAM and 4 on the SSD tier: each of its next 4 keys
    evicts its coldest SSD object and demotes its coldest DRAM one into that room. Batched: one Demote call carrying
    the 4 erases before its 4 moves; per object: 4 Drop and 4 Demote calls. The same end, every byte read back."""
    quotas = {"beta": Quota(dram_bytes=4 * K, total_bytes=8 * K)}
    a = Pool(tmp_path, "a", [("n1", 16, 16)], batched=batched, quotas=quotas, write_behind=False)
    try:
        for chain in range(2):
            assert a.put([chain_key(chain, i) for i in range(4)], tenant="beta") == [PutStatus.STORED] * 4
        keys = a.stored([chain_key(c, i) for c in range(3) for i in range(4)], "beta")
        assert [r.tier for r in a.master.inspect(keys[:8])] == [Tier.SSD] * 4 + [Tier.DRAM] * 4
        before, carried = a.calls(), a.ops["n1"].carried
        assert a.put([chain_key(2, i) for i in range(4)], tenant="beta") == [PutStatus.STORED] * 4
        demotes, drops, moves = (x - y for x, y in zip(a.calls(), before))
        assert (demotes, drops, moves, a.ops["n1"].carried - carried) == ((1, 0, 4, 4) if batched else (4, 4, 4, 0))
        assert [None if r is None else r.tier for r in a.master.inspect(keys)] == \
            [None] * 4 + [Tier.SSD] * 4 + [Tier.DRAM] * 4
        counters = a.master.stats()["tenants"]["beta"]
        assert (counters["quota_evictions"], counters["quota_demotions"]) == (4, 8)
        assert a.check_bytes(keys) == 8
        a.check_records()
        a.master.index.check_invariants()
    finally:
        a.close()


def test_a_quota_victim_that_the_same_put_moved_is_settled_before_it_is_evicted(tmp_path):
    """A put by acme (total quota 6 objects) on a full DRAM tier: its first 4 keys demote the pool's 4 coldest (beta's
    2, then acme's 2 oldest) to the SSD tier, queued; its 5th key is over the quota and acme's coldest is on the SSD
    tier now: an object whose move is still queued. That Demote call is sent first (4 moves), then the object is
    evicted; keys 5 and 6 land on the SSD tier (DRAM holds only this put's uncommitted objects), and the erases of
    acme's 2 evicted objects go in one Drop call when the put ends. No record is left of an object that left."""
    a = Pool(tmp_path, "a", [("n1", 4, 16)], batched=True, quotas={"acme": Quota(total_bytes=6 * K)},
             write_behind=False)
    try:
        assert a.put([chain_key(1, i) for i in range(2)], tenant="beta") == [PutStatus.STORED] * 2
        assert a.put([chain_key(2, i) for i in range(2)], tenant="acme") == [PutStatus.STORED] * 2
        before = a.calls()
        assert a.put([chain_key(3, i) for i in range(6)], tenant="acme") == [PutStatus.STORED] * 6
        a.check_records()
        demotes, drops, moves = (x - y for x, y in zip(a.calls(), before))
        assert (demotes, drops, moves, a.ops["n1"].carried) == (1, 1, 4, 0)
        beta = a.stored([chain_key(1, i) for i in range(2)], "beta")
        acme = a.stored([chain_key(c, i) for c in (2, 3) for i in ((0, 1) if c == 2 else range(6))], "acme")
        assert [None if r is None else r.tier for r in a.master.inspect(beta + acme)] == \
            [Tier.SSD] * 2 + [None] * 2 + [Tier.DRAM] * 4 + [Tier.SSD] * 2
        assert a.master.stats()["tenants"]["acme"]["quota_evictions"] == 2
        assert a.check_bytes(beta + acme) == 8
        a.master.index.check_invariants()
    finally:
        a.close()


def test_a_refused_move_of_a_quota_victim_evicts_it_once(tmp_path):
    """As above, with the node refusing the move of acme's oldest object: its answer, when the queue is sent, evicts
    it (a DRAM eviction), so acme is no longer over its quota at key 5 and loses only one more object (at key 6), as
    with per-object calls; the put's keys are all stored and the index stays consistent (evicting the refused object
    after the quota had evicted it would free a slot twice, or the slot a new key of this put has taken)."""
    tenants = Master(MasterConfig(), None, token_secret=b"s" * 32).tenants
    oldest = tenants.stored_keys(tenants.intern("acme"), [chain_key(2, 0)])[0]
    a = Pool(tmp_path, "a", [("n1", 4, 16)], batched=True, quotas={"acme": Quota(total_bytes=6 * K)},
             write_behind=False, refuse=lambda k: k == oldest)
    try:
        assert a.put([chain_key(1, i) for i in range(2)], tenant="beta") == [PutStatus.STORED] * 2
        assert a.put([chain_key(2, i) for i in range(2)], tenant="acme") == [PutStatus.STORED] * 2
        assert a.put([chain_key(3, i) for i in range(6)], tenant="acme") == [PutStatus.STORED] * 6
        a.master.index.check_invariants()
        a.check_records()
        beta = a.stored([chain_key(1, i) for i in range(2)], "beta")
        acme = a.stored([chain_key(c, i) for c in (2, 3) for i in ((0, 1) if c == 2 else range(6))], "acme")
        assert [None if r is None else r.tier for r in a.master.inspect(beta + acme)] == \
            [Tier.SSD] * 2 + [None] * 2 + [Tier.DRAM] * 4 + [Tier.SSD] * 2
        stats = a.master.stats()
        assert (stats["evictions"]["dram"], stats["tenants"]["acme"]["quota_evictions"]) == (1, 1)
        assert a.check_bytes(beta + acme) == 8
    finally:
        a.close()


def _grant_and_write(pool: Pool, keys: list[bytes]) -> list[int]:
    """put_start and the writes, not committed: the grant ids."""
    out = pool.master.put_start(keys, [K] * len(keys))
    for r in out:
        loc = r.grant.location
        pool.nodes[loc.node_id].write(loc.tier, loc.offset, r.grant.key, b"\0" * 16, payload(r.grant.key, K), None)
    return [r.grant.grant_id for r in out]


@pytest.mark.parametrize("how", ["remove", "abort", "late commit", "reap", "release"])
def test_objects_leaving_together_erase_their_ssd_records_in_one_drop_call(tmp_path, how):
    """16 objects with SSD records (their write-behind copies; for an abort, a late commit and a reap, the copies
    reserved for grants never committed) leave in one call to the master: removed, aborted, committed after their
    grant expired, reaped with it, or removed while leased and freed by the lease's release. Their 16 erases go in
    one Drop call (one per object before), and no record of them is left on the node."""
    a = Pool(tmp_path, "a", [("n1", 32, 64)], batched=True, grant_ttl_s=10.0)
    try:
        keys = [chain_key(1, i) for i in range(16)]
        if how in ("remove", "release"):
            assert a.put(keys) == [PutStatus.STORED] * 16
            assert a.master.copy_pending() == 16
            assert sorted(r.key for r in a.nodes["n1"].scan_ssd()) == sorted(keys)
        else:
            grants = _grant_and_write(a, keys)
        before = a.ops["n1"].drop_calls, a.ops["n1"].dropped
        if how == "remove":
            assert a.master.remove(keys) == 16
        elif how == "abort":
            assert a.master.put_abort(grants) == 16
        elif how == "late commit":
            a.clock.now += 11.0
            assert a.master.put_commit(grants, [0] * 16) == [False] * 16
        elif how == "reap":
            a.clock.now += 11.0
            assert a.master.reap()["grants"] == 16
        else:
            lease = a.master.lookup(keys).lease_id
            assert a.master.remove(keys) == 16     # leased: unlinked now, freed at the release
            assert (a.ops["n1"].drop_calls, a.ops["n1"].dropped) == before
            assert a.master.release([lease]) == 1
        assert (a.ops["n1"].drop_calls - before[0], a.ops["n1"].dropped - before[1]) == (1, 16)
        assert a.nodes["n1"].scan_ssd() == []
        assert a.master.inspect(keys) == [None] * 16
        a.master.index.check_invariants()
    finally:
        a.close()


def test_mixed_sizes_and_a_tiny_ssd_tier_whose_victims_were_demoted_in_the_same_batch(tmp_path):
    """SSD tiers of a few objects: a put of 24 pushes objects it demoted out of the SSD tier again, so the batch is
    sent before each of them is touched (the order a per-object call had); sizes of 1-3 pages leave holes."""
    nodes = [("n1", 6, 5), ("n2", 4, 3)]
    a = Pool(tmp_path, "a", nodes, batched=True)
    b = Pool(tmp_path, "b", nodes, batched=False)
    try:
        keys = workload(a, b, random.Random(3), 300, sizes=(K, K, 2 * K, 3 * K - 100))
        assert a.check_bytes(keys) == b.check_bytes(keys) > 0
        a.master.index.check_invariants()
        assert a.calls()[2] == b.calls()[2] > 0
        assert a.calls()[0] < b.calls()[0]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("move_drops", [True, False])
def test_a_put_on_a_full_pool_makes_one_demote_call_carrying_its_drops(tmp_path, move_drops):
    """One Demote call that erases the 8 SSD victims' records before its 8 moves; a node from before `move_drops`
    gets a Drop call first and a Demote, and the pool ends the same."""
    a = Pool(tmp_path, "a", [("n1", 8, 16)], batched=True, write_behind=False)
    try:
        if not move_drops:      # registered again as a node that does not say it (same incarnation: nothing lost)
            a.master.register_node(dataclasses.replace(a.nodes["n1"].info(), move_drops=False), a.ops["n1"],
                                   expires=False)
        for chain in range(3):          # 24 objects: DRAM (8) and SSD (16) full
            assert a.put([chain_key(chain, i) for i in range(8)]) == [PutStatus.STORED] * 8
        before = a.calls(), a.ops["n1"].carried
        assert a.put([chain_key(9, i) for i in range(8)]) == [PutStatus.STORED] * 8
        demotes, drops, moves = (x - y for x, y in zip(a.calls(), before[0]))
        carried = a.ops["n1"].carried - before[1]
        # per object: 8 Demote and 8 Drop calls
        assert (demotes, drops, moves, carried) == ((1, 0, 8, 8) if move_drops else (1, 1, 8, 0))
        stats = a.master.stats()
        assert stats["evictions"]["ssd"] == 8 and stats["demotions"] == 24
        # the oldest chain left the SSD tier, the next one moved down, the new one is in DRAM
        keys = [chain_key(c, i) for c in (0, 1, 2, 9) for i in range(8)]
        tiers = [None if r is None else r.tier for r in a.master.inspect(keys)]
        assert tiers == [None] * 8 + [Tier.SSD] * 16 + [Tier.DRAM] * 8
        assert a.check_bytes(keys) == 24
    finally:
        a.close()


def test_a_refused_move_evicts_that_object_and_no_other(tmp_path):
    """The node answers False for the moves of two keys (its write failed): those objects are evicted when the
    answers come, as a refused per-object move was; every other object moved, and every byte still stored is the
    byte put."""
    refused = {chain_key(1, 2), chain_key(1, 5)}
    a = Pool(tmp_path, "a", [("n1", 8, 32)], batched=True, refuse=refused.__contains__, write_behind=False)
    try:
        for chain in range(3):
            assert a.put([chain_key(chain, i) for i in range(8)]) == [PutStatus.STORED] * 8
        keys = [chain_key(c, i) for c in range(3) for i in range(8)]
        stored = [k for k, r in zip(keys, a.master.inspect(keys)) if r is not None]
        assert stored == [k for k in keys if k not in refused]
        stats = a.master.stats()
        assert stats["evictions"]["dram"] == 2 and stats["demotions"] == 14
        assert a.check_bytes(keys) == 22
        a.master.index.check_invariants()
        # the freed extents are used again: the next put finds its room without losing anything more
        assert a.put([chain_key(7, i) for i in range(8)]) == [PutStatus.STORED] * 8
        assert a.check_bytes(keys + [chain_key(7, i) for i in range(8)]) == 30
    finally:
        a.close()


def test_refused_moves_of_objects_demoted_in_the_same_batch_leave_a_consistent_index(tmp_path):
    """A tiny SSD tier whose victims are objects demoted earlier in the same put, and a node refusing one move in
    five: the batch is sent (and its refusals evict their objects) before such a victim is touched again, so an
    object is never evicted twice and never indexed where its bytes are not."""
    refuse = lambda k: k[-1] % 5 == 0    # noqa: E731
    a = Pool(tmp_path, "a", [("n1", 6, 5), ("n2", 4, 3)], batched=True, refuse=refuse)
    rng = random.Random(11)
    keys: list[bytes] = []
    try:
        for step in range(200):
            chain = rng.randrange(6)
            if rng.random() < 0.75:
                ks = [chain_key(chain * 1000 + step // 30, i) for i in range(rng.randint(1, 24))]
                keys.extend(k for k in ks if k not in keys)
                a.put(ks, rng.choice((K, 2 * K)))
            else:
                res = a.master.lookup([chain_key(chain * 1000 + step // 30, i) for i in range(8)])
                a.master.release([res.lease_id])
                a.master.promote_pending()
            a.master.index.check_invariants()
            a.check_bytes(keys)
        stats = a.master.stats()
        assert stats["evictions"]["dram"] > 0 and stats["demotions"] > 0     # refusals and moves both happened
    finally:
        a.close()


def test_a_drain_onto_a_full_node_makes_its_room_in_one_call_per_kind(tmp_path):
    """migrate_start of 8 objects onto a node whose DRAM and SSD tiers are full: one Demote call to it, its drops inside,
    the same destinations and the same evictions as the per-object calls, and the moved bytes read back."""
    pools = [Pool(tmp_path, tag, [("n1", 8, 0), ("n2", 8, 16)], batched=batched, write_behind=False)
             for tag, batched in (("a", True), ("b", False))]
    try:
        results = []
        for pool in pools:
            # chain 0 fills n1 (DRAM only); chains 1-3 fill n2: 3 in its DRAM, 1 and 2 on its SSD
            assert pool.put([chain_key(0, i) for i in range(8)], prefer="n1") == [PutStatus.STORED] * 8
            for chain in (1, 2, 3):
                assert pool.put([chain_key(chain, i) for i in range(8)], prefer="n2") == [PutStatus.STORED] * 8
            assert [r.node_id for r in pool.master.inspect([chain_key(0, i) for i in range(8)])] == ["n1"] * 8
            assert pool.master.begin_drain("n1") == (8, 0)
            before = pool.ops["n2"].demote_calls, pool.ops["n2"].drop_calls
            res = pool.master.migrate_start([chain_key(0, i) for i in range(8)])
            calls = pool.ops["n2"].demote_calls - before[0], pool.ops["n2"].drop_calls - before[1]
            assert [m.status for m in res.moves] == [MigrateStatus.MOVING] * 8
            for i, mv in enumerate(res.moves):      # what the draining client does: read the source, write the dest
                buf = bytearray(mv.source.size)
                assert pool.nodes["n1"].read_into(mv.source.tier, mv.source.offset, chain_key(0, i), K, buf)
                pool.nodes["n2"].write(mv.dest.tier, mv.dest.offset, chain_key(0, i), mv.ns_digest, buf, None)
            sums = [xxhash.xxh3_64_intdigest(payload(chain_key(0, i), K)) for i in range(8)]
            assert pool.master.migrate_commit([m.move_id for m in res.moves], sums) == [True] * 8
            keys = [chain_key(c, i) for c in range(4) for i in range(8)]
            results.append((calls, [(m.dest.tier, m.dest.offset) for m in res.moves], pool.state(keys)))
            assert pool.check_bytes(keys) == 24     # chain 1 evicted; 0 in n2's DRAM, 2 and 3 on its SSD
            assert [None if r is None else (r.node_id, r.tier) for r in pool.master.inspect(keys)] == \
                [("n2", Tier.DRAM)] * 8 + [None] * 8 + [("n2", Tier.SSD)] * 16
            pool.master.index.check_invariants()
        assert results[0][0] == (1, 0) and results[1][0] == (8, 8)     # batched: the drops inside the Demote
        assert results[0][1:] == results[1][1:]
    finally:
        for pool in pools:
            pool.close()


def test_a_node_call_that_raises_evicts_what_it_was_to_move_and_the_put_goes_on(tmp_path):
    a = Pool(tmp_path, "a", [("n1", 8, 8)], batched=True, write_behind=False)
    try:
        for chain in range(2):          # chain 0 on the SSD tier, chain 1 in DRAM: both tiers full
            assert a.put([chain_key(chain, i) for i in range(8)]) == [PutStatus.STORED] * 8
        a.ops["n1"].broken = True
        assert a.put([chain_key(2, i) for i in range(8)]) == [PutStatus.STORED] * 8
        keys = [chain_key(c, i) for c in range(3) for i in range(8)]
        # chain 0 evicted from the SSD tier for room (its erase failed: logged), chain 1 evicted from DRAM since it
        # could not move down; the new chain in DRAM
        assert [None if r is None else r.tier for r in a.master.inspect(keys)] == [None] * 16 + [Tier.DRAM] * 8
        assert a.master.stats()["evictions"] == {"dram": 8, "ssd": 8}
        a.ops["n1"].broken = False
        assert a.check_bytes(keys) == 8
        assert a.put([chain_key(3, i) for i in range(8)]) == [PutStatus.STORED] * 8     # and the pool goes on
        assert a.check_bytes(keys + [chain_key(3, i) for i in range(8)]) == 16
        a.master.index.check_invariants()
    finally:
        a.close()
