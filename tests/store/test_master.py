"""store/master.py against a real StorageNode (tiny /dev/shm-style arena in tmp_path, real SSD file) and a fake
clock: grants, leases, expiry, removal while leased, pinning, node liveness, reload from a persistent backend."""

import dataclasses

import numpy as np
import pytest
import xxhash

from kvpool.store import queries, tokens
from kvpool.store.config import MasterConfig, NodeConfig
from kvpool.store.master import BatchTooLarge, Master, SizeMismatch
from kvpool.store.metadata import MemoryMetadata
from kvpool.store.node import StorageNode
from kvpool.store.records import NsRef, ObjectRecord, PutStatus
from kvpool.tiers.types import Tier
from tests.store.fakes import Clock, key  # noqa: F401 - Clock is used by fixtures

OBJ = 4096


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def make(tmp_path, clock):
    made = []

    def _make(dram_objects=3, ssd_objects=0, metadata=None, node_id="n1", **cfg):
        node = StorageNode(NodeConfig(node_id=node_id, dram_bytes=dram_objects * OBJ, shm_dir=str(tmp_path),
                                      ssd_path=str(tmp_path / f"ssd-{node_id}") if ssd_objects else None,
                                      ssd_bytes=ssd_objects * 2 * OBJ))
        master = Master(MasterConfig(**cfg), metadata, clock=clock)
        master.register_node(node.info(), node, expires=False)
        made.append(node)
        return master, node

    yield _make
    for node in made:
        node.close()


def put(master, node, keys, fill=None):
    """put_start + write + commit, like a client does. Returns statuses."""
    results = master.put_start(keys, [OBJ] * len(keys))
    ids, sums = [], []
    for k, r in zip(keys, results):
        if r.grant is not None:
            data = np.full(OBJ, k[0] if fill is None else fill, np.uint8)
            node.write(r.grant.location.tier, r.grant.location.offset, k, b"\0" * 16, data,
                       xxhash.xxh3_64_intdigest(data))
            ids.append(r.grant.grant_id)
            sums.append(xxhash.xxh3_64_intdigest(data))
    master.put_commit(ids, sums)
    return [r.status for r in results]


def tiers(master, keys):
    return [None if r is None else r.tier.label for r in master.inspect(keys)]


def test_pending_objects_are_invisible_and_never_evicted(make):
    master, node = make(dram_objects=2)
    started = master.put_start([key(1), key(2)], [OBJ, OBJ])
    assert [r.status for r in started] == [PutStatus.STORED, PutStatus.STORED]
    assert master.lookup([key(1)]).hits == 0 and master.contains([key(1)]) == [False]
    # DRAM is full of uncommitted objects and there is no SSD: the third key gets NO_SPACE, nothing else changes.
    assert [r.status for r in master.put_start([key(3), key(1)], [OBJ, OBJ])] == [PutStatus.NO_SPACE,
                                                                                 PutStatus.EXISTS]
    assert master.put_commit([r.grant.grant_id for r in started], [7, 8]) == [True, True]
    res = master.lookup([key(1), key(2)])
    assert res.hits == 2 and res.checksums == [7, 8] and [loc.offset for loc in res.locations] == [0, OBJ]
    master.release([res.lease_id])
    master.index.check_invariants()


def test_leased_objects_are_never_evicted(make):
    master, node = make(dram_objects=2)
    put(master, node, [key(1), key(2)])
    lease = master.lookup([key(1), key(2)]).lease_id
    assert put(master, node, [key(3)]) == [PutStatus.NO_SPACE]
    master.release([lease])
    assert put(master, node, [key(3)]) == [PutStatus.STORED]
    # insert_chain([1, 2]) then the lookup touched the chain: tail 2 is colder than parent 1.
    assert tiers(master, [key(1), key(2), key(3)]) == ["dram", None, "dram"]
    assert master.stats()["evictions"] == {"dram": 1, "ssd": 0}


def test_grant_expiry_frees_space_and_commit_reports_it(make, clock):
    master, node = make(dram_objects=1, grant_ttl_s=5.0)
    grant = master.put_start([key(1)], [OBJ])[0].grant
    clock.now += 4.9
    assert master.reap() == {"grants": 0, "leases": 0, "nodes": 0}
    clock.now += 0.2
    assert master.reap()["grants"] == 1
    assert master.put_commit([grant.grant_id], [0]) == [False]
    assert master.contains([key(1)]) == [False] and master.stats()["tiers"]["dram"]["objects"] == 0
    assert put(master, node, [key(1)]) == [PutStatus.STORED]


def test_abort_frees(make):
    master, node = make(dram_objects=1)
    grant = master.put_start([key(1)], [OBJ])[0].grant
    assert master.put_abort([grant.grant_id, 12345]) == 1
    assert master.stats()["tiers"]["dram"]["bytes"] == 0 and master.stats()["grants_open"] == 0


def test_lease_expiry(make, clock):
    master, node = make(dram_objects=1, lease_ttl_s=2.0)
    put(master, node, [key(1)])
    lease = master.lookup([key(1)]).lease_id
    clock.now += 2.0
    assert put(master, node, [key(2)]) == [PutStatus.STORED]  # the put's own reap expired the lease first
    assert master.release([lease]) == 0 and tiers(master, [key(1), key(2)]) == [None, "dram"]


def test_remove_while_leased_frees_on_release(make):
    master, node = make(dram_objects=2)
    put(master, node, [key(1)])
    lease = master.lookup([key(1)]).lease_id
    assert master.remove([key(1), key(9)]) == 1
    assert master.contains([key(1)]) == [False] and master.lookup([key(1)]).hits == 0
    assert master.stats()["tiers"]["dram"]["bytes"] == OBJ  # the reader still owns the extent
    # A new put of the same key while the old bytes are being read lands elsewhere.
    assert put(master, node, [key(1)], fill=42) == [PutStatus.STORED]
    assert master.inspect([key(1)])[0].offset == OBJ
    assert master.release([lease]) == 1
    assert master.stats()["tiers"]["dram"]["bytes"] == OBJ
    master.index.check_invariants()


def test_expect_sizes_mismatch_changes_nothing(make):
    master, node = make(dram_objects=2)
    put(master, node, [key(1), key(2)])
    before = master.stats()
    with pytest.raises(SizeMismatch, match=r"expect_sizes\[1\] is 100 bytes, object has 4096"):
        master.lookup([key(1), key(2)], expect_sizes=[OBJ, 100])
    assert master.stats() == before


def test_bad_arguments_name_the_field(make):
    master, node = make(dram_objects=2, max_object_bytes=OBJ, max_batch_keys=4)
    before = master.stats()
    with pytest.raises(ValueError, match=r"keys\[1\] must be a 16-byte key, got 3"):
        master.put_start([key(1), b"abc"], [OBJ, OBJ])
    with pytest.raises(ValueError, match=r"sizes\[0\] must be an int in \[1, max_object_bytes=4096\], got 4097"):
        master.put_start([key(1)], [OBJ + 1])
    with pytest.raises(ValueError, match="sizes has 2 entries, keys has 1"):
        master.put_start([key(1)], [OBJ, OBJ])
    with pytest.raises(BatchTooLarge, match="keys: batch of 5 exceeds max_batch_keys=4"):
        master.lookup([key(i) for i in range(5)])
    with pytest.raises(ValueError, match="namespace must be a 16-byte namespace digest"):
        master.put_start([key(1)], [OBJ], NsRef(digest=b"short"))
    with pytest.raises(ValueError, match="checksums has 0 entries, grant_ids has 1"):
        master.put_commit([1], [])
    assert master.stats() == before and len(master.index) == 0


def test_tokens_sign_grants_and_leases(tmp_path, clock):
    node = StorageNode(NodeConfig(node_id="n", dram_bytes=OBJ, shm_dir=str(tmp_path)))
    try:
        master = Master(MasterConfig(), clock=clock, token_secret=b"s" * 32)
        secret = b"s" * 32          # a node that does not say `write_keys`: writes too are signed with the secret
        assert master.register(node.info(), node, expires=False).write_key == b""
        grant = master.put_start([key(1)], [OBJ])[0].grant
        loc = grant.location
        tokens.verify(secret, tokens.WRITE, grant.grant_id, loc.tier, loc.offset, loc.size,
                      int(grant.expires_at * 1000), grant.token, now=int(clock.now * 1000))
        master.put_commit([grant.grant_id], [0])
        res = master.lookup([key(1)])
        tokens.verify(secret, tokens.READ, res.lease_id, Tier.DRAM, 0, OBJ, int(res.expires_at * 1000),
                      res.tokens[0], now=int(clock.now * 1000))
        # The same token does not cover a stretched extent, nor a write, nor another secret.
        with pytest.raises(tokens.TokenError, match="does not match"):
            tokens.verify(secret, tokens.READ, res.lease_id, Tier.DRAM, 0, OBJ + 1, int(res.expires_at * 1000),
                          res.tokens[0], now=int(clock.now * 1000))
        with pytest.raises(tokens.TokenError, match="does not match"):
            tokens.verify(secret, tokens.WRITE, res.lease_id, Tier.DRAM, 0, OBJ, int(res.expires_at * 1000),
                          res.tokens[0], now=int(clock.now * 1000))
        with pytest.raises(tokens.TokenError, match="does not match"):
            tokens.verify(b"t" * 32, tokens.READ, res.lease_id, Tier.DRAM, 0, OBJ, int(res.expires_at * 1000),
                          res.tokens[0], now=int(clock.now * 1000))
    finally:
        node.close()


def test_write_keys_are_new_for_each_registration_the_master_starts_afresh(tmp_path, clock):
    """A node that says `write_keys` gets a key of its registration's, and its write grants are signed with it: kept
    while the master that gave it still tracks the node (it registers again as the same process: its grants stay
    good), new for a restarted node process and for a new master process on the same metadata and secret (Redis), so
    a grant from before verifies at neither. Another node gets a key of its own; read tokens stay the secret's."""
    config = NodeConfig(node_id="n", dram_bytes=4 * OBJ, shm_dir=str(tmp_path))
    meta = MemoryMetadata()
    node, other = StorageNode(config), StorageNode(dataclasses.replace(config, node_id="m"))
    restarted = None

    def info(n: StorageNode):
        return dataclasses.replace(n.info(), write_keys=True)

    try:
        master = Master(MasterConfig(), meta, clock=clock, token_secret=b"s" * 32)
        first = master.register(info(node), node).write_key
        assert len(first) == 32 and first != b"s" * 32
        assert master.register(info(other), other).write_key not in (first, b"")
        grant = master.put_start([key(1)], [OBJ], prefer_node="n")[0].grant
        loc = grant.location
        assert loc.node_id == "n"

        def good(secret: bytes) -> bool:
            try:
                tokens.verify(secret, tokens.WRITE, grant.grant_id, loc.tier, loc.offset, loc.size,
                              int(grant.expires_at * 1000), grant.token, now=int(clock.now * 1000))
            except tokens.TokenError:
                return False
            return True

        assert good(first) and not good(b"s" * 32)
        master.put_commit([grant.grant_id], [0])
        res = master.lookup([key(1)])                       # a read token: the secret's
        tokens.verify(b"s" * 32, tokens.READ, res.lease_id, loc.tier, loc.offset, loc.size, int(res.expires_at * 1000),
                      res.tokens[0], now=int(clock.now * 1000))
        again = master.register(info(node), node)           # the same process registers again
        assert again.write_key == first
        restarted_master = Master(MasterConfig(), meta, clock=clock, token_secret=b"s" * 32)
        later = restarted_master.register(info(node), node).write_key
        assert later not in (first, b"") and not good(later)
        node.close()
        node, restarted = None, StorageNode(config)         # a new process of node "n"
        fresh = master.register(info(restarted), restarted).write_key
        assert fresh not in (first, later, b"") and not good(fresh)
        # no secret: nothing is signed, and a node is handed no key
        assert Master(MasterConfig(), clock=clock).register(info(other), other).write_key == b""
    finally:
        for n in (node, other, restarted):
            if n is not None:
                n.close()


def test_tokens_are_signed_while_other_calls_go_on(tmp_path, clock):
    """put_start's write tokens and a lookup's read tokens are signed after the master's lock: while each HMAC is
    computed, another thread's call is answered. Under the lock, that call would wait out the join (and the test
    fail on `answered`)."""
    import threading

    node = StorageNode(NodeConfig(node_id="n", dram_bytes=4 * OBJ, shm_dir=str(tmp_path)))
    try:
        master = Master(MasterConfig(), clock=clock, token_secret=b"s" * 32)
        secret = master.register(dataclasses.replace(node.info(), write_keys=True), node, expires=False).write_key
        signed, answered = [], []
        real = master.leases.sign

        def sign(node_key, kind, *fields):
            probe = threading.Thread(target=lambda: answered.append(master.contains([key(9)])), daemon=True)
            probe.start()
            probe.join(10)
            signed.append(kind)
            return real(node_key, kind, *fields)

        master.leases.sign = sign
        grants = [r.grant for r in master.put_start([key(1), key(2)], [OBJ, OBJ])]
        master.put_commit([g.grant_id for g in grants], [0, 0])
        res = master.lookup([key(1), key(2)])       # no mapped nodes: every hit gets a read token
        assert signed == [tokens.WRITE] * 2 + [tokens.READ] * 2
        assert answered == [[False]] * 4
        for g in grants:
            loc = g.location
            tokens.verify(secret, tokens.WRITE, g.grant_id, loc.tier, loc.offset, loc.size,
                          int(g.expires_at * 1000), g.token, now=int(clock.now * 1000))
        for i, t in enumerate(res.tokens):
            tokens.verify(b"s" * 32, tokens.READ, res.lease_id, Tier.DRAM, res.offsets[i], OBJ,
                          int(res.expires_at * 1000), t, now=int(clock.now * 1000))
    finally:
        node.close()


def test_token_counting_by_namespace_and_tier(make):
    master, node = make(dram_objects=2)
    put(master, node, [key(1)])
    ns = NsRef(digest=b"d" * 16, label="m/t", block_tokens=16)
    master.lookup([key(1), key(2), key(3)], ns, lease=False)
    s = master.stats()
    assert (s["requested_tokens"], s["hit_tokens"], s["hit_tokens_by_tier"]["dram"]) == (48, 16, 16)
    assert s["namespaces"] == {"m/t": {"requested_tokens": 48, "hit_tokens": 16,
                                       "hit_tokens_by_tier": {"hbm": 0, "dram": 16, "ssd": 0},
                                       "prefill_seconds_saved": 0.0}}
    assert (s["requested_keys"], s["hit_keys"], s["miss_keys"]) == (3, 1, 2)


def test_ssd_hit_promoted_on_lookup_counts_under_ssd(make):
    master, node = make(dram_objects=1, ssd_objects=2)          # promote_on_hit defaults to True
    put(master, node, [key(1)])
    put(master, node, [key(2)])                                 # demotes key 1 to SSD
    assert tiers(master, [key(1), key(2)]) == ["ssd", "dram"]
    ns = NsRef(digest=b"d" * 16, label="m/t", block_tokens=16)
    result = master.lookup([key(1)], ns)
    # The reply says where the object is now; the promotion happens after the lookup, outside the master lock.
    assert result.hits == 1 and result.locations[0].tier is Tier.SSD
    assert tiers(master, [key(1), key(2)]) == ["ssd", "dram"] and master.promotions.pending == 1
    assert master.promote_pending() == 1
    assert tiers(master, [key(1), key(2)]) == ["dram", "ssd"]           # promoted; key 2 demoted for room
    s = master.stats()
    assert (s["hit_tokens_by_tier"], s["hit_keys_by_tier"]) == ({"hbm": 0, "dram": 0, "ssd": 16},
                                                                {"hbm": 0, "dram": 0, "ssd": 1})
    assert s["namespaces"]["m/t"]["hit_tokens_by_tier"] == {"hbm": 0, "dram": 0, "ssd": 16}
    assert s["promotions"] == 1
    master.release([result.lease_id])


def test_silent_node_is_dropped_and_its_objects_become_misses(tmp_path, clock):
    node = StorageNode(NodeConfig(node_id="n", dram_bytes=2 * OBJ, shm_dir=str(tmp_path)))
    try:
        master = Master(MasterConfig(node_ttl_s=10.0), clock=clock)
        epoch = master.register_node(node.info(), node)
        put(master, node, [key(1)])
        clock.now += 9
        assert master.heartbeat("n", epoch) is False
        clock.now += 9
        assert master.reap()["nodes"] == 0
        clock.now += 1.5
        assert master.reap()["nodes"] == 1
        assert master.contains([key(1)]) == [False] and master.heartbeat("n", epoch) is True
        assert put(master, node, [key(2)]) == [PutStatus.NO_SPACE]  # no node left
    finally:
        node.close()


def test_heartbeat_stamped_answers_both_fields_of_the_reply(tmp_path, clock):
    node = StorageNode(NodeConfig(node_id="n", dram_bytes=2 * OBJ, shm_dir=str(tmp_path)))
    try:
        master = Master(MasterConfig(node_ttl_s=10.0), clock=clock)
        assert master.heartbeat_stamped("n")[0] is True         # unknown: register first
        epoch = master.register_node(node.info(), node)
        before = master.time_us()
        reregister, stamp = master.heartbeat_stamped("n", epoch)
        assert reregister is False and stamp > before and master.time_us() > stamp    # strictly increasing
        assert master.heartbeat_stamped("n", epoch + 1)[0] is True                    # a stale epoch
        master.remove([key(9)])
        # a record stamped before the removal is refused at adoption, one stamped with the next reply's time is not
        assert master.tombstones.refuses(key(9), b"", stamp) is True
        assert master.tombstones.refuses(key(9), b"", master.heartbeat_stamped("n", epoch)[1]) is False
    finally:
        node.close()


def test_report_objects_adopts_known_and_drops_conflicts(make):
    master, node = make(dram_objects=1, ssd_objects=3, write_behind=False)  # no SSD copy of key 1 in the way
    put(master, node, [key(1)])
    known = master.inspect([key(1)])[0]
    records = [known,
               ObjectRecord(key(2), b"\0" * 16, "n1", Tier.SSD, 0, OBJ, 5),
               ObjectRecord(key(3), b"\0" * 16, "n1", Tier.SSD, 2 * OBJ, OBJ, 6),
               ObjectRecord(key(2), b"\0" * 16, "n1", Tier.SSD, 4 * OBJ, OBJ, 5),   # duplicate key
               ObjectRecord(key(4), b"\0" * 16, "n1", Tier.SSD, OBJ, OBJ, 7)]       # overlaps key 2
    result = master.report_objects("n1", records)
    assert (result.adopted, result.known, result.dropped_keys) == (2, 1, [key(2), key(4)])
    assert tiers(master, [key(2), key(3), key(4)]) == ["ssd", "ssd", None]
    with pytest.raises(KeyError, match="node_id 'zz' is not registered"):
        master.report_objects("zz", [])


def test_persistent_backend_reload(tmp_path, clock):
    meta = MemoryMetadata(persistent=True)
    node = StorageNode(NodeConfig(node_id="n", dram_bytes=3 * OBJ, shm_dir=str(tmp_path)))
    try:
        m1 = Master(MasterConfig(), meta, clock=clock)
        m1.register_node(node.info(), node)
        put(m1, node, [key(1), key(2)])
        m1.remove([key(2)])
        assert sorted(r.key for r in meta.load_objects()) == [key(1)]
        # A new master (restart / standby) reloads; the node re-registers with the same incarnation: data kept.
        m2 = Master(MasterConfig(), meta, clock=clock)
        assert m2.heartbeat("n") is True
        m2.register_node(node.info(), node)
        res = m2.lookup([key(1)])
        assert res.hits == 1 and res.locations[0].offset == m1.inspect([key(1)])[0].offset
        assert put(m2, node, [key(3)]) == [PutStatus.STORED]
        assert m2.inspect([key(3)])[0].offset not in (m1.inspect([key(1)])[0].offset,)
        # A restarted node (new incarnation) loses what it held.
        node.incarnation = "new"
        m2.register_node(node.info(), node)
        assert m2.contains([key(1), key(3)]) == [False, False] and meta.load_objects() == []
    finally:
        node.close()


def test_list_objects_pages_in_key_order(make):
    master, node = make(dram_objects=6)
    put(master, node, [key(i) for i in (5, 1, 3, 2)])
    lease = master.lookup([key(2)]).lease_id
    master.remove([key(2)])  # doomed (leased): not listed
    records, nxt = master.list_objects(limit=2)
    assert [r.key for r in records] == [key(1), key(3)] and nxt == key(3)
    records, nxt = master.list_objects(start_after=nxt, limit=2)
    assert [r.key for r in records] == [key(5)] and nxt == b""
    assert master.list_objects(ns_digest=b"x" * 16)[0] == []
    assert [r.key for r in master.list_objects(ns_digest=b"\0" * 16)[0]] == [key(1), key(3), key(5)]
    with pytest.raises(ValueError, match="start_after must be a 16-byte key, got 3 bytes"):
        master.list_objects(start_after=b"abc")
    master.release([lease])


def test_list_pages_every_object_once_in_byte_order_across_ties_in_the_first_eight_bytes(make):
    """A page takes the `limit` smallest keys after `start_after` by their first 8 bytes, then the last 8: keys that
    share their first 8 bytes, and pages that end inside such a run, come out in byte order all the same."""
    master, node = make(dram_objects=160)
    rng = np.random.default_rng(7)
    keys = [bytes(rng.integers(0, 256, 16, dtype=np.uint8)) for _ in range(100)]
    keys += [b"\x80" * 8 + i.to_bytes(8, "big") for i in (9, 3, 0, 2**63, 5, 2**64 - 1, 1, 4)]   # one first word
    keys += [i.to_bytes(8, "big") + b"\xff" * 8 for i in (2, 1, 2**64 - 2)] + [b"\0" * 16, b"\xff" * 16]
    assert put(master, node, keys) == [PutStatus.STORED] * len(keys)
    for limit in (1, 3, 7, 200):
        seen, after = [], b""
        while True:
            records, after = master.list_objects(start_after=after, limit=limit)
            seen += [r.key for r in records]
            assert len(records) == limit or after == b""
            if not after:
                break
        assert seen == sorted(keys), limit
    # from a key inside the run of equal first words, and from one that is not stored
    records, after = master.list_objects(start_after=b"\x80" * 8 + (5).to_bytes(8, "big"), limit=3)
    assert [r.key for r in records] == [b"\x80" * 8 + i.to_bytes(8, "big") for i in (9, 2**63, 2**64 - 1)]
    assert after == b"\x80" * 8 + (2**64 - 1).to_bytes(8, "big")
    absent = b"\x80" * 8 + (6).to_bytes(8, "big")
    assert [r.key for r in master.list_objects(start_after=absent, limit=2)[0]] == \
        [b"\x80" * 8 + i.to_bytes(8, "big") for i in (9, 2**63)]


def test_a_listing_lets_others_in_between_chunks_and_lists_every_object_present_throughout(make, monkeypatch):
    """`queries.LIST_CHUNK` slots per hold of the lock; between two, other calls remove and put objects; one key is
    removed and put again into a slot a later chunk scans (seen twice), one removed and put again uncommitted. Every
    object present for the whole listing is listed, once, in key order; none that is not committed when its page
    comes back is on it."""
    master, node = make(dram_objects=80)
    monkeypatch.setattr(queries, "LIST_CHUNK", 8)
    stable = [key(i) for i in range(1, 41)]                 # slots 0-39
    assert put(master, node, stable) == [PutStatus.STORED] * 40
    victims, newcomers = stable[4::5], [key(i) for i in range(100, 110)]
    pending, moved = stable[0], stable[1]                   # both on the first page, in the first chunk
    removed: list[bytes] = []
    calls = []

    def others() -> None:
        calls.append(len(calls))
        if victims:
            removed.append(victims.pop(0))
            assert master.remove(removed[-1:]) == 1
        if newcomers:                                       # into the slot just freed
            assert put(master, node, [newcomers.pop(0)]) == [PutStatus.STORED]
        if len(calls) == 2:                                 # its new slot holds an uncommitted put
            assert master.remove([pending]) == 1 and master.put_start([pending], [OBJ])[0].grant is not None
            removed.append(pending)
        if len(calls) == 3:                                 # slot 1 to a filler, the key to a slot past 39
            assert master.remove([moved]) == 1
            assert put(master, node, [key(200), moved]) == [PutStatus.STORED] * 2
            assert master.index.slot_of(moved) > 39

    master.between_chunks = others
    listed, after = [], b""
    while True:
        records, after = master.list_objects(start_after=after, limit=6)
        assert not {r.key for r in records} & set(removed)
        listed += [r.key for r in records]
        if not after:
            break
    assert listed == sorted(set(listed))                      # in order, each once
    assert moved in listed and pending not in listed
    throughout = set(stable) - set(stable[4::5]) - {moved, pending}
    assert throughout <= set(listed) and len(calls) >= 10


def test_leased_ssd_objects_are_not_evicted_to_make_room_for_demotions(make):
    master, node = make(dram_objects=1, ssd_objects=2, promote_on_hit=False, write_behind=False)  # exclusive tiers
    for i in (1, 2, 3):
        put(master, node, [key(i)])
    assert tiers(master, [key(1), key(2), key(3)]) == ["ssd", "ssd", "dram"]
    lease = master.lookup([key(1)]).lease_id  # key 1 is the SSD's coldest, but it is being read
    put(master, node, [key(4)])
    assert tiers(master, [key(1), key(2), key(3), key(4)]) == ["ssd", None, "ssd", "dram"]
    master.release([lease])
    s = master.stats()
    assert (s["demotions"], s["evictions"]) == (3, {"dram": 0, "ssd": 1})


def put_ns(master, node, keys, ns):
    results = master.put_start(keys, [OBJ] * len(keys), ns)
    for k, r in zip(keys, results):
        data = np.full(OBJ, k[0], np.uint8)
        node.write(r.grant.location.tier, r.grant.location.offset, k, ns.digest, data, xxhash.xxh3_64_intdigest(data))
    assert master.put_commit([r.grant.grant_id for r in results], [0] * len(keys)) == [True] * len(keys)


def test_last_access_is_set_on_commit_and_on_lookup_hits(make, clock):
    master, node = make(dram_objects=3)
    clock.now += 12.34                                    # ticks are tenths of a second since the master started
    put(master, node, [key(1), key(2)])
    atime = lambda k: int(master.index.atime[master.index.slot_of(k)])  # noqa: E731
    assert (atime(key(1)), atime(key(2))) == (123, 123)
    clock.now += 5
    master.lookup([key(1), key(9), key(2)], lease=False)  # only the leading hit is a hit
    assert (atime(key(1)), atime(key(2))) == (173, 123)
    clock.now += 1
    master.release([master.lookup([key(2)]).lease_id])
    assert (atime(key(1)), atime(key(2))) == (173, 183)


def test_evict_by_namespace_and_idle_age(make, clock):
    master, node = make(dram_objects=3, ssd_objects=2)
    a, b = NsRef(digest=b"a" * 16, label="a"), NsRef(digest=b"b" * 16, label="b")
    put_ns(master, node, [key(1)], a)                     # t=1000
    clock.now += 10
    put_ns(master, node, [key(2)], b)                     # t=1010
    clock.now += 10
    put_ns(master, node, [key(3)], a)                     # t=1020
    clock.now += 10
    assert master.lookup([key(1)], lease=False).hits == 1  # t=1030: key 1 used again
    clock.now += 10                                       # t=1040: idle 10, 30, 20
    assert master.evict(older_than_s=25) == 1
    assert master.contains([key(1), key(2), key(3)]) == [True, False, True]
    assert master.evict(ns_digest=b"a" * 16, older_than_s=20.05) == 0  # key 3 is idle 20.0 s
    assert master.evict(ns_digest=b"a" * 16, older_than_s=20) == 1
    assert master.contains([key(1), key(3)]) == [True, False]
    assert master.evict(ns_digest=b"z" * 16) == 0         # a namespace never seen
    lease = master.lookup([key(1)]).lease_id              # leased: never evicted
    assert master.evict(ns_digest=b"a" * 16) == 0 and master.contains([key(1)]) == [True]
    master.release([lease])
    assert master.evict(ns_digest=b"a" * 16) == 1 and master.contains([key(1)]) == [False]
    assert master.stats()["evictions"] == {"dram": 3, "ssd": 0}


def test_evict_never_touches_uncommitted_and_drops_ssd_records(make, clock):
    master, node = make(dram_objects=1, ssd_objects=2, promote_on_hit=False)
    put(master, node, [key(1)])
    put(master, node, [key(2)])                           # key 1 demoted to SSD
    assert tiers(master, [key(1), key(2)]) == ["ssd", "dram"]
    master.remove([key(2)])
    clock.now += 100
    pending = master.put_start([key(3)], [OBJ])[0].grant  # (a grant outlived by the clock would expire)
    assert master.evict(older_than_s=0) == 1              # key 1 only: key 3 is being written
    assert master.contains([key(1)]) == [False] and [r.key for r in node.scan_ssd()] == []
    assert master.put_commit([pending.grant_id], [0]) == [True] and master.contains([key(3)]) == [True]
    assert master.stats()["evictions"] == {"dram": 0, "ssd": 1}


@pytest.mark.parametrize("kwargs, match", [
    ({}, "ns_digest or older_than_s must be given"),
    ({"ns_digest": b"short"}, "ns_digest must be empty or a 16-byte namespace digest"),
    ({"ns_digest": "a" * 16}, "ns_digest must be empty or a 16-byte namespace digest"),
    ({"older_than_s": -1}, "older_than_s must be None or a finite number of seconds >= 0, got -1"),
    ({"older_than_s": float("nan")}, "older_than_s must be None or a finite number"),
    ({"older_than_s": True}, "older_than_s must be None or a finite number"),
    ({"older_than_s": "5"}, "older_than_s must be None or a finite number"),
])
def test_evict_bad_arguments_change_nothing(make, clock, kwargs, match):
    master, node = make(dram_objects=2)
    put(master, node, [key(1)])
    clock.now += 100
    with pytest.raises(ValueError, match=match):
        master.evict(**kwargs)
    assert master.contains([key(1)]) == [True] and master.stats()["evictions"] == {"dram": 0, "ssd": 0}


def test_commit_of_an_expired_grant_is_refused_before_the_reaper_runs(tmp_path, clock):
    node = StorageNode(NodeConfig(node_id="n", dram_bytes=4 * OBJ, shm_dir=str(tmp_path)))
    try:
        master = Master(MasterConfig(grant_ttl_s=1.0), clock=clock)
        master.register_node(node.info(), node, expires=False)
        early = master.put_start([key(1)], [OBJ])[0].grant
        late = master.put_start([key(2)], [OBJ])[0].grant
        clock.now += 0.9
        assert master.put_commit([early.grant_id], [0]) == [True]   # this tick reaps; the next reap is at 1.15
        clock.now += 0.15                                            # 1.05: past `late`'s expiry, before that reap
        assert master.put_commit([late.grant_id], [0]) == [False]
        assert master.contains([key(1), key(2)]) == [True, False]
        assert master.stats()["grants_open"] == 0
    finally:
        node.close()


def test_report_corrupt_forgets_under_a_live_lease_counts_by_tier_and_ignores_an_ended_lease(make, clock):
    master, node = make(dram_objects=3, ssd_objects=2, lease_ttl_s=5.0)
    for i in (1, 2, 3, 4):  # one at a time: the 4th put demotes key(1), the coldest, to SSD
        assert put(master, node, [key(i)]) == [PutStatus.STORED]
    assert tiers(master, [key(1), key(2)]) == ["ssd", "dram"]
    with pytest.raises(ValueError, match=r"keys\[0\] must be a 16-byte key, got 3"):
        master.report_corrupt(1, [b"abc"])
    lease = master.lookup([key(1), key(2)]).lease_id
    assert master.report_corrupt(lease, [key(1), key(2), key(9)]) == 2
    s = master.stats()
    assert (s["ssd_corrupt"], s["dram_corrupt"]) == (1, 1)
    assert master.contains([key(1), key(2)]) == [False, False]
    master.release([lease])
    # A report under a lease that ended (released, or expired: the extent may hold another object by now) is ignored.
    lease = master.lookup([key(3)]).lease_id
    master.release([lease])
    assert master.report_corrupt(lease, [key(3)]) == 0
    lease = master.lookup([key(4)]).lease_id
    clock.now += 6
    master.reap()
    assert master.report_corrupt(lease, [key(4)]) == 0
    assert master.contains([key(3), key(4)]) == [True, True] and master.stats()["dram_corrupt"] == 1


def test_a_silent_node_gets_no_new_objects_long_before_it_is_dropped(tmp_path, clock):
    nodes = [StorageNode(NodeConfig(node_id=n, dram_bytes=8 * OBJ, shm_dir=str(tmp_path))) for n in ("a", "b")]
    try:
        master = Master(MasterConfig(node_ttl_s=10.0, suspect_after_s=3.0), clock=clock)
        epochs = {n.node_id: master.register_node(n.info(), n) for n in nodes}
        assert put(master, nodes[1], [key(1)]) == [PutStatus.STORED]
        where = master.inspect([key(1)])[0].node_id
        clock.now += 3.5  # b misses its heartbeats (a SIGKILLed node); a keeps beating
        assert master.heartbeat("a", epochs["a"]) is False
        for i in (2, 3, 4, 5):
            assert master.put_start([key(i)], [OBJ])[0].grant.location.node_id == "a"
        assert master.lookup([key(1)], lease=False).hits == 1  # its objects are still served meanwhile
        assert master.reap()["nodes"] == 0
        assert master.heartbeat("b", epochs["b"]) is False  # alive after all: placeable again
        placed = {master.put_start([key(10 + i)], [OBJ])[0].grant.location.node_id for i in range(4)}
        assert "b" in placed and where in ("a", "b")  # b has the most free DRAM again
        clock.now += 10.5
        assert master.heartbeat("a", epochs["a"]) is False
        assert master.reap()["nodes"] == 1 and master.node_ids() == ["a"]
    finally:
        for n in nodes:
            n.close()


def test_nodes_reloaded_from_the_journal_get_a_grace_period_to_register(tmp_path, clock):
    meta = MemoryMetadata(persistent=True)
    node = StorageNode(NodeConfig(node_id="n", dram_bytes=3 * OBJ, shm_dir=str(tmp_path)))
    try:
        m1 = Master(MasterConfig(node_ttl_s=2.0), meta, clock=clock)
        m1.register_node(node.info(), node)
        put(m1, node, [key(1)])
        m2 = Master(MasterConfig(node_ttl_s=2.0, reload_grace_s=20.0), meta, clock=clock)  # m1 died
        clock.now += 19  # the node is slow to find the new master: far past node_ttl_s, within the grace
        assert m2.reap()["nodes"] == 0 and m2.contains([key(1)]) == [True]
        assert m2.heartbeat("n") is True  # "register again"
        epoch = m2.register_node(node.info(), node)
        assert m2.contains([key(1)]) == [True]
        clock.now += 1.5  # registered: the node's own ttl applies again
        assert m2.heartbeat("n", epoch) is False and m2.reap()["nodes"] == 0
        clock.now += 2.5
        assert m2.reap()["nodes"] == 1
        m3 = Master(MasterConfig(node_ttl_s=2.0), meta, clock=clock)  # default grace: max(30 s, 3 node_ttl_s)
        clock.now += 29
        assert m3.reap()["nodes"] == 0
        clock.now += 1.5
        assert m3.reap()["nodes"] == 1
    finally:
        node.close()


def test_a_lookup_stops_before_an_object_whose_u16_lease_count_is_full(make):
    from kvpool.store.index import LEASE_CAP, NamespaceTableFull

    master, node = make(dram_objects=3)
    k1, k2 = key(1), key(2)
    assert put(master, node, [k1, k2]) == [PutStatus.STORED] * 2
    # one key repeated in a batch pins it once per repeat: the count stops at LEASE_CAP, it never wraps
    many = master.lookup([k1] * 65536)
    assert many.hits == LEASE_CAP and int(master.index.leases[master.index.slot_of(k1)]) == LEASE_CAP
    assert master.lookup([k1, k2]).hits == 0                                  # full: a miss for this reader only
    assert master.lookup([k2]).hits == 1
    assert master.lookup([k1, k2], lease=False).hits == 2                   # a probe pins nothing
    master.release([many.lease_id])
    assert int(master.index.leases[master.index.slot_of(k1)]) == 0
    got = master.lookup([k1, k2])
    assert got.hits == 2
    master.release([got.lease_id])
    # a master whose namespace table is full refuses a new namespace before anything changes
    for i in range(master.index.ns_id_of(b"\0" * 16) + 2, 65536 + 1):
        master.index.intern_ns(i.to_bytes(16, "big"))
    before = len(master.index)
    with pytest.raises(NamespaceTableFull, match="^namespace: "):
        master.put_start([key(3)], [OBJ], NsRef(b"\xee" * 16, "new", 16))
    assert len(master.index) == before and master.lookup([key(3)], lease=False).hits == 0


def test_a_continued_lookup_is_answered_with_a_lease_and_counted_nowhere(make):
    master, node = make(dram_objects=3)
    put(master, node, [key(1), key(2), key(3)])
    first = master.lookup([key(1), key(2), key(3)], lease=True)
    before = master.stats()
    rest = master.lookup([key(2), key(3)], lease=True, continued=True)
    assert rest.hits == 2 and rest.lease_id and rest.lease_id != first.lease_id
    after = master.stats()
    assert [after[n] - before[n] for n in ("lookups", "requested_keys", "hit_keys")] == [0, 0, 0]
    assert after["leases_open"] == before["leases_open"] + 1
    master.release([first.lease_id, rest.lease_id])
    for kwargs in ({"lease": False}, {"lease": True, "count_only": True}):
        with pytest.raises(ValueError, match=r"continued: only a leased read's lookup continues"):
            master.lookup([key(1)], continued=True, **kwargs)
    assert master.stats()["lookups"] == after["lookups"] and master.stats()["leases_open"] == 0


def test_a_master_started_later_knows_none_of_an_earlier_ones_ids(make):
    """Grant and lease ids of a master process begin above every id an earlier one handed out (store/leases.py
    first_id), so a stale client's commit, abort or release, sent to the master that replaced the one it spoke to,
    refers to nothing there: it ends none of the new master's grants or leases (before 2026-12-07 both numbered
    from 1, and the stale commit of grant 1 committed the new master's grant 1)."""
    old, old_node = make(dram_objects=4, node_id="n1")
    put(old, old_node, [key(1)])
    stale_grants = [r.grant.grant_id for r in old.put_start([key(2), key(3)], [OBJ, OBJ])]
    stale_lease = old.lookup([key(1)]).lease_id
    new, new_node = make(dram_objects=4, node_id="n2")
    put(new, new_node, [key(1)])
    lease = new.lookup([key(1)]).lease_id
    fresh = [r.grant.grant_id for r in new.put_start([key(2), key(3)], [OBJ, OBJ])]
    assert min(fresh + [lease]) > max(stale_grants + [stale_lease])
    assert new.put_commit(stale_grants, [0, 0]) == [False, False]
    assert new.put_abort(stale_grants) == 0
    assert new.release([stale_lease]) == 0
    assert new.stats()["grants_open"] == 2 and new.stats()["leases_open"] == 1
    assert new.release([lease]) == 1
