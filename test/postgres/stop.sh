#!/usr/bin/env bash
# Stops a cluster started by start.sh and removes its directory.
set -euo pipefail
dir="${1:?usage: stop.sh DIR}"
pgbin=""
for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && pgbin="$d"; done
as_pg=()
[ "$(id -u)" = 0 ] && as_pg=(runuser -u postgres --)
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
rm -rf "$dir"
