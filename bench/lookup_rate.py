"""Master throughput under concurrent clients: lookups and small gets per second with 1, 2, 4 and 8 client processes.

One master process and one node process (`kvpool master` / `kvpool node`, DRAM + SSD), then for each number of
client processes, each process a `PoolClient` of its own, running for a fixed time:

  lookup 64      lookup_prefix of a 64-key chain (one Lookup RPC without a lease): the master's index path (its
                 clients never map a node's arena, so no lookup is answered by a host index, 2026-12-07 on)
  get 8 (dram)   get_many_into of an 8-block chain whose blocks are in DRAM: one Lookup + copy + check (an
                 optimistic Lookup, no lease, from builds of 2026-11-27 on; before: a leased Lookup + Release)
  get 8 (ssd)    the same on chains whose blocks sit on SSD, so every hit is promoted to DRAM (demoting others:
                 the DRAM tier holds a fraction of the SSD chains), the case a promotion inside the master lock
                 serialises
  lookup 64 grpc with --grpc-baseline: the same lookups with `PoolClient(control_channel=False)`, every call by
                 gRPC (what the master's control channel, store/control_channel.py, replaced; builds from
                 2026-11-23 on)
  redis 64       the peer: a redis-server (started here, loopback) answering a pipeline of 64 EXISTS from redis-py
                 + hiredis in the same number of processes; "lookup 64 / redis 64" is the master's ratio to it
                 (skipped, saying why, when redis-server or redis-py is missing)

Every result line is requests/s summed over the processes; the ratio lines compare each concurrency to one process.
Repeats are interleaved (case, concurrency) x rounds and the median is printed. The bench uses only the public
client API and the CLI, so the same file measures any build (`--python` picks the interpreter of the build: the
master, node and clients all run under it):

    python bench/lookup_rate.py [--seconds 2] [--rounds 3] [--procs 1,2,4,8] [--python /path/to/python]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from tqdm import tqdm

OBJECT_BYTES = 16 << 10
CHAIN = 64
GET_BLOCKS = 8
DRAM_CHAINS = 64          # get-from-DRAM chains (8 blocks each) written last, so they stay in DRAM
SSD_CHAINS = 256          # get-from-SSD chains: 256 x 8 x 16 KiB = 32 MiB on SSD, DRAM holds a fraction of them


def _keys(prefix: int, chain: int, n: int) -> list[bytes]:
    return [prefix.to_bytes(4, "little") + chain.to_bytes(4, "little") + i.to_bytes(8, "little") for i in range(n)]


def _client(argv: list[str]) -> None:
    """Child: run one case against the pool for `seconds`, print {"ops": n, "seconds": s, "misses": m}."""
    import random

    import numpy as np

    from kvpool import PoolClient

    address, case, seconds, seed = argv[0], argv[1], float(argv[2]), int(argv[3])
    rng = random.Random(seed)
    if case == "redis":
        import redis

        host, port = address.rsplit(":", 1)
        r = redis.Redis(host=host, port=int(port))
        chains = [_keys(1, c, CHAIN) for c in range(16)]
        ops = misses = 0
        end = time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < end:
            for _ in range(16):
                pipe = r.pipeline(transaction=False)
                for k in rng.choice(chains):
                    pipe.exists(k)
                misses += sum(pipe.execute()) != CHAIN
                ops += 1
        print(json.dumps({"ops": ops, "seconds": time.perf_counter() - start, "misses": misses}), flush=True)
        return
    bufs = [np.empty(OBJECT_BYTES, dtype=np.uint8) for _ in range(GET_BLOCKS)]
    lookups = [_keys(1, c, CHAIN) for c in range(16)]
    dram = [_keys(2, c, GET_BLOCKS) for c in range(DRAM_CHAINS)]
    ssd = [_keys(3, c, GET_BLOCKS) for c in range(SSD_CHAINS)]
    kw = {"control_channel": False} if case == "lookup_grpc" else {}
    with PoolClient(address, timeout=30, **kw) as pool:
        ops = misses = 0
        end = time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < end:
            for _ in range(16):
                if case in ("lookup", "lookup_grpc"):
                    misses += pool.lookup_prefix(rng.choice(lookups)) != CHAIN
                else:
                    keys = rng.choice(dram if case == "get_dram" else ssd)
                    misses += pool.get_many_into(keys, bufs) != GET_BLOCKS
                ops += 1
        print(json.dumps({"ops": ops, "seconds": time.perf_counter() - start, "misses": misses}), flush=True)


def _populate(address: str) -> None:
    import numpy as np

    from kvpool import PoolClient

    rng = np.random.default_rng(7)
    with PoolClient(address, timeout=60) as pool:
        def put(chains):
            for keys in chains:
                vals = [rng.integers(0, 256, OBJECT_BYTES, dtype=np.uint8) for _ in keys]
                statuses = pool.put_many(keys, vals)
                assert all(s in ("stored", "exists") for s in statuses), statuses
        put([_keys(3, c, GET_BLOCKS) for c in range(SSD_CHAINS)])
        put([_keys(1, c, CHAIN) for c in range(16)])
        put([_keys(2, c, GET_BLOCKS) for c in range(DRAM_CHAINS)])
        assert pool.lookup_prefix(_keys(3, 0, GET_BLOCKS)) == GET_BLOCKS


class Pool:
    """Master and node processes of the build under test (DRAM sized so the SSD chains do not fit in it)."""

    def __init__(self, python: str, workdir: str) -> None:
        from kvpool.launcher import free_port, wait_grpc_serving

        self.shm = tempfile.mkdtemp(prefix="kvpool-bench-", dir="/dev/shm")
        self.address = f"127.0.0.1:{free_port()}"
        node = f"127.0.0.1:{free_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
        log = open(os.path.join(workdir, "pool.log"), "ab")
        cli = [python, "-m", "kvpool.cli"]  # run in workdir: `-m` puts the cwd first on sys.path (a checkout: kvpool/)
        self.procs = [subprocess.Popen(cli + ["master", "--listen", self.address], stdout=log, stderr=log, env=env,
                                       cwd=workdir)]
        wait_grpc_serving(self.address, 30, self.procs[0])
        # DRAM: the lookup chains + the DRAM get chains + about a quarter of the SSD chains.
        dram = (16 * CHAIN + DRAM_CHAINS * GET_BLOCKS + SSD_CHAINS * GET_BLOCKS // 4) * OBJECT_BYTES
        self.procs.append(subprocess.Popen(cli + ["node", "--master", self.address, "--listen", node,
                                                  "--dram-bytes", str(dram), "--shm-dir", self.shm,
                                                  "--ssd-path", os.path.join(workdir, "ssd"), "--ssd-bytes", "256MiB",
                                                  "--node-id", "bench"], stdout=log, stderr=log, env=env, cwd=workdir))
        wait_grpc_serving(node, 30, self.procs[1])

    def close(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.shm, ignore_errors=True)


class RedisPeer:
    """A redis-server on a free loopback port holding the lookup chains' keys (nothing persisted)."""

    def __init__(self) -> None:
        import shutil as _shutil

        import redis

        from kvpool.launcher import free_port

        exe = _shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not on PATH")
        self.address = f"127.0.0.1:{free_port()}"
        port = int(self.address.rsplit(":", 1)[1])
        self.proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        pipe = client.pipeline(transaction=False)
        for c in range(16):
            for k in _keys(1, c, CHAIN):
                pipe.set(k, b"1")
        pipe.execute()
        client.close()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run_case(python: str, address: str, case: str, procs: int, seconds: float, seed: int) -> tuple[float, int]:
    children = [subprocess.Popen([python, __file__, "--child", address, case, str(seconds), str(seed + i)],
                                 stdout=subprocess.PIPE, text=True) for i in range(procs)]
    total, misses = 0.0, 0
    for child in children:
        out, _ = child.communicate(timeout=seconds + 120)
        if child.returncode != 0:
            raise RuntimeError(f"client process failed ({child.returncode})")
        row = json.loads(out.strip().splitlines()[-1])
        total += row["ops"] / row["seconds"]
        misses += row["misses"]
    return total, misses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="run time of each client process per repeat")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repeats; the median is printed")
    ap.add_argument("--procs", default="1,2,4,8", help="client process counts")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the build to measure")
    ap.add_argument("--json", default="", help="also write the medians to this JSON file")
    ap.add_argument("--no-redis", action="store_true", help="skip the redis-server peer")
    ap.add_argument("--grpc-baseline", action="store_true",
                    help="also run the lookups with every call by gRPC (control_channel=False)")
    args = ap.parse_args(argv)
    procs = [int(p) for p in args.procs.split(",")]
    if args.seconds <= 0 or args.rounds < 1 or any(p < 1 for p in procs):
        ap.error("--seconds must be > 0, --rounds >= 1, --procs positive integers")
    cases = ["lookup", "get_dram", "get_ssd"] + (["lookup_grpc"] if args.grpc_baseline else [])
    workdir = tempfile.mkdtemp(prefix="kvpool-lookup-rate-")
    print(f"# lookup rate {datetime.date.today()} {platform.machine()} {os.cpu_count()} cores, "
          f"python {args.python}", flush=True)
    pool = Pool(args.python, workdir)
    peer = None
    if not args.no_redis:
        try:
            peer = RedisPeer()
            cases.append("redis")
        except (ImportError, RuntimeError, OSError) as exc:
            print(f"redis peer skipped: {exc}")
    results: dict[tuple[str, int], list[float]] = {}
    missed = 0
    try:
        subprocess.run([args.python, __file__, "--populate", pool.address], check=True, timeout=600)
        plan = [(c, p) for _ in range(args.rounds) for c in cases for p in procs]
        for i, (case, p) in enumerate(tqdm(plan, desc="lookup rate", unit="run")):
            address = peer.address if case == "redis" else pool.address
            python = sys.executable if case == "redis" else args.python
            rate, misses = run_case(python, address, case, p, args.seconds, seed=1000 * i)
            results.setdefault((case, p), []).append(rate)
            missed += misses if case != "get_ssd" else 0
    finally:
        pool.close()
        if peer is not None:
            peer.close()
        shutil.rmtree(workdir, ignore_errors=True)
    medians = {f"{c}/{p}": statistics.median(v) for (c, p), v in results.items()}
    for case in cases:
        base = medians[f"{case}/{procs[0]}"]
        row = "  ".join(f"{p} proc {medians[f'{case}/{p}']:8.0f}/s ({medians[f'{case}/{p}'] / base:4.2f}x)"
                        for p in procs)
        print(f"{case:11s} {row}")
    if peer is not None:
        print("lookup 64 / redis 64-EXISTS pipeline: " + "  ".join(
            f"{p} proc {medians[f'lookup/{p}'] / medians[f'redis/{p}']:4.2f}x" for p in procs))
    if "lookup_grpc" in cases:
        print("lookup 64 control channel / gRPC: " + "  ".join(
            f"{p} proc {medians[f'lookup/{p}'] / medians[f'lookup_grpc/{p}']:4.2f}x" for p in procs))
    if missed:
        print(f"WARNING: {missed} lookups/gets of DRAM-resident chains missed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(medians, f, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _client(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--populate":
        _populate(sys.argv[2])
    else:
        sys.exit(main())
