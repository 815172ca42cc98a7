"""TLS and mutual TLS on real gRPC servers and the real TCP data channel, on 127.0.0.1, with certificates made by
kvpool/certs.py: round trips byte-exact, untrusted and expired certificates refused, validation naming the field."""

from __future__ import annotations

import random
import socket
import ssl

import grpc
import pytest

from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import tokens
from kvpool.store.auth import AuthConfig, AuthInterceptor, Identity, Role, TokenSource, TokenStore, auth_channel
from kvpool.store.data_channel import DENIED, DataClient, DataServer
from kvpool.store.tls import TlsConfig
from tests.store.grpc_recorder import Server
from tests.store.pki import pki  # noqa: F401 - fixture
from tests.store.test_data_channel import Arena, ext

ADMIN = "admin-token-0123456789"


def server_tls(pki, *, mutual=False, name="server"):  # noqa: F811
    return TlsConfig(cert=pki.path(name), key=pki.path(name, "key"), ca=pki.path("ca"), require_client_cert=mutual)


def client_tls(pki, name=None, *, ca="ca", server_name=""):  # noqa: F811
    return TlsConfig(cert=pki.path(name) if name else "", key=pki.path(name, "key") if name else "",
                     ca=pki.path(ca), server_name=server_name)


def raw_channel_creds(pki, name):  # noqa: F811
    """Credentials straight from PEM bytes: TlsConfig refuses an expired certificate of its own, and the point here is
    that the PEER refuses it."""
    issued = getattr(pki, name)
    return grpc.ssl_channel_credentials(pki.ca.cert_pem, issued.key_pem, issued.cert_pem)


def stats_code(channel):
    try:
        pbg.MasterServiceStub(channel).Stats(pb.StatsRequest(), timeout=5)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


# --- TlsConfig -----------------------------------------------------------------------------------------------------

def test_tls_config_validation_names_the_field(pki, tmp_path):  # noqa: F811
    cases = [
        (dict(cert=str(tmp_path / "missing.pem"), key=pki.path("server", "key")), "cert: file "),
        (dict(cert=pki.path("server")), "cert/key: give both"),
        (dict(cert=pki.path("server"), key=pki.path("acme", "key")), "key: "),
        (dict(cert=pki.path("server", "key"), key=pki.path("server", "key")), "cert: "),
        (dict(ca=pki.path("server", "key")), "ca: "),
        (dict(cert=pki.path("server"), key=pki.path("server", "key"), require_client_cert=True),
         "require_client_cert: needs ca"),
        (dict(cert=pki.path("expired_server"), key=pki.path("expired_server", "key")), "cert: "),
        (dict(), "cert/ca: a TLS config needs"),
        (dict(ca=pki.path("ca"), require_client_cert="yes"), "require_client_cert: expected true or false"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError) as err:
            TlsConfig(**kwargs)
        assert str(err.value).startswith(message), (kwargs, str(err.value))
    assert "is not the private key of the certificate" in _err(cert=pki.path("server"), key=pki.path("acme", "key"))
    assert "not now; issue a new one" in _err(cert=pki.path("expired_server"), key=pki.path("expired_server", "key"))
    assert TlsConfig.maybe() is None
    with pytest.raises(ValueError, match="^require_client_cert: needs TLS"):
        TlsConfig.maybe(require_client_cert=True)
    with pytest.raises(ValueError, match="^cert/key: a TLS server needs its own certificate"):
        TlsConfig(ca=pki.path("ca")).server_credentials()


def _err(**kwargs) -> str:
    with pytest.raises(ValueError) as err:
        TlsConfig(**kwargs)
    return str(err.value)


# --- gRPC ----------------------------------------------------------------------------------------------------------

def test_grpc_over_tls_with_a_token_round_trips_and_untrusted_or_plaintext_clients_fail(pki, tmp_path):  # noqa: F811
    (tmp_path / "admin.tokens").write_text(ADMIN)
    store = TokenStore(AuthConfig(admin_tokens=[f"file:{tmp_path / 'admin.tokens'}"]))
    server = Server([AuthInterceptor(store)], tls=server_tls(pki))
    token = TokenSource("env:T", env={"T": ADMIN})
    try:
        with auth_channel(server.address, tls=client_tls(pki), token=token) as ch:
            pbg.MasterServiceStub(ch).Evict(pb.EvictRequest(), timeout=5)
        assert server.calls == [("/kvpool.v1.MasterService/Evict", Identity(Role.ADMIN, "", "admin_tokens[0]"))]
        with auth_channel(server.address, tls=client_tls(pki), token=None) as ch:
            assert stats_code(ch) == grpc.StatusCode.UNAUTHENTICATED  # TLS is no credential by itself
        with auth_channel(server.address, tls=client_tls(pki, ca="rogue_ca"), token=token) as ch:
            assert stats_code(ch) == grpc.StatusCode.UNAVAILABLE      # server's certificate not trusted
        with auth_channel(server.address, tls=client_tls(pki, server_name="wrong.example"), token=token) as ch:
            assert stats_code(ch) == grpc.StatusCode.UNAVAILABLE      # name not in the certificate's SANs
        with auth_channel(server.address, tls=client_tls(pki, server_name="localhost"), token=token) as ch:
            assert stats_code(ch) == grpc.StatusCode.OK
        with auth_channel(server.address, token=token) as ch:
            assert stats_code(ch) == grpc.StatusCode.UNAVAILABLE      # plaintext to a TLS port
        assert len(server.calls) == 2
    finally:
        server.close()


def test_mutual_tls_refuses_missing_untrusted_and_expired_client_certificates(pki):  # noqa: F811
    server = Server([], tls=server_tls(pki, mutual=True))
    try:
        with auth_channel(server.address, tls=client_tls(pki, "acme")) as ch:
            assert stats_code(ch) == grpc.StatusCode.OK
        with auth_channel(server.address, tls=client_tls(pki)) as ch:
            assert stats_code(ch) == grpc.StatusCode.UNAVAILABLE      # no client certificate
        for name in ("rogue", "expired_client"):
            with grpc.secure_channel(server.address, raw_channel_creds(pki, name)) as ch:
                assert stats_code(ch) == grpc.StatusCode.UNAVAILABLE, name
        with grpc.secure_channel(server.address, raw_channel_creds(pki, "admin")) as ch:
            assert stats_code(ch) == grpc.StatusCode.OK               # the same path with a good certificate
        assert len(server.calls) == 2
    finally:
        server.close()


def test_an_expired_server_certificate_is_refused_by_the_client(pki):  # noqa: F811
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(2))
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
        [(pki.expired_server.key_pem, pki.expired_server.cert_pem)]))
    server.start()
    try:
        with auth_channel(f"127.0.0.1:{port}", tls=client_tls(pki)) as ch:
            assert stats_code(ch) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0).wait()


# --- the TCP data channel ------------------------------------------------------------------------------------------

@pytest.fixture
def data_server(pki, request):  # noqa: F811
    arena = Arena(size=8 << 20)
    mutual = getattr(request, "param", False)
    server = DataServer(arena, ssl_context=server_tls(pki, mutual=mutual).server_ssl_context(),
                        handshake_timeout_s=5).start()
    yield arena, server
    server.close()


def payloads():
    rng = random.Random(7)
    sizes = [2 << 20] + [rng.randrange(1, 50_000) for _ in range(69)]  # one 2 MiB object, then more than a window
    return [rng.randbytes(n) for n in sizes]


def test_data_channel_over_tls_is_byte_exact_and_checks_tokens(pki, data_server):  # noqa: F811
    arena, server = data_server
    client = DataClient(server.address, timeout=5, ssl_context=client_tls(pki).client_ssl_context())
    try:
        data = payloads()
        offsets, pos = [], 0
        for p in data:
            offsets.append(pos)
            pos += (len(p) + 4095) // 4096 * 4096
        writes = [ext(tokens.WRITE, i, offsets[i], len(p)) for i, p in enumerate(data)]
        forged = ext(tokens.WRITE, 99, pos, 100, secret=b"x" * 32)
        results = client.write_many([*writes, forged], [*(memoryview(p) for p in data), memoryview(b"F" * 100)])
        assert results[:-1] == [None] * len(data) and results[-1].status == DENIED
        assert bytes(arena.buf[pos:pos + 100]) == bytes(100)
        outs = [bytearray(len(p)) for p in data]
        reads = [ext(tokens.READ, 7, offsets[i], len(p)) for i, p in enumerate(data)]
        assert client.read_many_into(reads, [memoryview(o) for o in outs]) == [None] * len(data)
        assert [bytes(o) for o in outs] == data
        stale = ext(tokens.READ, 8, 0, 100, expires=tokens.now_ms() - 1)
        result = client.read_many_into([stale], [memoryview(bytearray(100))])[0]
        assert (result.status, result.message) == (DENIED, "expires_unix_ms: lease expired")
    finally:
        client.close()


def test_checked_ssd_reads_over_tls_are_read_and_verified_by_the_node(pki, tmp_path, monkeypatch):  # noqa: F811
    """FLAG_CHECKED over TLS: an SSLSocket cannot sendfile, so the node reads and verifies each SSD record as for any
    read (a damaged payload is its NOT_FOUND), and the client's digests still come back."""
    import os

    import xxhash

    from kvpool.tiers.types import Tier
    from tests.store.test_data_channel import _real_node, tiered

    node, handler = _real_node(tmp_path)
    server = DataServer(handler, ssl_context=server_tls(pki).server_ssl_context(), handshake_timeout_s=5).start()
    client = DataClient(server.address, timeout=5, ssl_context=client_tls(pki).client_ssl_context())
    monkeypatch.setattr(os, "sendfile", lambda *a: pytest.fail("sendfile on a TLS connection"))
    try:
        data = [bytes([i + 1]) * 4096 for i in range(3)]
        for i in range(3):
            node.write(Tier.SSD, i * 8192, bytes([i]) * 16, bytes(16), data[i], None)
        with open(node.ssd.path, "r+b") as raw:          # record 1's payload: one byte flipped
            raw.seek(8192 + 4096)
            raw.write(b"\xff")
        reads = [tiered(tokens.READ, 1, Tier.SSD, i * 8192, 4096, key=bytes([i]) * 16) for i in range(3)]
        outs, digests = [bytearray(4096) for _ in reads], [None] * 3
        results = client.read_many_into(reads, [memoryview(o) for o in outs], digests=digests)
        assert [r.status if r else None for r in results] == [None, 3, None]
        assert results[1].message == "checksum: SSD record failed verification (served as a miss)"
        assert [bytes(outs[0]), bytes(outs[2])] == [data[0], data[2]]
        assert [digests[0], digests[2]] == [xxhash.xxh3_64_intdigest(data[0]), xxhash.xxh3_64_intdigest(data[2])]
        assert handler.file_reads == 0 and node.ssd.corrupt_reads == 1
    finally:
        client.close()
        server.close()
        node.close()


def test_data_channel_tls_refuses_plaintext_and_untrusted_peers_and_keeps_serving(pki, data_server):  # noqa: F811
    arena, server = data_server
    host, port = server.address.rsplit(":", 1)
    silent = socket.create_connection((host, int(port)))
    try:  # a peer that never handshakes holds only its own thread, not the accept loop
        plain = DataClient(server.address, timeout=5)
        with pytest.raises(OSError):
            plain.write_many([ext(tokens.WRITE, 1, 0, 4)], [memoryview(b"evil")])
        plain.close()
        rogue_ctx = client_tls(pki, ca="rogue_ca").client_ssl_context()
        untrusting = DataClient(server.address, timeout=5, ssl_context=rogue_ctx)
        with pytest.raises(ssl.SSLCertVerificationError):
            untrusting.write_many([ext(tokens.WRITE, 1, 0, 4)], [memoryview(b"evil")])
        untrusting.close()
        wrong_name = DataClient(server.address, timeout=5, ssl_context=client_tls(pki).client_ssl_context(),
                                server_hostname="wrong.example")
        with pytest.raises(ssl.SSLCertVerificationError):
            wrong_name.write_many([ext(tokens.WRITE, 1, 0, 4)], [memoryview(b"evil")])
        wrong_name.close()
        assert bytes(arena.buf[:4]) == bytes(4) and arena.done == []
        good = DataClient(server.address, timeout=5, ssl_context=client_tls(pki).client_ssl_context())
        assert good.write_many([ext(tokens.WRITE, 1, 0, 4)], [memoryview(b"good")]) == [None]
        good.close()
        assert bytes(arena.buf[:4]) == b"good"
    finally:
        silent.close()


@pytest.mark.parametrize("data_server", [True], indirect=True)
def test_data_channel_mutual_tls_refuses_missing_untrusted_expired_client_certs(pki, data_server):  # noqa: F811
    arena, server = data_server

    def ctx_with(name):
        ctx = client_tls(pki).client_ssl_context()
        if name:  # loaded straight into the context: TlsConfig itself refuses an expired certificate of its own
            ctx.load_cert_chain(pki.path(name), pki.path(name, "key"))
        return ctx

    for name in (None, "rogue", "expired_client"):
        client = DataClient(server.address, timeout=5, ssl_context=ctx_with(name))
        with pytest.raises(OSError):  # TLS 1.3: the refusal arrives as an alert at the first read
            client.write_many([ext(tokens.WRITE, 1, 0, 4)], [memoryview(b"evil")])
        client.close()
    assert bytes(arena.buf[:4]) == bytes(4) and arena.done == []
    client = DataClient(server.address, timeout=5, ssl_context=client_tls(pki, "acme").client_ssl_context())
    assert client.write_many([ext(tokens.WRITE, 1, 0, 4)], [memoryview(b"good")]) == [None]
    client.close()
    assert bytes(arena.buf[:4]) == b"good"


def test_data_channel_client_refuses_an_expired_server_certificate(pki):  # noqa: F811
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.path("expired_server"), pki.path("expired_server", "key"))
    arena = Arena()
    server = DataServer(arena, ssl_context=ctx).start()
    client = DataClient(server.address, timeout=5, ssl_context=client_tls(pki).client_ssl_context())
    try:
        with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
            client.write_many([ext(tokens.WRITE, 1, 0, 4)], [memoryview(b"evil")])
        assert arena.done == []
    finally:
        client.close()
        server.close()
