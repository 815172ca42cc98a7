"""What security costs: the auth interceptor per RPC, TLS on gRPC, and TLS on the node's raw TCP data channel.

All measured in this one run, servers in a child process (as in production, client and server do not share a GIL):
  rpc plain       a unary MasterService.Contains (16 keys) to a trivial servicer, no interceptor (today)
  rpc auth        the same with AuthInterceptor, token added by the client's BearerInterceptor (auth_channel)
  rpc auth-md     the same, token passed as `metadata=` on each call (no client interceptor)
  rpc auth-1k     as auth, with 1,000 client tenants configured on the server
  rpc tls         TLS channel, no auth;   rpc tls+auth   TLS + interceptor
  data plain/tls/mtls   DataClient write then read of COUNT objects of SIZE bytes (default 2 MiB) with token checks,
                  into a bytearray arena in the child; plaintext, TLS, mutual TLS
  raw plain/tls   the physical limit: the child sendall()s the same bytes, the client recv_into()s them, no framing
Rounds are interleaved (every variant once per round) and the best round is kept (the least disturbed by other load
on the machine): per-RPC figures are the mean latency of CALLS sequential calls in the best of RPC_ROUNDS rounds,
data figures the best of ROUNDS. `identify` is TokenStore.identify in-process,
beside a hmac.compare_digest scan over the same number of token digests.
`rpc_cost()` and `data_channel_cost()` return the numbers, for bench/pool_remote.py to call.

    python bench/security.py [--calls 500] [--rpc-rounds 20] [--size 2MiB] [--count 24] [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

RPC_VARIANTS = ("plain", "auth", "auth-md", "auth-1k", "tls", "tls+auth")
DATA_VARIANTS = ("plain", "tls", "mtls")
RAW_VARIANTS = ("plain", "tls")
CLIENT_TOKEN = "bench-client-token-000000000000"
ARENA = 64 << 20


def make_pki(out: Path) -> None:
    from kvpool import certs

    ca = certs.make_ca()
    certs.save(ca, out, "ca")
    certs.save(certs.issue(ca, "server"), out, "server")
    certs.save(certs.issue(ca, "bench", kind="client", role="client", tenant="bench"), out, "client")


def make_tokens(out: Path, tenants: int) -> dict:
    (out / "node.tokens").write_text("bench-node-token-000000000000\n")
    (out / "admin.tokens").write_text("bench-admin-token-00000000000\n")
    lines = [f"bench:{CLIENT_TOKEN}"] + [f"t{i}:bench-tenant-{i:012d}-token" for i in range(tenants - 1)]
    (out / f"client{tenants}.tokens").write_text("\n".join(lines) + "\n")
    return dict(node_tokens=[f"file:{out / 'node.tokens'}"], admin_tokens=[f"file:{out / 'admin.tokens'}"],
                client_tokens=[f"file:{out / f'client{tenants}.tokens'}"])


def _tls(pki: Path, *, server: bool, mutual: bool = False):
    from kvpool.store.tls import TlsConfig

    if server:
        return TlsConfig(cert=str(pki / "server.pem"), key=str(pki / "server.key"), ca=str(pki / "ca.pem"),
                         require_client_cert=mutual)
    return TlsConfig(cert=str(pki / "client.pem") if mutual else "", key=str(pki / "client.key") if mutual else "",
                     ca=str(pki / "ca.pem"))


class _Contains:
    """MasterService with one trivial method; built lazily so the module imports without grpc in the parent."""

    @staticmethod
    def servicer():
        from kvpool.proto import kvpool_pb2 as pb
        from kvpool.proto import kvpool_pb2_grpc as pbg

        class S(pbg.MasterServiceServicer):
            def Contains(self, request, context):
                return pb.ContainsResponse(present=[False] * len(request.keys))

        return S()


def _raw_server(sock, ctx, size: int) -> None:
    """Answer an 8-byte count with count x size bytes, for ever (one connection at a time)."""
    import socket

    payload = memoryview(bytes(size))
    while True:
        conn, _ = sock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if ctx is not None:
                conn = ctx.wrap_socket(conn, server_side=True)
            while True:
                head = b""
                while len(head) < 8:
                    part = conn.recv(8 - len(head))
                    if not part:
                        raise ConnectionError
                    head += part
                for _ in range(int.from_bytes(head, "little")):
                    conn.sendall(payload)
        except (ConnectionError, OSError):
            conn.close()


def serve(work: str, size: int, ready) -> None:
    """Child process: every RPC and data variant on its own port; sends {variant: address} then serves forever."""
    from concurrent import futures

    import grpc

    from kvpool.proto import kvpool_pb2_grpc as pbg
    from kvpool.store import tokens
    from kvpool.store.auth import AuthConfig, AuthInterceptor, TokenStore
    from kvpool.store.data_channel import DataServer

    pki = Path(work)
    auth = {n: AuthInterceptor(TokenStore(AuthConfig(**make_tokens(pki, n)))) for n in (1, 1000)}
    addresses = {}
    keep = []
    for variant in RPC_VARIANTS:
        interceptors = [auth[1000 if variant == "auth-1k" else 1]] if "auth" in variant else []
        server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=interceptors)
        pbg.add_MasterServiceServicer_to_server(_Contains.servicer(), server)
        if variant.startswith("tls"):
            port = server.add_secure_port("127.0.0.1:0", _tls(pki, server=True).server_credentials())
        else:
            port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        keep.append(server)
        addresses[f"rpc {variant}"] = f"127.0.0.1:{port}"

    class Arena:
        def __init__(self):
            self.view = memoryview(bytearray(ARENA))

        def _check(self, kind, e):
            tokens.verify(b"bench-secret", kind, e.ident, e.tier, e.offset, e.size, e.expires_ms, e.token)
            return self.view[e.offset:e.offset + e.size]

        def write_view(self, e):
            return self._check(tokens.WRITE, e)

        def write_done(self, e, view):
            pass

        def read_view(self, e):
            return self._check(tokens.READ, e)

    for variant in DATA_VARIANTS:
        ctx = None if variant == "plain" else _tls(pki, server=True, mutual=variant == "mtls").server_ssl_context()
        server = DataServer(Arena(), ssl_context=ctx).start()
        keep.append(server)
        addresses[f"data {variant}"] = server.address
    import socket
    import threading

    for variant in RAW_VARIANTS:
        sock = socket.create_server(("127.0.0.1", 0))
        ctx = None if variant == "plain" else _tls(pki, server=True).server_ssl_context()
        threading.Thread(target=_raw_server, args=(sock, ctx, size), daemon=True).start()
        addresses[f"raw {variant}"] = f"127.0.0.1:{sock.getsockname()[1]}"
    ready.send(addresses)
    time.sleep(3600)


def start_servers(work: Path, size: int):
    ctx = mp.get_context("spawn")  # no fork after grpc: the child builds its own servers
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(str(work), size, child), daemon=True)
    proc.start()
    if not parent.poll(120):
        proc.kill()
        raise TimeoutError("bench servers did not start in 120 s")
    return proc, parent.recv()


def _rpc_channel(variant: str, address: str, pki: Path):
    from kvpool.store.auth import TokenSource, auth_channel

    token = TokenSource("env:T", env={"T": CLIENT_TOKEN}) if variant in ("auth", "auth-1k", "tls+auth") else None
    tls = _tls(pki, server=False) if variant.startswith("tls") else None
    return auth_channel(address, token=token, tls=tls)


def rpc_cost(addresses: dict, pki: Path, *, calls: int, rounds: int, bar=None) -> dict[str, float]:
    """Mean seconds per Contains call in the best of `rounds` interleaved rounds, per RPC variant."""
    from kvpool.proto import kvpool_pb2 as pb
    from kvpool.proto import kvpool_pb2_grpc as pbg

    request = pb.ContainsRequest(keys=[bytes([i]) * 16 for i in range(16)])
    from kvpool.store.auth import bearer_metadata

    stubs, channels = {}, []
    for variant in RPC_VARIANTS:
        ch = _rpc_channel(variant, addresses[f"rpc {variant}"], pki)
        channels.append(ch)
        stub = pbg.MasterServiceStub(ch).Contains
        if variant == "auth-md":
            stub = functools.partial(stub, metadata=bearer_metadata(CLIENT_TOKEN))
        stubs[variant] = stub
        for _ in range(50):  # connect, handshake, warm up
            stubs[variant](request, timeout=10)
    per = {v: [] for v in RPC_VARIANTS}
    for _ in range(rounds):
        for variant in RPC_VARIANTS:
            call = stubs[variant]
            t0 = time.perf_counter()
            for _ in range(calls):
                call(request, timeout=10)
            per[variant].append((time.perf_counter() - t0) / calls)
            if bar is not None:
                bar.update()
    for ch in channels:
        ch.close()
    return {v: min(t) for v, t in per.items()}


def data_channel_cost(addresses: dict, pki: Path, *, size: int, count: int, rounds: int,
                      bar=None) -> dict[str, tuple[float, float]]:
    """Best (write, read) seconds for `count` objects of `size` bytes, per data variant; bytes checked each round."""
    from kvpool.store import tokens
    from kvpool.store.data_channel import DataClient, Extent

    count = min(count, ARENA // size)
    src = bytearray(size * count)
    src[::4096] = bytes(range(256)) * (len(src[::4096]) // 256) + bytes(len(src[::4096]) % 256)
    dst = bytearray(len(src))
    exp = tokens.now_ms() + 3_600_000

    def extents(kind):
        return [Extent(i, 1, i * size, size, exp, tokens.sign(b"bench-secret", kind, i, 1, i * size, size, exp))
                for i in range(count)]

    writes, reads = extents(tokens.WRITE), extents(tokens.READ)
    srcs = [memoryview(src)[i * size:(i + 1) * size] for i in range(count)]
    dsts = [memoryview(dst)[i * size:(i + 1) * size] for i in range(count)]
    clients = {}
    for variant in DATA_VARIANTS:
        ctx = None if variant == "plain" else _tls(pki, server=False, mutual=variant == "mtls").client_ssl_context()
        clients[variant] = DataClient(addresses[f"data {variant}"], ssl_context=ctx, server_hostname="127.0.0.1")
    raws = {v: _raw_connect(addresses[f"raw {v}"], None if v == "plain" else _tls(pki, server=False).client_ssl_context())
            for v in RAW_VARIANTS}
    best = {v: [float("inf"), float("inf")] for v in DATA_VARIANTS}
    for _ in range(rounds):
        for variant in DATA_VARIANTS:
            client = clients[variant]
            t0 = time.perf_counter()
            assert not any(client.write_many(writes, srcs))
            t1 = time.perf_counter()
            assert not any(client.read_many_into(reads, dsts))
            t2 = time.perf_counter()
            assert dst == src, f"data {variant}: bytes differ"
            dst[:] = bytes(len(dst))
            best[variant] = [min(best[variant][0], t1 - t0), min(best[variant][1], t2 - t1)]
            if bar is not None:
                bar.update()
            raw_variant = {"plain": "plain", "tls": "tls"}.get(variant)
            if raw_variant:
                best[f"raw {raw_variant}"] = [0.0, min(best.get(f"raw {raw_variant}", [0, float("inf")])[1],
                                                       _raw_read(raws[raw_variant], count, dsts))]
    for client in clients.values():
        client.close()
    for sock in raws.values():
        sock.close()
    return {v: (w, r) for v, (w, r) in best.items()}


def _raw_connect(address: str, ctx):
    import socket

    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return ctx.wrap_socket(sock, server_hostname=host) if ctx is not None else sock


def _raw_read(sock, count: int, dsts) -> float:
    t0 = time.perf_counter()
    sock.sendall(count.to_bytes(8, "little"))
    for view in dsts:
        got = 0
        while got < len(view):
            got += sock.recv_into(view[got:])
    return time.perf_counter() - t0


def identify_cost(work: Path, tenants: int, n: int = 20000) -> tuple[float, float]:
    """(TokenStore.identify, a compare_digest scan over as many SHA-256 digests), seconds per call."""
    import hashlib
    import hmac

    from kvpool.store.auth import AuthConfig, TokenStore

    store = TokenStore(AuthConfig(**make_tokens(work, tenants)))
    t0 = time.perf_counter()
    for _ in range(n):
        store.identify(CLIENT_TOKEN)
    t1 = time.perf_counter()
    digests = [hashlib.sha256(f"bench-tenant-{i:012d}-token".encode()).digest() for i in range(len(store))]
    for _ in range(n // 10):
        d = hashlib.sha256(CLIENT_TOKEN.encode()).digest()
        hit = False
        for entry in digests:
            hit |= hmac.compare_digest(entry, d)
    t2 = time.perf_counter()
    return (t1 - t0) / n, (t2 - t1) / (n // 10)


def interceptor_cost(work: Path, n: int = 20000) -> tuple[float, float]:
    """CPU seconds per RPC added by auth, without the network: (server: AuthInterceptor.intercept_service + the bound
    handler call, minus the same without it; client: BearerInterceptor building the call details)."""
    from collections import namedtuple

    import grpc

    from kvpool.store.auth import AuthConfig, AuthInterceptor, BearerInterceptor, TokenStore, bearer_metadata

    interceptor = AuthInterceptor(TokenStore(AuthConfig(**make_tokens(work, 1))))
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: None)
    details = namedtuple("D", "method invocation_metadata")("/kvpool.v1.MasterService/Lookup",
                                                            (("user-agent", "grpc-python"),
                                                             *bearer_metadata(CLIENT_TOKEN)))
    continuation = lambda d: handler  # noqa: E731
    t0 = time.perf_counter()
    for _ in range(n):
        continuation(details).unary_unary(None, None)
    t1 = time.perf_counter()
    for _ in range(n):
        interceptor.intercept_service(continuation, details).unary_unary(None, None)
    t2 = time.perf_counter()
    bearer = BearerInterceptor(lambda: CLIENT_TOKEN)
    call = namedtuple("C", "method timeout metadata credentials wait_for_ready compression")(
        "/kvpool.v1.MasterService/Lookup", 10, None, None, None, None)
    t3 = time.perf_counter()
    for _ in range(n):
        bearer._details(call)  # noqa: SLF001
    t4 = time.perf_counter()
    return ((t2 - t1) - (t1 - t0)) / n, (t4 - t3) / n


def main(argv=None) -> int:
    from kvpool.config import parse_size

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=500, help="sequential RPCs per variant per round")
    ap.add_argument("--rpc-rounds", type=int, default=20, help="interleaved rounds of RPC calls")
    ap.add_argument("--size", default="2MiB", help="data channel object size")
    ap.add_argument("--count", type=int, default=24, help="data channel objects per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    size = parse_size(args.size, "--size")
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-sec-") as tmp:
        work = Path(tmp)
        make_pki(work)
        proc, addresses = start_servers(work, size)
        try:
            total = args.rpc_rounds * len(RPC_VARIANTS) + args.rounds * len(DATA_VARIANTS)
            with tqdm(total=total, desc="security", file=sys.stderr) as bar:
                rpc = rpc_cost(addresses, work, calls=args.calls, rounds=args.rpc_rounds, bar=bar)
                data = data_channel_cost(addresses, work, size=size, count=args.count, rounds=args.rounds, bar=bar)
            ident = {n: identify_cost(work, n) for n in (1, 1000)}
            server_cpu, client_cpu = interceptor_cost(work)
        finally:
            proc.kill()
    count = min(args.count, ARENA // size)
    print(f"per-RPC: {args.calls} sequential unary calls, best of {args.rpc_rounds} interleaved rounds; "
          "loopback, server in a child process")
    for v in RPC_VARIANTS:
        print(f"rpc {v:9s} {rpc[v] * 1e6:8.1f} us/call")
    for v, what in (("auth", "token by client interceptor"), ("auth-md", "token as per-call metadata"),
                    ("auth-1k", "1,000 tenants configured"), ("tls", "TLS, no auth"), ("tls+auth", "TLS + auth")):
        print(f"{v + '/plain':17s} {rpc[v] / rpc['plain']:.3f}x  ({(rpc[v] - rpc['plain']) * 1e6:+.1f} us/RPC, {what})")
    for n, (store, scan) in ident.items():
        print(f"TokenStore.identify with {n + 2:5d} tokens: {store * 1e6:6.2f} us   "
              f"(compare_digest scan over {n + 2}: {scan * 1e6:7.2f} us)")
    print(f"auth CPU per RPC without the network: server interceptor {server_cpu * 1e6:.2f} us, "
          f"client BearerInterceptor {client_cpu * 1e6:.2f} us")
    gb = size * count / 1e9
    print(f"data channel: {count} x {size} bytes, best of {args.rounds}, token checks on, bytes verified")
    for v in DATA_VARIANTS:
        w, r = data[v]
        print(f"data {v:5s} write {gb / w:6.2f} GB/s   read {gb / r:6.2f} GB/s")
    for v in RAW_VARIANTS:
        print(f"raw  {v:5s}                      read {gb / data[f'raw {v}'][1]:6.2f} GB/s   (sendall -> recv_into)")
    for v in ("tls", "mtls"):
        print(f"data {v}/plain: write {data['plain'][0] / data[v][0]:.2f}x  read {data['plain'][1] / data[v][1]:.2f}x")
    print(f"data tls read / raw tls read: {data['raw tls'][1] / data['tls'][1]:.2f}x   "
          f"raw tls / raw plain: {data['raw plain'][1] / data['raw tls'][1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
