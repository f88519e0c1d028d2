//go:build tools

// Package tools pins the node's Kubernetes components test/k8s/node/build.sh
// builds: kubelet, kube-scheduler and kube-controller-manager, from the same
// k8s.io/kubernetes version as the control plane in test/k8s/tools. It is
// never compiled into anything; it only keeps the module graph (and go.sum)
// honest.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
