"""Connector hooks with a dict-backed store: saved blocks load into another engine and give identical output;
short loads, garbage beyond the reported count and raising connectors all fall back to recompute."""

from __future__ import annotations

import pytest
import torch

from kvpool.keys import block_keys
from kvpool.hooks import KVConnectorBase
from kvpool.engine_adapter.llm import LLM
from kvpool.engine_adapter.sampling import SamplingParams
from kvpool.kernels.kv_transfer import gather_blocks, object_shape, scatter_blocks

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


class DictConnector(KVConnectorBase):
    """Stores one pool-layout object per block key. `mode` steers load_kv: "full", "short" (first block only,
    after writing garbage into every promised block), "raise"."""

    def __init__(self, store: dict) -> None:
        self.store = store
        self.mode = "full"
        self.calls: list[tuple] = []

    def _keys(self, request):
        return block_keys(self.info.namespace, request.token_ids)

    def get_num_external_tokens(self, request, num_local_cached_tokens):
        bt = self.info.block_tokens
        n = 0
        for key in self._keys(request)[num_local_cached_tokens // bt:]:
            if key not in self.store:
                break
            n += 1
        self.calls.append(("get", request.request_id, num_local_cached_tokens, n * bt))
        return n * bt

    def load_kv(self, request, block_ids, num_local_cached_tokens, num_external_tokens):
        bt = self.info.block_tokens
        first, count = num_local_cached_tokens // bt, num_external_tokens // bt
        self.calls.append(("load", request.request_id, num_local_cached_tokens, num_external_tokens))
        if self.mode == "raise":
            raise ConnectionError("store unreachable")
        keys = self._keys(request)[first:first + count]
        targets = block_ids[first:first + count]
        if self.mode == "short":
            scatter_blocks(self.info.kv_cache, targets, [torch.full(object_shape(self.info.kv_cache), 1e4)] * count)
            scatter_blocks(self.info.kv_cache, targets[:1], [self.store[keys[0]]])
            return bt
        scatter_blocks(self.info.kv_cache, targets, [self.store[k] for k in keys])
        return count * bt

    def save_kv(self, request, block_ids, num_computed_tokens):
        keys = block_keys(self.info.namespace, request.token_ids[:num_computed_tokens])
        self.calls.append(("save", request.request_id, num_computed_tokens))
        for key, block in zip(keys, block_ids):
            if key not in self.store:
                buf = torch.empty(object_shape(self.info.kv_cache))
                gather_blocks(self.info.kv_cache, [block], [buf])
                self.store[key] = buf

    def request_finished(self, request):
        self.calls.append(("finished", request.request_id))


@pytest.fixture(scope="module")
def setup(model_path, prompts):
    store: dict = {}
    prompt = prompts[2] * 4
    saver = DictConnector(store)
    a = LLM(model_path, num_kv_blocks=64, max_model_len=256, max_num_batched_tokens=32, connector=saver)
    baseline = a.generate(prompt, GREEDY)[0]
    loader = DictConnector(store)
    b = LLM(model_path, num_kv_blocks=64, max_model_len=256, enable_prefix_caching=False, connector=loader)
    return store, prompt, saver, baseline, loader, b


def test_prefill_saves_full_prompt_blocks_chunk_by_chunk(setup):
    store, prompt, saver, baseline, _, _ = setup
    n = len(baseline.prompt_token_ids)
    assert n == 72
    # budget 32 tokens per step: chunks end at 32, 64, 72 -> saves after 2, 4 and (no new full block) none
    assert [c for c in saver.calls if c[0] == "save"] == [("save", "req-0", 32), ("save", "req-0", 64)]
    assert len(store) == n // 16
    assert saver.calls[0] == ("get", "req-0", 0, 0) and saver.calls[-1] == ("finished", "req-0")
    assert baseline.num_cached_tokens_external == 0


def test_external_load_gives_identical_output(setup):
    _, prompt, _, baseline, loader, b = setup
    loader.mode, loader.calls = "full", []
    out = b.generate(prompt, GREEDY)[0]
    assert out.num_cached_tokens_external == 64 and out.num_cached_tokens_local == 0
    assert out.token_ids == baseline.token_ids
    assert loader.calls[:2] == [("get", out.request_id, 0, 64), ("load", out.request_id, 0, 64)]


def test_short_load_recomputes_the_rest(setup):
    _, prompt, _, baseline, loader, b = setup
    loader.mode = "short"
    out = b.generate(prompt, GREEDY)[0]
    assert out.num_cached_tokens_external == 16
    assert out.token_ids == baseline.token_ids


def test_raising_connector_falls_back_to_recompute(setup):
    _, prompt, _, baseline, loader, b = setup
    loader.mode = "raise"
    out = b.generate(prompt, GREEDY)[0]
    assert out.num_cached_tokens_external == 0
    assert out.token_ids == baseline.token_ids
    assert not b.engine.has_unfinished_requests() and b.engine.block_manager.num_free_blocks == 64


def test_close_closes_the_connector_once_and_refuses_work_after(model_path, prompts):
    class Closing(DictConnector):
        def close(self):
            self.calls.append(("close",))

    conn = Closing({})
    with LLM(model_path, num_kv_blocks=64, max_model_len=256, connector=conn) as llm:
        llm.generate(prompts[0], GREEDY)
        req = llm.engine.add_request(prompts[1], GREEDY)    # left unfinished: close does not run it
    llm.close()
    assert [c for c in conn.calls if c[0] == "close"] == [("close",)]
    assert ("finished", req) not in conn.calls
    with pytest.raises(RuntimeError, match="^step: the engine is closed$"):
        llm.engine.step()
    with pytest.raises(RuntimeError, match="^add_request: the engine is closed$"):
        llm.generate(prompts[0], GREEDY)
    KVConnectorBase().close()                               # the no-op default
