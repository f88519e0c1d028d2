package k8snode_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/gatewaytest"
	"github.com/openshell-go/openshell/internal/k8stest"
	"github.com/openshell-go/openshell/internal/pki"
)

// gatewayImage is the gateway image built on this machine from the static
// openshell-gateway binary (on PATH at /usr/local/bin).
const gatewayImage = "docker.io/openshell-test/openshell-gateway:local"

// helmBinary returns the helm CLI built by test/k8s/node/build.sh
// (OPENSHELL_K8S_HELM); without it the test skips, or fails under CI=true.
func helmBinary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("OPENSHELL_K8S_HELM")
	if _, err := os.Stat(p); p == "" || err != nil {
		citest.SkipOrFail(t, "OPENSHELL_K8S_HELM=%q is not the helm binary (run: eval \"$(test/k8s/node/build.sh)\")", p)
	}
	return p
}

// TestHelmChartInstall installs deploy/helm/openshell with helm into the
// one-node cluster, with the gateway and supervisor images built on this
// machine: the PKI hook Job creates the Secrets, the gateway StatefulSet
// becomes Ready (in-cluster config to the apiserver through the kubernetes
// Service address, SQLite on its state claim), a sandbox created through that gateway runs as a pod,
// exchanges its token and turns READY, exec works, and helm uninstall
// removes the gateway.
func TestHelmChartInstall(t *testing.T) {
	helm := helmBinary(t)
	c := k8stest.Start(t, k8stest.Options{Node: true, Controller: true})
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	ns := c.CreateNamespace(t, "")

	bin := gatewaytest.BinDir(t)
	for _, img := range []struct{ name, file, path string }{
		{gatewayImage, "openshell-gateway", "usr/local/bin/openshell-gateway"},
		{SupervisorImage, "openshell-sandbox", "openshell-sandbox"},
	} {
		data, err := os.ReadFile(filepath.Join(bin, img.file))
		if err != nil {
			t.Fatal(err)
		}
		files := []k8stest.ImageFile{{Path: img.path, Mode: 0o755, Data: data}, {Path: "tmp", Dir: true, Mode: 0o1777}}
		if err := c.Node.ImportImage(ctx, k8stest.Image{Name: img.name, Files: files}); err != nil {
			t.Fatal(err)
		}
	}

	// Services have no proxy here: sandbox pods reach the gateway pod
	// through a relay on the node's bridge address, which the server
	// certificate names (serverSANs).
	const release = "openshell"
	pods := c.Clientset.CoreV1().Pods(ns)
	relay, err := k8stest.NewRelay(net.JoinHostPort(c.Node.IP, "0"), func() (string, error) {
		p, err := pods.Get(context.Background(), release+"-0", metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if p.Status.PodIP == "" {
			return "", fmt.Errorf("pod %s has no IP yet", p.Name)
		}
		return net.JoinHostPort(p.Status.PodIP, "17670"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relay.Close)

	// The chart's state volume (SQLite) binds to a hostPath volume owned
	// by the gateway's user (fsGroup does not apply to hostPath).
	stateDir := c.HostPathVolume(t, "state-"+ns, "1Gi")
	if err := os.Chown(stateDir, 65532, 65532); err != nil {
		t.Fatal(err)
	}

	dir := gatewaytest.TempDir(t)
	values := fmt.Sprintf(`image:
  repository: docker.io/openshell-test/openshell-gateway
  tag: local
  pullPolicy: Never
server:
  logLevel: debug
  # No OIDC here: the client certificate's holders are the local-dev user.
  auth:
    allowUnauthenticatedUsers: true
  serverSANs: [%q]
  drivers:
    kubernetes:
      supervisorImage: %q
      defaultImage: %q
      imagePullPolicy: Never
      gatewayEndpoint: %q
`, c.Node.IP, SupervisorImage, k8stest.BusyboxImage, "https://"+relay.Addr())
	valuesFile := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(valuesFile, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	chart := filepath.Join(filepath.Dir(file), "..", "..", "deploy", "helm", "openshell")
	runHelm := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, helm, append(args, "--kubeconfig", c.Kubeconfig, "--namespace", ns)...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(dir, "cache"), "HELM_CONFIG_HOME="+filepath.Join(dir, "config"), "HELM_DATA_HOME="+filepath.Join(dir, "data"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			logNamespace(t, c, ns)
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("helm %s:\n%s", args[0], out)
	}
	runHelm("install", release, chart, "--values", valuesFile, "--wait", "--timeout", "4m")
	t.Cleanup(func() {
		if t.Failed() {
			logNamespace(t, c, ns)
		}
	})

	// helm --wait returned: the gateway is Ready, and the hook Job ran and
	// was removed after its success (hook-delete-policy hook-succeeded).
	sts, err := c.Clientset.AppsV1().StatefulSets(ns).Get(ctx, release, metav1.GetOptions{})
	if err != nil || sts.Status.ReadyReplicas != 1 {
		t.Fatalf("gateway StatefulSet after install: %v ready replicas, %v; want 1", sts.Status.ReadyReplicas, err)
	}
	if _, err := c.Clientset.BatchV1().Jobs(ns).Get(ctx, release+"-pki-hook", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("PKI hook Job after a successful install: %v, want it deleted", err)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "openshell.db")); err != nil {
		t.Errorf("gateway state on its volume: %v", err)
	}
	for _, name := range []string{release + "-server-tls", release + "-jwt"} {
		if _, err := c.Clientset.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("PKI Secret %s from the hook: %v", name, err)
		}
	}
	// The client Secret is the test's mTLS identity.
	secret, err := c.Clientset.CoreV1().Secrets(ns).Get(ctx, release+"-client-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("client TLS Secret from the PKI hook: %v", err)
	}
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(dir, k), secret.Data[k], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tc, err := pki.ClientTLSConfig(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), c.Node.IP)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(relay.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := openshellv1.NewOpenShellClient(conn)

	const name = "via-helm"
	created, err := cl.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}})
	if err != nil {
		t.Fatalf("CreateSandbox through the installed gateway: %v", err)
	}
	id := created.GetSandbox().GetMetadata().GetId()
	t.Cleanup(func() { logPod(t, c, ns, name) })
	gatewaytest.WaitPhase(ctx, t, cl, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 3*time.Minute)
	stdout, stderr, code, err := gatewaytest.Exec(ctx, t, cl, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"hostname"}})
	if err != nil || code != 0 || strings.TrimSpace(stdout) != name {
		t.Fatalf("Exec(hostname) = %q, %q, %d, %v; want %q", stdout, stderr, code, err, name)
	}
	if _, err := cl.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: name}); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, "the sandbox pod to be gone")

	runHelm("uninstall", release, "--wait", "--timeout", "2m")
	eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		if _, err := c.Clientset.AppsV1().StatefulSets(ns).Get(ctx, release, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, err
		}
		_, err := pods.Get(ctx, release+"-0", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, "the gateway StatefulSet and its pod to be gone after uninstall")
}

// logNamespace logs the pods of ns with their status and logs.
func logNamespace(t *testing.T, c *k8stest.Cluster, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("list pods: %v", err)
		return
	}
	for _, p := range l.Items {
		t.Logf("pod %s: phase %s, %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
		for _, ct := range p.Spec.Containers {
			b, _ := c.Clientset.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: ct.Name, TailLines: ptr(int64(40))}).DoRaw(ctx)
			t.Logf("logs of %s/%s:\n%s", p.Name, ct.Name, b)
		}
	}
}

func ptr[T any](v T) *T { return &v }
