#!/usr/bin/env bash
# Regenerate the committed gRPC/protobuf stubs from proto/kvpool.proto.
#   bash scripts/gen_proto.sh            write proto/kvpool_pb2.py, kvpool_pb2_grpc.py, kvpool_pb2.pyi
#   bash scripts/gen_proto.sh --check    regenerate into a temp dir and fail if the committed files differ
# Stubs are committed so nodes and clients need no grpcio-tools at run time; tests/proto/test_stubs.py runs --check.
# protoc sees the file as kvpool/proto/kvpool.proto, so the generated grpc module imports
# `from kvpool.proto import kvpool_pb2` (the installed package path) instead of a bare top-level name.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/kvpool/proto" "$tmp/out"
cp proto/kvpool.proto "$tmp/src/kvpool/proto/kvpool.proto"
"$PY" -m grpc_tools.protoc -I "$tmp/src" --python_out="$tmp/out" --pyi_out="$tmp/out" --grpc_python_out="$tmp/out" \
  "$tmp/src/kvpool/proto/kvpool.proto"
status=0
for f in kvpool_pb2.py kvpool_pb2.pyi kvpool_pb2_grpc.py; do
  if [ "${1:-}" = "--check" ]; then
    cmp -s "$tmp/out/kvpool/proto/$f" "proto/$f" || { echo "proto/$f is stale: run bash scripts/gen_proto.sh" >&2; status=1; }
  else
    cp "$tmp/out/kvpool/proto/$f" "proto/$f"
  fi
done
exit $status
