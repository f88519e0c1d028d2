package k8snode_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/gatewaytest"
	"github.com/openshell-go/openshell/internal/k8stest"
)

// SupervisorImage is the supervisor image built on this machine from the
// static openshell-sandbox binary: only /openshell-sandbox, which the
// driver's init container runs as `copy-self` into the pod.
const SupervisorImage = "docker.io/openshell-test/openshell-sandbox:local"

const sandboxSA = "openshell-sandbox"

// podGateway is a gateway on the kubernetes driver whose sandboxes run as
// real pods on the cluster's node.
type podGateway struct {
	*gatewaytest.Gateway
	c  *k8stest.Cluster
	ns string
	// Endpoint is where the pods reach the gateway (the node's bridge).
	Endpoint string
}

// startPodGateway starts a one-node cluster with the agent-sandbox
// controller, imports the supervisor image, and starts a gateway on the
// kubernetes driver that the pods reach through a TCP relay on the node's
// bridge address (the gateway itself listens on loopback only). Its server
// certificate names that address; the client certificate the supervisors
// use is the Secret openshell-client-tls. extraTOML is appended to the
// [openshell.drivers.kubernetes] table.
// createReady creates a sandbox running `sleep infinity`, logs its pod
// when the test ends, waits until it is READY and returns its id.
func (g podGateway) createReady(ctx context.Context, t *testing.T, name string) string {
	t.Helper()
	created, err := g.Client().CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	t.Cleanup(func() { logPod(t, g.c, g.ns, name) })
	gatewaytest.WaitPhase(ctx, t, g.Client(), name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 3*time.Minute)
	return created.GetSandbox().GetMetadata().GetId()
}

func startPodGateway(t *testing.T, extraTOML string) podGateway {
	t.Helper()
	c := k8stest.Start(t, k8stest.Options{Node: true, Controller: true})
	ctx := t.Context()
	ns := c.CreateNamespace(t, "")
	c.CreateServiceAccount(t, ns, sandboxSA)

	bin := gatewaytest.BinDir(t)
	sup, err := os.ReadFile(filepath.Join(bin, "openshell-sandbox"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Node.ImportImage(ctx, k8stest.Image{Name: SupervisorImage, Files: []k8stest.ImageFile{{Path: "openshell-sandbox", Mode: 0o755, Data: sup}}}); err != nil {
		t.Fatal(err)
	}

	// PKI whose server certificate also names the bridge address.
	tlsDir := gatewaytest.TempDir(t)
	if out, err := exec.Command(filepath.Join(bin, "openshell-gateway"), "generate-certs", "--output-dir", tlsDir, "--server-san", c.Node.IP).CombinedOutput(); err != nil {
		t.Fatalf("generate-certs: %v\n%s", err, out)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "openshell-client-tls"}, Data: map[string][]byte{}}
	for key, file := range map[string]string{"ca.crt": "ca.crt", "tls.crt": "client/tls.crt", "tls.key": "client/tls.key"} {
		b, err := os.ReadFile(filepath.Join(tlsDir, file))
		if err != nil {
			t.Fatal(err)
		}
		secret.Data[key] = b
	}
	if _, err := c.Clientset.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	port := freePort(t)
	relay := startRelay(t, net.JoinHostPort(c.Node.IP, "0"), fmt.Sprintf("127.0.0.1:%d", port))
	endpoint := "https://" + relay
	cfg := fmt.Sprintf(`[openshell]
version = 1

[openshell.drivers.kubernetes]
kubeconfig = %q
sandbox_namespace = %q
gateway_endpoint = %q
default_image = %q
supervisor_image = %q
image_pull_policy = "Never"
client_tls_secret_name = "openshell-client-tls"
%s`, c.Kubeconfig, ns, endpoint, k8stest.BusyboxImage, SupervisorImage, extraTOML)
	cfgPath := filepath.Join(gatewaytest.TempDir(t), "gateway.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	g := gatewaytest.Start(t, gatewaytest.Options{Port: port, TLSDir: tlsDir, ExtraArgs: []string{"--drivers", "kubernetes", "--config", cfgPath, "--allow-unauthenticated-users"}})
	return podGateway{Gateway: g, c: c, ns: ns, Endpoint: endpoint}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startRelay copies TCP connections accepted on listen to target until the
// test ends, and returns the address it listens on.
func startRelay(t *testing.T, listen, target string) string {
	t.Helper()
	l, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		if add {
			conns[c] = struct{}{}
		} else {
			delete(conns, c)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			track(in, true)
			track(out, true)
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}
			go pipe(out, in)
			go func() {
				pipe(in, out)
				track(in, false)
				track(out, false)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

// TestGatewaySandboxInPod: a sandbox created through the real gateway on
// the kubernetes driver runs as a real pod: the init container copies the
// supervisor out of the locally built supervisor image, the supervisor in
// the agent container exchanges its projected ServiceAccount token (checked
// by TokenReview) for a sandbox session over the pod network, the sandbox
// turns READY, exec runs inside the container, and delete removes the
// Sandbox CR and the pod.
func TestGatewaySandboxInPod(t *testing.T) {
	g := startPodGateway(t, "")
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	const name = "in-pod"
	id := g.createReady(ctx, t, name)

	pod, err := g.c.Clientset.CoreV1().Pods(g.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Spec.NodeName != k8stest.NodeName {
		t.Fatalf("pod phase %s on node %q, want Running on %s", pod.Status.Phase, pod.Spec.NodeName, k8stest.NodeName)
	}
	if !strings.Contains(g.Logs(), "sandbox bootstrapped from a K8s ServiceAccount token") {
		t.Errorf("gateway log lacks the bootstrap success line")
	}

	// Exec runs in the pod: its hostname is the pod's name, and the
	// supervisor's binary is the one the init container copied.
	stdout, stderr, code, err := gatewaytest.Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", "hostname; test -x /opt/openshell/bin/openshell-sandbox && echo supervisor-present"}})
	if err != nil || code != 0 {
		t.Fatalf("Exec = %q, %q, %d, %v", stdout, stderr, code, err)
	}
	if got := strings.Fields(stdout); len(got) != 2 || got[0] != name || got[1] != "supervisor-present" {
		t.Errorf("Exec stdout = %q, want the pod's hostname %q and supervisor-present", stdout, name)
	}

	if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: name}); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := g.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(g.ns).Get(ctx, name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, err
		}
		_, err = g.c.Clientset.CoreV1().Pods(g.ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, "the Sandbox CR and its pod to be gone")
}

// logPod logs the pod's status and its containers' logs when t failed.
func logPod(t *testing.T, c *k8stest.Cluster, ns, name string) {
	if !t.Failed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod, err := c.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Logf("pod %s/%s: %v", ns, name, err)
		return
	}
	t.Logf("pod %s/%s status: %+v", ns, name, pod.Status)
	for _, ct := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		b, err := c.Clientset.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: ct.Name}).DoRaw(ctx)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Logf("logs of %s: %v", ct.Name, err)
			continue
		}
		t.Logf("logs of %s:\n%s", ct.Name, b)
	}
}

// TestGatewaySandboxStopStartKeepsWorkspace: with workspace_pvc the pod's
// /sandbox is a PersistentVolumeClaim from the Sandbox's
// volumeClaimTemplates. Stop deletes the pod, start runs a new pod (new
// UID, new token exchange) that sees what the first one wrote; delete
// removes the CR, the pod and the claim (garbage collection).
func TestGatewaySandboxStopStartKeepsWorkspace(t *testing.T) {
	g := startPodGateway(t, `[openshell.drivers.kubernetes.workspace_pvc]
size = "1Gi"
`)
	g.c.HostPathVolume(t, "ws-"+g.ns, "1Gi")
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()

	const name = "keeps-ws"
	id := g.createReady(ctx, t, name)
	pod1, err := g.c.Clientset.CoreV1().Pods(g.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var claim string
	for _, v := range pod1.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claim = v.PersistentVolumeClaim.ClaimName
		}
	}
	if claim == "" {
		t.Fatalf("pod %s mounts no claim: %+v", name, pod1.Spec.Volumes)
	}

	sh := func(what, script string) string {
		t.Helper()
		stdout, stderr, code, err := gatewaytest.Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", script}})
		if err != nil || code != 0 {
			t.Fatalf("Exec %s = %q, %q, %d, %v", what, stdout, stderr, code, err)
		}
		return strings.TrimSpace(stdout)
	}
	sh("write", "echo kept-across-restart > /sandbox/data")

	if _, err := c.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: name}); err != nil {
		t.Fatalf("StopSandbox: %v", err)
	}
	gatewaytest.WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, 2*time.Minute)
	eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := g.c.Clientset.CoreV1().Pods(g.ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, "the stopped sandbox's pod to be gone")

	if _, err := c.StartSandbox(ctx, &openshellv1.StartSandboxRequest{Name: name}); err != nil {
		t.Fatalf("StartSandbox: %v", err)
	}
	gatewaytest.WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 3*time.Minute)
	pod2, err := g.c.Clientset.CoreV1().Pods(g.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod2.UID == pod1.UID || pod2.Status.Phase != corev1.PodRunning {
		t.Fatalf("after start: pod UID %s phase %s, want a new Running pod (old UID %s)", pod2.UID, pod2.Status.Phase, pod1.UID)
	}
	if got := sh("read", "cat /sandbox/data"); got != "kept-across-restart" {
		t.Errorf("/sandbox/data after stop/start = %q, want kept-across-restart", got)
	}

	if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: name}); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		if _, err := g.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(g.ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, err
		}
		if _, err := g.c.Clientset.CoreV1().Pods(g.ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, err
		}
		_, err := g.c.Clientset.CoreV1().PersistentVolumeClaims(g.ns).Get(ctx, claim, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, "the Sandbox CR, its pod and its claim to be gone")
}

// waitRunningPod returns pod ns/name once it is Running with a UID other
// than notUID (empty: any).
func waitRunningPod(t *testing.T, c *k8stest.Cluster, ns, name string, notUID string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, podTimeout, func(ctx context.Context) (bool, error) {
		p, err := c.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			t.Fatalf("pod %s ended in phase %s: %+v", name, p.Status.Phase, p.Status)
		}
		pod = p
		return string(p.UID) != notUID && p.Status.Phase == corev1.PodRunning, nil
	}, "pod "+name+" to be Running")
	return pod
}

// TestGatewayServiceAccountsInPods: a sandbox whose template selects a
// selectable ServiceAccount runs its pod under that account and its
// supervisor bootstraps (READY, exec); a pod running the same supervisor
// with the same sandbox id under an account the gateway does not accept
// is refused at the token exchange and never becomes that sandbox.
func TestGatewayServiceAccountsInPods(t *testing.T) {
	g := startPodGateway(t, `selectable_service_account_names = ["sa-2"]
`)
	g.c.CreateServiceAccount(t, g.ns, "sa-2")
	g.c.CreateServiceAccount(t, g.ns, "intruder")
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	const name = "selected-sa"
	created, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{
		Command:  []string{"sleep", "infinity"},
		Template: &openshellv1.SandboxTemplate{ServiceAccountName: "sa-2"},
	}})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	id := created.GetSandbox().GetMetadata().GetId()
	t.Cleanup(func() { logPod(t, g.c, g.ns, name) })
	gatewaytest.WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 3*time.Minute)
	pod, err := g.c.Clientset.CoreV1().Pods(g.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.ServiceAccountName != "sa-2" {
		t.Fatalf("pod runs as %q, want sa-2", pod.Spec.ServiceAccountName)
	}
	if !strings.Contains(g.Logs(), `"service_account":"sa-2"`) && !strings.Contains(g.Logs(), "service_account=sa-2") {
		t.Errorf("gateway log lacks the bootstrap of service account sa-2")
	}
	stdout, stderr, code, err := gatewaytest.Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"echo", "hi"}})
	if err != nil || code != 0 || strings.TrimSpace(stdout) != "hi" {
		t.Fatalf("Exec = %q, %q, %d, %v", stdout, stderr, code, err)
	}

	// The same pod spec (supervisor, sandbox id, client certificate) under
	// an account the gateway does not accept.
	intruder := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "intruder", Annotations: pod.Annotations},
		Spec:       *pod.Spec.DeepCopy(),
	}
	intruder.Spec.ServiceAccountName = "intruder"
	intruder.Spec.NodeName = ""
	intruder.Spec.Hostname = ""
	if _, err := g.c.Clientset.CoreV1().Pods(g.ns).Create(ctx, intruder, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create intruder pod: %v", err)
	}
	t.Cleanup(func() { logPod(t, g.c, g.ns, "intruder") })
	eventually(t, podTimeout, func(context.Context) (bool, error) {
		return strings.Contains(g.Logs(), "K8s TokenReview principal is not an accepted sandbox service account") &&
			strings.Contains(g.Logs(), "system:serviceaccount:"+g.ns+":intruder"), nil
	}, "the gateway to refuse the intruder pod's token")
	if n := strings.Count(g.Logs(), "sandbox bootstrapped from a K8s ServiceAccount token"); n != 1 {
		t.Errorf("gateway bootstrapped %d sandboxes, want only the sa-2 one", n)
	}
	// The real sandbox is unaffected.
	if sb, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: name}); err != nil || sb.GetSandbox().GetStatus().GetPhase() != openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		t.Errorf("sandbox after the refused pod: %v, %v; want READY", sb.GetSandbox().GetStatus(), err)
	}
}

// TestGatewayAdoptsRunningSandbox: a bare agent-sandbox Sandbox (no
// gateway) runs a busybox pod that writes a random value into its claim
// at /data. The gateway adopts it with a policy that names /data
// read-only: the recreated pod runs the supervisor, which bootstraps with
// the pod's token, the sandbox turns READY, exec reads the value the bare
// pod wrote, and a write to /data is refused.
func TestGatewayAdoptsRunningSandbox(t *testing.T) {
	g := startPodGateway(t, "allow_adoption = true\ngateway_id = \"gw-adopt\"\n")
	g.c.HostPathVolume(t, "adopt-"+g.ns, "1Gi")
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	const name = "bare"
	script := `[ -s /data/seed ] || cat /proc/sys/kernel/random/uuid > /data/seed; echo "seed=$(cat /data/seed)"; exec sleep 2147483647`
	bare := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": map[string]any{"name": name, "namespace": g.ns},
		"spec": map[string]any{
			"podTemplate": map[string]any{"spec": map[string]any{
				"serviceAccountName": sandboxSA,
				// sleep as PID 1 ignores SIGTERM: do not wait 30 s for it.
				"terminationGracePeriodSeconds": int64(1),
				"containers": []any{map[string]any{
					"name": "agent", "image": k8stest.BusyboxImage, "imagePullPolicy": "Never",
					"command":      []any{"/bin/sh", "-c", script},
					"volumeMounts": []any{map[string]any{"name": "data", "mountPath": "/data"}},
				}},
			}},
			"volumeClaimTemplates": []any{map[string]any{
				"metadata": map[string]any{"name": "data"},
				"spec":     map[string]any{"accessModes": []any{"ReadWriteOnce"}, "resources": map[string]any{"requests": map[string]any{"storage": "1Gi"}}},
			}},
		},
	}}
	if _, err := g.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(g.ns).Create(ctx, bare, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create bare Sandbox: %v", err)
	}
	t.Cleanup(func() { logPod(t, g.c, g.ns, name) })
	oldPod := waitRunningPod(t, g.c, g.ns, name, "")
	var seed string
	eventually(t, podTimeout, func(ctx context.Context) (bool, error) {
		b, err := g.c.Clientset.CoreV1().Pods(g.ns).GetLogs(name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
		if v, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "seed="); ok && v != "" {
			seed = v
			return true, nil
		}
		return false, err
	}, "the bare pod to write its seed")

	// The default policy does not name the CR's own /data mount: the
	// adoption's policy adds it, read-only.
	policy := &sandboxv1.SandboxPolicy{
		Version: 1,
		Filesystem: &sandboxv1.FilesystemPolicy{
			IncludeWorkdir: true,
			ReadOnly:       []string{"/bin", "/etc", "/data"},
			ReadWrite:      []string{"/tmp"},
		},
		Landlock: &sandboxv1.LandlockPolicy{Compatibility: "best_effort"},
	}
	resp, err := c.AdoptSandbox(ctx, &openshellv1.AdoptSandboxRequest{Name: name, Namespace: g.ns, Spec: &openshellv1.SandboxSpec{Policy: policy}})
	if err != nil {
		t.Fatalf("AdoptSandbox: %v", err)
	}
	id := resp.GetSandbox().GetMetadata().GetId()
	gatewaytest.WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 3*time.Minute)
	pod := waitRunningPod(t, g.c, g.ns, name, string(oldPod.UID))
	if len(pod.Spec.InitContainers) == 0 {
		t.Errorf("adopted pod has no supervisor init container")
	}
	stdout, stderr, code, err := gatewaytest.Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"cat", "/data/seed"}})
	if err != nil || code != 0 {
		t.Fatalf("Exec(cat /data/seed) = %q, %q, %d, %v", stdout, stderr, code, err)
	}
	if got := strings.TrimSpace(stdout); got != seed {
		t.Errorf("/data/seed after adoption = %q, want %q (written by the bare pod)", got, seed)
	}
	// The policy given at adoption holds in the pod: /data is read-only.
	stdout, stderr, code, err = gatewaytest.Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", "echo x > /data/other"}})
	if err != nil || code == 0 {
		t.Errorf("Exec(write /data/other) = %q, %q, %d, %v; want a refused write", stdout, stderr, code, err)
	}
}

// TestGatewayForwardToPod: ForwardTcp through the gateway reaches a TCP
// server the sandbox's main process runs inside its pod (busybox nc
// echoing through cat) over the supervisor's relay session, and a 1 MiB
// payload comes back intact.
func TestGatewayForwardToPod(t *testing.T) {
	g := startPodGateway(t, "")
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	const name = "forward"
	created, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{
		Command: []string{"nc", "-ll", "-p", "8080", "-e", "/bin/cat"},
	}})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	id := created.GetSandbox().GetMetadata().GetId()
	t.Cleanup(func() { logPod(t, g.c, g.ns, name) })
	gatewaytest.WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 3*time.Minute)
	sess, err := c.CreateSshSession(ctx, &openshellv1.CreateSshSessionRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	target := &openshellv1.TcpForwardInit{
		SandboxId:          id,
		Target:             &openshellv1.TcpForwardInit_Tcp{Tcp: &openshellv1.TcpRelayTarget{Host: "127.0.0.1", Port: 8080}},
		AuthorizationToken: sess.GetToken(),
	}
	// The echo server starts with the main process: retry until it answers.
	var s openshellv1.OpenShell_ForwardTcpClient
	// The stream outlives the poll: it runs on the test's context.
	eventually(t, time.Minute, func(context.Context) (bool, error) {
		st, err := c.ForwardTcp(ctx)
		if err != nil {
			return false, err
		}
		if err := st.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Init{Init: target}}); err != nil {
			return false, err
		}
		if err := st.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: []byte("ping\n")}}); err != nil {
			return false, err
		}
		f, err := st.Recv()
		if err != nil {
			return false, err
		}
		if string(f.GetData()) != "ping\n" {
			return false, fmt.Errorf("echo answered %q", f.GetData())
		}
		s = st
		return true, nil
	}, "the echo server in the pod to answer through ForwardTcp")

	const total = 1 << 20
	payload := make([]byte, total)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	errc := make(chan error, 1)
	go func() {
		for off := 0; off < total; off += 32 << 10 {
			if err := s.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: payload[off : off+32<<10]}}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	got := make([]byte, 0, total)
	for len(got) < total {
		f, err := s.Recv()
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		got = append(got, f.GetData()...)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if string(got) != string(payload) {
		t.Fatal("the echoed payload differs from what was sent")
	}
	_ = s.CloseSend()
}
