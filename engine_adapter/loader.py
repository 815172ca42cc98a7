"""Model files -> `ModelSpec` + fp32 state dict + fingerprint: a GGUF file, or a Hugging Face directory
(config.json + *.safetensors + tokenizer.json) through `load_model`.

llama.cpp's converter stores the rows of attn_q / attn_k permuted so that RoPE rotates interleaved pairs
(x0,x1),(x2,x3)...; our model (like transformers) rotates halves (x_i, x_{i+d/2}), so those rows are put back:

    GGUF rows of one head:  [p0a p0b p1a p1b ... ]      (pair-interleaved)
    HF rows of one head:    [p0a p1a ... | p0b p1b ...] (half-split)

The fingerprint is xxh3_128 over every tensor's name, type and raw bytes as stored (still quantised for GGUF) plus
the spec, so two files with the same weights give the same Namespace however they are named on disk. It is computed
once per (path, size, mtime) in a process. The same weights stored differently (Q4_1 GGUF vs its fp32 safetensors
export) get different fingerprints: the pool only ever shares KV between byte-identical models.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass

import numpy as np
import torch
import xxhash


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Architecture numbers of a Llama-family decoder, read from GGUF metadata."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool

    def canonical(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


@dataclass(slots=True)
class LoadedModel:
    spec: ModelSpec
    state_dict: dict[str, torch.Tensor]   # names follow transformers' LlamaForCausalLM without the "model." prefix
    fingerprint: str
    metadata: dict[str, object]           # GGUF: tokenizer.* and general.* fields; HF dir: {"hf_dir": path}


_NAME_MAP = {
    "attn_norm": "input_layernorm.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "attn_q": "self_attn.q_proj.weight",
    "attn_k": "self_attn.k_proj.weight",
    "attn_v": "self_attn.v_proj.weight",
    "attn_output": "self_attn.o_proj.weight",
    "ffn_gate": "mlp.gate_proj.weight",
    "ffn_up": "mlp.up_proj.weight",
    "ffn_down": "mlp.down_proj.weight",
}


def _reader(path: str):
    import gguf

    return gguf.GGUFReader(path)


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def read_spec(reader) -> ModelSpec:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"model: only the llama architecture is supported, the file says {arch!r}")
    p = "llama."
    hidden = int(_field(reader, p + "embedding_length"))
    heads = int(_field(reader, p + "attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = _field(reader, p + "vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    return ModelSpec(
        num_layers=int(_field(reader, p + "block_count")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(_field(reader, p + "attention.head_count_kv", heads)),
        head_dim=int(_field(reader, p + "rope.dimension_count", hidden // heads)),
        intermediate_size=int(_field(reader, p + "feed_forward_length")),
        vocab_size=int(vocab),
        rope_theta=float(_field(reader, p + "rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=int(_field(reader, p + "context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
    )


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _fingerprint_of(reader) -> str:
    h = xxhash.xxh3_128()
    h.update(read_spec(reader).canonical())
    for t in reader.tensors:
        h.update(f"{t.name}|{t.tensor_type.name}|{list(t.shape)}".encode())
        h.update(np.ascontiguousarray(t.data).view(np.uint8).data)
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _fingerprint_cached(path: str, size: int, mtime_ns: int) -> str:
    return _fingerprint_of(_reader(path))


def fingerprint(path: str) -> str:
    """Digest of weights + architecture; stable across file names, copies and processes."""
    st = os.stat(path)
    return _fingerprint_cached(os.path.realpath(path), st.st_size, st.st_mtime_ns)


def load_gguf(path: str) -> LoadedModel:
    """Dequantised model; cached per (path, size, mtime) so several engines in a process load it once."""
    st = os.stat(path)
    return _load_cached(os.path.realpath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _load_cached(path: str, size: int, mtime_ns: int) -> LoadedModel:
    import gguf

    reader = _reader(path)
    spec = read_spec(reader)
    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        parts = t.name.split(".")
        if parts[0] == "blk":
            layer, kind = int(parts[1]), parts[2]
            if kind == "attn_q":
                w = _unpermute(w, spec.num_heads)
            elif kind == "attn_k":
                w = _unpermute(w, spec.num_kv_heads)
            name = f"layers.{layer}.{_NAME_MAP[kind]}"
        elif t.name == "token_embd.weight":
            name = "embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        else:
            continue
        state[name] = torch.from_numpy(np.array(w, dtype=np.float32, order="C"))  # own, writable copy
    metadata: dict[str, object] = {}
    for key, field in reader.fields.items():
        if key.startswith(("tokenizer.", "general.")):
            metadata[key] = field.contents()
    digest = _fingerprint_of(reader)  # same reader: the file is parsed once
    return LoadedModel(spec=spec, state_dict=state, fingerprint=digest, metadata=metadata)


def load_model(path: str) -> LoadedModel:
    """A .gguf file or a Hugging Face model directory."""
    return load_hf_dir(path) if os.path.isdir(path) else load_gguf(path)


def _hf_spec(cfg: dict) -> ModelSpec:
    if cfg.get("model_type") != "llama":
        raise ValueError(f"model: only the llama architecture is supported, config.json says "
                         f"{cfg.get('model_type')!r}")
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ValueError(f"model: rope scaling {rope.get('rope_type', rope.get('type'))!r} is not supported")
    heads = int(cfg["num_attention_heads"])
    return ModelSpec(
        num_layers=int(cfg["num_hidden_layers"]), hidden_size=int(cfg["hidden_size"]), num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        intermediate_size=int(cfg["intermediate_size"]), vocab_size=int(cfg["vocab_size"]),
        rope_theta=float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)))


def load_hf_dir(path: str) -> LoadedModel:
    """config.json + *.safetensors (transformers' LlamaForCausalLM names) -> fp32 state dict."""
    from safetensors import safe_open

    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"model directory {path!r} has no config.json")
    with open(cfg_path) as f:
        spec = _hf_spec(json.load(f))
    files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"model directory {path!r} has no *.safetensors files")
    h = xxhash.xxh3_128()
    h.update(spec.canonical())
    state: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(os.path.join(path, name), framework="pt") as f:
            for key in sorted(f.keys()):
                t = f.get_tensor(key)
                h.update(f"{key}|{t.dtype}|{list(t.shape)}".encode())
                h.update(t.contiguous().view(torch.uint8).numpy().data)
                state[key.removeprefix("model.")] = t.to(torch.float32).contiguous()
    return LoadedModel(spec=spec, state_dict=state, fingerprint=h.hexdigest(), metadata={"hf_dir": path})
