// Package k8snode holds the end-to-end tests that need pods to run: a
// cluster from [k8stest.Start] with [k8stest.Options].Node, where a kubelet
// and containerd run the pods on this machine.
//
// The tests carry the build tag k8snode and are not yet part of `make test`:
// they do not pass yet (runc fails to start the pod sandbox; see
// docs/kubernetes.md);
// run them with `make test-k8s-node` (see docs/kubernetes.md). They need root,
// the binaries of test/k8s/build.sh and test/k8s/node/build.sh, runc,
// containernetworking-plugins and busybox-static.
package k8snode
