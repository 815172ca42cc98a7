"""LLM behaviour: batching, prefix cache, preemption, chunked prefill, seeds, stops, bad input."""

from __future__ import annotations

import pytest

from kvpool.engine_adapter.llm import LLM
from kvpool.engine_adapter.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def alone(llm, prompts):
    """Each prompt run by itself on the shared engine (the baseline the other tests compare with)."""
    return [llm.generate(p, GREEDY)[0].token_ids for p in prompts]


def test_concurrent_requests_equal_each_alone(llm, prompts, alone):
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == alone
    assert all(o.finish_reason == "length" and len(o.token_ids) == 10 for o in outs)


def test_prefix_cache_hit_equals_miss(model_path, prompts):
    llm = LLM(model_path, num_kv_blocks=128, max_model_len=512)
    long_prompt = prompts[2] * 4
    miss = llm.generate(long_prompt, GREEDY)[0]
    hit = llm.generate(long_prompt, GREEDY)[0]
    n = len(miss.prompt_token_ids)
    assert miss.num_cached_tokens_local == 0
    assert hit.num_cached_tokens_local == (n - 1) // 16 * 16 and hit.num_cached_tokens_local > 0
    assert hit.token_ids == miss.token_ids
    off = LLM(model_path, num_kv_blocks=128, max_model_len=512, enable_prefix_caching=False)
    again = off.generate(long_prompt, GREEDY)
    again += off.generate(long_prompt, GREEDY)
    assert [o.num_cached_tokens_local for o in again] == [0, 0]
    assert again[1].token_ids == miss.token_ids


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preemption_by_recompute_gives_the_same_tokens(model_path, prompts, prefix_caching):
    # 5 blocks x 16 tokens: three prompts of 14-18 tokens fit (1+2+2 blocks) but cannot all grow by 10 tokens
    llm = LLM(model_path, num_kv_blocks=5, max_model_len=64, max_num_seqs=3,
              enable_prefix_caching=prefix_caching)
    long_prompts = [prompts[1] + prompts[0], prompts[2], prompts[1] * 2]
    solo = [llm.generate(p, GREEDY)[0].token_ids for p in long_prompts]
    assert llm.engine.scheduler.num_preemptions == 0
    outs = llm.generate(long_prompts, GREEDY)
    assert llm.engine.scheduler.num_preemptions > 0
    assert sum(o.num_preemptions for o in outs) == llm.engine.scheduler.num_preemptions
    assert [o.token_ids for o in outs] == solo
    assert llm.engine.block_manager.num_free_blocks == 5


def test_chunked_prefill_equals_unchunked(model_path, prompts, alone):
    llm = LLM(model_path, num_kv_blocks=128, max_model_len=512, max_num_batched_tokens=8)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == alone


def test_seeded_sampling_is_reproducible_regardless_of_batching(llm, prompts):
    params = [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, max_tokens=12, seed=s, ignore_eos=True)
              for s in (1, 2, 3)]
    batched = llm.generate(prompts, params)
    single = [llm.generate(p, sp)[0] for p, sp in zip(prompts, params)]
    assert [o.token_ids for o in batched] == [o.token_ids for o in single]
    other_seed = llm.generate(prompts[0], SamplingParams(temperature=0.9, max_tokens=12, seed=99, ignore_eos=True))
    assert other_seed[0].token_ids != batched[0].token_ids


def test_stop_token_and_eos(llm, prompts, alone):
    stop = alone[0][3]
    out = llm.generate(prompts[0], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=(stop,)))[0]
    assert out.token_ids == alone[0][: alone[0].index(stop) + 1] and out.finish_reason == "stop"
    chat = llm.tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}])
    out = llm.generate(chat, SamplingParams(temperature=0, max_tokens=64))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] in llm.tokenizer.stop_token_ids


def test_outputs_report_text_and_ttft(llm, prompts, alone):
    out = llm.generate(prompts[0], GREEDY)[0]
    assert out.text == llm.tokenizer.decode(alone[0])
    assert out.ttft is not None and out.ttft > 0
    assert out.prompt_token_ids == llm.tokenizer.encode(prompts[0])


def test_context_limit_ends_with_length(model_path):
    llm = LLM(model_path, num_kv_blocks=8, max_model_len=20)
    out = llm.generate([1, 2, 3, 4, 5], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
    assert len(out.token_ids) == 15 and out.finish_reason == "length"


def test_bad_input_raises_clear_errors_and_engine_keeps_working(llm, prompts, alone, tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match=f"model file '{missing}' does not exist"):
        LLM(str(missing))
    with pytest.raises(ValueError, match=r"^prompt: 1100 tokens do not fit the context of max_model_len=1024"):
        llm.generate([[7] * 1100], GREEDY)
    with pytest.raises(ValueError, match=r"^prompt: is empty$"):
        llm.generate([""], GREEDY)
    with pytest.raises(ValueError, match=r"^prompt: token id 49152 is outside the vocabulary"):
        llm.generate([[1, 49152]], GREEDY)
    with pytest.raises(ValueError, match=r"^temperature must be a number in \[0, 100\], got -0.5$"):
        SamplingParams(temperature=-0.5)
    # a bad prompt in a batch rejects the batch before anything starts
    with pytest.raises(ValueError, match=r"^prompt: is empty$"):
        llm.generate([prompts[0], ""], GREEDY)
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate(prompts[0], GREEDY)[0].token_ids == alone[0]


def test_engine_config_errors(model_path):
    with pytest.raises(ValueError, match=r"EngineConfig.num_kv_blocks: 2 blocks of 16 tokens cannot hold one "
                                         r"sequence of max_model_len=64"):
        LLM(model_path, num_kv_blocks=2, max_model_len=64)
    with pytest.raises(ValueError, match=r"^EngineConfig.max_model_len=9000 exceeds the model's context length"):
        LLM(model_path, num_kv_blocks=1000, max_model_len=9000)


def test_continuous_batching_joins_and_leaves_mid_flight(model_path, llm, prompts):
    texts = [p + s for p in prompts for s in ("", " Answer briefly.")] + [prompts[0] * 3, prompts[1] * 2]
    params = [SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(len(texts))]
    solo = [llm.generate(t, p)[0].token_ids for t, p in zip(texts, params)]
    # 3 running at most, 24-token budget: requests join as others finish, prefills are chunked beside decodes
    small = LLM(model_path, num_kv_blocks=64, max_model_len=256, max_num_seqs=3, max_num_batched_tokens=24)
    outs = small.generate(texts, params)
    assert [o.token_ids for o in outs] == solo
    assert [len(o.token_ids) for o in outs] == [3 + 2 * i for i in range(len(texts))]


def test_abort_frees_blocks_and_leaves_others_alone(llm, prompts, alone):
    engine = llm.engine
    free = engine.block_manager.num_free_blocks
    keep = engine.add_request(prompts[0], GREEDY)
    drop = engine.add_request(prompts[1], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    engine.step()
    engine.abort_request(drop)
    tokens = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == keep
            tokens[out.request_id] = out.token_ids
    assert tokens[keep] == alone[0]
    assert engine.block_manager.num_free_blocks == free
