#!/usr/bin/env bash
# `make run`: build, create local PKI (once), start openshell-gateway with
# its embedded defaults (SQLite + process sandboxes, mTLS on 127.0.0.1:17670)
# in the background, then create a sandbox and open a shell in it.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$PWD/bin"
state="${XDG_STATE_HOME:-$HOME/.local/state}/openshell"
tls="${OPENSHELL_LOCAL_TLS_DIR:-$state/tls}"
log="$state/gateway.log"
pidfile="$state/gateway.pid"
mkdir -p "$state"
chmod 0700 "$state"

"$bin/openshell-gateway" generate-certs --output-dir "$tls" >/dev/null

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
if running; then
  echo "openshell-gateway already running (pid $(cat "$pidfile"))"
else
  OPENSHELL_LOCAL_TLS_DIR="$tls" nohup "$bin/openshell-gateway" >"$log" 2>&1 &
  echo $! >"$pidfile"
  echo "openshell-gateway started (pid $!, log $log)"
fi
for _ in $(seq 1 100); do
  if "$bin/openshell" status >/dev/null 2>&1; then break; fi
  if ! running; then echo "openshell-gateway exited; see $log" >&2; tail -20 "$log" >&2; exit 1; fi
  sleep 0.1
done
"$bin/openshell" status

name="${OPENSHELL_QUICKSTART_SANDBOX:-quickstart}"
if ! "$bin/openshell" sandbox get "$name" >/dev/null 2>&1; then
  "$bin/openshell" sandbox create --name "$name" --detach -- sleep infinity
fi
"$bin/openshell" sandbox exec --name "$name" --no-tty -- sh -c 'echo "hello from $(hostname): $(uname -sr)"'
cat <<MSG

Sandbox "$name" is ready. Try:
  $bin/openshell sandbox list
  $bin/openshell sandbox exec --name $name -- ls -la
  $bin/openshell sandbox connect $name        # interactive shell
  $bin/openshell sandbox delete $name
Stop the gateway with: make stop
MSG
if [ -t 0 ] && [ -t 1 ] && [ -z "${OPENSHELL_QUICKSTART_NO_SHELL:-}" ]; then
  echo "Opening a shell in $name (exit to leave; the sandbox keeps running)..."
  exec "$bin/openshell" sandbox connect "$name"
fi
