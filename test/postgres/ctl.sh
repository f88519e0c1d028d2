#!/usr/bin/env bash
# Stops (fast shutdown: sessions are terminated) or starts again a cluster
# started by start.sh, keeping its data, port and options: outage tests use
# it to take the database away and bring it back.
set -euo pipefail
dir="${1:?usage: ctl.sh DIR stop|start}"
action="${2:?usage: ctl.sh DIR stop|start}"
pgbin=""
for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && pgbin="$d"; done
as_pg=()
[ "$(id -u)" = 0 ] && as_pg=(runuser -u postgres --)
case "$action" in
  stop) "${as_pg[@]}" "$pgbin/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >&2 ;;
  start) "${as_pg[@]}" "$pgbin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 -o "$(cat "$dir/options")" start >&2 \
    || { cat "$dir/server.log" >&2; exit 1; } ;;
  *) echo "ctl.sh: unknown action $action (want stop or start)" >&2; exit 2 ;;
esac
