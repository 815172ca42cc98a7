"""Which transport carries a storage node's bulk bytes: gRPC streaming or the raw TCP data channel?

Both servers run in a child process (so client and server do not share one GIL, as in production) and are the
node's own: a `StorageNode` with a 64 MiB DRAM arena behind `NodeDataHandler` (token checks on), served by the real
`DataServer` or the real gRPC `NodeServicer`. The client writes then reads N objects of SIZE bytes into a
preallocated buffer. A plain loopback socket (sendall / recv_into, no framing) is the physical limit.

    python bench/data_channel.py [--size 2MiB] [--count 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import sys
import time
from concurrent import futures

import grpc
from tqdm import tqdm

from kvpool.config import parse_size
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import tokens
from kvpool.store.config import NodeConfig
from kvpool.store.data_channel import DataClient, DataServer, Extent
from kvpool.store.node import StorageNode
from kvpool.store.node_data import NodeDataHandler
from kvpool.store.node_server import NodeServicer

ARENA = 64 << 20
SECRET = b"bench-secret"
CHUNK = 1 << 20


def _raw_server(sock: socket.socket, size: int) -> None:
    payload = bytes(size)
    while True:
        conn, _ = sock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(size)
        view = memoryview(buf)
        try:
            while True:
                got = 0
                while got < 8:
                    k = conn.recv_into(view[got:8])
                    if k == 0:
                        raise ConnectionError
                    got += k
                n = int.from_bytes(buf[:8], "little")
                for _ in range(n):
                    conn.sendall(payload)
        except (ConnectionError, OSError):
            conn.close()


def serve(kind: str, size: int, ready) -> None:
    if kind == "raw":
        sock = socket.create_server(("127.0.0.1", 0))
        ready.send(f"127.0.0.1:{sock.getsockname()[1]}")
        _raw_server(sock, size)
    node = StorageNode(NodeConfig(node_id="bench", dram_bytes=ARENA))  # arena unlinked at once: nothing is left
    handler = NodeDataHandler(node)
    handler.secret = SECRET
    if kind == "tcp":
        server = DataServer(handler).start()
        ready.send(server.address)
    else:
        opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        server = grpc.server(futures.ThreadPoolExecutor(4), options=opts)
        pbg.add_NodeServiceServicer_to_server(NodeServicer(node, handler), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        ready.send(f"127.0.0.1:{port}")
    time.sleep(3600)


def start(kind: str, size: int):
    parent, child = mp.Pipe()
    proc = mp.Process(target=serve, args=(kind, size, child), daemon=True)
    proc.start()
    return proc, parent.recv()


def extents(kind: bytes, count: int, size: int) -> list[Extent]:
    exp = tokens.now_ms() + 600_000
    return [Extent(i, 1, i * size, size, exp, tokens.sign(SECRET, kind, i, 1, i * size, size, exp))
            for i in range(count)]


def bench_tcp(addr, size, count, src, dst):
    client = DataClient(addr)
    w = extents(tokens.WRITE, count, size)
    r = extents(tokens.READ, count, size)
    t0 = time.perf_counter()
    assert not any(client.write_many(w, [memoryview(src)[i * size:(i + 1) * size] for i in range(count)]))
    t1 = time.perf_counter()
    assert not any(client.read_many_into(r, [memoryview(dst)[i * size:(i + 1) * size] for i in range(count)]))
    t2 = time.perf_counter()
    client.close()
    return t1 - t0, t2 - t1


def bench_grpc(addr, size, count, src, dst):
    opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(addr, options=opts) as ch:
        stub = pbg.NodeServiceStub(ch)
        w = extents(tokens.WRITE, count, size)
        r = extents(tokens.READ, count, size)
        t0 = time.perf_counter()
        for i, e in enumerate(w):
            def chunks(e=e, i=i):
                base = i * size
                for pos in range(0, size, CHUNK):
                    yield pb.WriteChunk(grant_id=e.ident, tier=e.tier, offset=e.offset, size=e.size,
                                        expires_unix_ms=e.expires_ms, token=e.token,
                                        data=bytes(src[base + pos: base + min(pos + CHUNK, size)]))
            stub.Write(chunks())
        t1 = time.perf_counter()
        for i, e in enumerate(r):
            pos = i * size
            for chunk in stub.Read(pb.ReadRequest(lease_id=e.ident, tier=e.tier, offset=e.offset, size=e.size,
                                                  expires_unix_ms=e.expires_ms, token=e.token)):
                n = len(chunk.data)
                dst[pos:pos + n] = chunk.data
                pos += n
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def bench_raw(addr, size, count, dst):
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    view = memoryview(dst)
    t0 = time.perf_counter()
    sock.sendall(count.to_bytes(8, "little"))
    for i in range(count):
        part = view[i * size:(i + 1) * size]
        got = 0
        while got < size:
            got += sock.recv_into(part[got:])
    t1 = time.perf_counter()
    sock.close()
    return t1 - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2MiB")
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    size = parse_size(args.size, "--size")
    count = min(args.count, ARENA // size)
    src = bytearray(size * count)
    src[::4096] = bytes(range(256)) * (len(src[::4096]) // 256) + bytes(len(src[::4096]) % 256)
    dst = bytearray(size * count)
    procs = {k: start(k, size) for k in ("raw", "tcp", "grpc")}
    best = {k: [float("inf"), float("inf")] for k in ("raw", "tcp", "grpc")}
    with tqdm(total=args.rounds * 3, desc="data channel", file=sys.stderr) as bar:
        for _ in range(args.rounds):
            for kind, fn in (("tcp", bench_tcp), ("grpc", bench_grpc)):
                w, r = fn(procs[kind][1], size, count, src, dst)
                assert dst == src, f"{kind}: bytes differ"
                dst[:] = bytes(len(dst))
                best[kind] = [min(best[kind][0], w), min(best[kind][1], r)]
                bar.update()
            best["raw"][1] = min(best["raw"][1], bench_raw(procs["raw"][1], size, count, dst))
            bar.update()
    total = size * count / 1e9
    raw = total / best["raw"][1]
    print(f"objects: {count} x {size} bytes, best of {args.rounds}; loopback, server in a child process")
    print(f"raw socket recv        {raw:7.2f} GB/s")
    for kind in ("tcp", "grpc"):
        w, r = total / best[kind][0], total / best[kind][1]
        print(f"{kind:4s} write {w:6.2f} GB/s   read {r:6.2f} GB/s   read/raw {r / raw:5.2f}x")
    print(f"tcp/grpc: write {best['grpc'][0] / best['tcp'][0]:.2f}x  read {best['grpc'][1] / best['tcp'][1]:.2f}x")
    for proc, _ in procs.values():
        proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
