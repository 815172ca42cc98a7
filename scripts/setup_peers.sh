#!/usr/bin/env bash
# The benchmarks' peers beyond what scripts/setup.sh installs (it installs redis-server): Mooncake's store, for the
# Mooncake columns of bench/pool_remote.py (bench/mooncake_peer.py). Debian, root or sudo; idempotent, seconds when
# present. Not part of the test set-up: a benchmark whose peer is missing prints why and skips it.
#   system: libibverbs1 (the transfer engine's library loads it even for its TCP transport)
#   python: the `peers` extra of pyproject.toml (mooncake-transfer-engine-non-cuda), without reinstalling kvpool
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
PY=${PYTHON:-python3}

if command -v apt-get >/dev/null && ! ldconfig -p | grep -q 'libibverbs\.so\.1'; then
  echo "[setup_peers] apt-get install: libibverbs1"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq libibverbs1 >/dev/null
fi
if ! "$PY" -c 'import mooncake.store' 2>/dev/null || ! command -v mooncake_master >/dev/null; then
  # the extra's requirements alone (no reinstall of kvpool); Python 3.10 has no tomllib: the extra through pip then
  if mapfile -t reqs < <("$PY" -c 'import tomllib
for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["peers"]:
    print(r)') && [ "${#reqs[@]}" -gt 0 ]; then
    echo "[setup_peers] pip install ${reqs[*]}"
    "$PY" -m pip install -q "${reqs[@]}"
  else
    echo "[setup_peers] pip install -e .[peers]"
    "$PY" -m pip install -q -e '.[peers]'
  fi
fi
"$PY" -c 'import sys; sys.path.insert(0, "bench"); import mooncake_peer; why = mooncake_peer.unavailable()
sys.exit(f"[setup_peers] Mooncake still unavailable: {why}" if why else 0)'
echo "[setup_peers] ok (Mooncake's store and mooncake_master)"
