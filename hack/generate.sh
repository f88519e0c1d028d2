#!/usr/bin/env bash
# Regenerates api/ from proto/ with protoc and the Go plugins pinned in go.mod.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v protoc >/dev/null 2>&1; then
  echo "protoc not found: install it with 'apt-get install -y protobuf-compiler'" >&2
  exit 1
fi
inc=/usr/include
[ -f "$inc/google/protobuf/descriptor.proto" ] || { echo "protobuf well-known types not found under $inc: install 'protobuf-compiler'" >&2; exit 1; }
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
rm -rf api/openshell
mkdir -p api
mapfile -t files < <(cd proto && find . -name '*.proto' | sed 's|^\./||' | sort)
(cd proto && PATH="$bin:$PATH" protoc -I . -I "$inc" \
  --go_out=../api --go_opt=paths=source_relative \
  --go-grpc_out=../api --go-grpc_opt=paths=source_relative \
  "${files[@]}")
