"""An admin evict of many objects, or a node holding many leaving the pool: how long other clients' lookups wait on
the master meanwhile.

`kvpool evict --older-than` (or `--namespace`, `--all`) may take any number of objects. This bench starts a master
and a node as separate processes (`kvpool master`, `kvpool node` with a DRAM and an SSD tier: the inclusive SSD tier
with write-behind, so each object has a copy whose record the evict erases), puts `--objects` objects of `--size`
bytes from one client, then has an admin evict every object idle for a second (`AdminClient.evict(older_than_s=1)`).
Meanwhile another client process (bench/full_pool.py's prober) looks up a 64-key chain every 2 ms (an engine's lookup
before a prefill; hit every 2 ms, so never idle and never evicted), recording each lookup's latency, classed by
whether it started before the evict (idle: the limit, nothing else running) or during it.

Prints per round, then the medians over rounds:

  evict: objects evicted, the call's time and its rate
  lookup p50 / p99 / max (ms), idle and during the evict
  ratio lookup p99 during an admin evict vs idle: 1.00x is an evict that costs other clients nothing
  longest lookup during the evict as a share of the evict: 100% is an evict that holds the master's lock for its
  whole length (every lookup meanwhile waits for all of it); a chunked evict (queries.REMOVAL_CHUNK) makes a lookup
  wait a chunk or two

`--removal node`: the same objects, then a second node process starts (DRAM only, as large), the prober's chain lands
there (the node with the most free room), and an admin takes the first node out of the pool with all of them on it
(`AdminClient.drain(node, migrate=False)`: `kvpool drain NODE --no-migrate`, the master's `remove_node`, as for a node
that died or restarted). The lines say "node removal" for "evict".

The bench uses only the public client and admin APIs and the CLI (the master and node processes are
bench/pool_remote.py's), so the same file measures any build (`bench/ab.py` runs two builds alternately):

    python bench/admin_evict.py [--rounds 3] [--objects 50000] [--size 4KiB] [--removal evict|node]
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from full_pool import CHAIN, LOOKUP_EVERY_S, pct, size_arg  # noqa: E402 - its prober looks the chain up every 2 ms
from pool_remote import Pool  # noqa: E402 - the master and node processes bench/pool_remote.py runs

IDLE_S = 1.0                # evicted: objects idle this long (the prober's chain is hit every 2 ms)
PUT_BATCH = 256


def one_round(args, workdir: str) -> dict:
    """One fresh pool: the puts, the prober, an idle span, the evict (or the node removal). Returns the count it took
    and its span, and the lookups' latencies by phase."""
    from kvpool import PoolClient
    from kvpool.admin import AdminClient

    dram = args.objects * args.size * 5 // 4 + (64 << 20)
    pool = Pool(dram, workdir, "admin-evict",
                node_args=["--ssd-path", os.path.join(workdir, "ssd"), "--ssd-bytes", str(2 * dram)])
    try:
        with PoolClient(pool.address, timeout=60) as client:
            payload = bytes(args.size)
            for at in range(0, args.objects, PUT_BATCH):
                keys = [b"E" + i.to_bytes(15, "big") for i in range(at, min(at + PUT_BATCH, args.objects))]
                assert client.put_many(keys, [payload] * len(keys)) == ["stored"] * len(keys)
            if args.removal == "node":      # where the prober's chain goes: the emptier node, which stays
                pool.add_node("other", dram)
                end = time.monotonic() + 30
                while "other" not in client.stats()["nodes"] and time.monotonic() < end:
                    time.sleep(0.05)
        prober = subprocess.Popen([sys.executable, os.path.join(HERE, "full_pool.py"), "--prober", pool.address,
                                   str(IDLE_S + 120), "0", workdir],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert prober.stdout.readline().strip() == "ready"
        time.sleep(IDLE_S + 0.5)    # the idle phase, and every put object idle for IDLE_S (a fixed span, not a wait)
        admin = AdminClient(pool.address, timeout=120)
        t0 = time.monotonic()
        if args.removal == "node":
            evicted = admin.drain("bench", migrate=False)["dropped"]
        else:
            evicted = admin.evict(older_than_s=IDLE_S)
        t1 = time.monotonic()
        out, _ = prober.communicate("", timeout=120)
        lookups = json.loads(out.strip().splitlines()[-1])
    finally:
        pool.close()
    idle = [dt for start, dt, _ in lookups if start + dt < t0]
    during = [dt for start, dt, _ in lookups if start < t1 and start + dt > t0]
    misses = sum(hits != CHAIN for _, _, hits in lookups)
    return {"evicted": evicted, "seconds": t1 - t0, "idle": idle, "during": during, "misses": misses}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="fresh pools; the medians over rounds are printed")
    ap.add_argument("--objects", type=int, default=50_000, help="objects put, then evicted")
    ap.add_argument("--size", type=size_arg("--size"), default=4 << 10, help="bytes per object (e.g. 4KiB)")
    ap.add_argument("--removal", choices=("evict", "node"), default="evict",
                    help="evict: an admin evict of every idle object; node: the node holding them taken out")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.objects < 1 or args.size < 1:
        ap.error("--rounds, --objects and --size must be >= 1")
    if args.objects * args.size > 8 << 30:
        ap.error("--objects x --size must be at most 8 GiB (the node's DRAM tier holds them all)")
    print(f"kvpool bench/admin_evict.py  {datetime.date.today()}  {platform.machine()} {os.cpu_count()} cores  "
          f"python {sys.executable}", flush=True)
    then = (f"an admin evict of those idle {IDLE_S:.0f} s" if args.removal == "evict" else
            "their node taken out of the pool (a second node holds the chain)")
    print(f"{args.objects} objects of {args.size >> 10} KiB (DRAM + inclusive SSD tier), then {then}; a lookup of a "
          f"{CHAIN}-key chain every {LOOKUP_EVERY_S * 1e3:.0f} ms from another client", flush=True)
    what, a_what, an_what = (("evict", "an admin evict", "an evict") if args.removal == "evict" else
                              ("node removal", "a node removal", "a node removal"))
    per_round = []
    for r in tqdm(range(args.rounds), desc=f"admin {what}", unit="round"):
        workdir = tempfile.mkdtemp(prefix="kvpool-admin-evict-")
        try:
            res = one_round(args, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if res["evicted"] != args.objects or res["misses"] or not res["during"] or not res["idle"]:
            raise SystemExit(f"round {r + 1}: evicted {res['evicted']} of {args.objects}, {res['misses']} lookups "
                             f"missed the chain, {len(res['during'])} lookups during the {what}, {len(res['idle'])} "
                             "idle: the bench did not measure what it says")
        per_round.append(res)
        tqdm.write(f"round {r + 1}: {what} {res['evicted']} in {res['seconds'] * 1e3:.0f} ms; "
                   f"lookup p50 / p99 / max ms: "
                   f"idle {pct(res['idle'], 0.5) * 1e3:.2f} / {pct(res['idle'], 0.99) * 1e3:.2f} / "
                   f"{max(res['idle']) * 1e3:.2f}, during the {what} {pct(res['during'], 0.5) * 1e3:.2f} / "
                   f"{pct(res['during'], 0.99) * 1e3:.2f} / {max(res['during']) * 1e3:.2f} "
                   f"({len(res['during'])} lookups)")

    def med(f) -> float:
        return statistics.median(f(res) for res in per_round)

    seconds = med(lambda x: x["seconds"])
    idle = {q: statistics.median(pct(res["idle"], q) for res in per_round) for q in (0.5, 0.99)}
    during = {q: statistics.median(pct(res["during"], q) for res in per_round) for q in (0.5, 0.99)}
    longest = med(lambda x: max(x["during"]))
    share = med(lambda x: max(x["during"]) / x["seconds"])
    print(f"{what} (median over rounds): {args.objects} objects in {seconds * 1e3:.0f} ms "
          f"({args.objects / seconds:,.0f} objects/s)")
    print(f"lookup p50 / p99 (ms, median over rounds): idle {idle[0.5] * 1e3:.2f} / {idle[0.99] * 1e3:.2f}, during the "
          f"{what} {during[0.5] * 1e3:.2f} / {during[0.99] * 1e3:.2f}; "
          f"longest during the {what} {longest * 1e3:.1f} ms")
    print(f"ratio lookup p99 during {a_what} vs idle: {during[0.99] / idle[0.99]:.2f}x (1.00x: {an_what} costs "
          "other clients nothing)")
    print(f"longest lookup during the {what}: {share * 100:.0f}% of the {what}'s span (100%: the {what} holds the "
          "master's lock for its whole length)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
