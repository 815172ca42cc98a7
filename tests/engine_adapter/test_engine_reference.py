"""The engine against Hugging Face transformers on the same GGUF weights (fp32): greedy tokens and logits."""

from __future__ import annotations

import json
import os

import pytest
import torch

from kvpool.engine_adapter.sampling import SamplingParams

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def hf_model(model_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(model_path), gguf_file=os.path.basename(model_path), dtype=torch.float32)
    model.eval()
    return model


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                             pad_token_id=2)
    return out[0, len(ids):].tolist()


def engine_last_logits(engine, ids: list[int]) -> torch.Tensor:
    """Run the prompt through the scheduler and model (chunked if the engine's budget is small)."""
    rid = engine.add_request(ids, SamplingParams(temperature=0, max_tokens=1))
    while True:
        scheduled = engine.scheduler.schedule()
        logits = engine.runner.forward(scheduled)
        sampled = logits.argmax(-1).tolist()
        engine.scheduler.update(scheduled, sampled)
        if len(sampled):
            engine.requests.pop(rid, None)
            return logits[0]


def test_greedy_tokens_equal_transformers(llm, hf_model, prompts):
    prompt_ids = [llm.tokenizer.encode(p) for p in prompts]
    outs = llm.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    for ids, out in zip(prompt_ids, outs):
        assert out.token_ids == hf_greedy(hf_model, ids, NEW_TOKENS)


def test_last_position_logits_within_1e4(llm, hf_model, prompts):
    for p in prompts:
        ids = llm.tokenizer.encode(p)
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids])).logits[0, -1]
        got = engine_last_logits(llm.engine, ids)
        assert (got - ref).abs().max().item() < 1e-4


def test_chunked_prefill_after_cached_prefix_logits_within_1e4(model_path, hf_model, prompts):
    from kvpool.engine_adapter.llm_engine import LLMEngine

    engine = LLMEngine(model=model_path, num_kv_blocks=64, max_model_len=256, max_num_batched_tokens=16)
    ids = engine.tokenizer.encode(" ".join(prompts * 2))
    assert len(ids) > 40  # three chunks at least: the masked cached-prefix path runs
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0, -1]
    got = engine_last_logits(engine, ids)
    assert (got - ref).abs().max().item() < 1e-4


def test_hugging_face_safetensors_directory_gives_the_same_tokens(llm, hf_model, model_path, prompts, tmp_path):
    from kvpool.engine_adapter.llm import LLM

    tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(model_path),
                                                     gguf_file=os.path.basename(model_path))
    # transformers refuses save_pretrained on a GGUF-loaded model; write the same export by hand
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().clone() for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = hf_model.config.to_dict()
    config.pop("quantization_config", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    tok.save_pretrained(tmp_path)
    from_dir = LLM(str(tmp_path), num_kv_blocks=64, max_model_len=256)
    assert from_dir.engine.fingerprint != llm.engine.fingerprint  # fp32 export != Q4_1 bytes: never share KV
    assert from_dir.tokenizer.encode(prompts[1]) == llm.tokenizer.encode(prompts[1])
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    assert [o.token_ids for o in from_dir.generate(prompts, params)] == \
        [o.token_ids for o in llm.generate(prompts, params)]
