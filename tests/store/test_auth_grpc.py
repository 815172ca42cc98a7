"""AuthInterceptor on real gRPC servers on 127.0.0.1: every RPC of kvpool.v1 and the health service, each role.

The servicer is built from the real generated stubs (kvpool_pb2_grpc) with a trivial body per method that records
who called it, so "the handler never ran" is checked exactly; the node's real NodeServicer checks the GRANT rule.
"""

from __future__ import annotations

import os
from concurrent import futures

import grpc
import pytest

from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store.auth import (GRANT, METHOD_RULES, PUBLIC, AuthConfig, AuthInterceptor, Identity, Role,
                               TokenSource, TokenStore, auth_channel, current_identity)
from kvpool.store.tls import TlsConfig
from tests.store.grpc_recorder import Server, all_methods, call
from tests.store.pki import pki  # noqa: F401 - fixture

TOKENS = {Role.NODE: "node-token-aaaaaaaaaaaa", Role.ADMIN: "admin-token-0123456789",
          Role.CLIENT: "acme-token-0123456789ab"}


@pytest.fixture
def token_files(tmp_path):
    files = {}
    for role, token in TOKENS.items():
        files[role] = tmp_path / f"{role.value}.tokens"
        files[role].write_text(f"acme:{token}\n" if role is Role.CLIENT else f"{token}\n")
    return files


@pytest.fixture
def authed(token_files):
    cfg = AuthConfig(node_tokens=[f"file:{token_files[Role.NODE]}"], admin_tokens=[f"file:{token_files[Role.ADMIN]}"],
                     client_tokens=[f"file:{token_files[Role.CLIENT]}"], reload_interval_s=0)
    rejected = []
    server = Server([AuthInterceptor(TokenStore(cfg), on_reject=lambda m, c: rejected.append((m, c)))])
    server.rejected = rejected
    yield server
    server.close()


def channel_for(address, token, **kw):
    return auth_channel(address, token=TokenSource("env:T", env={"T": token}) if token else None, **kw)


def test_the_table_names_every_rpc_kvpool_serves():
    assert set(METHOD_RULES) == {full for full, _, _ in all_methods()}


def test_every_rpc_without_a_credential_is_unauthenticated_and_its_handler_never_runs(authed):
    with channel_for(authed.address, None) as ch:
        for full, module, m in all_methods():
            code, details = call(ch, full, module, m)
            rule = METHOD_RULES[full]
            if rule in (PUBLIC, GRANT):  # health; node Write/Read carry their own HMAC grant (handler checks it)
                unimplemented = full == "/grpc.health.v1.Health/List"  # grpc_health's servicer lacks it
                assert code == (grpc.StatusCode.UNIMPLEMENTED if unimplemented else grpc.StatusCode.OK), full
            else:
                assert code == grpc.StatusCode.UNAUTHENTICATED, full
                assert details == "authorization: missing credential (send 'authorization: Bearer <token>')"
    ran = {name for name, _ in authed.calls}
    node = "/kvpool.v1.NodeService/"
    assert ran == {node + "Write", node + "Read", node + "Read:after-yield"}
    assert all(ident is None for _, ident in authed.calls)
    refused = [full for full, _, _ in all_methods() if METHOD_RULES[full] not in (PUBLIC, GRANT)]
    assert authed.rejected == [(full, grpc.StatusCode.UNAUTHENTICATED) for full in refused]


def test_each_role_may_call_exactly_its_methods_and_the_handler_sees_the_identity(authed):
    for role, token in TOKENS.items():
        expected = Identity(role, "acme" if role is Role.CLIENT else "", f"{role.value}_tokens[0]")
        with channel_for(authed.address, token) as ch:
            for full, module, m in all_methods():
                rule = METHOD_RULES[full]
                if rule in (PUBLIC, GRANT):
                    continue
                authed.calls.clear()
                code, details = call(ch, full, module, m)
                if role in rule:
                    assert code == grpc.StatusCode.OK, (role, full)
                    assert authed.calls == [(full, expected)]
                else:
                    assert code == grpc.StatusCode.PERMISSION_DENIED, (role, full)
                    assert details.startswith(f"{full}: needs a ") and details.endswith(f"this one is {role.value}")
                    assert authed.calls == []


def test_master_methods_by_role():
    by_role = {r: sorted(m.rsplit("/", 1)[1] for m, rule in METHOD_RULES.items()
                         if m.startswith("/kvpool.v1.MasterService/") and r in rule) for r in Role}
    assert by_role[Role.NODE] == ["FlushNode", "Heartbeat", "RegisterNode", "ReportObjects"]
    assert by_role[Role.CLIENT] == ["Contains", "Hello", "Lookup", "PutAbort", "PutCommit", "PutStart", "Release",
                                    "Remove", "Stats"]
    assert by_role[Role.ADMIN] == ["BeginDrain", "DrainNode", "Evict", "Hello", "Inspect", "List", "MigrateAbort",
                                   "MigrateCommit", "MigrateStart", "Remove", "StartRecording", "Stats",
                                   "StopRecording"]
    assert by_role[Role.VIEWER] == ["Hello", "Stats"]


@pytest.mark.parametrize("header, details", [
    ("Bearer not-a-known-token-0000", "authorization: unknown or revoked token"),
    ("Basic YWRtaW46YWRtaW4=", "authorization: malformed header, expected 'Bearer <token>'"),
    ("Bearer", "authorization: malformed header, expected 'Bearer <token>'"),
    (f"Token {TOKENS[Role.ADMIN]}", "authorization: malformed header, expected 'Bearer <token>'"),
])
def test_bad_authorization_headers_are_unauthenticated(authed, header, details):
    with grpc.insecure_channel(authed.address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pbg.MasterServiceStub(ch).Evict(pb.EvictRequest(), metadata=[("authorization", header)], timeout=5)
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, details)
    assert authed.calls == []


def test_token_rotation_without_restart(authed, token_files):
    old, new = TOKENS[Role.ADMIN], "admin-token-rotated-000001"
    stats = lambda ch: call(ch, "/kvpool.v1.MasterService/Stats", pb,  # noqa: E731
                            pb.DESCRIPTOR.services_by_name["MasterService"].methods_by_name["Stats"])[0]
    with channel_for(authed.address, old) as old_ch, channel_for(authed.address, new) as new_ch:
        assert (stats(old_ch), stats(new_ch)) == (grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED)
        tmp = f"{token_files[Role.ADMIN]}.new"
        with open(tmp, "w") as f:
            f.write(f"{old}\n{new}\n")
        os.replace(tmp, token_files[Role.ADMIN])
        assert (stats(old_ch), stats(new_ch)) == (grpc.StatusCode.OK, grpc.StatusCode.OK)
        with open(tmp, "w") as f:
            f.write(f"{new}\n")
        os.replace(tmp, token_files[Role.ADMIN])
        assert (stats(old_ch), stats(new_ch)) == (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OK)


def test_client_token_file_rotation_is_followed_by_the_channel(authed, token_files, tmp_path):
    mine = tmp_path / "mine.token"
    mine.write_text(f"acme:{TOKENS[Role.CLIENT]}\n")
    src = TokenSource(f"file:{mine}", reload_interval_s=0)
    with auth_channel(authed.address, token=src) as ch:
        stub = pbg.MasterServiceStub(ch)
        stub.Contains(pb.ContainsRequest(), timeout=5)
        tmp = tmp_path / "mine.tmp"
        tmp.write_text(TOKENS[Role.ADMIN])
        os.replace(tmp, mine)
        stub.Evict(pb.EvictRequest(), timeout=5)  # the same channel now presents the admin token
    assert [(name, ident.role) for name, ident in authed.calls] == [
        ("/kvpool.v1.MasterService/Contains", Role.CLIENT), ("/kvpool.v1.MasterService/Evict", Role.ADMIN)]


def test_streaming_replies_see_the_identity_at_every_step(token_files):
    def count(request, context):
        for i in range(3):
            ident = current_identity()
            yield f"{i}:{ident.role.value}:{ident.tenant}".encode()

    def echo_all(request_iterator, context):
        for item in request_iterator:
            yield item + current_identity().tenant.encode()

    handler = grpc.method_handlers_generic_handler("test.Echo", {
        "Count": grpc.unary_stream_rpc_method_handler(count),
        "EchoAll": grpc.stream_stream_rpc_method_handler(echo_all)})
    clients = frozenset({Role.CLIENT})
    rules = {**METHOD_RULES, "/test.Echo/Count": clients, "/test.Echo/EchoAll": clients}
    store = TokenStore(AuthConfig(client_tokens=[f"file:{token_files[Role.CLIENT]}"]))
    server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[handler],
                         interceptors=[AuthInterceptor(store, rules=rules)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with channel_for(f"127.0.0.1:{port}", TOKENS[Role.CLIENT]) as ch:
            assert list(ch.unary_stream("/test.Echo/Count")(b"", timeout=5)) == [b"0:client:acme", b"1:client:acme",
                                                                                b"2:client:acme"]
            assert list(ch.stream_stream("/test.Echo/EchoAll")(iter([b"a", b"b"]), timeout=5)) == [b"aacme", b"bacme"]
        with channel_for(f"127.0.0.1:{port}", None) as ch:
            with pytest.raises(grpc.RpcError) as err:
                list(ch.unary_stream("/test.Echo/Count")(b"", timeout=5))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(0).wait()
    assert current_identity() is None


def test_a_method_missing_from_the_table_is_refused(token_files):
    handler = grpc.method_handlers_generic_handler("test.New", {
        "Call": grpc.unary_unary_rpc_method_handler(lambda request, context: b"ran")})
    store = TokenStore(AuthConfig(admin_tokens=[f"file:{token_files[Role.ADMIN]}"]))
    server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[handler], interceptors=[AuthInterceptor(store)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with channel_for(f"127.0.0.1:{port}", TOKENS[Role.ADMIN]) as ch:
            with pytest.raises(grpc.RpcError) as err:
                ch.unary_unary("/test.New/Call")(b"", timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert err.value.details() == "/test.New/Call: not callable with authentication on"
    finally:
        server.stop(0).wait()


def test_auth_off_is_todays_behaviour():
    server = Server([])
    try:
        with channel_for(server.address, None) as ch:
            codes = {full: call(ch, full, module, m)[0] for full, module, m in all_methods()}
        assert codes == {full: grpc.StatusCode.UNIMPLEMENTED if full == "/grpc.health.v1.Health/List"
                         else grpc.StatusCode.OK for full in METHOD_RULES}
        assert len(server.calls) == 29 + 1 and all(ident is None for _, ident in server.calls)
    finally:
        server.close()


def test_the_real_node_servicer_grant_and_node_rules(tmp_path, token_files):
    from kvpool.store.config import NodeConfig
    from kvpool.store.node import StorageNode
    from kvpool.store.node_data import NodeDataHandler
    from kvpool.store.node_server import NodeServicer

    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=1 << 20, shm_dir=str(tmp_path)))
    handler = NodeDataHandler(node)
    handler.secret = b"s" * 32
    store = TokenStore(AuthConfig(node_tokens=[f"file:{token_files[Role.NODE]}"],
                                  client_tokens=[f"file:{token_files[Role.CLIENT]}"]))
    server = grpc.server(futures.ThreadPoolExecutor(2), interceptors=[AuthInterceptor(store)])
    pbg.add_NodeServiceServicer_to_server(NodeServicer(node, handler), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    forged = pb.WriteChunk(grant_id=1, tier=1, offset=0, size=4, expires_unix_ms=2**62, token=b"f" * 16, data=b"evil")
    try:
        for token in (None, TOKENS[Role.CLIENT]):
            with channel_for(f"127.0.0.1:{port}", token) as ch:
                stub = pbg.NodeServiceStub(ch)
                with pytest.raises(grpc.RpcError) as err:
                    stub.Write(iter([forged]), timeout=5)
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert err.value.details().startswith("token: does not match the grant")
                with pytest.raises(grpc.RpcError) as err:
                    stub.Drop(pb.DropRequest(), timeout=5)
                assert err.value.code() == (grpc.StatusCode.UNAUTHENTICATED if token is None
                                            else grpc.StatusCode.PERMISSION_DENIED)
        assert bytes(node.dram.view(0, 4)) == bytes(4)
        with channel_for(f"127.0.0.1:{port}", TOKENS[Role.NODE]) as ch:
            assert pbg.NodeServiceStub(ch).Drop(pb.DropRequest(), timeout=5).dropped == 0
    finally:
        server.stop(0).wait()
        node.close()


# --- client certificates as identities (mutual TLS, cert_roles) ---------------------------------------------------

@pytest.fixture
def mtls_server(pki, token_files):  # noqa: F811
    tls = TlsConfig(cert=pki.path("server"), key=pki.path("server", "key"), ca=pki.path("ca"),
                    require_client_cert=True)
    store = TokenStore(AuthConfig(admin_tokens=[f"file:{token_files[Role.ADMIN]}"], cert_roles=True))
    server = Server([AuthInterceptor(store, cert_roles=True)], tls=tls)
    yield server
    server.close()


def client_tls(pki, name):  # noqa: F811
    return TlsConfig(cert=pki.path(name), key=pki.path(name, "key"), ca=pki.path("ca"))


def test_a_verified_client_certificate_is_the_identity(mtls_server, pki):  # noqa: F811
    with auth_channel(mtls_server.address, tls=client_tls(pki, "acme")) as ch:
        stub = pbg.MasterServiceStub(ch)
        stub.Lookup(pb.LookupRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as err:
            stub.Evict(pb.EvictRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert err.value.details() == "/kvpool.v1.MasterService/Evict: needs a admin credential; this one is client"
    with auth_channel(mtls_server.address, tls=client_tls(pki, "admin")) as ch:
        pbg.MasterServiceStub(ch).Evict(pb.EvictRequest(), timeout=5)
    assert mtls_server.calls == [
        ("/kvpool.v1.MasterService/Lookup", Identity(Role.CLIENT, "acme", "cert CN=engine-a")),
        ("/kvpool.v1.MasterService/Evict", Identity(Role.ADMIN, "", "cert CN=alice"))]


def test_a_certificate_without_a_role_needs_a_token_and_a_token_decides_alone(mtls_server, pki):  # noqa: F811
    with auth_channel(mtls_server.address, tls=client_tls(pki, "nobody")) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pbg.MasterServiceStub(ch).Stats(pb.StatsRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    token = TokenSource("env:T", env={"T": TOKENS[Role.ADMIN]})
    with auth_channel(mtls_server.address, tls=client_tls(pki, "nobody"), token=token) as ch:
        pbg.MasterServiceStub(ch).Evict(pb.EvictRequest(), timeout=5)
    bad = TokenSource("env:T", env={"T": "admin-token-revoked-0000"})
    with auth_channel(mtls_server.address, tls=client_tls(pki, "admin"), token=bad) as ch:
        with pytest.raises(grpc.RpcError) as err:  # a bad token is not rescued by a good certificate
            pbg.MasterServiceStub(ch).Evict(pb.EvictRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert [(n, i.name) for n, i in mtls_server.calls] == [("/kvpool.v1.MasterService/Evict", "admin_tokens[0]")]
