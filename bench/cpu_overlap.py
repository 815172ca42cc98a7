"""Would a layer-wise load pay on a CPU engine? Forward and KV load at once, against one after the other.

A pool hit's TTFT on the bundled CPU engine is the load (the prefix's KV copied into the paged cache, checked as it
lands) plus the forward of the rest. A layer-wise load would copy layer i + 1 on another thread while layer i
computes, so the best it can do is the two running side by side. This bench measures exactly that upper bound,
with no engine change: in interleaved rounds,

    forward      the local prefix hit of an N-token prompt (the engine's own cache; what the pool case is held to)
    load         scatter_blocks of the prompt's blocks (N / 16 objects of the model's block size) from host buffers
                 into a second cache of the same shape, each block hashed as it lands (one pass where
                 kvpool._copyhash is built), as the connector's CPU load of same-host extents does (connector/direct.py)
    both         the load on a second thread while the forward runs (wall time until both are done)

and prints medians and the ratio lines: what running them side by side saves over one after the other, and the
TTFT ratio to the local hit that each way gives. On a machine whose cores the forward already fills (torch's
intra-op threads) and whose memory bandwidth the copy fills, "both" is no faster than the sum.
Usage: python bench/cpu_overlap.py [--length 4096] [--rounds 7]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import threading
import time

import numpy as np
import torch
from tqdm import tqdm

from kvpool import copyhash
from kvpool.engine_adapter.llm import LLM
from kvpool.engine_adapter.sampling import SamplingParams
from kvpool.kernels.kv_transfer import object_shape, scatter_blocks

GREEDY = SamplingParams(temperature=0, max_tokens=1)
BLOCK = 16


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=4096, help="prompt tokens (a multiple of 16)")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    if args.length < 2 * BLOCK or args.length % BLOCK or args.rounds < 1:
        ap.error("--length must be a multiple of 16 and at least 32; --rounds at least 1")
    llm = LLM(max_model_len=args.length + 64, num_kv_blocks=(args.length + 64) // BLOCK + 8, max_num_seqs=1,
              max_num_batched_tokens=args.length + 64)
    cache = llm.engine.runner.kv_cache
    blocks = args.length // BLOCK - 1                  # what a pool hit loads: every full block but the last
    scratch = torch.zeros((*cache.shape[:2], blocks, *cache.shape[3:]), dtype=cache.dtype)
    nbytes = int(np.prod(object_shape(cache))) * cache.element_size()
    rng = np.random.default_rng(3)
    sources = [rng.integers(0, 255, nbytes, dtype=np.uint8) for _ in range(blocks)]
    ids = list(range(blocks))
    prompt = rng.integers(100, 40000, size=args.length).tolist()

    def forward() -> float:
        return llm.generate([prompt], GREEDY)[0].ttft

    def load() -> float:
        t0 = time.perf_counter()
        got = scatter_blocks(scratch, ids, sources, after=lambda i, digest: True, hash_landed=lambda i: True)
        assert got == blocks
        return time.perf_counter() - t0

    def both() -> float:
        t0 = time.perf_counter()
        th = threading.Thread(target=load)
        th.start()
        forward()
        th.join()
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {"forward": [], "load": [], "both": []}
    cases = list(times)
    with tqdm(total=1 + args.rounds, desc="cpu_overlap", unit="round", file=sys.stderr) as bar:
        llm.generate([prompt], GREEDY)     # the cold prefill: the prompt's blocks are in the engine's cache after it
        load()
        bar.update()
        for r in range(args.rounds):
            k = r % len(cases)
            for case in cases[k:] + cases[:k]:
                times[case].append({"forward": forward, "load": load, "both": both}[case]())
            bar.update()
    med = {c: statistics.median(v) for c, v in times.items()}
    serial = med["forward"] + med["load"]
    print(f"\nkvpool bench/cpu_overlap.py  {datetime.date.today()}  {platform.machine()} {os.cpu_count()} cores  "
          f"torch threads {torch.get_num_threads()}  one-pass copy {copyhash.simd() or 'off'}")
    print(f"{args.length}-token local hit and a load of {blocks} x {nbytes >> 10} KiB, median ms of {args.rounds} "
          f"interleaved rounds")
    print(" | ".join(f"{c}: {med[c] * 1e3:.1f}" for c in cases) + f" | forward + load: {serial * 1e3:.1f}")
    print(f"ratio cpu_overlap: side by side {serial / med['both']:.2f}x the speed of one after the other "
          f"({(1 - med['both'] / serial):+.0%} time saved)")
    print(f"ratio cpu_overlap: TTFT vs the local hit: {med['forward'] / serial:.2f}x one after the other, "
          f"{med['forward'] / med['both']:.2f}x side by side (the most a layer-wise load could give here; goal 0.9x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
