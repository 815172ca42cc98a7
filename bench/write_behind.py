"""What the inclusive SSD tier (write-behind, MasterConfig.write_behind) costs in write bandwidth, beside the disk's
own limit, all measured in this one run on the same directory:

  inclusive    EmbeddedPool(write_behind=True): every put is copied to its SSD extent by the writer thread
  exclusive    EmbeddedPool(write_behind=False): only DRAM victims are written to SSD (demotion)
  copier       the write-behind alone: puts with the writer thread parked, then `Master.copy_pending` rounds
               until every copy is written, timed by themselves (what the copier costs without a put beside it)
  raw pwrite   os.pwrite of the same records (4 KiB header page + payload) at consecutive offsets of a
               preallocated file: the physical limit the SSD tier writes against

Each round puts `--total` bytes of `--size` objects in batches of `--batch` into a pool with `--dram` of DRAM and an
SSD large enough for all of it (so nothing is evicted and the two modes write comparable data). `put` is the rate
the caller sees; `sustained` also waits until every write-behind copy is written (`stats()["write_behind"]`), which
is what a put rate above the disk's would run into. SSD bytes written come from the process's own write syscalls
(/proc/self/io wchar), so they count headers and every copy. Rounds interleave the three cases; medians printed.

    python bench/write_behind.py [--total 512MiB] [--size 256KiB] [--dram 64MiB] [--rounds 3] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

from kvpool import EmbeddedPool
from kvpool.config import parse_size

HEADER = 4096


def wchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no wchar line")


def ssd_size(n: int, size: int, dram: int) -> int:
    """Room for every record, and at least twice the DRAM (below that a node keeps the exclusive tiers)."""
    return max((n + 16) * (size + HEADER), 2 * dram + (1 << 20))


def run_copier(args, workdir: str, salt: int) -> dict:
    n = args.total // args.size
    shm = tempfile.mkdtemp(prefix="kvpool-bench-", dir="/dev/shm")
    payload = np.full(args.size, salt % 251, np.uint8)
    try:
        dram = n * args.size + (1 << 20)
        with EmbeddedPool(dram_bytes=dram, ssd_path=os.path.join(workdir, "ssd"),
                          ssd_bytes=ssd_size(n, args.size, dram), shm_dir=shm, write_behind_s=3600.0,
                          max_object_bytes=max(args.size, 1 << 20)) as pool:
            for b in range(0, n, args.batch):
                keys = [(salt << 40 | b + j).to_bytes(16, "little") for j in range(min(args.batch, n - b))]
                pool.put_many(keys, [payload] * len(keys))
            start = time.perf_counter()
            copied = 0
            while done := pool.master.copy_pending():
                copied += done
            seconds = time.perf_counter() - start
            assert copied == n, (copied, n)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(os.path.join(workdir, "ssd"), ignore_errors=True)
    return {"put": n * args.size / seconds / 1e9}


def run_pool(write_behind: bool, args, workdir: str, salt: int) -> dict:
    n = args.total // args.size
    ssd_bytes = ssd_size(n, args.size, args.dram)
    shm = tempfile.mkdtemp(prefix="kvpool-bench-", dir="/dev/shm")
    payloads = [np.full(args.size, (i * 37 + salt) % 251, np.uint8) for i in range(args.batch)]
    try:
        with EmbeddedPool(dram_bytes=args.dram, ssd_path=os.path.join(workdir, "ssd"), ssd_bytes=ssd_bytes,
                          shm_dir=shm, write_behind=write_behind, promote_on_hit=False,
                          max_object_bytes=max(args.size, 1 << 20)) as pool:
            written0 = wchar()
            start = time.perf_counter()
            for b in range(0, n, args.batch):
                keys = [(salt << 40 | b + j).to_bytes(16, "little") for j in range(min(args.batch, n - b))]
                assert pool.put_many(keys, payloads[:len(keys)]) == ["stored"] * len(keys)
            put_s = time.perf_counter() - start
            while pool.stats()["write_behind"]["pending"]:
                time.sleep(0.001)
            sustained_s = time.perf_counter() - start
            written = wchar() - written0
            stats = pool.stats()
            assert sum(stats["evictions"].values()) == 0, "the SSD must hold everything: no evictions"
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(os.path.join(workdir, "ssd"), ignore_errors=True)
    nbytes = n * args.size
    return {"put": nbytes / put_s / 1e9, "sustained": nbytes / sustained_s / 1e9, "amplification": written / nbytes,
            "copied": stats["write_behind"]["copied_bytes"] / nbytes}


def run_raw(args, workdir: str) -> dict:
    n = args.total // args.size
    record = args.size + HEADER
    path = os.path.join(workdir, "raw.data")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, n * record)
        header = bytes(HEADER)
        payload = np.full(args.size, 7, np.uint8)
        start = time.perf_counter()
        for i in range(n):
            os.pwrite(fd, header, i * record)
            os.pwrite(fd, payload, i * record + HEADER)
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)
    return {"put": n * args.size / seconds / 1e9}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", default="512MiB", help="bytes put per case per round")
    ap.add_argument("--size", default="256KiB", help="object size")
    ap.add_argument("--dram", default="64MiB", help="DRAM tier of the pool")
    ap.add_argument("--batch", type=int, default=8, help="objects per put_many")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp", help="directory of the SSD files (the disk measured)")
    args = ap.parse_args(argv)
    args.total, args.size, args.dram = (parse_size(args.total, "--total"), parse_size(args.size, "--size"),
                                        parse_size(args.dram, "--dram"))
    if not os.path.exists("/proc/self/io"):
        print("skipped: /proc/self/io is needed to count the bytes written")
        return 0
    workdir = tempfile.mkdtemp(prefix="kvpool-wb-", dir=args.dir)
    results: dict[str, list[dict]] = {"inclusive": [], "exclusive": [], "copier": [], "raw": []}
    try:
        with tqdm(total=4 * args.rounds, desc="write_behind", unit="case", file=sys.stderr) as bar:
            for r in range(args.rounds):
                for case in results:                            # interleaved: drift hits every case alike
                    if case == "raw":
                        results[case].append(run_raw(args, workdir))
                    elif case == "copier":
                        results[case].append(run_copier(args, workdir, r))
                    else:
                        results[case].append(run_pool(case == "inclusive", args, workdir, r))
                    bar.update(1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def med(case: str, key: str) -> float:
        return statistics.median(x[key] for x in results[case])

    print(f"\nkvpool bench/write_behind.py  {datetime.date.today()}  {platform.machine()} {os.cpu_count()} cores  "
          f"python {platform.python_version()}")
    print(f"{args.total >> 20} MiB of {args.size >> 10} KiB objects per case, DRAM {args.dram >> 20} MiB, batch "
          f"{args.batch}, SSD files under {args.dir}; median of {args.rounds} interleaved rounds; GB/s")
    print(f"{'case':>10} | {'put':>6} {'sustained':>9} | {'SSD bytes written / put':>23} {'copied / put':>12}")
    for case in ("inclusive", "exclusive"):
        print(f"{case:>10} | {med(case, 'put'):6.2f} {med(case, 'sustained'):9.2f} | "
              f"{med(case, 'amplification'):23.2f} {med(case, 'copied'):12.2f}")
    print(f"{'copier':>10} | {'':>6} {med('copier', 'put'):9.2f} | {'':>23} {1.0:12.2f}")
    print(f"{'raw pwrite':>10} | {med('raw', 'put'):6.2f} {'':>9} | {1 + HEADER / args.size:23.2f}")
    print()
    print(f"write-behind cost: put {med('inclusive', 'put') / med('exclusive', 'put'):.2f}x, sustained "
          f"{med('inclusive', 'sustained') / med('exclusive', 'sustained'):.2f}x the exclusive tiers; "
          f"SSD bytes written per byte put {med('inclusive', 'amplification'):.2f} vs "
          f"{med('exclusive', 'amplification'):.2f}")
    print(f"inclusive sustained put {med('inclusive', 'sustained') / med('raw', 'put'):.2f}x raw pwrite of the same "
          f"records; exclusive {med('exclusive', 'sustained') / med('raw', 'put'):.2f}x; the write-behind copier "
          f"alone {med('copier', 'put') / med('raw', 'put'):.2f}x raw pwrite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
