"""`LLM`: the offline batch API over `LLMEngine`.

    llm = LLM()                                   # bundled SmolLM2; or LLM(model="/path/model.gguf", max_num_seqs=8)
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=16))
    llm.close()                                   # or `with LLM(...) as llm:`: the connector's threads end
"""

from __future__ import annotations

from typing import Sequence

from kvpool.engine_adapter.config import EngineConfig
from kvpool.hooks import KVConnectorBase
from kvpool.engine_adapter.llm_engine import LLMEngine, RequestOutput
from kvpool.engine_adapter.sampling import SamplingParams


class LLM:
    def __init__(self, model: str | None = None, *, connector: KVConnectorBase | None = None, **config) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **config), connector=connector)
        self.tokenizer = self.engine.tokenizer

    def close(self) -> None:
        """LLMEngine.close: the connector's threads end and its leases are released; generate raises afterwards."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(self, prompts: str | Sequence[str] | Sequence[list[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run every prompt to completion, batched; results in prompt order. Bad input raises ValueError before
        any request starts."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params_list = [params or SamplingParams()] * len(prompts)
        else:
            params_list = list(params)
            if len(params_list) != len(prompts):
                raise ValueError(f"params: {len(params_list)} SamplingParams for {len(prompts)} prompts")
        for p in prompts:
            self.engine.encode_prompt(p)
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params_list)]
        results: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="generate")
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    results[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [results[i] for i in ids]
