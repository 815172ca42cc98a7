"""Engine fixtures: the bundled SmolLM2 GGUF is dequantised once per session (loader caches it), so each engine
built here costs only its weight fusion and KV cache."""

from __future__ import annotations

import pytest
import torch

from kvpool.engine_adapter.llm import LLM
from kvpool.engine_adapter.model_files import default_model_path

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One intra-op thread: on a shared 2-core box, OpenMP threads spinning against other processes make small
    decode steps 10-20x slower. Restored after each module so other suites keep torch's default."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    return list(PROMPTS)


@pytest.fixture(scope="session")
def model_path() -> str:
    try:
        return default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def llm(model_path) -> LLM:
    """Shared engine: 512 blocks, 1024-token context. Tests must leave it idle (all requests finished)."""
    return LLM(model_path, num_kv_blocks=512, max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=1024)
