//go:build tools

// Package tools pins the main packages test/k8s/build.sh builds: the
// kube-apiserver, etcd and the agent-sandbox controller. It is never
// compiled into anything; it only keeps the module graph (and go.sum) honest.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller"
)
