#!/usr/bin/env bash
# Installs the Debian packages the test suites need when they are missing:
# protoc and its well-known types (regenerate-and-diff), PostgreSQL (store and gateway suites),
# OpenSSH client (CLI ssh-config test), busybox-static (rootfs sandboxes), curl (HTTP/2
# endpoints answered to curl's default negotiation), docker.io (docker driver suites: dockerd,
# started by test/docker/start.sh), iproute2 and util-linux's nsenter and setpriv (the
# nftables fence tests: a veth pair to a peer namespace, a pod's capability set), runc and
# containernetworking-plugins (the one-node Kubernetes harness), chromium (the headless
# browser test of service URLs).
# Needs root and apt-get; otherwise it says what to install and returns 1.
set -euo pipefail
pkgs=()
command -v protoc >/dev/null 2>&1 || pkgs+=(protobuf-compiler)
# protoc's well-known types (google/protobuf/*.proto) are only a recommendation of
# protobuf-compiler, which --no-install-recommends skips.
[ -f /usr/include/google/protobuf/descriptor.proto ] || pkgs+=(libprotobuf-dev)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || pkgs+=(postgresql)
command -v ssh >/dev/null 2>&1 || pkgs+=(openssh-client)
[ -x /usr/bin/python3 ] || pkgs+=(python3)  # the system python: sandboxes see /usr, not per-user installs
[ -x /bin/busybox ] || pkgs+=(busybox-static)
command -v curl >/dev/null 2>&1 || pkgs+=(curl)
command -v wget >/dev/null 2>&1 || pkgs+=(wget)
command -v dockerd >/dev/null 2>&1 || pkgs+=(docker.io)
command -v ip >/dev/null 2>&1 || pkgs+=(iproute2)
{ command -v nsenter && command -v setpriv; } >/dev/null 2>&1 || pkgs+=(util-linux)
# The one-node Kubernetes harness (test/k8s/node.sh): runc and the CNI plugins.
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || pkgs+=(runc)
[ -x /usr/lib/cni/bridge ] || pkgs+=(containernetworking-plugins)
# Headless browser test of sandbox service URLs (internal/gatewaytest).
command -v chromium >/dev/null 2>&1 || pkgs+=(chromium)
if [ "${#pkgs[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "test: missing packages: ${pkgs[*]} (install them with apt-get as root)" >&2
  exit 1
fi
echo "test: installing ${pkgs[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
# Debian starts a default cluster on install; the tests use their own.
service postgresql stop >/dev/null 2>&1 || true
