#!/usr/bin/env bash
# Runs the benchmarks. Each benchmark reports its figure next to a baseline
# measured in the same run (raw gRPC, raw SQL, raw fork/exec), as a ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
if out="$("$root/test/postgres/start.sh")"; then
  eval "$out"
  trap "'$root/test/postgres/stop.sh' '$OPENSHELL_TEST_POSTGRES_DIR'" EXIT
fi
export OPENSHELL_TEST_BIN_DIR="$root/bin"
go test -run '^$' -bench . -benchmem -count=1 -timeout 30m ./... "$@"
