// Package k8snode holds the end-to-end tests that need pods to run: a
// cluster from [k8stest.Start] with [k8stest.Options].Node, where a kubelet
// and containerd run the pods on this machine.
//
// They need root, the binaries of test/k8s/build.sh and
// test/k8s/node/build.sh, runc, containernetworking-plugins and
// busybox-static; without them they skip, except under CI=true where they
// fail. `make test` builds the binaries and runs them; `make test-k8s-node`
// runs only this package (see docs/kubernetes.md).
package k8snode
