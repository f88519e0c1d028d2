#!/usr/bin/env bash
# api/ is the only importable tree: it must not import anything under internal/.
set -euo pipefail
cd "$(dirname "$0")/.."
bad="$(go list -deps -test ./api/... | grep '^github.com/openshell-go/openshell/internal' || true)"
if [ -n "$bad" ]; then
  echo "api/ imports internal packages:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "api/ imports nothing internal"
