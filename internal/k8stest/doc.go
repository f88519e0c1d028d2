// Package k8stest runs a real Kubernetes control plane for tests: etcd, a
// kube-apiserver and (optionally) the agent-sandbox controller, as child
// processes on loopback. By default there is no kubelet, scheduler or
// controller-manager: pods stay Pending until a test marks them Ready with
// [Cluster.MarkPodReady], new namespaces get no "default" ServiceAccount, and
// nothing garbage-collects owned objects or finalizes namespaces.
//
// With [Options].Node the cluster also gets a node ([Node]): containerd and a
// kubelet that run the pods on this machine (root only), kube-scheduler and
// kube-controller-manager, images built locally ([Node.ImportImage]), a pod
// bridge, hostPath PersistentVolumes ([Cluster.HostPathVolume]) and the
// apiserver reachable from pods at the kubernetes Service address; [Relay]
// lets pods reach other loopback servers. See docs/kubernetes.md.
//
// The binaries come from test/k8s/build.sh, which builds them once per
// machine and prints the directory to use:
//
//	eval "$(test/k8s/build.sh)"   # exports OPENSHELL_K8S_BIN_DIR
//	go test ./internal/compute/kubernetes/...
//
// `make test` (test/run-all.sh) does this itself. When OPENSHELL_K8S_BIN_DIR is
// unset or lacks a binary the tests skip, except under CI=true where they fail.
//
// # One cluster per test binary
//
// Starting a cluster costs a few seconds and ~400 MB, so packages share one:
//
//	func TestMain(m *testing.M) { k8stest.Main(m) }
//
//	func TestCreate(t *testing.T) {
//		c := k8stest.Shared(t) // etcd + apiserver + agent-sandbox controller
//		ns := c.CreateNamespace(t, "")
//		c.CreateServiceAccount(t, ns, "sandbox")
//		...
//	}
//
// Tests on the shared cluster isolate themselves by namespace. [Start] gives a
// test its own cluster, stopped in t.Cleanup, for tests that need a pristine
// one (other options, or no controller).
//
// # Apiserver configuration
//
// RBAC authorization; an admin user (group system:masters) authenticated by a
// static bearer token; ServiceAccount tokens signed by a generated RSA key with
// issuer [Issuer] and API audience [Issuer] (TokenRequest can ask for any other
// audience, such as "openshell-gateway"); the agent-sandbox Sandbox CRD
// (v1beta1 storage, v1alpha1 served; plus the extensions CRDs when
// [Options].ExtensionCRDs) installed with spec.conversion.strategy None.
//
// Cluster methods that take a testing.TB fail the test on error; the Cluster
// fields give direct access (clientset, dynamic client, rest.Config) for
// tests that assert on errors. A Cluster is safe for concurrent use.
package k8stest
