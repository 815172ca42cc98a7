"""GPU data path: copy bandwidth out of the pinned shared arena, and TTFT with the connector's direct path.

  bandwidth  host -> device and device -> host GB/s for one --copy-mib buffer, on one dedicated CUDA stream, wall
             time around copy + stream synchronize, repeats interleaved across the three host sides:
               arena      the DRAM arena (a /dev/shm file, as a node creates it) pinned with cudaHostRegister
               pageable   a plain numpy buffer of the same size (the driver stages the copy)
               peak       cudaHostAlloc memory: the pinned peak of this machine, measured in the same run
             ratio lines: arena / peak (goal >= 0.9) and pageable / peak, per direction.
             Then the two ways a load puts pool objects (one block each, SmolLM2's 30 x 2 x 16 x 3 x 64 float32)
             from the pinned arena into a CUDA cache, GB/s of objects landed, vs the same pinned peak:
               mapped     kernels/mapped_scatter.py: per layer one gather kernel reading the arena in place + one
                          index_put (what the connector does on CUDA)
               per-block  one non_blocking copy_ per block (kernels/kv_transfer.py scatter_blocks)
  ttft       the bundled engine on CUDA, one prompt of each --lengths tokens (random ids, 1 generated token), local
             prefix cache off so every run starts empty: cold (no pool) vs a pool hit through an in-process
             EmbeddedPool (direct path: the arena pinned, H2D straight into the KV blocks), with layer-wise overlap
             and without (the whole load before layer 0). Lengths past the model's 8K context use
             allow_long_context (RoPE extrapolated: the timing is real, the text is not).
             A fourth engine with its own prefix cache on (no pool) runs the same prompt: from the second round on
             it is the engine's local hit, the speed a pool hit is measured against.
             ratio lines: cold / hit per mode, overlap vs whole-load, pool hit vs local hit; per mode the host time
             of a load (lookups, checksums, queuing) and whether it went mapped.
On a machine where torch or CuPy sees no CUDA device it prints why and exits 0 (nothing is measured).
Usage: python bench/gpu_path.py [--copy-mib 256] [--repeats 5] [--lengths 4096,16384] [--skip-ttft] [--skip-bandwidth]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

from kvpool.tiers import gpu


def why_no_gpu() -> str | None:
    reason = gpu.unavailable_reason()
    if reason is not None:
        return f"CuPy: {reason}"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (CUDA build: {torch.version.cuda or 'none'})"
    return None


def bandwidth(copy_mib: int, repeats: int) -> None:
    from kvpool.tiers.dram import DramArena

    cp = gpu.require_cupy()
    n = copy_mib << 20
    device = cp.cuda.Memory(n)
    shm = tempfile.mkdtemp(prefix="kvpool-bench-", dir="/dev/shm")
    arena = DramArena.create(n, directory=shm)
    pinned = arena.pin()
    print(f"arena {arena.path}: {'pinned' if pinned else 'NOT pinned: ' + str(arena.pin_error)}")
    arena.array(0, n)[:] = 1
    pageable = np.ones(n, dtype=np.uint8)
    peak_ptr = cp.cuda.runtime.hostAlloc(n, 0)
    ctypes.memset(peak_ptr, 1, n)                           # touch every page, like the other two
    hosts = {"arena": arena.address, "pageable": int(pageable.ctypes.data), "peak": int(peak_ptr)}
    stream = gpu.CopyStream()
    results: dict[tuple[str, str], list[float]] = {(h, d): [] for h in hosts for d in ("H2D", "D2H")}
    try:
        for _ in range(2):                                  # warm-up: first-touch mappings, driver caches
            for ptr in hosts.values():
                stream.h2d(device.ptr, ptr, n)
                stream.d2h(ptr, device.ptr, n)
            stream.synchronize()
        for _ in tqdm(range(repeats), desc="bandwidth", leave=False):
            for name, ptr in hosts.items():
                for direction in ("H2D", "D2H"):
                    t0 = time.perf_counter()
                    if direction == "H2D":
                        stream.h2d(device.ptr, ptr, n)
                    else:
                        stream.d2h(ptr, device.ptr, n)
                    stream.synchronize()
                    results[(name, direction)].append(n / (time.perf_counter() - t0) / 1e9)
    finally:
        cp.cuda.runtime.freeHost(peak_ptr)
        arena.close()
        arena.unlink()
    for (name, direction), values in results.items():
        print(f"{direction} {name:9s} {copy_mib} MiB: median {statistics.median(values):6.2f} GB/s "
              f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} runs)")
    for direction in ("H2D", "D2H"):
        peak = statistics.median(results[("peak", direction)])
        for name in ("arena", "pageable"):
            ratio = statistics.median(results[(name, direction)]) / peak
            goal = " (goal >= 0.9)" if name == "arena" else ""
            print(f"ratio {direction} {name} / pinned peak: {ratio:.2f}x{goal}")
    scatter_paths(copy_mib, repeats, statistics.median(results[("peak", "H2D")]))


def scatter_paths(copy_mib: int, repeats: int, peak: float) -> None:
    """Pool objects in the pinned arena -> a CUDA cache's blocks: mapped gather vs per-block copies."""
    import torch

    from kvpool.kernels.kv_transfer import object_view, scatter_blocks
    from kvpool.kernels.mapped_scatter import MappedScatter
    from kvpool.tiers.dram import DramArena

    layers, bt, heads, dim = 30, 16, 3, 64
    obj = layers * 2 * bt * heads * dim * 4
    count = (copy_mib << 20) // obj
    kv = torch.zeros((layers, 2, count + 8, bt, heads, dim), dtype=torch.float32, device="cuda")
    shm = tempfile.mkdtemp(prefix="kvpool-bench-", dir="/dev/shm")
    arena = DramArena.create(count * obj, directory=shm)
    try:
        if not arena.pin():
            print(f"scatter paths: arena not pinned ({arena.pin_error}): skipped")
            return
        arena.array(0, count * obj)[:] = np.random.default_rng(0).integers(0, 256, count * obj, dtype=np.uint8)
        order = np.random.default_rng(1).permutation(count)          # blocks land out of arena order
        sources = [arena.array(int(i) * obj, obj) for i in range(count)]
        ids = [int(b) for b in order]
        objects = [object_view(s, kv) for s in sources]
        plan = MappedScatter.plan(kv, ids, objects, gpu.device_pointer)
        if plan is None:
            print("scatter paths: the arena is not mapped for kernels (device_pointer is None): skipped")
            return
        runs = {"mapped": lambda: plan.scatter(0, layers),
                "per-block": lambda: scatter_blocks(kv, ids, objects, non_blocking=True)}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(2):
            for fn in runs.values():
                fn()
        torch.cuda.synchronize()
        for _ in tqdm(range(repeats), desc="scatter paths", leave=False):
            for name, fn in runs.items():
                kv.zero_()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                times[name].append(count * obj / (time.perf_counter() - t0) / 1e9)
                i = count // 2                                        # source i landed in block order[i]
                got = kv[:, :, int(order[i])].cpu().contiguous().view(torch.uint8).reshape(-1).numpy()
                assert np.array_equal(got, arena.array(i * obj, obj)), f"{name}: block {order[i]} holds wrong bytes"
        for name, values in times.items():
            print(f"scatter {name:9s} {count} objects of {obj} bytes: median {statistics.median(values):6.2f} GB/s "
                  f"(min {min(values):.2f}, max {max(values):.2f})")
            print(f"ratio scatter {name} / pinned peak: {statistics.median(values) / peak:.2f}x")
        runs.clear(), objects.clear(), sources.clear()            # views of the arena: gone before it closes
    finally:
        arena.close()
        arena.unlink()


def ttft(lengths: list[int], repeats: int) -> None:
    import torch

    from kvpool.connector.config import ConnectorConfig
    from kvpool.connector.connector import PoolConnector
    from kvpool.embedded import EmbeddedPool
    from kvpool.engine_adapter.llm_engine import LLMEngine
    from kvpool.engine_adapter.sampling import SamplingParams

    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    for length in lengths:
        blocks = length // 16 + 2
        args = dict(device="cuda", max_model_len=length + 16, num_kv_blocks=blocks, max_num_seqs=1,
                    max_num_batched_tokens=length + 16, enable_prefix_caching=False,
                    allow_long_context=length + 16 > 8192)
        prompt = np.random.default_rng(length).integers(100, 40000, length).tolist()
        cold = LLMEngine(**args)
        block_bytes = cold.namespace.block_bytes
        pool = EmbeddedPool(dram_bytes=(blocks + 8) * block_bytes)
        engines = {"cold": cold}
        for mode in ("on", "off"):
            conn = PoolConnector(ConnectorConfig(load_policy="always", layerwise_load=mode, transfer="direct"),
                                 pool=pool)
            engines[f"hit layer-wise {mode}"] = LLMEngine(connector=conn, **args)
        engines["local prefix hit"] = LLMEngine(**dict(args, enable_prefix_caching=True))   # its own cache, no pool
        saver = engines["hit layer-wise on"]
        saver.add_request(prompt, one)                    # fills the pool with the prompt's blocks
        while saver.has_unfinished_requests():
            saver.step()
        saver.connector.flush()
        print(f"{length} tokens: pool holds {pool.stats()['objects']} blocks of {block_bytes} bytes; pinned: "
              f"{saver.connector.pinned_memory()}")
        times: dict[str, list[float]] = {name: [] for name in engines}
        host: dict[str, list[float]] = {name: [] for name in engines}
        loaded: dict[str, int] = {}
        for _ in tqdm(range(repeats + 1), desc=f"ttft {length}", leave=False):
            for name, engine in engines.items():
                stats = getattr(engine.connector, "stats", None)
                before = (stats.load_seconds, stats.loads) if stats is not None else (0.0, 0)
                engine.add_request(prompt, one)
                out = []
                while engine.has_unfinished_requests():
                    out += engine.step()
                torch.cuda.synchronize()
                times[name].append(out[-1].ttft)
                if stats is not None and stats.loads > before[1]:
                    host[name].append((stats.load_seconds - before[0]) / (stats.loads - before[1]))
                loaded[name] = out[-1].num_cached_tokens_external + out[-1].num_cached_tokens_local
        for name, values in times.items():
            values = values[1:]                           # the first round warms kernels and allocators
            conn = engines[name].connector
            extra = "" if not host[name] else (f"; host time per load {statistics.median(host[name][1:]) * 1e3:.1f}"
                                               f" ms, mapped loads {conn.mapped_loads}")
            print(f"TTFT {length} {name:20s}: median {statistics.median(values) * 1e3:8.1f} ms "
                  f"({loaded[name]} tokens cached{extra})")
        cold_s = statistics.median(times["cold"][1:])
        for mode in ("on", "off"):
            hit = statistics.median(times[f"hit layer-wise {mode}"][1:])
            print(f"ratio TTFT {length} cold / pool hit (layer-wise {mode}): {cold_s / hit:.2f}x")
        on, off = (statistics.median(times[f"hit layer-wise {m}"][1:]) for m in ("on", "off"))
        print(f"ratio TTFT {length} whole-load / layer-wise overlap: {off / on:.2f}x")
        local = statistics.median(times["local prefix hit"][1:])
        print(f"ratio TTFT {length} pool hit vs the engine's own prefix-cache hit: {local / min(on, off):.2f}x "
              f"its speed")
        for engine in engines.values():
            if hasattr(engine.connector, "close"):
                engine.connector.close()
        pool.close()
        del engines, cold, saver
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copy-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", default="4096,16384")
    parser.add_argument("--skip-ttft", action="store_true")
    parser.add_argument("--skip-bandwidth", action="store_true")
    args = parser.parse_args(argv)
    reason = why_no_gpu()
    if reason is not None:
        print(f"bench/gpu_path.py: skipped, no CUDA device: {reason}")
        return 0
    props = gpu.require_cupy().cuda.runtime.getDeviceProperties(0)
    print(f"device 0: {props['name'].decode() if isinstance(props['name'], bytes) else props['name']}")
    if not args.skip_bandwidth:
        bandwidth(args.copy_mib, args.repeats)
    if not args.skip_ttft:
        ttft([int(x) for x in args.lengths.split(",") if x], args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
