//go:build tools

// Package tools pins the helm CLI that the one-node suites install the
// chart with (built by test/k8s/node/build.sh).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
