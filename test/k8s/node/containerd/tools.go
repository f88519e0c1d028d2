//go:build tools

// Package tools pins the container runtime test/k8s/node/build.sh builds:
// containerd 2.x and its runc shim. Kept apart from the Kubernetes tools
// modules so their dependency graphs never meet. It is never compiled into
// anything.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
