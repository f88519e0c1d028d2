#!/usr/bin/env bash
# Stops a Docker Engine started by start.sh: removes every container it
# still runs, stops dockerd (and the containerd it started) and removes its
# directory.
set -euo pipefail
dir="${1:?usage: stop.sh DIR}"
[ -f "$dir/pid" ] || exit 0
pid="$(cat "$dir/pid")"
export DOCKER_HOST="unix://$dir/docker.sock"
ids="$(docker ps -aq 2>/dev/null || true)"
[ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
if kill -0 "$pid" 2>/dev/null; then
  kill "$pid"
  for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
fi
# Mounts dockerd left behind (overlay layers, shm) must go before the files.
{ grep -o " $dir/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
rm -rf "$dir"
