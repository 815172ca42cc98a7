"""The master's memory per indexed object, and its chain lookups, with each key table (store/keytable.py).

For each key table (the C table, store/_keytable.c, and the dict it replaced, `KVPOOL_NATIVE_KEYS=0`), in rounds
that alternate which goes first:

  master          an in-process Master fed `--objects` committed 4 KiB objects by put_start / put_commit in batches
                  of 65,536, under tracemalloc: everything a committed object costs the master (index rows, key
                  table, allocator extents, eviction-policy entries), per object
  master, quota   the same, the objects a tenant's under a quota (its key space: stored keys; per-tenant LRU lists)
  index           the index alone (store/index.py: rows + key table), per object
  lookup 64       on the first populated master (tracemalloc off): `Master.lookup` of 64-key chains without a lease
                  (every key a hit), then of chains whose first key misses; microseconds per call, the median of
                  the round's `--lookups` calls

Issue "master memory" set <= 200 B per indexed object at 1M objects; the tenant-with-quota case was over it (205-209
B) with the dict. The ratio lines compare the C table with the dict measured in the same run.

    python bench/master_memory.py [--objects 1000000] [--rounds 1] [--lookups 20000]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import tracemalloc

from tqdm import tqdm

TABLES = {"C table": "1", "dict": "0"}      # KVPOOL_NATIVE_KEYS for each
BATCH = 65536


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def populated_master(objects: int, bar, tenant: str = ""):
    """(a Master holding `objects` committed objects, the bytes tracemalloc saw it take for them). `tenant`: the
    objects are that tenant's (stored keys of its key space) and it has a quota, so the per-tenant LRU lists are
    kept too; "" = auth off, no quotas."""
    from kvpool.planner import NullNode
    from kvpool.store.config import MasterConfig
    from kvpool.store.master import Master
    from kvpool.store.records import NodeInfo
    from kvpool.store.tenants import Quota

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    quotas = {tenant: Quota(total_bytes=objects * 4096 * 4)} if tenant else None
    # Grants live an hour: under tracemalloc on a loaded machine one 65,536-key put_start can outlast the default 30 s.
    master = Master(MasterConfig(max_batch_keys=BATCH, grant_ttl_s=3600), token_secret=b"s" * 32, quotas=quotas)
    master.register_node(NodeInfo(node_id="n", dram_bytes=objects * 4096 * 2), NullNode(), expires=False)
    for start in range(0, objects, BATCH):
        n = min(BATCH, objects - start)
        keys = [key(start + i) for i in range(n)]
        grants = master.put_start(keys, [4096] * n, tenant=tenant)
        assert master.put_commit([g.grant.grant_id for g in grants], [0] * n, tenant=tenant) == [True] * n
        bar.update(n)
    del keys, grants
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert len(master.index) == objects
    return master, used


def bench_master_memory(objects: int, bar, tenant: str = "") -> float:
    """Bytes per object a Master takes for `objects` committed objects (populated_master)."""
    return populated_master(objects, bar, tenant)[1] / objects


def bench_index_memory(objects: int) -> float:
    """The index alone (store/index.py: rows + key table), without allocator extents and policy entries."""
    from kvpool.store.index import Index, State
    from kvpool.tiers.types import Tier

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    index = Index()
    for i in range(objects):
        index.add(key(i), node=0, tier=Tier.DRAM, state=State.COMMITTED, offset=i * 4096, size=4096, ns=0)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / objects


def lookup_us(master, objects: int, calls: int, miss: bool) -> float:
    """Median microseconds of `calls` lookups of 64-key chains (no lease) at spread-out places in the index, after
    as many as 500 of the same lookups untimed (the first calls of a fresh process ran ~1.6x slower in a scratch
    run)."""
    step = max(1, (objects - 64) // calls)
    times = []
    for c in list(range(min(calls, 500))) + list(range(calls)):
        first = (c * step) % (objects - 63)
        chain = [key(first + i) for i in range(64)]
        if miss:
            chain[0] = key(objects + c)
        t = time.perf_counter()
        got = master.lookup(chain, lease=False)
        times.append(time.perf_counter() - t)
        assert got.hits == (0 if miss else 64)
    return statistics.median(times[-calls:]) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--lookups", type=int, default=20_000)
    args = ap.parse_args(argv)
    if args.objects < 64 or args.rounds < 1 or args.lookups < 1:
        ap.error(f"--objects must be >= 64, --rounds and --lookups >= 1 (got {args.objects}, {args.rounds}, "
                 f"{args.lookups})")
    from kvpool.store.keytable import native_available

    tables = [t for t in TABLES if t != "C table" or native_available()]
    if len(tables) < len(TABLES):
        print("C table: skipped (kvpool.store._keytable is not built: no C compiler at install)")
    got: dict[tuple[str, str], list[float]] = {}
    steps = args.rounds * len(tables) * (3 * args.objects + 2 * args.lookups)
    saved = os.environ.get("KVPOOL_NATIVE_KEYS")
    try:
        with tqdm(total=steps, desc="master memory", file=sys.stderr, unit_scale=True) as bar:
            for r in range(args.rounds):
                for table in tables if r % 2 == 0 else tables[::-1]:
                    os.environ["KVPOOL_NATIVE_KEYS"] = TABLES[table]
                    master, used = populated_master(args.objects, bar)
                    got.setdefault((table, "master"), []).append(used / args.objects)
                    for miss in (False, True):
                        got.setdefault((table, "miss" if miss else "hit"), []).append(
                            lookup_us(master, args.objects, args.lookups, miss))
                        bar.update(args.lookups)
                    del master
                    got.setdefault((table, "quota"), []).append(bench_master_memory(args.objects, bar, "bench"))
                    got.setdefault((table, "index"), []).append(bench_index_memory(args.objects))
                    bar.update(args.objects)
    finally:
        if saved is None:
            os.environ.pop("KVPOOL_NATIVE_KEYS", None)
        else:
            os.environ["KVPOOL_NATIVE_KEYS"] = saved
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"\nkvpool bench/master_memory.py  {datetime.date.today()}  {platform.machine()}  {os.cpu_count()} cores  "
          f"Python {platform.python_version()}  {args.objects:,} objects of 4 KiB, medians of {args.rounds} rounds")
    print(f"{'key table':>10}  {'master':>9}  {'quota':>9}  {'index':>9}  {'lookup 64 hit':>14}  "
          f"{'first key miss':>14}")
    for t in tables:
        print(f"{t:>10}  {med[(t, 'master')]:>7.1f} B  {med[(t, 'quota')]:>7.1f} B  {med[(t, 'index')]:>7.1f} B  "
              f"{med[(t, 'hit')]:>11.1f} us  {med[(t, 'miss')]:>11.1f} us")
    if len(tables) == 2:
        c, d = "C table", "dict"
        for what, label in (("master", "master_memory"), ("quota", "master_memory_quota"), ("index", "index_memory")):
            print(f"ratio {label} per object C table vs dict: {med[(c, what)] / med[(d, what)]:.2f}x "
                  f"({med[(c, what)]:.1f} vs {med[(d, what)]:.1f} B)")
        for what in ("hit", "miss"):
            print(f"ratio lookup_64_{what} C table vs dict: {med[(d, what)] / med[(c, what)]:.2f}x the dict's speed "
                  f"({med[(c, what)]:.1f} vs {med[(d, what)]:.1f} us)")
    for t in tables:
        worst = max(med[(t, "master")], med[(t, "quota")])
        print(f"goal master memory <= 200 B per object at {args.objects:,} objects ({t}): "
              f"{'met' if worst <= 200 else 'MISSED'} ({med[(t, 'master')]:.1f} B; a tenant with a quota "
              f"{med[(t, 'quota')]:.1f} B)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
