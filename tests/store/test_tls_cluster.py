"""TLS and mutual TLS on REAL master and node processes (127.0.0.1), with certificates from kvpool/certs.py.

Two pools, both with authentication on: `tls_pool` (server certificates; clients verify them with the CA) and
`mtls_pool` (tls_require_client_cert + auth_cert_roles: a client certificate of the CA is required on every channel,
the data channel included, and OU/O name the caller when it sends no token). Round trips are byte-exact over the
node's TLS data channel (transport "tcp") and over shared memory (transport "auto", same host); untrusted, missing
and expired client certificates are refused by the master's gRPC port and by the node's data channel alike.
"""

from __future__ import annotations

import socket
import ssl

import grpc
import pytest

from kvpool import PoolClient
from kvpool.errors import PoolUnavailable
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store.auth import TokenSource, auth_channel
from kvpool.store.data_channel import DataClient, Extent
from kvpool.store.tls import TlsConfig
from tests.store.cluster import Cluster
from tests.store.pki import pki  # noqa: F401 - fixture
from tests.store.test_secure_cluster import OBJ, TOKENS, auth_args, blob, key, write_tokens


def server_args(pki, *, mutual: bool) -> list[str]:  # noqa: F811
    args = ["--tls-cert", pki.path("server"), "--tls-key", pki.path("server", "key"), "--tls-ca", pki.path("ca")]
    return args + (["--tls-require-client-cert", "true", "--auth-cert-roles", "true"] if mutual else [])


def start(tmp_path_factory, pki, *, mutual: bool) -> Cluster:  # noqa: F811
    work = tmp_path_factory.mktemp("mtls" if mutual else "tls")
    tokens = write_tokens(work / "tokens")
    # The test's own health checks present a certificate when the servers require one.
    c = Cluster(workdir=work, tls=TlsConfig(ca=pki.path("ca"), cert=pki.path("acme") if mutual else "",
                                            key=pki.path("acme", "key") if mutual else ""))
    try:
        c.start_master(extra=auth_args(work / "tokens") + server_args(pki, mutual=mutual))
        c.start_node("n1", dram="4MiB", ssd="8MiB",
                     extra=["--auth-node-tokens", f"file:{work / 'tokens' / 'node.tokens'}",
                            *server_args(pki, mutual=mutual)])
    except BaseException:
        c.close()
        print(c.logs())
        raise
    c.tokens = tokens
    return c


@pytest.fixture(scope="module")
def tls_pool(tmp_path_factory, pki):  # noqa: F811
    c = start(tmp_path_factory, pki, mutual=False)
    yield c
    c.close()
    print(c.logs())


@pytest.fixture(scope="module")
def mtls_pool(tmp_path_factory, pki):  # noqa: F811
    c = start(tmp_path_factory, pki, mutual=True)
    yield c
    c.close()
    print(c.logs())


def round_trip(c: PoolClient, salt: int) -> None:
    keys = [key(i, salt) for i in range(6)]
    datas = [blob(i, salt) for i in range(6)]
    assert c.put_many(keys, datas) == ["stored"] * 6
    for _ in range(3):      # over TCP the third get is the location cache's: dated reads, over TLS here too
        bufs = [bytearray(OBJ) for _ in keys]
        assert c.get_many_into(keys, bufs) == 6
        assert bufs == [bytearray(d) for d in datas]
    assert c.transfers.dated_reads == (6 if c.transport == "tcp" else 0) and c.transfers.stamp_refusals == 0
    assert c.remove_many(keys) == 6


def data_address(pool, tls: TlsConfig, token: str | None) -> tuple[str, bool]:
    """The node's data channel address and its data_tls flag, as a Lookup reply's node table gives them."""
    with PoolClient(pool.master.address, token=token, tls=tls, timeout=5) as c:
        assert c.put_many([key(99, 99)], [blob(99, 99)]) == ["stored"]
        with auth_channel(pool.master.address, tls=tls,
                          token=TokenSource(token) if token else None) as ch:
            reply = pbg.MasterServiceStub(ch).Lookup(pb.LookupRequest(keys=[key(99, 99)], lease=False), timeout=5)
            assert reply.hits == 1
            reply = pbg.MasterServiceStub(ch).Lookup(pb.LookupRequest(keys=[key(99, 99)], lease=True), timeout=5)
            pbg.MasterServiceStub(ch).Release(pb.ReleaseRequest(lease_ids=[reply.lease_id]), timeout=5)
        c.remove_many([key(99, 99)])
    return reply.nodes[0].data_address, reply.nodes[0].data_tls


def plaintext_request_refused(address: str) -> bool:
    """A plaintext data-channel header sent to a TLS data channel gets no data-channel reply: the server reads it as
    a broken TLS handshake and closes."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(Extent(1, 1, 0, 16, 2**62, b"t" * 16).header(2))
        try:
            return s.recv(16) == b""
        except ConnectionResetError:
            return True


def test_tls_round_trip_byte_exact_over_the_data_channel_and_shared_memory(tls_pool, pki):  # noqa: F811
    ca = TlsConfig(ca=pki.path("ca"))
    for salt, transport in enumerate(("tcp", "auto")):
        with PoolClient(tls_pool.master.address, transport=transport, token=tls_pool.tokens["acme"], tls=ca,
                        timeout=5) as c:
            round_trip(c, salt)
    address, data_tls = data_address(tls_pool, ca, tls_pool.tokens["acme"])
    assert data_tls and plaintext_request_refused(address)


def test_tls_master_refuses_plaintext_and_clients_that_trust_another_ca(tls_pool, pki):  # noqa: F811
    for tls in (None, TlsConfig(ca=pki.path("rogue_ca"))):
        with pytest.raises(PoolUnavailable):
            PoolClient(tls_pool.master.address, token=tls_pool.tokens["acme"], tls=tls, timeout=2,
                       connect_timeout=2).close()


def test_mtls_round_trip_with_a_client_certificate_as_the_only_credential(mtls_pool, pki):  # noqa: F811
    acme_cert = TlsConfig(ca=pki.path("ca"), cert=pki.path("acme"), key=pki.path("acme", "key"))
    for salt, transport in enumerate(("tcp", "auto")):
        with PoolClient(mtls_pool.master.address, transport=transport, tls=acme_cert, timeout=5) as c:
            round_trip(c, 10 + salt)
            assert set(c.stats()["tenants"]) == {"acme"}  # the certificate's O= is the tenant
    address, data_tls = data_address(mtls_pool, acme_cert, None)
    assert data_tls and plaintext_request_refused(address)
    # The node checks roles too: a client certificate is a verified identity there, but not a node's.
    with auth_channel(mtls_pool.nodes["n1"].address, tls=acme_cert) as ch, pytest.raises(grpc.RpcError) as err:
        pbg.NodeServiceStub(ch).Drop(pb.DropRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert err.value.details() == "/kvpool.v1.NodeService/Drop: needs a node credential; this one is client"


@pytest.mark.parametrize("who", ["none", "rogue", "expired_client"])
def test_mtls_refuses_missing_untrusted_and_expired_client_certificates(mtls_pool, pki, who):  # noqa: F811
    ca_pem = pki.ca.cert_pem
    if who == "none":
        creds = grpc.ssl_channel_credentials(ca_pem)
    else:  # straight from PEM bytes: TlsConfig itself refuses to load an expired certificate of its own
        issued = getattr(pki, who)
        creds = grpc.ssl_channel_credentials(ca_pem, issued.key_pem, issued.cert_pem)
    token = [("authorization", f"Bearer {TOKENS['admin']}")]  # a valid token does not make up for the certificate
    with grpc.secure_channel(mtls_pool.master.address, creds) as ch, pytest.raises(grpc.RpcError) as err:
        pbg.MasterServiceStub(ch).Stats(pb.StatsRequest(), metadata=token, timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    # ... and the node's data channel refuses the same peer at its handshake.
    address, _ = data_address(mtls_pool, TlsConfig(ca=pki.path("ca"), cert=pki.path("acme"),
                                                   key=pki.path("acme", "key")), None)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=pki.path("ca"))
    if who != "none":
        ctx.load_cert_chain(pki.path(who), pki.path(who, "key"))
    client = DataClient(address, timeout=5, ssl_context=ctx)
    try:
        with pytest.raises(OSError):  # ssl.SSLError or a reset: either way no byte is served
            client.read_many_into([Extent(1, 1, 0, 16, 2**62, b"t" * 16)], [memoryview(bytearray(16))])
    finally:
        client.close()
