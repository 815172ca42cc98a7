"""Sampling parameters and the sampler.

Reproducibility: a sampled token depends only on (request seed, index of the token in the output, logits), never
on which other requests shared the step or whether the request was preempted and recomputed: each draw uses a
fresh generator seeded from xxh3(seed, index). temperature == 0 is greedy (argmax, ties -> lowest id).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import xxhash


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = -1               # -1 = whole vocabulary
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None       # None = the engine's seed mixed with the request id
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False      # True: only max_tokens / stop_token_ids end the request (benchmarks)

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not 0.0 <= float(self.temperature) <= 100.0:
            raise ValueError(f"temperature must be a number in [0, 100], got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            raise ValueError(f"top_k must be -1 (disabled) or a positive int, got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {self.max_tokens!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        ids = tuple(self.stop_token_ids)
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", ids)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # keep the smallest prefix whose mass reaches top_p (the token crossing the threshold is kept)
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], indices: list[int]) -> list[int]:
    """One token per row of logits [B, vocab]; row i uses params[i] and the draw (seeds[i], indices[i])."""
    greedy = logits.argmax(-1).tolist()
    out: list[int] = []
    for row, (p, seed, index) in enumerate(zip(params, seeds, indices)):
        if p.greedy:
            out.append(greedy[row])
            continue
        scaled = _filter(logits[row] / float(p.temperature), p.top_k, float(p.top_p))
        probs = scaled.softmax(-1)
        gen = torch.Generator().manual_seed(xxhash.xxh3_64_intdigest(f"{seed}:{index}".encode()) >> 1)
        out.append(int(torch.multinomial(probs, 1, generator=gen)))
    return out
