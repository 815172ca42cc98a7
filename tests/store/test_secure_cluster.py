"""Authentication, tenants and quotas on REAL master and node processes (`python -m kvpool.cli` on 127.0.0.1).

One authenticated pool per module (tests/store/cluster.py): a master with node / admin / viewer / client token files
(clients acme with a DRAM quota of 2 objects, so its objects sit in DRAM and SSD; beta; q with a total quota of 4
objects) and one node that presents the node token. Every refused call is checked to change nothing:
the admin's view of the pool (objects, where they are, grants, leases, drains, counters) is equal before and after,
and the objects read back byte-exact (verify="all" hashes even same-host copies).
"""

from __future__ import annotations

import os
import time

import grpc
import pytest

from kvpool import Namespace, PoolClient
from kvpool.admin import AdminClient
from kvpool.errors import PoolAuthError
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import wire
from kvpool.store.auth import GRANT, METHOD_RULES, PUBLIC, Role, TokenSource, auth_channel
from kvpool.store.control_channel import CHANNEL_METHODS, ControlClient
from kvpool.store.node import Drop, Move, Publication
from kvpool.store.records import ObjectRecord
from kvpool.tiers.types import Tier
from tests.store.cluster import Cluster, free_port, spawn

OBJ = 16 << 10
NS = Namespace(model="sec", fingerprint="f", kv_dtype="float16", block_tokens=16, num_layers=1, num_kv_heads=1,
               head_dim=256)  # 16 KiB blocks
TOKENS = {"node": "node-token-0123456789abcdef", "admin": "admin-token-0123456789abcd",
          "viewer": "viewer-token-0123456789abc", "acme": "acme-token-0123456789abcde",
          "beta": "beta-token-0123456789abcde", "q": "quota-token-0123456789abcd"}
ROLE = {"node": Role.NODE, "admin": Role.ADMIN, "viewer": Role.VIEWER, "acme": Role.CLIENT, "beta": Role.CLIENT,
        "q": Role.CLIENT}


def key(i: int, salt: int = 0) -> bytes:
    return (salt << 64 | i).to_bytes(16, "big")


def blob(i: int, salt: int = 0) -> bytes:
    return bytes([(i * 31 + salt * 7 + 1) % 251]) * 8 + i.to_bytes(8, "little") * ((OBJ - 8) // 8)


def write_tokens(d) -> dict[str, str]:
    """Server-side token files and one file per caller (what it presents); returns {name: file: source}."""
    d.mkdir(exist_ok=True)
    (d / "node.tokens").write_text(TOKENS["node"] + "\n")
    (d / "admin.tokens").write_text(TOKENS["admin"] + "\n")
    (d / "viewer.tokens").write_text(TOKENS["viewer"] + "\n")
    (d / "client.tokens").write_text("".join(f"{t}:{TOKENS[t]}\n" for t in ("acme", "beta", "q")))
    for name, tok in TOKENS.items():
        (d / f"{name}.token").write_text(tok + "\n")
    return {name: f"file:{d / f'{name}.token'}" for name in TOKENS}


def auth_args(d) -> list[str]:
    return ["--auth-node-tokens", f"file:{d / 'node.tokens'}", "--auth-admin-tokens", f"file:{d / 'admin.tokens'}",
            "--auth-viewer-tokens", f"file:{d / 'viewer.tokens'}", "--auth-client-tokens",
            f"file:{d / 'client.tokens'}", "--auth-reload-interval-s", "0"]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    work = tmp_path_factory.mktemp("secure")
    tokens = write_tokens(work / "tokens")
    c = Cluster(workdir=work)
    try:
        c.start_master(extra=auth_args(work / "tokens") + ["--tenant-quotas", f"acme:dram={2 * OBJ};q:total={4 * OBJ}"])
        c.start_node("n1", dram="1MiB", ssd="2MiB",
                     extra=["--auth-node-tokens", f"file:{work / 'tokens' / 'node.tokens'}"])
        c.tokens = tokens
        c.token_dir = work / "tokens"
        yield c
    finally:
        c.close()
        print(c.logs())


def client(pool, name, **kw) -> PoolClient:
    return PoolClient(pool.master.address, token=pool.tokens[name], timeout=5, **kw)


def admin(pool, name="admin") -> AdminClient:
    return AdminClient(pool.master.address, token=pool.tokens[name])


def pool_state(pool) -> dict:
    """Everything a refused call could have changed, as the admin sees it."""
    with admin(pool) as a:
        stats = a.raw_stats()
        rows = list(a.list())
    keep = ("objects", "tiers", "nodes", "grants_open", "leases_open", "draining", "moves_open", "evictions",
            "demotions", "promotions", "lookups", "requested_keys", "namespaces", "tenants")
    return {"stats": {k: stats.get(k) for k in keep}, "rows": rows}


def copied(a: AdminClient, deadline_s: float = 30.0) -> None:
    """Wait until the write-behind has copied every object (none queued, none being copied: pinned)."""
    end = time.monotonic() + deadline_s
    while a.raw_stats()["write_behind"]["pending"]:
        assert time.monotonic() < end, "the write-behind did not catch up"
        time.sleep(0.01)


def channel(address, name=None):
    return auth_channel(address, token=TokenSource("env:T", env={"T": TOKENS[name]}) if name else None)


def put_and_check(c: PoolClient, keys, datas):
    assert c.put_many(keys, datas) == ["stored"] * len(keys)
    bufs = [bytearray(OBJ) for _ in keys]
    assert c.get_many_into(keys, bufs) == len(keys)
    assert bufs == [bytearray(d) for d in datas]


def leases_ended(pool) -> None:
    """Wait for the get's read lease to end (the client releases it within a few ms, or a next lookup takes it)."""
    deadline = time.monotonic() + 10
    with admin(pool) as a:
        while a.raw_stats()["leases_open"]:
            assert time.monotonic() < deadline, "the read lease was never released"
            time.sleep(0.005)


# ---------------------------------------------------------------- every RPC, every credential


def damaging_requests(pool, rows) -> dict[str, object]:
    """A request per method that WOULD change the pool (or leak it) if it ran."""
    stored = [bytes.fromhex(r["key"]) for r in rows]
    on_ssd = next(r for r in rows if r["tier"] == "ssd")
    on_dram = next(r for r in rows if r["tier"] == "dram")
    ids = list(range(1, 64))
    mallory = pb.NodeEndpoint(node_id="mallory", host_id="x", data_address="127.0.0.1:1",
                              control_address="127.0.0.1:1", tiers=[pb.TierCapacity(tier=pb.DRAM, capacity_bytes=OBJ)])
    move = Move(bytes.fromhex(on_ssd["key"]), bytes(16), OBJ, 0, Tier.SSD, on_ssd["offset"], Tier.DRAM,
                on_dram["offset"])  # would copy an SSD object over a DRAM one
    m = "/kvpool.v1.MasterService/"
    n = "/kvpool.v1.NodeService/"
    return {
        m + "RegisterNode": pb.RegisterNodeRequest(node=mallory),
        m + "Heartbeat": pb.HeartbeatRequest(node_id="n1"),
        m + "ReportObjects": wire.report_to_msg("n1", [ObjectRecord(b"m" * 16, bytes(16), "n1", Tier.SSD, 1 << 19,
                                                                    OBJ, 0)]),
        m + "DrainNode": pb.DrainNodeRequest(node_id="n1"),
        m + "FlushNode": pb.FlushNodeRequest(node_id="n1"),
        m + "PutStart": pb.PutStartRequest(keys=[b"x" * 16], sizes=[OBJ]),
        m + "PutCommit": pb.PutCommitRequest(grant_ids=ids, checksums=[0] * len(ids)),
        m + "PutAbort": pb.PutAbortRequest(grant_ids=ids),
        m + "Lookup": pb.LookupRequest(keys=[key(i) for i in range(3)], lease=True),
        m + "Release": pb.ReleaseRequest(lease_ids=ids),
        m + "Contains": pb.ContainsRequest(keys=[key(i) for i in range(3)]),
        m + "Remove": pb.RemoveRequest(keys=[key(i) for i in range(3)] + stored),
        m + "List": pb.ListRequest(),
        m + "Inspect": pb.InspectRequest(keys=stored),
        m + "Evict": pb.EvictRequest(),
        m + "Stats": pb.StatsRequest(),
        m + "BeginDrain": pb.BeginDrainRequest(node_id="n1"),
        m + "MigrateStart": pb.MigrateStartRequest(node_id="n1"),
        m + "MigrateCommit": pb.MigrateCommitRequest(move_ids=ids, checksums=[0] * len(ids)),
        m + "MigrateAbort": pb.MigrateAbortRequest(move_ids=ids),
        m + "StartRecording": pb.StartRecordingRequest(directory="/tmp/kvpool-never-recorded", duration_s=60),
        m + "StopRecording": pb.StopRecordingRequest(),
        m + "Hello": pb.HelloRequest(),
        n + "Demote": wire.moves_to_msg([move]),
        n + "Promote": wire.moves_to_msg([move]),
        n + "Drop": wire.drops_to_msg([Drop(bytes.fromhex(on_ssd["key"]), Tier.SSD, on_ssd["offset"], OBJ)]),
        # would point a DRAM object's key at another extent in the node's host index
        n + "Publish": wire.publication_to_msg(Publication((bytes.fromhex(on_dram["key"]),), (0,), (OBJ,), (0,))),
    }


def invoke(pool, full: str, request, who):
    service, name = full[1:].split("/")
    address = pool.master.address if service == "kvpool.v1.MasterService" else pool.nodes["n1"].address
    stub_cls = pbg.MasterServiceStub if service == "kvpool.v1.MasterService" else pbg.NodeServiceStub
    with channel(address, who) as ch:
        try:
            getattr(stub_cls(ch), name)(request, timeout=5)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def test_every_rpc_without_a_credential_or_with_the_wrong_role_is_refused_and_changes_nothing(pool):
    keys, datas = [key(i) for i in range(3)], [blob(i) for i in range(3)]
    with client(pool, "acme", verify="all") as acme:
        put_and_check(acme, keys, datas)
        with admin(pool) as a:
            rows = list(a.list(tenant="acme"))
        assert sorted(r["tier"] for r in rows) == ["dram", "dram", "ssd"]
        requests = damaging_requests(pool, rows)
        assert set(requests) == {full for full, rule in METHOD_RULES.items()
                                 if rule not in (PUBLIC, GRANT)}  # every authenticated RPC of both servers
        leases_ended(pool)
        before = pool_state(pool)
        refused = []
        for who in (None, "node", "acme", "viewer", "admin"):
            for full, request in requests.items():
                if who is not None and ROLE[who] in METHOD_RULES[full]:
                    continue  # allowed: calling it would (rightly) change things
                code, details = invoke(pool, full, request, who)
                # A node knows the cluster's node tokens only (never the tenants'): any other token is unknown there.
                unknown = who is None or (full.startswith("/kvpool.v1.NodeService/") and who != "node")
                expected = grpc.StatusCode.UNAUTHENTICATED if unknown else grpc.StatusCode.PERMISSION_DENIED
                assert code == expected, (who, full, code, details)
                refused.append((who, full))
        # 27 authenticated RPCs: all refused without a credential; a node may call 8 of them, a client 9, a viewer 2,
        # an admin 13
        assert len(refused) == 27 + 19 + 18 + 25 + 14
        assert pool_state(pool) == before
        bufs = [bytearray(OBJ) for _ in keys]
        assert acme.get_many_into(keys, bufs) == 3 and bufs == [bytearray(d) for d in datas]
        assert acme.remove_many(keys) == 3


def test_every_control_channel_call_without_a_credential_or_with_the_wrong_role_is_refused(pool):
    """The same rules over the master's control channel (store/control_channel.py), which PoolClient uses for its
    hot calls: the token travels with each request and the method table is the gRPC one."""
    keys, datas = [key(i, salt=3) for i in range(3)], [blob(i, 3) for i in range(3)]
    with client(pool, "acme", verify="all") as acme:
        assert acme.rpc.uses_control_channel()
        put_and_check(acme, keys, datas)
        with admin(pool) as a:
            rows = list(a.list(tenant="acme"))
        requests = {full.rsplit("/", 1)[1]: req for full, req in damaging_requests(pool, rows).items()
                    if full.startswith("/kvpool.v1.MasterService/") and full.rsplit("/", 1)[1] in CHANNEL_METHODS}
        assert sorted(requests) == sorted(CHANNEL_METHODS)
        with channel(pool.master.address, "acme") as ch:
            hello = pbg.MasterServiceStub(ch).Hello(pb.HelloRequest(), timeout=5)
        assert hello.control_port and len(hello.instance) == 16 and not hello.control_tls
        ctl = ControlClient("127.0.0.1", hello.control_port, hello.instance)
        leases_ended(pool)
        before = pool_state(pool)
        refused = []
        try:
            for who in (None, "unknown", "node", "acme", "viewer", "admin"):
                token = {None: "", "unknown": "not-a-known-token-0000"}.get(who, TOKENS.get(who, ""))
                for name, request in requests.items():
                    if who in ROLE and ROLE[who] in METHOD_RULES[f"/kvpool.v1.MasterService/{name}"]:
                        continue  # allowed: calling it would (rightly) change things
                    code, body = ctl.call(name, request.SerializeToString(), token, 5.0)
                    expected = {None: (16, "authorization: missing credential (send 'authorization: Bearer <token>')"),
                                "unknown": (16, "authorization: unknown or revoked token")}.get(who)
                    if expected is None:
                        rule = METHOD_RULES[f"/kvpool.v1.MasterService/{name}"]
                        need = " or ".join(sorted(r.value for r in rule))
                        expected = (7, f"{name}: needs a {need} credential; this one is {ROLE[who].value}")
                    assert (code, body.decode()) == expected, (who, name)
                    refused.append((who, name))
        finally:
            ctl.close()
        # 7 channel methods: all refused without a token or with an unknown one; a node, a viewer may call none of
        # them; a client all; an admin only Remove
        assert len(refused) == 7 + 7 + 7 + 0 + 7 + 6
        assert pool_state(pool) == before
        bufs = [bytearray(OBJ) for _ in keys]
        assert acme.get_many_into(keys, bufs) == 3 and bufs == [bytearray(d) for d in datas]
        assert acme.remove_many(keys) == 3


def test_a_caller_without_a_node_credential_cannot_register_or_learn_the_secret(pool, tmp_path):
    ep = pb.NodeEndpoint(node_id="mallory", host_id="x", data_address="127.0.0.1:1", control_address="127.0.0.1:1")
    for who, code in ((None, grpc.StatusCode.UNAUTHENTICATED), ("acme", grpc.StatusCode.PERMISSION_DENIED),
                      ("admin", grpc.StatusCode.PERMISSION_DENIED), ("viewer", grpc.StatusCode.PERMISSION_DENIED)):
        with channel(pool.master.address, who) as ch, pytest.raises(grpc.RpcError) as err:
            pbg.MasterServiceStub(ch).RegisterNode(pb.RegisterNodeRequest(node=ep), timeout=5)
        assert err.value.code() == code
    # Real node processes with no node token, and with a well-formed token the master does not know: they serve,
    # but never register (health stays NOT_SERVING), and the master never lists them.
    (tmp_path / "wrong.token").write_text("node-token-guessed-00000000\n")
    rogues = []
    wrong = ["--auth-node-tokens", f"file:{tmp_path / 'wrong.token'}"]
    for name, extra in (("rogue-none", []), ("rogue-wrong", wrong)):
        port = free_port()
        proc = spawn(name, ["node", "--master", pool.master.address, "--node-id", name, "--listen",
                            f"127.0.0.1:{port}", "--dram-bytes", "1MiB", "--heartbeat-s", "0.2", "--shm-dir",
                            pool.shm_dir, *extra], tmp_path)
        rogues.append(proc)
    try:
        deadline = time.monotonic() + 30
        expected = {"rogue-none": "UNAUTHENTICATED", "rogue-wrong": "UNAUTHENTICATED"}
        while any(f"StatusCode.{code}" not in p.log() for p, code in zip(rogues, expected.values())):
            assert time.monotonic() < deadline, [p.log()[-2000:] for p in rogues]
            time.sleep(0.1)
        with admin(pool) as a:
            assert sorted(a.raw_stats()["nodes"]) == ["n1"]
    finally:
        for p in rogues:
            p.kill()


# ---------------------------------------------------------------- tenants


def test_tenant_b_with_tenant_a_exact_keys_misses_and_cannot_remove_list_or_inspect(pool):
    keys = [key(i, salt=7) for i in range(2)]
    with client(pool, "acme") as acme, client(pool, "beta") as beta:
        put_and_check(acme, keys, [blob(i, 7) for i in range(2)])
        bufs = [bytearray(OBJ) for _ in keys]
        assert beta.get_many_into(keys, bufs) == 0 and beta.lookup_prefix(keys) == 0
        assert beta.contains_many(keys) == [False, False] and beta.remove_many(keys) == 0
        view = beta.stats()
        assert view["nodes"] == {} and set(view["tenants"]) == {"beta"}  # nothing of acme, nor of the nodes
        with admin(pool, "beta") as as_beta:
            for call in (lambda: list(as_beta.list()), lambda: as_beta.inspect([k.hex() for k in keys]),
                         lambda: as_beta.evict(older_than_s=1.0)):
                with pytest.raises(PoolAuthError, match="PERMISSION_DENIED"):
                    call()
        # B's own objects under the same key bytes are B's: each tenant reads its own bytes.
        assert beta.put_many(keys, [blob(9, 9)] * 2) == ["stored", "stored"]
        assert beta.get_many_into(keys, bufs) == 2 and bufs == [bytearray(blob(9, 9))] * 2
        assert acme.get_many_into(keys, bufs) == 2 and bufs == [bytearray(blob(i, 7)) for i in range(2)]
        # The admin sees everything, as stored: tenant-owned, under keys that are not the tenants' key bytes.
        with admin(pool) as a:
            assert a.inspect([k.hex() for k in keys]) == [None, None]
            mine = {r["key"]: r for r in a.list(tenant="acme")}
            assert len(mine) == 2 and not {k.hex() for k in keys} & set(mine)
            assert {r["tenant"] for r in a.list()} >= {"acme", "beta"}
            stats = a.raw_stats()
            assert stats["tenants"]["beta"]["objects"] == 2 and stats["tenants"]["acme"]["objects"] >= 2
        assert beta.remove_many(keys) == 2 and acme.contains_many(keys) == [True, True]
        assert acme.remove_many(keys) == 2


def test_quota_evicts_only_the_tenants_own_objects_in_order_and_leaves_others_untouched(pool):
    acme_keys = [key(i, salt=3) for i in range(2)]
    q_keys = [key(i, salt=4) for i in range(7)]
    with client(pool, "acme") as acme, client(pool, "q") as q, admin(pool) as a:
        assert acme.put_many(acme_keys, [blob(i, 3) for i in range(2)], namespace=NS) == ["stored"] * 2
        assert acme.get_many_into(acme_keys, [bytearray(OBJ) for _ in acme_keys], namespace=NS) == 2
        for k in q_keys[:4]:
            assert q.put_many([k], [blob(k[-1], 4)]) == ["stored"]
        assert q.get_many_into(q_keys[:1], [bytearray(OBJ)]) == 1        # q0 becomes q's hottest
        acme_before = a.raw_stats()["tenants"]["acme"]
        evicted = []
        for k in q_keys[4:]:
            copied(a)       # a quota walk passes over objects the write-behind is copying (pinned): not a victim
            before = q.contains_many(q_keys)
            assert q.put_many([k], [blob(k[-1], 4)]) == ["stored"]
            after = q.contains_many(q_keys)
            evicted += [i for i in range(7) if before[i] and not after[i]]
        assert evicted == [1, 2, 3]                                       # q's coldest, in order; q0 kept
        assert q.contains_many(q_keys) == [True, False, False, False, True, True, True]
        stats = a.raw_stats()
        assert stats["tenants"]["q"]["bytes"] == 4 * OBJ and stats["tenants"]["q"]["quota_evictions"] == 3
        assert stats["tenants"]["q"]["quota"] == {"dram_bytes": 0, "total_bytes": 4 * OBJ}
        assert stats["tenants"]["acme"] == acme_before                     # objects, bytes, hit counters: untouched
        bufs = [bytearray(OBJ) for _ in acme_keys]
        assert acme.get_many_into(acme_keys, bufs, namespace=NS) == 2
        assert bufs == [bytearray(blob(i, 3)) for i in range(2)]
        acme.stats()        # sends the report of that get, which acme's location cache served without a lookup
        after = a.raw_stats()["tenants"]["acme"]
        assert after["hit_rate"] == acme_before["hit_rate"] == 1.0
        assert after["requested_tokens"] == acme_before["requested_tokens"] + 32  # its own get, nothing else
        acme.remove_many(acme_keys)
        q.remove_many(q_keys)


# ---------------------------------------------------------------- rotation


def test_admin_and_client_tokens_rotate_without_restart(pool):
    d = pool.token_dir
    new_admin, new_acme = "admin-token-rotated-0000001", "acme-token-rotated-00000001"

    def replace(path, text):
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    mine = d / "acme-rotating.token"
    mine.write_text(TOKENS["acme"])
    rotating = TokenSource(f"file:{mine}", reload_interval_s=0)
    try:
        with AdminClient(pool.master.address, token=f"file:{d / 'admin.token'}") as old_admin, \
                PoolClient(pool.master.address, token=rotating, timeout=5) as acme:
            (d / "admin-new.token").write_text(new_admin)
            with AdminClient(pool.master.address, token=f"file:{d / 'admin-new.token'}") as fresh:
                with pytest.raises(PoolAuthError, match="UNAUTHENTICATED"):
                    fresh.raw_stats()
                replace(d / "admin.tokens", f"{TOKENS['admin']}\n{new_admin}\n")       # both accepted
                assert fresh.raw_stats()["nodes_alive"] == old_admin.raw_stats()["nodes_alive"] == 1
                replace(d / "admin.tokens", f"{new_admin}\n")                          # the old one revoked
                fresh.raw_stats()
                with pytest.raises(PoolAuthError, match="UNAUTHENTICATED"):
                    old_admin.raw_stats()
            # A client's token: the master accepts old + new, the client's file switches, the old is revoked; the
            # same PoolClient (same channel) keeps working throughout.
            assert acme.put_many([key(1, 11)], [blob(1, 11)]) == ["stored"]
            replace(d / "client.tokens", f"acme:{TOKENS['acme']}\nacme:{new_acme}\nbeta:{TOKENS['beta']}\n"
                                         f"q:{TOKENS['q']}\n")
            replace(mine, new_acme)
            replace(d / "client.tokens", f"acme:{new_acme}\nbeta:{TOKENS['beta']}\nq:{TOKENS['q']}\n")
            assert acme.contains_many([key(1, 11)]) == [True]                          # same tenant, new token
            with client(pool, "acme") as old_acme:  # presents the revoked token
                with pytest.raises(PoolAuthError, match="UNAUTHENTICATED"):
                    old_acme.contains_many([key(1, 11)])
            assert acme.remove_many([key(1, 11)]) == 1
    finally:
        write_tokens(d)


# ---------------------------------------------------------------- drain (last: it retires n1)


def test_drain_needs_an_admin_token_and_moves_tenant_objects_byte_exact(pool):
    keys, datas = [key(i, salt=21) for i in range(3)], [blob(i, 21) for i in range(3)]
    with client(pool, "acme", verify="all") as acme:
        put_and_check(acme, keys, datas)                 # acme's DRAM quota: one of the three sits on SSD
        pool.start_node("n2", dram="1MiB", ssd="2MiB",
                        extra=["--auth-node-tokens", f"file:{pool.token_dir / 'node.tokens'}"])
        with admin(pool, "viewer") as viewer, pytest.raises(PoolAuthError, match="PERMISSION_DENIED"):
            viewer.drain("n1")
        with admin(pool) as a:
            assert a.raw_stats()["draining"] == []      # the refused drain changed nothing
            assert a.drain("n1") == {"node": "n1", "moved": 3, "dropped": 0, "no_room": 0, "failed": 0,
                                     "passes": 1}
            rows = list(a.list(tenant="acme"))
            assert [r["node"] for r in rows] == ["n2"] * 3 and sorted(r["tier"] for r in rows) == ["dram",
                                                                                               "dram", "ssd"]
        bufs = [bytearray(OBJ) for _ in keys]
        assert acme.get_many_into(keys, bufs) == 3 and bufs == [bytearray(d) for d in datas]
