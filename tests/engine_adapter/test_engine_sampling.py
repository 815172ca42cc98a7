"""The sampler: greedy, top-k, top-p and per-(seed, index) reproducibility, on fixed logits (no model)."""

from __future__ import annotations

import torch

from kvpool.engine_adapter.sampling import SamplingParams, sample

LOGITS = torch.tensor([[0.0, 3.0, 2.9, -1.0, 1.0, 2.0]])


def draws(params: SamplingParams, n: int = 200, logits: torch.Tensor = LOGITS) -> list[int]:
    return [sample(logits, [params], [7], [i])[0] for i in range(n)]


def test_greedy_is_argmax_with_lowest_id_on_ties():
    assert sample(LOGITS, [SamplingParams(temperature=0)], [0], [0]) == [1]
    tie = torch.tensor([[1.0, 5.0, 5.0]])
    assert sample(tie, [SamplingParams(temperature=0)], [0], [0]) == [1]


def test_top_k_and_top_p_restrict_the_support_exactly():
    assert set(draws(SamplingParams(temperature=1.0, top_k=2))) == {1, 2}
    assert set(draws(SamplingParams(temperature=1.0, top_k=1))) == {1}
    # softmax of LOGITS: p1=0.40, p2=0.37, p5=0.15 ... top_p=0.5 keeps {1, 2}: 1 alone (0.40) is below 0.5
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.5))) == {1, 2}
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.3))) == {1}
    assert set(draws(SamplingParams(temperature=1.0), n=400)) == {0, 1, 2, 3, 4, 5}


def test_draws_depend_only_on_seed_and_index():
    p = SamplingParams(temperature=1.0)
    first = draws(p, 50)
    assert draws(p, 50) == first
    batch = torch.cat([torch.zeros(1, 6), LOGITS, torch.randn(1, 6)])  # other rows do not change this row's draw
    assert [sample(batch, [p, p, p], [1, 7, 3], [0, i, 0])[1] for i in range(50)] == first
    other = [sample(LOGITS, [p], [8], [i])[0] for i in range(50)]
    assert other != first
