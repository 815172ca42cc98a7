"""An admin listing a large pool (`kvpool ls`): how long a page takes, and how long other clients' lookups wait on the
master meanwhile.

In one process (the master's own cost, no RPC): a Master and a StorageNode (DRAM only), `--objects` objects of
`--size` bytes put by a client's put path (put_start, put_commit; 1,000 a batch), then a prober thread looks up a
64-key chain every 2 ms (an engine's lookup before a prefill), recording each lookup's latency, classed by whether
it started before the listing (idle: nothing else running) or during it, while the main thread lists `--pages`
pages of `--limit` objects in key order (`Master.list_objects`, as `kvpool ls` pages through the pool).

Prints per round, then the medians over rounds:

  list: pages, ms per page (median, max), objects listed
  lookup p50 / p99 / max (ms), idle and during the listing
  ratio lookup p99 during an admin listing vs idle: 1.00x is a listing that costs other clients nothing
  longest lookup during the listing as a share of a page: 100% is a page that holds the master's lock for its
  whole length (every lookup meanwhile waits for all of it)

Only public Master calls, so `bench/ab.py` runs the same file on two builds:

    python bench/admin_list.py [--rounds 3] [--objects 1000000] [--pages 5] [--limit 1000]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import threading
import time

from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHAIN = 64
LOOKUP_EVERY_S = 0.002
IDLE_S = 1.0
BATCH = 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def key(i: int) -> bytes:
    import xxhash
    return xxhash.xxh3_128_digest(i.to_bytes(8, "little"))


def put_objects(master, total: int, size: int) -> None:
    """`total` objects of `size` bytes (keys `key(0..total-1)`) through the client's put path, BATCH a call; their
    bytes are never written (the master's cost only)."""
    bar = tqdm(total=total, desc="puts", unit="obj", leave=False)
    for start in range(0, total, BATCH):
        keys = [key(i) for i in range(start, min(start + BATCH, total))]
        grants = master.put_start(keys, [size] * len(keys))
        assert all(g.grant is not None for g in grants), "the node is full"
        assert master.put_commit([g.grant.grant_id for g in grants], [0] * len(keys)) == [True] * len(keys)
        bar.update(len(keys))
    bar.close()
    assert master.stats()["objects"] == total, "the node evicted some: its arena is too small"


class LookupProber:
    """A thread looking up a CHAIN-key chain every LOOKUP_EVERY_S (an engine's lookup before a prefill), each
    latency recorded as `idle` or, between `during.set()` and `during.clear()`, `busy` (ms)."""

    def __init__(self, master, chain: list[bytes], bound_s: float) -> None:
        self.master, self.chain, self.bound_s = master, chain, bound_s
        self.during = threading.Event()
        self.idle: list[float] = []
        self.busy: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, daemon=True)

    def __enter__(self) -> "LookupProber":
        self._thread.start()
        time.sleep(IDLE_S)                                      # the idle phase (a fixed span, not a wait)
        self.during.set()
        return self

    def __exit__(self, *exc) -> None:
        wait_until = time.monotonic() + 5                       # a short phase may end before any lookup does
        while not self.busy and time.monotonic() < wait_until:
            time.sleep(0.001)
        self.during.clear()
        self._stop.set()
        self._thread.join(timeout=30)

    def _probe(self) -> None:
        deadline = time.monotonic() + self.bound_s              # bounded whatever happens to the main thread
        while not self._stop.is_set() and time.monotonic() < deadline:
            busy = self.during.is_set()
            t0 = time.perf_counter()
            hits = self.master.lookup(self.chain, lease=False).hits
            took = (time.perf_counter() - t0) * 1e3
            assert hits == len(self.chain)
            (self.busy if busy and self.during.is_set() else self.idle).append(took)
            time.sleep(LOOKUP_EVERY_S)

    def summary(self) -> dict:
        return {"idle_p50": pct(self.idle, 0.5), "idle_p99": pct(self.idle, 0.99), "idle_max": max(self.idle),
                "busy_p50": pct(self.busy, 0.5), "busy_p99": pct(self.busy, 0.99),
                "busy_max": max(self.busy) if self.busy else float("nan")}


def one_round(args, workdir: str) -> dict:
    from kvpool.store.config import MasterConfig, NodeConfig
    from kvpool.store.master import Master
    from kvpool.store.node import StorageNode

    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=(args.objects + CHAIN) * args.size, shm_dir=workdir))
    master = Master(MasterConfig(write_behind=False))
    master.register_node(node.info(), node, expires=False)
    try:
        put_objects(master, args.objects + CHAIN, args.size)
        page_ms: list[float] = []
        listed, after = 0, b""
        with LookupProber(master, [key(args.objects + i) for i in range(CHAIN)], 600) as prober:
            for _ in range(args.pages):
                t0 = time.perf_counter()
                records, after = master.list_objects(start_after=after, limit=args.limit)
                page_ms.append((time.perf_counter() - t0) * 1e3)
                listed += len(records)
                if not after:
                    break
        return {"pages": len(page_ms), "page_ms": statistics.median(page_ms), "page_max_ms": max(page_ms),
                "listed": listed, **prober.summary()}
    finally:
        node.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--objects", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=4096,
                   help="bytes per object (the node's arena holds them all; never written)")
    p.add_argument("--pages", type=int, default=5)
    p.add_argument("--limit", type=int, default=1000, help="objects per page (kvpool ls --limit)")
    args = p.parse_args()
    if min(args.rounds, args.objects, args.size, args.pages, args.limit) < 1:
        p.error("--rounds, --objects, --size, --pages and --limit must be >= 1")
    if args.objects * args.size > 8 << 30:
        p.error("--objects x --size must be at most 8 GiB (the node's arena, in /dev/shm; never written)")
    print(f"# bench/admin_list.py {datetime.date.today()} {platform.node()} python {platform.python_version()}: "
          f"{args.objects:,} objects of {args.size} B, {args.pages} pages of {args.limit:,}")
    rounds = []
    for r in tqdm(range(args.rounds), desc="admin list", unit="round"):
        with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as workdir:
            res = one_round(args, workdir)
        rounds.append(res)
        tqdm.write(f"round {r + 1}: {res['pages']} pages, {res['page_ms']:.1f} ms a page (max "
                   f"{res['page_max_ms']:.1f}); lookup p99 idle {res['idle_p99']:.2f} ms, during "
                   f"{res['busy_p99']:.2f} ms, max during {res['busy_max']:.1f} ms")
    med = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
    print(f"list (median over rounds): {med['pages']:.0f} pages of {args.limit:,} from {args.objects:,} objects, "
          f"{med['page_ms']:.1f} ms a page (max {med['page_max_ms']:.1f} ms), {med['listed']:,.0f} listed")
    print(f"lookup p50 / p99 (ms, median over rounds): idle {med['idle_p50']:.2f} / {med['idle_p99']:.2f}, during the "
          f"listing {med['busy_p50']:.2f} / {med['busy_p99']:.2f}; longest during the listing {med['busy_max']:.1f} ms")
    print(f"ratio lookup p99 during an admin listing vs idle: {med['busy_p99'] / med['idle_p99']:.2f}x (1.00x: a "
          f"listing that costs other clients nothing)")
    print(f"longest lookup during the listing: {med['busy_max'] / med['page_ms']:.0%} of a page's time (100%: one "
          f"hold of the master's lock for a whole page)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
