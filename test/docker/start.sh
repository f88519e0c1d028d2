#!/usr/bin/env bash
# Starts a throw-away Docker Engine (dockerd with its own containerd) for the
# tests and prints `export` lines for OPENSHELL_TEST_DOCKER_HOST and
# OPENSHELL_TEST_DOCKER_DIR. Stop it with test/docker/stop.sh DIR.
#
# Its data root, exec root and API socket live in a fresh directory, so it
# never touches a Docker Engine already on the machine. Sandboxes use
# --network none or host networking only, so the daemon needs neither a
# bridge nor iptables. Needs root (dockerd does) and docker.io.
set -euo pipefail
if ! command -v dockerd >/dev/null 2>&1; then
  echo "docker: dockerd not found (apt-get install -y docker.io)" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "docker: dockerd needs root" >&2
  exit 1
fi
# The exec root holds containerd's sockets, whose paths must stay short.
dir="$(mktemp -d /tmp/openshell-docker.XXXXXX)"
sock="$dir/docker.sock"
dockerd \
  --data-root "$dir/data" --exec-root "$dir/exec" --pidfile "$dir/dockerd.pid" \
  --host "unix://$sock" --iptables=false --ip6tables=false --ip-masq=false --bridge=none \
  --containerd-namespace openshell-test --containerd-plugins-namespace openshell-test-plugins \
  >"$dir/dockerd.log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$dir/pid"
for _ in $(seq 1 300); do
  if DOCKER_HOST="unix://$sock" docker version --format '{{.Server.APIVersion}}' >/dev/null 2>&1; then
    echo "export OPENSHELL_TEST_DOCKER_HOST='unix://$sock'"
    echo "export OPENSHELL_TEST_DOCKER_DIR='$dir'"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
echo "docker: dockerd did not become ready; its log:" >&2
tail -50 "$dir/dockerd.log" >&2 || true
kill "$pid" 2>/dev/null || true
exit 1
