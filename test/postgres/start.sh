#!/usr/bin/env bash
# Starts a throw-away PostgreSQL cluster on loopback for the tests and prints
# `export` lines for OPENSHELL_TEST_POSTGRES_URL and OPENSHELL_TEST_POSTGRES_DIR.
# Stop it with test/postgres/stop.sh DIR; test/postgres/ctl.sh DIR stop|start
# pauses and resumes it (outage tests). initdb refuses root, so the cluster
# runs as the postgres user when started by root.
set -euo pipefail
pgbin=""
for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && pgbin="$d"; done
if [ -z "$pgbin" ]; then
  echo "postgres: initdb not found (apt-get install -y postgresql)" >&2
  exit 1
fi
dir="$(mktemp -d /tmp/openshell-pg.XXXXXX)"
chmod 0755 "$dir"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
as_pg=()
if [ "$(id -u)" = 0 ]; then
  chown postgres:postgres "$dir"
  as_pg=(runuser -u postgres --)
fi
pw="openshell-test"
echo "$pw" > "$dir/pwfile"
[ "$(id -u)" = 0 ] && chown postgres:postgres "$dir/pwfile"
"${as_pg[@]}" "$pgbin/initdb" -D "$dir/data" -U openshell --pwfile="$dir/pwfile" -A scram-sha-256 >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
# ctl.sh restarts the cluster with the same options.
echo "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" >"$dir/options"
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 -o "$(cat "$dir/options")" start >&2 \
  || { cat "$dir/server.log" >&2; exit 1; }
echo "export OPENSHELL_TEST_POSTGRES_URL='postgres://openshell:$pw@127.0.0.1:$port/postgres?sslmode=disable'"
echo "export OPENSHELL_TEST_POSTGRES_DIR='$dir'"
