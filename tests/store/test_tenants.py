"""store/tenants.py + store/quota.py through the Master, against a real StorageNode and a fake clock: each tenant's
key space (exact keys of another tenant miss and cannot be removed), grants and leases owned by their tenant, stats
per tenant, and quotas that evict (or demote) only the tenant's own objects in exact LRU order."""

import threading
from contextlib import contextmanager

import numpy as np
import pytest
import xxhash

from kvpool.store.config import MasterConfig, NodeConfig, TenantQuotas
from kvpool.store.master import Master
from kvpool.store.metadata import MemoryMetadata
from kvpool.store.node import StorageNode
from kvpool.store.records import NsRef, PutStatus
from kvpool.store.tenants import Quota, Tenants, parse_quotas
from kvpool.tiers.types import Tier
from tests.store.fakes import Clock, key

OBJ = 4096
NS = NsRef(b"n" * 16, "smollm2/whoever-the-client-says", 16)
STORED, EXISTS, NO_SPACE = PutStatus.STORED, PutStatus.EXISTS, PutStatus.NO_SPACE


@pytest.fixture
def make(tmp_path):
    made = []

    def _make(dram_objects=8, ssd_objects=0, quotas=None, metadata=None, secret=b"s" * 32, node=None, tenants=()):
        node = node or StorageNode(NodeConfig(node_id="n1", dram_bytes=dram_objects * OBJ, shm_dir=str(tmp_path),
                                              ssd_path=str(tmp_path / "ssd") if ssd_objects else None,
                                              ssd_bytes=ssd_objects * 2 * OBJ))
        master = Master(MasterConfig(promote_on_hit=False), metadata, clock=Clock(), token_secret=secret,
                        quotas=quotas, tenants=tenants)
        master.register_node(node.info(), node, expires=False)
        made.append(node)
        return master, node

    yield _make
    for node in made:
        node.close()


def put(master, node, keys, tenant, fill=None, pin_s=0.0):
    """put_start + write (under the STORED key the grant names, as a client does) + commit."""
    results = master.put_start(keys, [OBJ] * len(keys), NS, tenant=tenant, pin_s=pin_s)
    ids, sums = [], []
    for k, r in zip(keys, results):
        if r.grant is not None:
            data = np.full(OBJ, k[0] if fill is None else fill, np.uint8)
            loc = r.grant.location
            node.write(loc.tier, loc.offset, r.grant.key, NS.digest, data, xxhash.xxh3_64_intdigest(data))
            ids.append(r.grant.grant_id)
            sums.append(xxhash.xxh3_64_intdigest(data))
    assert master.put_commit(ids, sums, tenant=tenant) == [True] * len(ids)
    return [r.status for r in results]


def present(master, keys, tenant):
    return master.contains(keys, tenant=tenant)


# ---------------------------------------------------------------- key spaces


def test_stored_keys_are_per_tenant_deterministic_and_secret_bound():
    keys = [key(i) for i in range(4)]
    t1, t2 = Tenants(b"a" * 32), Tenants(b"a" * 32)
    acme, beta = t1.intern("acme"), t1.intern("beta")
    assert t2.intern("acme") == acme and t2.stored_keys(acme, keys) == t1.stored_keys(acme, keys)
    mine, theirs = t1.stored_keys(acme, keys), t1.stored_keys(beta, keys)
    assert len(set(mine) | set(theirs) | set(keys)) == 12 and all(len(k) == 16 for k in mine + theirs)
    other = Tenants(b"b" * 32)
    assert other.stored_keys(0, keys) is keys
    assert other.stored_keys(other.intern("acme"), keys) != mine  # another pool secret, another key space
    assert [t1.owner_of(k) for k in mine + theirs + keys[:1]] == [acme] * 4 + [beta] * 4 + [0]


def test_tenant_b_with_a_exact_keys_misses_and_cannot_remove_or_overwrite(make):
    master, node = make()
    keys = [key(i) for i in range(3)]
    assert put(master, node, keys, "acme") == [STORED] * 3
    assert master.lookup(keys, NS, tenant="beta").hits == 0
    assert master.lookup(keys, NS, lease=False, tenant="beta").hits == 0
    assert present(master, keys, "beta") == [False] * 3
    assert master.remove(keys, tenant="beta") == 0
    # B storing the same key bytes makes B's own objects; A's stay A's, byte for byte.
    assert put(master, node, keys[:1], "beta", fill=0xBB) == [STORED]
    got = master.lookup(keys, NS, tenant="acme")
    assert got.hits == 3 and present(master, keys, "acme") == [True] * 3
    buf = bytearray(OBJ)
    assert node.read_into(Tier(got.tiers[0]), got.offsets[0], got.record_keys[0], OBJ, buf)
    assert buf == bytes([keys[0][0]]) * OBJ
    master.release([got.lease_id], tenant="acme")
    # The unscoped space (auth off, admins) does not see tenants' keys as given either: they are stored keys.
    assert present(master, keys, "") == [False] * 3
    stored = got.record_keys
    assert present(master, stored, "") == [True] * 3 and [r.tenant for r in master.inspect(stored)] == ["acme"] * 3
    assert master.remove(keys, tenant="acme") == 3 and master.contains(keys, tenant="beta") == [True, False, False]
    master.index.check_invariants()


def test_grants_and_leases_belong_to_their_tenant(make):
    master, node = make()
    results = master.put_start([key(1)], [OBJ], NS, tenant="acme")
    gid = results[0].grant.grant_id
    assert master.put_commit([gid], [0], tenant="beta") == [False]   # not B's grant: unknown to B, still open
    assert master.put_abort([gid], tenant="beta") == 0
    assert master.put_commit([gid], [0], tenant="acme") == [True]
    lease = master.lookup([key(1)], NS, tenant="acme").lease_id
    assert master.release([lease], tenant="beta") == 0
    assert int(master.index.leases[master.index.find(results[0].grant.key)]) == 1
    assert master.release([lease], tenant="acme") == 1


def test_stats_per_tenant_and_a_tenant_view(make):
    master, node = make()
    put(master, node, [key(1), key(2)], "acme")
    put(master, node, [key(3)], "beta")
    master.lookup([key(1), key(2), key(9)], NS, lease=False, tenant="acme")
    master.lookup([key(1)], NS, lease=False, tenant="beta")
    full = master.stats()
    assert set(full["tenants"]) == {"acme", "beta"}
    acme = full["tenants"]["acme"]
    assert (acme["objects"], acme["bytes"], acme["bytes_by_tier"]["dram"]) == (2, 2 * OBJ, 2 * OBJ)
    assert (acme["requested_tokens"], acme["hit_tokens"], acme["lookups"]) == (48, 32, 1)
    assert full["tenants"]["beta"]["hit_tokens"] == 0 and full["tenants"]["beta"]["requested_tokens"] == 16
    # The client's label names the credential's tenant, whatever the request said.
    assert set(full["namespaces"]) == {"smollm2/acme", "smollm2/beta"}
    view = master.stats_record(tenant="beta").to_dict()
    assert view["nodes"] == {} and set(view["tenants"]) == {"beta"} and list(view["namespaces"]) == ["smollm2/beta"]
    assert (view["objects"], view["requested_tokens"], view["lookups"]) == (1, 16, 1)


def test_auth_off_has_no_tenants_in_stats_and_stores_keys_as_given(make):
    master, node = make()
    put(master, node, [key(1)], "")
    assert "tenants" not in master.stats()
    assert master.inspect([key(1)])[0].tenant == "" and master.index.find(key(1)) >= 0


def test_tenant_objects_reloaded_from_the_journal_keep_their_owner(make, tmp_path):
    meta = MemoryMetadata(persistent=True)
    master, node = make(metadata=meta)
    put(master, node, [key(1)], "acme")
    again, _ = make(metadata=meta, node=node, tenants=["acme"])  # restarted on the same backend and secret
    assert again.contains([key(1)], tenant="acme") == [True]
    assert again.stats()["tenants"]["acme"]["objects"] == 1


# ---------------------------------------------------------------- quotas


def test_parse_quotas_and_its_errors_name_the_entry():
    assert parse_quotas("acme:dram=8KiB,total=16KiB; *:total=1MiB") == {
        "acme": Quota(8192, 16384), "*": Quota(0, 1 << 20)}
    for text, msg in [("acme", "tenant_quotas[0] ('acme'): expected TENANT:"),
                      ("acme:ram=1", "tenant_quotas[0] ('acme:ram=1'): expected dram=SIZE"),
                      ("a:total=1;a:total=2", "tenant_quotas[1] ('a:total=2'): tenant 'a' is listed twice"),
                      ("a:dram=2,total=1", "tenant_quotas[0] ('a:dram=2,total=1'): dram (2) is above total (1)"),
                      ("a:total=lots", "tenant_quotas[0] ('a:total=lots') total: expected a size")]:
        with pytest.raises(ValueError) as err:
            TenantQuotas(tenant_quotas=text)
        assert str(err.value).startswith(msg), err.value
    assert TenantQuotas(tenant_quotas={"acme": {"total_bytes": "16KiB"}}).tenant_quotas == "acme:dram=0,total=16384"


def test_total_quota_evicts_only_the_tenants_own_objects_in_lru_order(make):
    master, node = make(dram_objects=16, quotas={"acme": Quota(total_bytes=4 * OBJ)})
    a = [key(i) for i in range(1, 8)]
    b = [key(i) for i in range(20, 23)]
    for k in a[:4]:
        assert put(master, node, [k], "acme") == [STORED]
    assert put(master, node, b, "beta") == [STORED] * 3
    master.release([master.lookup([a[0]], NS, tenant="acme").lease_id], tenant="acme")  # a0 is now A's hottest
    beta_before = master.stats()["tenants"]["beta"]
    evicted = []
    for k in a[4:7]:
        before = present(master, a, "acme")
        assert put(master, node, [k], "acme") == [STORED]
        after = present(master, a, "acme")
        evicted += [a[i] for i in range(len(a)) if before[i] and not after[i]]
    assert evicted == [a[1], a[2], a[3]]                       # coldest first, a0 kept for its hit
    assert present(master, a, "acme") == [True, False, False, False, True, True, True]
    assert present(master, b, "beta") == [True] * 3
    stats = master.stats()
    assert stats["tenants"]["acme"]["bytes"] == 4 * OBJ and stats["tenants"]["acme"]["quota_evictions"] == 3
    assert stats["tenants"]["beta"] == beta_before
    assert stats["evictions"]["dram"] == 3
    master.index.check_invariants()


@pytest.mark.parametrize("pinned", [False, True])
def test_total_quota_evicts_a_tenants_pinned_objects_last_in_exact_order(make, pinned):
    master, node = make(dram_objects=8, quotas={"acme": Quota(total_bytes=3 * OBJ)})
    a = [key(i) for i in range(1, 8)]
    pin = 60 if pinned else 0
    evicted = []
    for i, k in enumerate(a):                   # one key at a time: past the third, each put evicts exactly one
        before = present(master, a, "acme")
        assert put(master, node, [k], "acme", pin_s=pin if i in (0, 1, 5) else 0) == [STORED]
        after = present(master, a, "acme")
        evicted += [j + 1 for j in range(len(a)) if before[j] and not after[j]]
    # LRU alone: oldest first. Pinned a1, a2 (and later a6): the unpinned go first, coldest first; once all three
    # objects of the quota are pinned, the coldest pin (a1) yields rather than refuse the put.
    assert evicted == ([3, 4, 5, 1] if pinned else [1, 2, 3, 4])
    assert present(master, a, "acme") == ([False, True, False, False, False, True, True] if pinned
                                          else [False, False, False, False, True, True, True])
    s = master.stats()
    assert s["pinned_evictions"] == (1 if pinned else 0)
    assert s["tenants"]["acme"]["quota_evictions"] == 4
    master.index.check_invariants()


@pytest.mark.parametrize("pinned", [False, True])
def test_dram_quota_sheds_a_tenants_unpinned_objects_before_its_pinned_ones(make, pinned):
    master, node = make(dram_objects=8, ssd_objects=8, quotas={"acme": Quota(dram_bytes=2 * OBJ)})
    a = [key(i) for i in range(1, 5)]
    for i, k in enumerate(a[:3]):
        put(master, node, [k], "acme", pin_s=60 if pinned and i == 0 else 0)
    tiers = lambda: [None if r is None else r.tier.label  # noqa: E731
                     for r in master.inspect(master.tenants.stored_keys(1, a))]
    # over its DRAM quota by one: the coldest unpinned object is demoted (a1 unless a1 is pinned)
    assert tiers() == (["dram", "ssd", "dram", None] if pinned else ["ssd", "dram", "dram", None])
    put(master, node, [a[3]], "acme")
    assert tiers() == (["dram", "ssd", "ssd", "dram"] if pinned else ["ssd", "ssd", "dram", "dram"])
    assert master.stats()["tenants"]["acme"]["quota_demotions"] == 2
    assert master.stats()["pinned_evictions"] == 0


def test_total_quota_full_of_leased_objects_is_no_space_and_evicts_nothing(make):
    master, node = make(quotas={"acme": Quota(total_bytes=2 * OBJ)})
    put(master, node, [key(1), key(2)], "acme")
    lease = master.lookup([key(1), key(2)], NS, tenant="acme").lease_id
    assert master.put_start([key(3)], [OBJ], NS, tenant="acme")[0].status is NO_SPACE
    assert master.put_start([key(4)], [3 * OBJ], NS, tenant="acme")[0].status is NO_SPACE  # above the quota itself
    assert present(master, [key(1), key(2)], "acme") == [True, True]
    assert master.stats()["tenants"]["acme"]["no_space"] == 2
    master.release([lease], tenant="acme")
    assert put(master, node, [key(3)], "acme") == [STORED]
    # the hit touched the chain [1, 2]: its tail (2) is colder than its parent, so 2 goes first
    assert present(master, [key(1), key(2), key(3)], "acme") == [True, False, True]


class _CopyGate:
    """The node as the master's NodeOps, its write-behind copies (demote of DRAM -> SSD copy moves) held at a gate
    until the test opens it."""

    def __init__(self, node):
        self.node, self.entered, self.gate = node, threading.Event(), threading.Event()

    def demote(self, moves):
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return self.node.demote(moves)

    def __getattr__(self, name):
        return getattr(self.node, name)


@pytest.fixture
def gated(tmp_path):
    """`gated(quota)`: a master whose tenant acme has `quota`, over a DRAM + SSD node whose copies wait at a gate."""
    made = []

    def _gated(quota):
        node = StorageNode(NodeConfig(node_id="n1", dram_bytes=8 * OBJ, shm_dir=str(tmp_path),
                                      ssd_path=str(tmp_path / "ssd"), ssd_bytes=16 * OBJ))
        made.append(node)
        master = Master(MasterConfig(promote_on_hit=False), clock=Clock(), token_secret=b"s" * 32,
                        quotas={"acme": quota})
        ops = _CopyGate(node)
        master.register_node(node.info(), ops, expires=False)
        return master, node, ops

    yield _gated
    for node in made:
        node.close()


@contextmanager
def _round_held(master, ops):
    """A write-behind round (`copy_pending`) held at its node call for the body (its objects pinned), then let go
    and ended. Yields the list its result lands in."""
    copied: list[int] = []
    round_ = threading.Thread(target=lambda: copied.append(master.copy_pending()), daemon=True)
    round_.start()
    assert ops.entered.wait(30)
    try:
        yield copied
    finally:
        ops.gate.set()
        round_.join(30)


def test_total_quota_evicts_an_object_the_write_behind_is_copying(gated):
    """A tenant at its total quota whose every object is in a write-behind round (pinned while the node copies it to
    its SSD extent) used to be refused its put (no_space) until the round ended. Now the coldest is evicted as an
    object removed mid-copy is: it leaves when its copy ends, and stops counting for the tenant at once."""
    master, node, ops = gated(Quota(total_bytes=3 * OBJ))
    a = [key(i) for i in range(1, 5)]
    for k in a[:3]:
        assert put(master, node, [k], "acme") == [STORED]
    with _round_held(master, ops) as copied:       # a1-a3 pinned by the round, their copies being written
        assert put(master, node, [a[3]], "acme") == [STORED]
        assert present(master, a, "acme") == [False, True, True, True]     # the coldest went
        acme = master.stats()["tenants"]["acme"]
        assert (acme["bytes"], acme["objects"], acme["quota_evictions"], acme["no_space"]) == (3 * OBJ, 3, 1, 0)
    assert copied == [2]                            # a2 and a3 are clean; a1 left meanwhile: freed with its copy
    stored = master.tenants.stored_keys(master.tenants.intern("acme"), a)
    assert sorted(r.key for r in node.scan_ssd()) == sorted(stored[1:3])    # a1's copy record erased, a4's not due
    assert int(master.index.leases.sum()) == 0
    master.index.check_invariants()
    assert put(master, node, [key(9)], "acme") == [STORED]                      # the quota goes on as before
    assert present(master, a + [key(9)], "acme") == [False, False, True, True, True]


def test_dram_quota_does_not_move_an_object_the_write_behind_is_copying(gated):
    """The DRAM quota moves its victims one tier down: one being copied is not moved (the copy reads it); the new
    object goes below DRAM instead, and nothing is evicted."""
    master, node, ops = gated(Quota(dram_bytes=2 * OBJ))
    a = [key(i) for i in range(1, 4)]
    for k in a[:2]:
        assert put(master, node, [k], "acme") == [STORED]
    with _round_held(master, ops) as copied:
        assert put(master, node, [a[2]], "acme") == [STORED]
        stored = master.tenants.stored_keys(master.tenants.intern("acme"), a)
        assert [r.tier for r in master.inspect(stored)] == [Tier.DRAM, Tier.DRAM, Tier.SSD]
        assert master.stats()["tenants"]["acme"]["quota_evictions"] == 0
    assert copied == [2]
    master.index.check_invariants()


def test_pending_writes_count_against_the_quota(make):
    master, _ = make(quotas={"acme": Quota(total_bytes=2 * OBJ)})
    assert [r.status for r in master.put_start([key(1), key(2), key(3)], [OBJ] * 3, NS, tenant="acme")] == \
        [STORED, STORED, NO_SPACE]


def test_dram_quota_demotes_own_coldest_to_ssd_and_total_then_evicts_own_ssd_first(make):
    master, node = make(dram_objects=8, ssd_objects=8,
                        quotas={"acme": Quota(dram_bytes=2 * OBJ, total_bytes=4 * OBJ)})
    a = [key(i) for i in range(1, 6)]
    put(master, node, [key(40)], "beta")
    for k in a[:2]:
        put(master, node, [k], "acme")
    tiers = lambda: [t.label if t is not None else None for t in  # noqa: E731
                     [None if r is None else r.tier for r in master.inspect(master.tenants.stored_keys(1, a))]]
    assert tiers() == ["dram", "dram", None, None, None]
    put(master, node, [a[2]], "acme")
    assert tiers() == ["ssd", "dram", "dram", None, None]       # a0 (coldest) demoted, nobody else's moved
    put(master, node, [a[3]], "acme")
    assert tiers() == ["ssd", "ssd", "dram", "dram", None]
    put(master, node, [a[4]], "acme")                            # total 4 objects: a0 (coldest, on SSD) evicted
    assert tiers() == [None, "ssd", "ssd", "dram", "dram"]
    acme = master.stats()["tenants"]["acme"]
    assert (acme["quota_demotions"], acme["quota_evictions"]) == (3, 1)
    assert acme["bytes_by_tier"] == {"hbm": 0, "dram": 2 * OBJ, "ssd": 2 * OBJ}
    assert master.inspect(master.tenants.stored_keys(2, [key(40)]))[0].tier is Tier.DRAM
    # A's demoted objects are still hits, byte-exact, read from SSD.
    got = master.lookup(a[1:], NS, tenant="acme")
    assert got.hits == 4 and got.tiers[:2] == [int(Tier.SSD)] * 2
    buf = bytearray(OBJ)
    assert node.read_into(Tier.SSD, got.offsets[0], got.record_keys[0], OBJ, buf) and buf == bytes([a[1][0]]) * OBJ
    master.index.check_invariants()


def test_dram_quota_without_room_below_places_on_ssd_or_evicts_own(make):
    master, node = make(dram_objects=8, quotas={"acme": Quota(dram_bytes=OBJ)})  # no SSD: shedding evicts
    put(master, node, [key(1)], "acme")
    put(master, node, [key(2)], "acme")
    assert present(master, [key(1), key(2)], "acme") == [False, True]
    assert master.stats()["tenants"]["acme"]["quota_evictions"] == 1


def test_default_quota_applies_to_unnamed_tenants(make):
    master, node = make(quotas={"*": Quota(total_bytes=OBJ), "big": Quota()})
    put(master, node, [key(1)], "anyone")
    put(master, node, [key(2)], "anyone")
    for k in (key(1), key(2), key(3)):
        put(master, node, [k], "big")
    assert present(master, [key(1), key(2)], "anyone") == [False, True]
    assert present(master, [key(1), key(2), key(3)], "big") == [True] * 3


def test_a_hit_is_not_promoted_into_dram_past_the_tenants_dram_quota(make, tmp_path):
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=8 * OBJ, shm_dir=str(tmp_path), ssd_path=str(tmp_path / "s"),
                                  ssd_bytes=16 * OBJ))
    master = Master(MasterConfig(promote_on_hit=True), clock=Clock(), token_secret=b"s" * 32,
                    quotas={"acme": Quota(dram_bytes=2 * OBJ)})
    master.register_node(node.info(), node, expires=False)
    try:
        for k in (key(1), key(2), key(3)):
            put(master, node, [k], "acme")
        put(master, node, [key(9)], "beta")
        stored = master.tenants.stored_keys(1, [key(1), key(2), key(3)])
        assert [r.tier for r in master.inspect(stored)] == [Tier.SSD, Tier.DRAM, Tier.DRAM]
        master.release([master.lookup([key(1)], NS, tenant="acme").lease_id], tenant="acme")
        assert master.promote_pending() == 0                 # acme's DRAM is at its quota: served from SSD
        assert master.inspect(stored[:1])[0].tier is Tier.SSD
        assert master.remove([key(2)], tenant="acme") == 1   # room within the quota again
        master.release([master.lookup([key(1)], NS, tenant="acme").lease_id], tenant="acme")
        assert master.promote_pending() == 1 and master.inspect(stored[:1])[0].tier is Tier.DRAM
    finally:
        node.close()


def test_a_tenants_orphans_are_its_first_quota_victims(make):
    master, node = make(quotas={"acme": Quota(total_bytes=3 * OBJ)})
    a, b, c, x, y = (key(i) for i in (1, 2, 3, 4, 5))
    assert put(master, node, [x], "acme") == [STORED]
    assert put(master, node, [a, b, c], "acme") == [STORED] * 3              # c (4th) over quota 3: x evicted
    assert present(master, [x, a, b, c], "acme") == [False, True, True, True]
    assert put(master, node, [x], "acme") == [STORED]                          # evicts the chain's tail, c
    assert present(master, [x, a, b, c], "acme") == [True, True, True, False]
    master.release([master.lookup([a, b], NS, tenant="acme").lease_id], tenant="acme")  # x is the coldest again
    assert master.remove([a], tenant="acme") == 1                              # b lost its parent: an orphan
    assert put(master, node, [y], "acme") == [STORED]
    assert put(master, node, [c], "acme") == [STORED]                          # over quota: the orphan b goes,
    assert present(master, [x, b, y, c], "acme") == [True, False, True, True]  # not x, the coldest non-orphan


def test_a_tenant_at_its_quota_walks_its_pinned_objects_once_not_at_every_put(make, monkeypatch):
    # Its pins are its coldest objects: the first pick passes over them (held) and moves them to the hot end, their
    # order kept, so the next picks find the unpinned victim at once.
    from kvpool.store.quota import TenantLists

    walked: list[int] = []
    real = TenantLists.victims

    def counted(lists, tenant, tier):
        walked.append(0)
        for slot in real(lists, tenant, tier):
            walked[-1] += 1
            yield slot

    master, node = make(dram_objects=16, quotas={"acme": Quota(total_bytes=6 * OBJ)})
    a = [key(i) for i in range(1, 13)]
    for i, k in enumerate(a[:6]):
        assert put(master, node, [k], "acme", pin_s=60 if i < 3 else 0) == [STORED]
    monkeypatch.setattr(TenantLists, "victims", counted)
    evicted = []
    for k in a[6:10]:                           # each put evicts exactly one of the tenant's objects
        before = present(master, a, "acme")
        assert put(master, node, [k], "acme") == [STORED]
        after = present(master, a, "acme")
        evicted += [j + 1 for j in range(len(a)) if before[j] and not after[j]]
    assert evicted == [4, 5, 6, 7]              # the unpinned, coldest first; the pinned a1-a3 stay
    # one walk per tier per put (SSD: none here, then DRAM): the pins walked at the first pick, then once a4-a6 are
    # gone (before the change: 4 at every put)
    assert [n for n in walked if n] == [4, 1, 1, 4]
    assert present(master, a, "acme") == [True] * 3 + [False] * 4 + [True] * 3 + [False] * 2
    assert master.stats()["pinned_evictions"] == 0
    master.index.check_invariants()
