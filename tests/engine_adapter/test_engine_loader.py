"""GGUF loading: spec from metadata, RoPE row order, fingerprint stability."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from kvpool.engine_adapter.loader import _reader, _unpermute, fingerprint, load_model, read_spec

# The bundled model's fingerprint feeds every pool Namespace: changing the scheme silently orphans every stored block.
PINNED = "55fae0ce04bf1e94afe19cce396d506f"


def test_spec_from_gguf_metadata(model_path):
    spec = read_spec(_reader(model_path))
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (30, 576, 9, 3, 64)
    assert (spec.intermediate_size, spec.vocab_size, spec.rope_theta) == (1536, 49152, 100000.0)
    assert spec.tie_word_embeddings


def test_unpermute_inverts_the_llama_cpp_rope_permutation():
    heads, dim, cols = 3, 8, 5
    hf = np.arange(heads * dim * cols, dtype=np.float32).reshape(heads * dim, cols)
    # llama.cpp convert: reshape(heads, 2, dim/2, cols).swapaxes(1, 2) interleaves the two halves of each head
    gguf_rows = hf.reshape(heads, 2, dim // 2, cols).swapaxes(1, 2).reshape(hf.shape)
    assert np.array_equal(_unpermute(gguf_rows, heads), hf)


def test_fingerprint_is_pinned_and_follows_bytes_not_names(model_path, tmp_path):
    assert fingerprint(model_path) == PINNED
    copy = tmp_path / "renamed.gguf"
    shutil.copyfile(model_path, copy)
    assert fingerprint(str(copy)) == PINNED
    tensor = _reader(str(copy)).tensors[5]
    offset = tensor.data_offset + 7
    with open(copy, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    assert fingerprint(str(copy)) != PINNED


def test_hf_directory_without_config_or_weights_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"model directory '{tmp_path}' has no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "llama", "num_attention_heads": 2, "num_hidden_layers": 1,'
                                          ' "hidden_size": 8, "intermediate_size": 16, "vocab_size": 10}')
    with pytest.raises(FileNotFoundError, match=r"has no \*\.safetensors files"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "mistral"}')
    with pytest.raises(ValueError, match="only the llama architecture is supported, config.json says 'mistral'"):
        load_model(str(tmp_path))
