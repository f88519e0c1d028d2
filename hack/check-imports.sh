#!/usr/bin/env bash
# Import rules of the module, checked on every package (test files included
# where a rule says so). Each rule prints the offending imports and the
# script fails if any rule is broken.
#
#  1. api/ (generated, importable) imports nothing under internal/.
#  2. Compute drivers (internal/compute/<driver>/...) never import another
#     driver; they share only internal/compute. Tests may (remote's
#     conformance test serves the real process driver through the proxy).
#  3. Test-helper packages (a package named *test: storetest, computetest,
#     gatewaytest, relaytest, k8stest, apitest, wiretest, citest, nstest) are imported only
#     from _test.go files, or by other test helpers.
#  4. internal/server does not import internal/store (or its subpackages):
#     handlers reach state through the API packages and the lifecycle engine.
#  5. API domain packages (internal/api/<domain>/...) do not import each
#     other; they share only internal/api/authz (and apitest in tests). The
#     composition package internal/api is the one place that imports them all.
#  6. Only the docker driver (internal/compute/docker/...) imports the Docker
#     Engine client (github.com/docker/docker/...); tests may.
set -euo pipefail
cd "$(dirname "$0")/.."

mod="$(go list -m)"
fail=0
report() { # rule, offending lines
  if [ -n "$2" ]; then
    echo "import rule broken: $1" >&2
    echo "$2" | sed 's/^/  /' >&2
    fail=1
  fi
}

# One line per (package, import): "<pkg> <kind> <import>", kind is "src" for
# non-test files and "test" for _test.go files (internal and external).
edges="$(go list -f '{{$p := .ImportPath}}{{range .Imports}}{{$p}} src {{.}}
{{end}}{{range .TestImports}}{{$p}} test {{.}}
{{end}}{{range .XTestImports}}{{$p}} test {{.}}
{{end}}' ./... | sed '/^$/d' | awk -v m="$mod/" '$3 ~ "^"m { sub(m, "", $1); sub(m, "", $3); print }' | sort -u)"

# 1. api/ imports nothing internal (transitively, tests included).
bad="$(go list -deps -test ./api/... | grep "^$mod/internal" || true)"
report "api/ must import nothing under internal/" "$bad"

# 2. No driver imports another driver.
bad="$(echo "$edges" | awk '
  $2 == "src" && $1 ~ /^internal\/compute\/[^\/]+/ && $3 ~ /^internal\/compute\/[^\/]+/ {
    split($1, a, "/"); split($3, b, "/")
    if (a[3] != b[3]) print $1 " imports " $3
  }')"
report "compute drivers must not import each other" "$bad"

# 3. Test helpers only from tests (or from other test helpers).
istest='(^|/)[a-z0-9]+test$'
bad="$(echo "$edges" | awk -v t="$istest" '$2 == "src" && $3 ~ t && $1 !~ t { print $1 " imports " $3 }')"
report "test-helper packages may be imported only by _test.go files" "$bad"

# 4. server does not import store.
bad="$(echo "$edges" | awk '$1 ~ /^internal\/server(\/|$)/ && $3 ~ /^internal\/store(\/|$)/ { print $1 " (" $2 ") imports " $3 }')"
report "internal/server must not import internal/store" "$bad"

# 5. API domains import only authz (and apitest from tests).
bad="$(echo "$edges" | awk '
  $1 ~ /^internal\/api\/[^\/]+/ && $3 ~ /^internal\/api\/[^\/]+/ {
    split($1, a, "/"); split($3, b, "/")
    if (a[3] == b[3] || b[3] == "authz" || (b[3] == "apitest" && ($2 == "test" || a[3] == "apitest"))) next
    print $1 " (" $2 ") imports " $3
  }')"
report "internal/api/<domain> packages must not import each other (only authz)" "$bad"

# 6. The Docker Engine client stays inside the docker driver.
bad="$(go list -f '{{$p := .ImportPath}}{{range .Imports}}{{$p}} {{.}}
{{end}}' ./... | awk -v m="$mod/" '$2 ~ /^github\.com\/docker\/docker(\/|$)/ && $1 !~ ("^" m "internal/compute/docker(/|$)") { print $1 " imports " $2 }')"
report "only internal/compute/docker may import the Docker Engine client" "$bad"

if [ "$fail" -ne 0 ]; then
  exit 1
fi
echo "import rules hold: api/ isolated, drivers independent, test helpers test-only, server without store, API domains independent, Docker client only in the docker driver"
