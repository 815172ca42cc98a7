"""Same-host gets from several client processes at once: optimistic (no lease, the default) vs leased gets.

A `kvpool up`-style master and node (bench/pool_remote.py's Pool) hold `--objects` objects of `--size` bytes in
DRAM. For each process count (1, 2, 4 by default), N client processes each map the node's arena, read every object
once (untimed), wait for a common start, then loop 32-key `get_many_into` calls over the objects for `--seconds`
(bounded: at most 100,000 gets per process), checking the count of every get and the bytes of the last pass. The
two modes take turns in every round, in an order that alternates, and each line is the median of `--rounds`:

  optimistic   PoolClient() (default): a Lookup without a lease, the copy kept where it hashes to the committed
               checksum (tests/kvpool/test_optimistic_reads.py); no Release
  leased       PoolClient(optimistic_reads=False): a leased Lookup, the same copy and check, the lease ended by the
               next Lookup

Both copy through the same read fence, so the difference is the master's work per get (the lease, its release and
their bookkeeping, under the master's one lock) and what the clients wait for. Ratio line per process count:
`concurrent gets <N> processes: optimistic / leased <r>x gets/s`.

    python bench/concurrent_gets.py [--processes 1,2,4] [--rounds 3] [--seconds 3] [--size 64KiB] [--objects 256]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pool_remote import Pool

from kvpool.store.config import parse_size

BATCH = 32
MAX_GETS = 100_000


def _keys(n: int) -> list[bytes]:
    return [(0xC6 << 120 | i).to_bytes(16, "big") for i in range(n)]


def _pattern(i: int, size: int) -> np.ndarray:
    return np.full(size, (i * 13 + 5) % 251, np.uint8)


def _worker(address: str, optimistic: bool, size: int, objects: int, seconds: float, ready, start, out) -> None:
    from kvpool import PoolClient

    keys = _keys(objects)
    dst = [np.empty(size, np.uint8) for _ in range(objects)]
    with PoolClient(address, timeout=60, optimistic_reads=optimistic) as c:
        for i in range(0, objects, BATCH):
            assert c.get_many_into(keys[i:i + BATCH], dst[i:i + BATCH]) == len(keys[i:i + BATCH])
        ready.put(True)
        start.wait()
        n, t0 = 0, time.perf_counter()
        while n < MAX_GETS and time.perf_counter() - t0 < seconds:
            i = (n * BATCH) % objects
            got = c.get_many_into(keys[i:i + BATCH], dst[i:i + BATCH])
            if got != len(keys[i:i + BATCH]):
                raise RuntimeError(f"get {n}: {got} of {len(keys[i:i + BATCH])} filled")
            n += 1
        rate = n / (time.perf_counter() - t0)
        bad = [j for j in range(objects) if not np.array_equal(dst[j], _pattern(j, size))]
        out.put((rate, len(bad), c.optimistic_retries))


def run_once(ctx, address: str, processes: int, optimistic: bool, size: int, objects: int,
             seconds: float) -> tuple[float, int]:
    """(gets/s summed over the processes, optimistic retries); raises if any process read wrong bytes."""
    ready, out, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_worker, args=(address, optimistic, size, objects, seconds, ready, start, out))
             for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        start.set()
        results = [out.get(timeout=seconds + 120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if any(bad for _, bad, _ in results):
        raise RuntimeError("a client read bytes that differ from the objects put")
    return sum(r for r, _, _ in results), sum(k for _, _, k in results)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", default="1,2,4", help="client process counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds per run")
    ap.add_argument("--size", type=lambda v: parse_size(v, "--size"), default=64 << 10)
    ap.add_argument("--objects", type=int, default=256)
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.processes.split(",")]
    for name, v in (("--rounds", args.rounds), ("--objects", args.objects), *(("--processes", n) for n in counts)):
        if v < 1:
            ap.error(f"{name} must be >= 1, got {v}")
    if not 0 < args.seconds <= 60:
        ap.error(f"--seconds must be in (0, 60], got {args.seconds}")
    ctx = multiprocessing.get_context("spawn")
    workdir = tempfile.mkdtemp(prefix="kvpool-concurrent-")
    pool = Pool(args.objects * args.size + (64 << 20), workdir)
    rates: dict[tuple[int, bool], list[float]] = {}
    retries = 0
    try:
        from kvpool import PoolClient

        keys = _keys(args.objects)
        with PoolClient(pool.address, timeout=60) as c:
            for i in range(0, args.objects, BATCH):
                part = [_pattern(j, args.size) for j in range(i, min(i + BATCH, args.objects))]
                assert c.put_many(keys[i:i + BATCH], part) == ["stored"] * len(part)
        with tqdm(total=len(counts) * args.rounds * 2, desc="concurrent_gets", unit="run", file=sys.stderr) as bar:
            for r in range(args.rounds):
                for n in counts:
                    for optimistic in ((True, False) if r % 2 == 0 else (False, True)):
                        rate, k = run_once(ctx, pool.address, n, optimistic, args.size, args.objects, args.seconds)
                        rates.setdefault((n, optimistic), []).append(rate)
                        retries += k
                        bar.update()
    finally:
        pool.close()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nkvpool bench/concurrent_gets.py  {datetime.date.today()}  {platform.machine()} {os.cpu_count()} cores  "
          f"python {platform.python_version()}")
    print(f"{args.size >> 10} KiB objects, {BATCH} keys per get, {args.objects} objects, {args.seconds:g} s per run, "
          f"median of {args.rounds} rounds; gets/s summed over the processes")
    for n in counts:
        opt, lea = statistics.median(rates[(n, True)]), statistics.median(rates[(n, False)])
        print(f"{n} processes: optimistic {opt:,.0f} gets/s, leased {lea:,.0f} gets/s")
    for n in counts:
        opt, lea = statistics.median(rates[(n, True)]), statistics.median(rates[(n, False)])
        print(f"ratio concurrent gets {n} processes: optimistic / leased {opt / lea:.2f}x gets/s")
    print(f"optimistic reads asked again under a lease (an extent reused meanwhile): {retries}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
