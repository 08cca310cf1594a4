#!/usr/bin/env bash
# Generates canal_protocol/canal/{packet,entry}_pb2.py(i) from the project's .proto files
# with grpcio-tools' protoc (a dev dependency, pinned so the output is reproducible).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/protocol}"
cd "$root/protocol"
"$root/.venv/bin/python" -m grpc_tools.protoc -I. --python_out="$out" --pyi_out="$out" \
  canal_protocol/canal/packet.proto canal_protocol/canal/entry.proto
