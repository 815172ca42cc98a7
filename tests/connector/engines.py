"""Engines for connector tests. The model loads once per process (the loader caches it), so each engine after the
first costs only its KV cache. Prompts share a long prefix so a pool hit spans many blocks."""

from __future__ import annotations

from kvpool.connector.config import ConnectorConfig
from kvpool.connector.connector import PoolConnector
from kvpool.engine_adapter.llm import LLM
from kvpool.engine_adapter.sampling import SamplingParams

PREFIX = ("System: you are a careful assistant for a travel agency. Answer briefly, cite the policy section. "
          "Policy 1: refunds within 14 days. Policy 2: changes cost 20 euros. Policy 3: pets travel in carriers. ") * 2
QUESTION_A = "User: can I bring my cat?\nAssistant:"
QUESTION_B = "User: how much is a date change?\nAssistant:"
GREEDY = SamplingParams(temperature=0, max_tokens=6)
ENGINE_ARGS = dict(max_model_len=1024, num_kv_blocks=160, max_num_seqs=4)


def make_engine(pool=None, **config) -> LLM:
    connector = None
    if pool is not None or config:
        connector = PoolConnector(ConnectorConfig(**config), pool=pool)
    return LLM(connector=connector, **ENGINE_ARGS)
