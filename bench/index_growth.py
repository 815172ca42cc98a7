"""The master's index growing: the longest put while the index doubles, against the pause a doubling took at once.

The index doubles its rows (store/rows.py) and its key table (store/_keytable.c) as objects arrive. Both used to
grow all at once under the master's lock: a copy of every row into a new array and a rehash of every key, ~0.6 s at
2M objects on a 2-core box, every lookup and put of every client waiting. Now the rows grow in place (a reservation
of address space: no copy) and the key table moves into its larger table a few entries per call.

In each round (a fresh in-process Master, one DRAM node):

  put       `--objects` committed 4 KiB objects by put_start + put_commit in batches of `--batch` keys (an engine's
            put of a prompt's blocks); each put_start holds the master's lock for its whole call, so its duration is
            what a growth makes every other call wait. Reported: the median and the longest put_start, and the
            object count where the longest happened
  at once   the reference, in the same round at the largest doubling the puts crossed (n rows / keys): what the one
            doubling cost when done at once, as before: a numpy array of 2n rows, n rows copied into it and n slots
            pushed on a free list, plus a full rehash of a C key table of n keys (KeyTable.settle() right after its
            growth starts)

Ratio lines: `ratio index_growth longest put_start / doubling at once` (below 1: no put waits for a whole doubling)
and `ratio index_growth longest / median put_start`.

    python bench/index_growth.py [--objects 2200000] [--batch 64] [--rounds 1]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np
from tqdm import tqdm


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def fill(objects: int, batch: int, bar) -> tuple[list[float], list[int], int, bool]:
    """(put_start seconds per batch, objects held before each batch, the index's capacity at the end, whether its
    rows are a reservation)."""
    from kvpool.planner import NullNode
    from kvpool.store.config import MasterConfig
    from kvpool.store.master import Master
    from kvpool.store.records import NodeInfo

    master = Master(MasterConfig(grant_ttl_s=3600), token_secret=b"s" * 32)
    master.register_node(NodeInfo(node_id="n", dram_bytes=objects * 4096 * 2), NullNode(), expires=False)
    took, at = [], []
    for start in range(0, objects, batch):
        n = min(batch, objects - start)
        keys = [key(start + i) for i in range(n)]
        t0 = time.perf_counter()
        grants = master.put_start(keys, [4096] * n)
        took.append(time.perf_counter() - t0)
        at.append(start)
        assert master.put_commit([g.grant.grant_id for g in grants], [0] * n) == [True] * n
        bar.update(n)
    assert len(master.index) == objects
    return took, at, master.index.capacity, master.index.rows_reserved


def at_once(n: int) -> tuple[float, float]:
    """(seconds of the rows' doubling done at once, seconds of a full rehash of a C key table of n keys); the key
    table's is nan where the extension is not built."""
    from kvpool.store.index import ROW
    from kvpool.store.keytable import native_available, new_key_table

    rows = np.zeros(n, dtype=ROW)
    rows["offset"] = 1           # touched, as a live index's rows are
    t0 = time.perf_counter()
    grown = np.zeros(2 * n, dtype=ROW)
    grown[:n] = rows
    free: list[int] = []
    free.extend(range(2 * n - 1, n - 1, -1))
    rows_s = time.perf_counter() - t0
    del grown, free, rows
    if not native_available():
        return rows_s, float("nan")
    table = new_key_table(n + 1, native=True)
    for i in range(n + 1):      # n keys fill a table of 2n entries to half: the next one starts its growth
        table.link(key(i), i)
    assert table.stats()[4] > 0, table.stats()
    t0 = time.perf_counter()
    table.settle()
    return rows_s, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=2_200_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    if args.objects < 4096 or args.batch < 1 or args.rounds < 1:
        ap.error(f"--objects must be >= 4096, --batch and --rounds >= 1 (got {args.objects}, {args.batch}, "
                 f"{args.rounds})")
    worst, median, where, ref_rows, ref_keys = [], [], [], [], []
    with tqdm(total=args.rounds * args.objects, desc="index growth", file=sys.stderr, unit_scale=True) as bar:
        for _ in range(args.rounds):
            took, at, capacity, reserved = fill(args.objects, args.batch, bar)
            i = int(np.argmax(took))
            worst.append(took[i])
            where.append(at[i])
            median.append(statistics.median(took))
            n = 1 << (max(1, args.objects - 1).bit_length() - 1)     # the largest doubling the puts crossed
            r, k = at_once(n)
            ref_rows.append(r)
            ref_keys.append(k)
    longest, med = statistics.median(worst), statistics.median(median)
    rows_s, keys_s = statistics.median(ref_rows), statistics.median(ref_keys)
    once = rows_s + (0.0 if keys_s != keys_s else keys_s)
    kind = "reserved (grow in place)" if reserved else "a numpy array grown by copying (reservation refused here)"
    print(f"\nkvpool bench/index_growth.py  {datetime.date.today()}  {platform.machine()}  {os.cpu_count()} cores  "
          f"Python {platform.python_version()}  {args.objects:,} objects of 4 KiB, puts of {args.batch} keys, "
          f"medians of {args.rounds} round(s); index rows {kind}, capacity {capacity:,}")
    print(f"put_start: median {med * 1e3:.3f} ms, longest {longest * 1e3:.2f} ms (at {where[0]:,} objects held)")
    print(f"a doubling at once at {n:,}: rows {rows_s * 1e3:.1f} ms, key table rehash "
          f"{'n/a (no C table here)' if keys_s != keys_s else f'{keys_s * 1e3:.1f} ms'}")
    print(f"ratio index_growth longest put_start / doubling at once: {longest / once:.3f}x "
          f"({longest * 1e3:.2f} vs {once * 1e3:.1f} ms)")
    print(f"ratio index_growth longest / median put_start: {longest / med:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
