"""Same-host get through master + node processes: the read fence in one pass, on the calling thread, with a helper.

One pool (bench/pool_remote.py's Pool: a master and a DRAM node process), one object size at a time, 32 objects per
get_many_into call. Every round times, in an order that rotates each round, the same objects read by

    no check       PoolClient(verify="remote"): same-host copies not hashed (what the fence costs: the difference)
    one pass       PoolClient() (the default where kvpool._copyhash is built): each object copied and hashed in
                   one pass (copyhash.simd(): every 64-byte stripe stored and folded into XXH3 from one load)
    one thread     PoolClient(verify_threads=0) with the one-pass copy off (copyhash.use(False)): numpy's copy,
                   then xxh3 of each chunk on the calling thread
    helper thread  PoolClient() with the one-pass copy off: a helper thread hashes landed chunks while the next one
                   copies, for calls of at least fence.PIPELINE_MIN bytes (smaller ones run as "one thread")
    memcpy         np.copyto of the same bytes between two local buffers (the limit)

and prints medians over the rounds as GB/s and as ratios to memcpy, then the ratio lines. Shared 2-core machines are
noisy, so rounds interleave the columns and the figure is a median, not a best.

Then the connector's direct load on a CPU engine (connector/direct.py): `--load-blocks` objects shaped like
SmolLM2-135M's blocks ([30 layers, K/V, 16 tokens, 3 heads, 64] fp32, 720 KiB; 256 = a 4,096-token prompt), leased
with acquire_many in chunks of 64 (the connector's load_chunk_blocks) and copied into a paged KV cache by
scatter_blocks, in interleaved rounds:

    copy only          no check (the limit: what the copy itself costs)
    check per chunk    scatter the chunk, then read.verify(): every extent hashed again after the whole chunk
    check per block    scatter_blocks(after=read.verify_copy): each extent hashed right after its block landed,
                       still in cache (what the connector did until 2026-11-27)
    landed per block   scatter_blocks(after=read.verify_copy, hash_landed=read.needs_check) with the one-pass copy
                       off: each block's 60 runs hashed in the cache as they landed, right after torch's copy (the
                       check sees a change to the extent during the copy even when it is undone before the check)
    landed, one pass   the same call with the one-pass copy on (what the connector did where kvpool._copyhash is
                       built until 2026-11-28): each 64-byte stripe stored into its run and folded into the hash
                       from one load
    landed, two threads  the same with `helper=` a second thread: the back half of each chunk copied and hashed on
                       it while the calling thread does the front half (the connector now, for all-direct chunks)
    staged, torch      the same objects from plain host buffers (the connector's load ring, where SSD records and
                       TCP reads land, checked as they arrived), scatter_blocks(hash_landed=lambda i: False) with
                       the one-pass copy off: torch's strided copy_ per block (the connector until 2026-11-28)
    staged, one pass   the same with the one-pass copy on: its run copy, digest not used (the connector now)

    python bench/verify_pipeline.py [--sizes 64KiB 512KiB 2MiB] [--total 64MiB] [--rounds 15] [--load-blocks 256]
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
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pool_remote import Pool  # noqa: E402

from kvpool import PoolClient, copyhash, fence  # noqa: E402
from kvpool.config import parse_size  # noqa: E402

BATCH = 32
COLUMNS = ("no check", "one pass", "one thread", "helper thread", "memcpy")


def measure(address: str, size: int, total: int, rounds: int, bar) -> dict[str, float]:
    count = max(BATCH, total // size // BATCH * BATCH)
    src = [np.full(size, (i * 7 + 1) % 256, np.uint8) for i in range(count)]
    dst = [np.empty(size, np.uint8) for _ in range(count)]
    keys = [(size << 64 | i).to_bytes(16, "big") for i in range(count)]
    clients = {"no check": PoolClient(address, timeout=60, verify="remote"),
               "one thread": PoolClient(address, timeout=60, verify_threads=0),
               "helper thread": PoolClient(address, timeout=60)}
    clients["one pass"] = clients["helper thread"]
    native = bool(copyhash.simd())
    columns = COLUMNS if native else tuple(c for c in COLUMNS if c != "one pass")
    times: dict[str, list[float]] = {c: [] for c in columns}
    try:
        for i in range(0, count, BATCH):
            assert clients["one thread"].put_many(keys[i:i + BATCH], src[i:i + BATCH]) == ["stored"] * BATCH

        def get_all(client, one_pass: bool) -> None:
            if native:
                copyhash.use(one_pass)
            for i in range(0, count, BATCH):
                assert client.get_many_into(keys[i:i + BATCH], dst[i:i + BATCH]) == BATCH

        def copy_all() -> None:
            for d, s in zip(dst, src):
                np.copyto(d, s)

        runs = {name: (lambda c=c, name=name: get_all(c, name == "one pass")) for name, c in clients.items()
                if name in columns}
        runs["memcpy"] = copy_all
        for fn in runs.values():   # one untimed pass each: mappings, caches
            fn()
        for r in range(rounds):
            order = columns[r % len(columns):] + columns[:r % len(columns)]
            for name in order:
                t0 = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - t0)
                if name != "memcpy":
                    assert all(np.array_equal(a, b) for a, b in zip(src, dst)), f"{name}: bytes differ"
                for d in dst:
                    d[:1] = 0
            bar.update()
        clients["one thread"].remove_many(keys)
    finally:
        if native:
            copyhash.use(True)
        for c in {id(c): c for c in clients.values()}.values():
            c.close()
    return {name: count * size / statistics.median(v) / 1e9 for name, v in times.items()}


LOAD_COLUMNS = ("copy only", "check per chunk", "check per block", "landed per block", "landed, one pass",
                "landed, two threads", "staged, torch", "staged, one pass")
NATIVE_LOAD = ("landed, one pass", "landed, two threads", "staged, one pass")
LOAD_CHUNK = 64
LOAD_SHAPE = (30, 2, 16, 3, 64)     # SmolLM2-135M: layers, K/V, block tokens, KV heads, head dim (fp32)


def measure_load(address: str, blocks: int, rounds: int, bar) -> dict[str, float]:
    """Median seconds per load of `blocks` objects into a paged cache, per LOAD_COLUMNS entry."""
    import torch

    from kvpool.kernels.kv_transfer import scatter_blocks

    layers, two, bt, heads, dim = LOAD_SHAPE
    cache = torch.zeros((layers, two, blocks + 8, bt, heads, dim), dtype=torch.float32)
    nbytes = int(np.prod(LOAD_SHAPE)) * 4
    rng = np.random.default_rng(5)
    keys = [(0x10AD << 64 | i).to_bytes(16, "big") for i in range(blocks)]
    ids = list(range(blocks))
    native = bool(copyhash.simd())
    columns = LOAD_COLUMNS if native else tuple(c for c in LOAD_COLUMNS if c not in NATIVE_LOAD)
    staged: list[np.ndarray] = []
    times: dict[str, list[float]] = {c: [] for c in columns}
    with PoolClient(address, timeout=60) as client, ThreadPoolExecutor(1) as helper:
        for i in range(0, blocks, LOAD_CHUNK):
            objs = [rng.integers(0, 255, nbytes, dtype=np.uint8) for _ in keys[i:i + LOAD_CHUNK]]
            staged += objs
            assert client.put_many(keys[i:i + LOAD_CHUNK], objs) == ["stored"] * len(objs)
        expect = cache.clone()

        def load(column: str) -> None:
            if native:
                copyhash.use(column in NATIVE_LOAD)
            if column.startswith("staged"):
                for i in range(0, blocks, LOAD_CHUNK):
                    got = scatter_blocks(cache, ids[i:i + LOAD_CHUNK], staged[i:i + LOAD_CHUNK],
                                         after=lambda j, digest: True, hash_landed=lambda j: False)
                    assert got == len(staged[i:i + LOAD_CHUNK]), f"{column}: {got} blocks landed"
                return
            for i in range(0, blocks, LOAD_CHUNK):
                with client.acquire_many(keys[i:i + LOAD_CHUNK], [nbytes] * len(keys[i:i + LOAD_CHUNK])) as read:
                    assert read.count == len(read.keys) and all(read.direct), "not a same-host DRAM hit"
                    objects = read.buffers[:read.count]   # as the connector hands them over (connector/direct.py)
                    if column == "check per block":
                        got = scatter_blocks(cache, ids[i:i + read.count], objects, after=read.verify_copy)
                    elif column in ("landed per block", "landed, one pass", "landed, two threads"):
                        got = scatter_blocks(cache, ids[i:i + read.count], objects, after=read.verify_copy,
                                             hash_landed=read.needs_check,
                                             helper=helper if column == "landed, two threads" else None)
                    else:
                        got = scatter_blocks(cache, ids[i:i + read.count], objects)
                        if column == "check per chunk":
                            got = read.verify()
                    assert got == read.count, f"{column}: {got} of {read.count} blocks checked out"

        load("copy only")
        expect.copy_(cache)
        for fn in columns:    # one untimed pass each
            load(fn)
        for r in range(rounds):
            k = r % len(columns)
            for name in columns[k:] + columns[:k]:
                cache.zero_()
                t0 = time.perf_counter()
                load(name)
                times[name].append(time.perf_counter() - t0)
                # compared as integers: random bytes hold NaNs as float32
                assert torch.equal(cache.view(torch.int32), expect.view(torch.int32)), f"{name}: the cache differs"
            bar.update()
        client.remove_many(keys)
    if native:
        copyhash.use(True)
    return {name: statistics.median(v) for name, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["64KiB", "512KiB", "2MiB"])
    ap.add_argument("--total", default="64MiB", help="bytes read per column per round, per size")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--load-blocks", type=int, default=256,
                    help="720 KiB objects per direct load into a paged cache (0: skip that part)")
    args = ap.parse_args(argv)
    sizes = [parse_size(s, "--sizes") for s in args.sizes]
    total = parse_size(args.total, "--total")
    if args.rounds < 1 or total <= 0 or min(sizes) <= 0 or args.load_blocks < 0:
        ap.error("--rounds, --total and --sizes must be positive, --load-blocks >= 0")
    workdir = tempfile.mkdtemp(prefix="kvpool-bench-")
    load_bytes = args.load_blocks * int(np.prod(LOAD_SHAPE)) * 4
    pool = Pool(max(total, max(sizes) * BATCH, load_bytes) + (64 << 20), workdir, "verify")
    rows = {}
    load = None
    try:
        with tqdm(total=(len(sizes) + (args.load_blocks > 0)) * args.rounds, desc="verify_pipeline", unit="round",
                  file=sys.stderr) as bar:
            for size in sizes:
                rows[size] = measure(pool.address, size, total, args.rounds, bar)
            if args.load_blocks:
                load = measure_load(pool.address, args.load_blocks, args.rounds, bar)
    finally:
        pool.close()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nkvpool bench/verify_pipeline.py  {datetime.date.today()}  {platform.machine()} {os.cpu_count()} cores  "
          f"python {platform.python_version()}")
    print(f"same-host get, {BATCH} objects per call, median of {args.rounds} interleaved rounds; GB/s "
          f"(fence.PIPELINE_MIN = {fence.PIPELINE_MIN >> 20} MiB per call)")
    print(f"one-pass copy: {copyhash.simd() or 'off (' + copyhash.REASON + ')'}")
    print(f"{'size':>8} | " + " | ".join(f"{c:>13}" for c in COLUMNS))
    for size, row in rows.items():
        print(f"{size >> 10:>5}KiB | " + " | ".join(f"{row[c]:>13.2f}" if c in row else f"{'-':>13}" for c in COLUMNS))
    for size, row in rows.items():
        if "one pass" in row:
            print(f"ratio verify_pipeline {size >> 10}KiB: one pass {row['one pass'] / row['memcpy']:.2f}x memcpy, "
                  f"no check {row['no check'] / row['memcpy']:.2f}x; one pass / helper thread "
                  f"{row['one pass'] / row['helper thread']:.2f}x, / one thread "
                  f"{row['one pass'] / row['one thread']:.2f}x")
        print(f"ratio verify_pipeline {size >> 10}KiB: helper thread {row['helper thread'] / row['memcpy']:.2f}x "
              f"memcpy, one thread {row['one thread'] / row['memcpy']:.2f}x, no check "
              f"{row['no check'] / row['memcpy']:.2f}x; helper / one thread "
              f"{row['helper thread'] / row['one thread']:.2f}x")
    if load is not None:
        print(f"\ndirect load into a paged cache: {args.load_blocks} x {int(np.prod(LOAD_SHAPE)) * 4 >> 10} KiB "
              f"(acquire_many per {LOAD_CHUNK}), median ms of {args.rounds} interleaved rounds")
        print(" | ".join(f"{c}: {load[c] * 1e3:.1f}" for c in LOAD_COLUMNS if c in load))
        print(f"ratio verify_pipeline load: check per block {load['copy only'] / load['check per block']:.2f}x "
              f"the copy alone, check per chunk {load['copy only'] / load['check per chunk']:.2f}x; per block / "
              f"per chunk {load['check per chunk'] / load['check per block']:.2f}x faster")
        print(f"ratio verify_pipeline load: landed per block {load['copy only'] / load['landed per block']:.2f}x the "
              f"copy alone; its cost over the extent checked per block "
              f"{load['landed per block'] / load['check per block'] - 1:+.0%}")
        if "landed, one pass" in load:
            one = load["landed, one pass"]
            print(f"ratio verify_pipeline load: landed, one pass {load['copy only'] / one:.2f}x the copy alone; "
                  f"{load['landed per block'] / one:.2f}x faster than landed per block (two passes)")
            two = load["landed, two threads"]
            print(f"ratio verify_pipeline load: landed, two threads {load['copy only'] / two:.2f}x the copy alone; "
                  f"{one / two:.2f}x faster than one pass on one thread")
        if "staged, one pass" in load:
            print(f"ratio verify_pipeline load: staged entries (SSD records, TCP reads), one pass "
                  f"{load['staged, torch'] / load['staged, one pass']:.2f}x faster than torch's copy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
