"""What the traffic recorder costs the master: lookups and puts with recording off vs on, same process, same index.

One in-process `Master` with a byte-less node (kvpool.planner.NullNode) holds a warm index of prefix chains; each
round times R calls of each kind with recording off and with recording on (to Parquet files in a temporary
directory, its writer thread running), the two modes alternating which goes first. Calls: `lookup(chain,
lease=False)` (a probe), `lookup` under a lease + `release`, `put_start` + `put_commit` of a chain whose first
half exists. The writer thread runs meanwhile (its work left when the recording stops is timed apart). Peer: the
same call with recording off; physical floor of "off": the cost of the one attribute check
(`master.recorder is not None`), timed alone. Prints medians over rounds and ratio lines on/off.

Usage: python bench/recorder_cost.py [--rounds 7] [--calls 2000] [--chain 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import timeit

import xxhash
from tqdm import tqdm

from kvpool.planner import NullNode
from kvpool.store.config import MasterConfig
from kvpool.store.master import Master
from kvpool.store.records import NodeInfo, NsRef

UNIT = 4096
NS = NsRef(bytes(range(16)), "bench/recorder", 16)


def chain(i: int, n: int) -> list[bytes]:
    return [xxhash.xxh3_128_digest(f"{i}:{j}".encode()) for j in range(n)]


def build(chains: int, length: int) -> Master:
    m = Master(MasterConfig())
    m.register_node(NodeInfo(node_id="n", dram_bytes=8 * chains * length * UNIT, alignment=UNIT), NullNode(),
                    expires=False)
    for i in range(chains):
        ks = chain(i, length)
        grants = [r.grant.grant_id for r in m.put_start(ks, [UNIT] * length, NS)]
        m.put_commit(grants, [0] * length)
    return m


def time_calls(m: Master, calls: int, length: int, chains: int, salt: int) -> dict[str, float]:
    """Microseconds per call of each kind (fresh keys for the put tails, so every put writes)."""
    probes = [chain(i % chains, length) for i in range(calls)]
    out = {}
    t0 = time.perf_counter()
    for ks in probes:
        m.lookup(ks, NS, lease=False)
    out["probe"] = (time.perf_counter() - t0) / calls * 1e6
    t0 = time.perf_counter()
    for ks in probes:
        r = m.lookup(ks, NS)
        m.release([r.lease_id])
    out["lookup+release"] = (time.perf_counter() - t0) / calls * 1e6
    puts = [probes[i][: length // 2] + chain(-(salt * calls + i) - 1, length - length // 2) for i in range(calls)]
    sizes, zeros = [UNIT] * length, [0] * length
    t0 = time.perf_counter()
    for ks in puts:
        grants = [r.grant.grant_id for r in m.put_start(ks, sizes, NS) if r.grant is not None]
        m.put_commit(grants, zeros[: len(grants)])
    out["put_start+commit"] = (time.perf_counter() - t0) / calls * 1e6
    for ks in puts:                                          # keep the index the same size round after round
        m.remove(ks[length // 2:])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--chain", type=int, default=64)
    ap.add_argument("--chains", type=int, default=2000)
    args = ap.parse_args()
    m = build(args.chains, args.chain)
    results: dict[str, dict[str, list[float]]] = {"off": {}, "on": {}}
    rows = dropped = 0
    stops: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-rec-") as tmp, \
            tqdm(total=2 * args.rounds, desc="rounds", unit="mode", file=sys.stderr) as bar:
        for rnd in range(args.rounds):
            for j, mode in enumerate(("off", "on") if rnd % 2 == 0 else ("on", "off")):
                if mode == "on":
                    m.start_recording(f"{tmp}/r{rnd}")
                per = time_calls(m, args.calls, args.chain, args.chains, salt=2 * rnd + j)
                if mode == "on":
                    t0 = time.perf_counter()
                    status = m.stop_recording()      # the rows the writer thread had not written yet, then close
                    stops.append(time.perf_counter() - t0)
                    rows += status.rows
                    dropped += status.dropped
                for kind, us in per.items():
                    results[mode].setdefault(kind, []).append(us)
                bar.update()
    check_ns = min(timeit.repeat("m.recorder is not None", globals={"m": m}, number=200_000, repeat=5)) / 200_000 * 1e9
    print(f"\nmaster: {len(m.index)} objects, chains of {args.chain} keys; {args.rounds} rounds x {args.calls} calls "
          f"per kind and mode; recorded {rows} rows, dropped {dropped}")
    print(f"{'call':>18} {'off us':>9} {'on us':>9}")
    for kind in results["off"]:
        off, on = statistics.median(results["off"][kind]), statistics.median(results["on"][kind])
        print(f"{kind:>18} {off:>9.1f} {on:>9.1f}")
    for kind in results["off"]:
        off, on = statistics.median(results["off"][kind]), statistics.median(results["on"][kind])
        print(f"ratio recording on/off {kind}: {on / off:.3f}x")
    print(f"writer work left at stop_recording (not in the per-call times above): median "
          f"{statistics.median(stops) * 1e3:.0f} ms per round of {rows // args.rounds} rows")
    probe_off = statistics.median(results["off"]["probe"])
    print(f"recording off: the one check costs {check_ns:.0f} ns = {check_ns / 10 / probe_off:.3f}% of a "
          f"{args.chain}-key probe ({probe_off:.1f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
