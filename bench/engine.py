"""Bundled engine vs transformers on the same GGUF weights, same process, same threads.

Prints one line per measurement and a ratio line against transformers (goal: prefill <= 1.3x transformers):
  prefill N tokens   engine: one engine step (schedule + paged forward + sample) for an N-token prompt, prefix cache
                     off; transformers: model(ids, logits_to_keep=1), i.e. what generate() runs for its prefill.
  decode batch B     tokens/s over the decode steps only (prefill time subtracted), B equal-length prompts.
Usage: python bench/engine.py [--repeats 3] [--threads N] [--decode-tokens 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from tqdm import tqdm

from kvpool.engine_adapter.llm_engine import LLMEngine
from kvpool.engine_adapter.model_files import default_model_path
from kvpool.engine_adapter.sampling import SamplingParams


def engine_prefill(engine: LLMEngine, ids: list[int]) -> float:
    engine.add_request(ids, SamplingParams(temperature=0, max_tokens=1))
    t0 = time.perf_counter()
    engine.step()
    elapsed = time.perf_counter() - t0
    assert not engine.has_unfinished_requests()
    return elapsed


def hf_prefill(model, ids: list[int]) -> float:
    x = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.no_grad():
        model(x, logits_to_keep=1)
    return time.perf_counter() - t0


def engine_decode(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> float:
    """tokens/s over decode steps: the first step (prefill of all prompts) is excluded."""
    for ids in prompts:
        engine.add_request(ids, SamplingParams(temperature=0, max_tokens=new_tokens + 1, ignore_eos=True))
    engine.step()  # prefill: every prompt gets its first token
    t0 = time.perf_counter()
    produced = 0
    while engine.has_unfinished_requests():
        produced += len(engine.step())
    return produced / (time.perf_counter() - t0)


def hf_decode(model, prompts: list[list[int]], new_tokens: int) -> float:
    x = torch.tensor(prompts)
    with torch.no_grad():
        t0 = time.perf_counter()
        model.generate(x, max_new_tokens=1, min_new_tokens=1, do_sample=False, pad_token_id=2)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(x, max_new_tokens=new_tokens + 1, min_new_tokens=new_tokens + 1, do_sample=False,
                       pad_token_id=2)
        total = time.perf_counter() - t0
    return len(prompts) * new_tokens / (total - prefill)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--lengths", default="512,2048")
    parser.add_argument("--batches", default="1,16")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    batches = [int(x) for x in args.batches.split(",")]

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.float32).eval()
    engine = LLMEngine(model=path, max_model_len=max(lengths) + 64, max_num_batched_tokens=max(lengths) + 64,
                       max_num_seqs=max(batches), enable_prefix_caching=False,
                       num_kv_blocks=max(max(batches) * 8, (max(lengths) + 64) // 16 + 1))
    gen = torch.Generator().manual_seed(0)
    total = len(lengths) * (args.repeats + 1) * 2 + len(batches) * 2
    results: list[str] = []
    with tqdm(total=total, desc="bench engine") as bar:
        for n in lengths:
            ids = torch.randint(100, 40000, (n,), generator=gen).tolist()
            times = {"engine": [], "transformers": []}
            for i in range(args.repeats + 1):  # first round warms up both
                for name, fn in (("engine", lambda: engine_prefill(engine, ids)), ("transformers",
                                                                                   lambda: hf_prefill(hf, ids))):
                    t = fn()
                    if i:
                        times[name].append(t)
                    bar.update(1)
            e, h = statistics.median(times["engine"]), statistics.median(times["transformers"])
            results.append(f"prefill {n:5d} tokens: engine {e * 1000:8.1f} ms  transformers {h * 1000:8.1f} ms  "
                           f"ratio engine/transformers = {e / h:.2f}x (goal <= 1.30x)")
        for b in batches:
            prompts = [torch.randint(100, 40000, (32,), generator=gen).tolist() for _ in range(b)]
            e = engine_decode(engine, prompts, args.decode_tokens)
            bar.update(1)
            h = hf_decode(hf, prompts, args.decode_tokens)
            bar.update(1)
            results.append(f"decode batch {b:3d}: engine {e:8.1f} tok/s  transformers {h:8.1f} tok/s  "
                           f"ratio engine/transformers throughput = {e / h:.2f}x")
    print(f"threads={torch.get_num_threads()}  model={os.path.basename(path)}")
    for line in results:
        print(line)


if __name__ == "__main__":
    main()
