"""Puts on a full pool: what making room costs a put, and what it costs other clients' lookups meanwhile.

A cache runs full: past its first minutes every put pushes older objects a tier down or out. This bench starts a
master and a node as separate processes (`kvpool master`, `kvpool node` with a DRAM and an SSD tier, its defaults
otherwise: the inclusive SSD tier with write-behind), then one client process puts chains of `--batch` objects of
`--size` bytes until both tiers have been full for a while. Each put is classed by what it made the master do,
from the pool's counters read after it (outside the timed call):

  room        nothing moved: the DRAM tier had room. The limit: what a put costs when making room costs nothing
  DRAM full   objects were demoted to the SSD tier to make room
  both full   objects were also evicted from the SSD tier

Meanwhile another client process looks up a resident 64-key chain every 2 ms (an engine's lookup before a
prefill), recording each lookup's latency; a lookup is classed by the put it started during (idle: before the first
put). Prints, per round, the median put per phase and lookup p50 / p99 per phase, then the medians over rounds:

  ratio put on a full pool vs with room: how much slower a put is when it makes room (1.00x: making room is free)
  put mean / p90: a phase whose puts are sometimes slow (some make many node calls) shows it here, not in the median
  remove per call: the putter then removes its last 20 chains, one remove_many each (they have SSD records or copies
  to erase), and the ratio remove vs put with room
  ratio lookup p99 during full-pool puts vs during room puts: how much longer other clients wait on the master
  CPU per put of the master and the node processes, per phase: their utime + stime read from /proc around each put
  (so the prober's lookups meanwhile count too: the same for every build), summed over the phase over its puts;
  the kernel counts in ticks (10 ms), so a phase needs a few hundred puts (`--dram 1GiB` for the room phase)

`--quota on`: the pool runs with auth on and the putting client is a tenant with quotas (DRAM: half the DRAM tier;
total: half the SSD tier), so the pool itself never fills: its puts are classed by what its quotas made the master
do instead (`at DRAM quota`: its own coldest DRAM objects shed one tier down; `at both quotas`: its own coldest
objects also evicted, store/quota.py), and the ratio reads "put at a tenant's quota vs with room".

The bench uses only the public client API and the CLI (its master and node processes are bench/pool_remote.py's),
so the same file measures any build: master, node and clients run under the interpreter that runs it, and
`bench/ab.py` runs two builds alternately:

    python bench/full_pool.py [--rounds 3] [--size 64KiB] [--batch 32] [--dram 64MiB] [--ssd 256MiB]
                              [--full-puts 100] [--pinned 0] [--transport auto|tcp] [--write-behind on|off]
                              [--quota off|on]
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

from kvpool.config import parse_size

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pool_remote import Pool  # noqa: E402 - the master and node processes bench/pool_remote.py runs

PHASES = ("idle", "room", "DRAM full", "both full")
QUOTA_PHASES = {"DRAM full": "at DRAM quota", "both full": "at both quotas"}    # their names with --quota on
TOKENS = {"node": "bench-node-token-0000000000000", "admin": "bench-admin-token-000000000000",
          "putter": "bench-putter-token-00000000000", "prober": "bench-prober-token-00000000000"}
CHAIN = 64                  # the lookup chain's keys (4 KiB objects)
LOOKUP_EVERY_S = 0.002
MAX_PUTS = 2000             # per round, whatever the sizes; the round also ends at --seconds
REMOVES = 20                # then the last puts' chains are removed, one remove call each


def size_arg(flag: str):
    """An argparse type: "64KiB", "256MiB", bytes (kvpool.config.parse_size)."""
    def size(value: str) -> int:
        return parse_size(value, flag)
    return size


def _lookup_keys() -> list[bytes]:
    return [b"L" + i.to_bytes(15, "big") for i in range(CHAIN)]      # 16-byte keys


def _token(workdir: str, name: str) -> str | None:
    """The token source of caller `name` when the pool has auth on (`_write_tokens` made the file), else None."""
    path = os.path.join(workdir, f"{name}.token")
    return f"file:{path}" if os.path.exists(path) else None


def _write_tokens(workdir: str) -> tuple[list[str], list[str]]:
    """Auth on: the token files of the node, the admin and the two client tenants; returns the master's and the
    node's flags."""
    for name, tok in TOKENS.items():
        with open(os.path.join(workdir, f"{name}.token"), "w") as f:
            f.write(tok + "\n")
    with open(os.path.join(workdir, "clients.tokens"), "w") as f:
        f.write(f"putter:{TOKENS['putter']}\nprober:{TOKENS['prober']}\n")
    node = ["--auth-node-tokens", f"file:{workdir}/node.token"]
    return node + ["--auth-admin-tokens", f"file:{workdir}/admin.token",
                   "--auth-client-tokens", f"file:{workdir}/clients.tokens"], node


def _prober(address: str, max_s: float, pinned: int, workdir: str) -> None:
    """Child: put the chain (and `pinned` more objects of 4 KiB, pinned), then look it up every 2 ms until stdin
    closes (or max_s); print [[start, seconds, hits], ...]."""
    import threading

    from kvpool import PoolClient

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    keys = _lookup_keys()
    rows = []
    with PoolClient(address, timeout=30, token=_token(workdir, "prober")) as pool:
        assert pool.put_many(keys, [bytes(4096)] * CHAIN, pin_s=3600) == ["stored"] * CHAIN  # kept resident
        for at in range(0, pinned, 256):        # pinned objects the pool must keep past every unpinned one
            extra = [b"Q" + i.to_bytes(15, "big") for i in range(at, min(at + 256, pinned))]
            assert pool.put_many(extra, [bytes(4096)] * len(extra), pin_s=3600) == ["stored"] * len(extra)
        assert pool.lookup_prefix(keys) == CHAIN
        print("ready", flush=True)
        end = time.monotonic() + max_s
        nxt = time.monotonic()
        while not stop.is_set() and time.monotonic() < end and len(rows) < max_s / LOOKUP_EVERY_S:
            t0 = time.monotonic()
            hits = pool.lookup_prefix(keys)
            rows.append((t0, time.monotonic() - t0, hits))
            nxt = max(nxt + LOOKUP_EVERY_S, time.monotonic())
            stop.wait(nxt - time.monotonic())      # paced: one lookup per period, like an engine's requests
    print(json.dumps(rows), flush=True)


def _put_keys(n: int, batch: int) -> list[bytes]:
    """The keys of the putter's `n`-th put (16 bytes each)."""
    return [b"P" + n.to_bytes(8, "big") + i.to_bytes(7, "big") for i in range(batch)]


def _cpu_ticks(pid: int) -> int:
    """utime + stime of process `pid`, all its threads, in clock ticks (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _putter(address: str, size: int, batch: int, transport: str, seconds: float, full_puts: int,
            pids: list[int], workdir: str) -> None:
    """Child: put chains until `full_puts` puts found both tiers full (or MAX_PUTS, or `seconds`); print
    [[start, seconds, phase, [CPU ticks of each of `pids` during it]], ...]. With a token (--quota on): the tiers
    are the tenant's quotas, read from its own counters."""
    import numpy as np

    from kvpool import PoolClient

    rng = np.random.default_rng(size)
    values = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(batch)]
    rows = []
    token = _token(workdir, "putter")
    with PoolClient(address, timeout=60, transport=transport, token=token) as pool:
        def counters():
            s = pool.stats()
            if token is not None:
                own = s["tenants"]["putter"]
                return own["quota_demotions"], own["quota_evictions"]
            return s["demotions"], s["evictions"]["ssd"]

        before = counters()
        end = time.monotonic() + seconds
        both = 0
        for n in range(MAX_PUTS):
            if both >= full_puts or time.monotonic() > end:
                break
            keys = _put_keys(n, batch)
            ticks = [_cpu_ticks(pid) for pid in pids]
            t0 = time.monotonic()
            statuses = pool.put_many(keys, values)
            dt = time.monotonic() - t0
            ticks = [_cpu_ticks(pid) - t for pid, t in zip(pids, ticks)]
            assert statuses == ["stored"] * batch, statuses
            after = counters()
            phase = "both full" if after[1] > before[1] else "DRAM full" if after[0] > before[0] else "room"
            both += phase == "both full"
            rows.append((t0, dt, phase, ticks))
            before = after
        removes = []
        for n in range(max(0, len(rows) - REMOVES), len(rows)):     # the last puts' chains, one remove call each
            keys = _put_keys(n, batch)
            t0 = time.monotonic()
            pool.remove_many(keys)
            removes.append(time.monotonic() - t0)
    print(json.dumps(rows), flush=True)
    print(json.dumps(removes), flush=True)


def one_round(args, workdir: str) -> dict:
    """One fresh pool: the prober, an idle second, the putter. Returns per phase: put times, lookup latencies; and
    under "removes" the putter's remove times."""
    master_args = [] if args.write_behind == "on" else ["--write-behind", "false"]
    node_args = ["--ssd-path", os.path.join(workdir, "ssd"), "--ssd-bytes", str(args.ssd)]
    if args.quota == "on":
        auth_master, auth_node = _write_tokens(workdir)
        master_args += auth_master + ["--tenant-quotas", f"putter:dram={args.dram // 2},total={args.ssd // 2}"]
        node_args += auth_node
    pool = Pool(args.dram, workdir, "full-pool", master_args=master_args, node_args=node_args)
    try:
        max_s = args.seconds + 60
        prober = subprocess.Popen([sys.executable, __file__, "--prober", pool.address, str(max_s), str(args.pinned),
                                   workdir],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert prober.stdout.readline().strip() == "ready"
        time.sleep(1.0)         # the idle phase: lookups with nothing else running (a fixed span, not a wait)
        putter = subprocess.run([sys.executable, __file__, "--putter", pool.address, str(args.size), str(args.batch),
                                 args.transport, str(args.seconds), str(args.full_puts),
                                 ",".join(str(proc.pid) for proc in pool.procs), workdir],
                                stdout=subprocess.PIPE, text=True, timeout=args.seconds + 120, check=True)
        puts, removes = (json.loads(line) for line in putter.stdout.strip().splitlines()[-2:])
        out, _ = prober.communicate("", timeout=120)
        lookups = json.loads(out.strip().splitlines()[-1])
    finally:
        pool.close()
    by_phase: dict[str, dict] = {p: {"puts": [], "lookups": [], "misses": 0, "ticks": [0, 0]} for p in PHASES}
    by_phase["removes"] = removes
    for _, dt, phase, ticks in puts:
        by_phase[phase]["puts"].append(dt)
        by_phase[phase]["ticks"] = [a + b for a, b in zip(by_phase[phase]["ticks"], ticks)]    # master, node
    starts = [p[0] for p in puts]
    j = 0
    for t0, dt, hits in lookups:
        while j < len(puts) and puts[j][0] + puts[j][1] < t0:
            j += 1
        if not starts or t0 < starts[0]:
            phase = "idle"
        elif j < len(puts) and puts[j][0] <= t0:
            phase = puts[j][2]
        else:
            continue            # between two puts (the putter reading counters) or after the last one
        by_phase[phase]["lookups"].append(dt)
        by_phase[phase]["misses"] += hits != CHAIN
    return by_phase


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="fresh pools; the medians over rounds are printed")
    ap.add_argument("--size", type=size_arg("--size"), default=64 << 10, help="bytes per object (e.g. 64KiB)")
    ap.add_argument("--batch", type=int, default=32, help="objects per put_many")
    ap.add_argument("--dram", type=size_arg("--dram"), default=64 << 20, help="the node's DRAM tier")
    ap.add_argument("--ssd", type=size_arg("--ssd"), default=256 << 20, help="the node's SSD tier")
    ap.add_argument("--full-puts", type=int, default=100, help="puts to time once both tiers are full")
    ap.add_argument("--seconds", type=float, default=60.0, help="the most a round's puts may take")
    ap.add_argument("--pinned", type=int, default=0,
                    help="objects of 4 KiB the prober also puts pinned (pin_s), beside its pinned 64-key chain")
    ap.add_argument("--transport", choices=("auto", "tcp"), default="auto",
                    help="the putting client's data path: auto (same host: shared memory) or tcp")
    ap.add_argument("--write-behind", choices=("on", "off"), default="on",
                    help="the master's write_behind: off, objects reach the SSD tier only when DRAM evicts them (each "
                         "full-pool put then demotes its victims with a node call under the master's lock)")
    ap.add_argument("--quota", choices=("off", "on"), default="off",
                    help="on: auth on, the putter a tenant with quotas (DRAM: half of --dram, total: half of --ssd); "
                         "its puts are classed by what its quotas made the master do")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.size < 1 or args.batch < 1 or args.full_puts < 1 or args.seconds <= 0 \
            or args.pinned < 0:
        ap.error("--rounds, --size, --batch and --full-puts must be >= 1, --seconds > 0, --pinned >= 0")
    if (args.pinned + CHAIN) * 4096 > args.dram // 4:
        ap.error("--pinned x 4 KiB must stay under a quarter of --dram (the pool's pins are capped at a share of it)")
    if args.size * args.batch > args.dram // 4:
        ap.error("--size x --batch must be at most a quarter of --dram (a put must find several rounds of room)")
    print(f"kvpool bench/full_pool.py  {datetime.date.today()}  {platform.machine()} {os.cpu_count()} cores  "
          f"python {sys.executable}", flush=True)
    print(f"puts of {args.batch} x {args.size >> 10} KiB ({args.transport}), DRAM {args.dram >> 20} MiB, "
          f"SSD {args.ssd >> 20} MiB, write-behind {args.write_behind}; a lookup of a {CHAIN}-key chain (pinned) "
          f"every {LOOKUP_EVERY_S * 1e3:.0f} ms from another client; {args.pinned} more objects pinned", flush=True)
    quota = args.quota == "on"
    name = {p: QUOTA_PHASES.get(p, p) if quota else p for p in PHASES}     # what each phase is called here
    if quota:
        print(f"quota on: auth on, the putter a tenant with DRAM quota {args.dram >> 21} MiB and total quota "
              f"{args.ssd >> 21} MiB (the pool never fills)", flush=True)
    per_round = []
    for r in tqdm(range(args.rounds), desc="full pool", unit="round"):
        workdir = tempfile.mkdtemp(prefix="kvpool-full-pool-")
        try:
            res = one_round(args, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        per_round.append(res)
        line = "  ".join(f"{name[p]}: put {statistics.median(res[p]['puts']) * 1e3:.2f} ms ({len(res[p]['puts'])})"
                         for p in PHASES[1:] if res[p]["puts"])
        look = "  ".join(f"{name[p]} {pct(res[p]['lookups'], 0.5) * 1e3:.2f} / "
                         f"{pct(res[p]['lookups'], 0.99) * 1e3:.2f}" for p in PHASES if res[p]["lookups"])
        tqdm.write(f"round {r + 1}: {line}; lookup p50 / p99 ms: {look}")

    def med(phase: str, f) -> float:
        vals = [f(res[phase]) for res in per_round if res[phase]["puts" if phase != "idle" else "lookups"]]
        return statistics.median(vals) if vals else float("nan")

    put = {p: med(p, lambda x: statistics.median(x["puts"])) for p in PHASES[1:]}
    p50 = {p: med(p, lambda x: pct(x["lookups"], 0.5)) for p in PHASES}
    p99 = {p: med(p, lambda x: pct(x["lookups"], 0.99)) for p in PHASES}
    mb = args.size * args.batch / 1e6
    print("put per call (median over rounds): " + ", ".join(
        f"{name[p]} {put[p] * 1e3:.2f} ms ({mb / put[p] / 1e3:.2f} GB/s)" for p in PHASES[1:]))
    mean = {p: med(p, lambda x: statistics.mean(x["puts"])) for p in PHASES[1:]}
    p90 = {p: med(p, lambda x: pct(x["puts"], 0.9)) for p in PHASES[1:]}
    print("put mean / p90 (ms, median over rounds): " + ", ".join(
        f"{name[p]} {mean[p] * 1e3:.2f} / {p90[p] * 1e3:.2f}" for p in PHASES[1:]))
    where = "at a tenant's quota" if quota else "on a full pool"
    print(f"ratio put {where} vs with room: "
          f"{name['DRAM full']} {put['room'] / put['DRAM full']:.2f}x, {name['both full']} "
          f"{put['room'] / put['both full']:.2f}x the room put's speed (1.00x: making room costs a put nothing)")
    tick_ms = 1e3 / os.sysconf("SC_CLK_TCK")
    cpu = {p: [med(p, lambda x, j=j: x["ticks"][j] * tick_ms / len(x["puts"])) for j in (0, 1)] for p in PHASES[1:]}
    print("CPU per put (ms, median over rounds), master / node: " + ", ".join(
        f"{name[p]} {cpu[p][0]:.2f} / {cpu[p][1]:.2f} ({sum(len(res[p]['puts']) for res in per_round)} puts)"
        for p in PHASES[1:]))
    print("lookup p50 / p99 (ms): " + ", ".join(f"{name[p]} {p50[p] * 1e3:.2f} / {p99[p] * 1e3:.2f}" for p in PHASES))
    print(f"ratio lookup p99 during {'quota' if quota else 'full-pool'} puts vs during room puts: {name['DRAM full']} "
          f"{p99['DRAM full'] / p99['room']:.2f}x, {name['both full']} {p99['both full'] / p99['room']:.2f}x (1.00x: "
          f"making room holds the master no longer)")
    remove = statistics.median(statistics.median(res["removes"]) for res in per_round)
    print(f"remove per call ({args.batch} keys, the last puts' chains, median over rounds): {remove * 1e3:.2f} ms; "
          f"ratio remove vs put with room: {put['room'] / remove:.2f}x the room put's speed (a remove moves no bytes; "
          f"its objects' SSD records are erased in one call per node)")
    misses = sum(res[p]["misses"] for res in per_round for p in PHASES)
    if misses:
        print(f"WARNING: {misses} lookups of the resident chain missed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--prober":
        _prober(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif len(sys.argv) > 1 and sys.argv[1] == "--putter":
        _putter(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], float(sys.argv[6]), int(sys.argv[7]),
                [int(pid) for pid in sys.argv[8].split(",")], sys.argv[9])
    else:
        sys.exit(main())
