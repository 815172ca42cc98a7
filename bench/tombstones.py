"""What a large purge costs a node that was away: the share of its SSD records of keys never removed that the master
still re-adopts when it comes back, with the removal tombstones folded past their limit.

The master keeps a tombstone per removed key (store/tombstones.py) so that a node that was out of the pool cannot
bring a removed key back. Past `max_tombstones` the oldest fold. Until 2026-12-06 they folded into one floor: every
record written before it was refused, whatever its key, so a node restarting after a purge of more than the limit
came back cold. Now each folded tombstone raises one of 2^20 time slots, picked by a hash of its key, and a record
is refused only when written before its own key's slot.

Per round: a Tombstones as a persistent master keeps it (its changes taken for the journal after every call), the
records of `--records` keys never removed, all written before the purge (the node that was away), then `--removed`
keys removed `--per-call` at a time (the admin's `kvpool rm` calls), then the report: which records are refused.
Prints per round, then the medians over rounds:

  kept: records of keys never removed that are still re-adopted, against exp(-folded / slots) (the slots' bound),
        and against the one floor of before (0 once anything folded: every record was written before it)
  removed keys refused: every removed key's record must be (a miss, never a removed key back)
  a remove call with a fold in it (under the master's lock), the longest call, and the report's cost per record
  memory the tombstones and the slots took (tracemalloc peak)

    python bench/tombstones.py [--rounds 3] [--records 100000] [--removed 300000] [--per-call 1000]
                               [--limit 100000]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc

import xxhash
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def keys(tag: bytes, n: int) -> list[bytes]:
    """n distinct 16-byte keys, as chained xxh3 block keys look (uniform bytes)."""
    return [xxhash.xxh3_128_digest(tag + i.to_bytes(8, "little")) for i in range(n)]


def one_round(args, r: int) -> dict:
    from kvpool.store.tombstones import ADMIN_BUCKETS, Tombstones

    records = keys(b"kept-%d-" % r, args.records)
    removed = keys(b"removed-%d-" % r, args.removed)
    ns = b"\0" * 16
    tracemalloc.start()                             # memory: one pass with allocations traced (slow) ...
    t = Tombstones(args.limit, track=True)
    for start in range(0, len(removed), args.per_call):
        t.bury(removed[start:start + args.per_call])
        t.take_changes()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t = Tombstones(args.limit, track=True)          # ... time: the same again, untraced
    written = t.now_us()                            # every record: written before the purge
    fold_calls = []                                 # the calls a fold happened in
    longest = 0.0
    for start in range(0, len(removed), args.per_call):
        folded = t.folded
        t0 = time.perf_counter()
        t.bury(removed[start:start + args.per_call])
        t.take_changes()                            # what the journal writes after each call
        took = time.perf_counter() - t0
        longest = max(longest, took)
        if t.folded > folded:
            fold_calls.append(took)
    t0 = time.perf_counter()
    kept = sum(not t.refuses(k, ns, written) for k in records)
    per_record = (time.perf_counter() - t0) / len(records)
    refused_removed = sum(t.refuses(k, ns, written) for k in removed)
    return {"kept": kept, "folded": t.folded, "slots": ADMIN_BUCKETS, "refused_removed": refused_removed,
            "floor_kept": args.records if t.folded == 0 else 0, "longest_ms": longest * 1e3,
            "fold_ms": statistics.median(fold_calls) * 1e3 if fold_calls else 0.0, "folds": len(fold_calls),
            "report_us": per_record * 1e6, "peak_mib": peak / 2**20}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--records", type=int, default=100_000, help="records of keys never removed on the node away")
    p.add_argument("--removed", type=int, default=300_000, help="keys removed while it is away")
    p.add_argument("--per-call", type=int, default=1_000, help="keys per remove call")
    p.add_argument("--limit", type=int, default=None, help="max_tombstones (default: the master's)")
    args = p.parse_args()
    from kvpool.store.config import MasterConfig
    if args.limit is None:
        args.limit = MasterConfig().max_tombstones
    if min(args.rounds, args.records, args.removed, args.per_call, args.limit) < 1:
        p.error("--rounds, --records, --removed, --per-call and --limit must be >= 1")
    print(f"# bench/tombstones.py {datetime.date.today()} {platform.node()} python {platform.python_version()}: "
          f"{args.records:,} records kept, {args.removed:,} keys removed {args.per_call:,} per call, "
          f"max_tombstones {args.limit:,}")
    rounds = []
    for r in tqdm(range(args.rounds), desc="tombstones", unit="round"):
        res = one_round(args, r)
        rounds.append(res)
        tqdm.write(f"round {r + 1}: folded {res['folded']:,}; kept {res['kept']:,} of {args.records:,}; removed "
                   f"refused {res['refused_removed']:,} of {args.removed:,}; {res['folds']} folds, a call with one "
                   f"{res['fold_ms']:.1f} ms, longest call {res['longest_ms']:.1f} ms; report "
                   f"{res['report_us']:.2f} us/record; peak {res['peak_mib']:.1f} MiB")
    med = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
    bound = math.exp(-med["folded"] / med["slots"])
    print(f"kept (median over rounds): {med['kept']:,.0f} of {args.records:,} records of keys never removed "
          f"({med['kept'] / args.records:.1%}); the slots' bound exp(-{med['folded']:,.0f} / {med['slots']:,}) "
          f"{bound:.1%}; one floor (before 2026-12-06) {med['floor_kept']:,.0f}")
    print(f"removed keys refused (every round): {min(x['refused_removed'] for x in rounds):,} of {args.removed:,}")
    print(f"remove call with a fold in it (under the master's lock): median {med['fold_ms']:.1f} ms; longest call "
          f"{med['longest_ms']:.1f} ms (the interpreter's garbage collector included); report "
          f"{med['report_us']:.2f} us per record; peak memory {med['peak_mib']:.1f} MiB")
    floor_share = med["floor_kept"] / args.records
    print(f"ratio records of keys never removed kept after a purge of {args.removed:,}: "
          f"{med['kept'] / args.records:.1%} with slots vs {floor_share:.1%} with one floor; "
          f"{med['kept'] / args.records / bound:.2f}x the slots' bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
