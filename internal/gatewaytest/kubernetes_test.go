package gatewaytest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/k8stest"
)

// kubeGateway is a gateway on the kubernetes driver against a real
// kube-apiserver with the agent-sandbox controller.
type kubeGateway struct {
	*Gateway
	c  *k8stest.Cluster
	ns string
}

const kubeSandboxSA = "openshell-sandbox"

// startKubeGateway starts a cluster and a gateway on it; extraTOML is
// appended to the [openshell.drivers.kubernetes] table; accounts are extra
// ServiceAccounts to create in the sandbox namespace.
func startKubeGateway(t *testing.T, extraTOML string, accounts ...string) kubeGateway {
	t.Helper()
	c := k8stest.Start(t, k8stest.Options{Controller: true})
	ns := c.CreateNamespace(t, "")
	for _, sa := range append([]string{kubeSandboxSA}, accounts...) {
		c.CreateServiceAccount(t, ns, sa)
	}
	port := freePort(t)
	dir := TempDir(t)
	toml := fmt.Sprintf(`[openshell]
version = 1

[openshell.drivers.kubernetes]
kubeconfig = %q
sandbox_namespace = %q
gateway_endpoint = "https://127.0.0.1:%d"
default_image = "agent:1"
supervisor_image = "openshell-sandbox:test"
client_tls_secret_name = "openshell-client-tls"
%s`, c.Kubeconfig, ns, port, extraTOML)
	cfgPath := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(cfgPath, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	g := Start(t, Options{Port: port, ExtraArgs: []string{"--drivers", "kubernetes", "--config", cfgPath, "--allow-unauthenticated-users"}})
	return kubeGateway{Gateway: g, c: c, ns: ns}
}

// runPodSupervisor starts the real openshell-sandbox on the host with the
// environment the driver put in the pod's agent container, its in-pod
// paths (projected token, client TLS) mapped to files on the host, and the
// given pod-bound ServiceAccount token. The returned func stops it (as the
// pod's deletion would); it also runs at cleanup.
func (k kubeGateway) runPodSupervisor(t *testing.T, pod *corev1.Pod, token string) (stop func()) {
	t.Helper()
	dir := TempDir(t)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{
		"/var/run/secrets/openshell/token":  tokenFile,
		"/etc/openshell-tls/client/ca.crt":  filepath.Join(k.TLSDir, "ca.crt"),
		"/etc/openshell-tls/client/tls.crt": filepath.Join(k.TLSDir, "client", "tls.crt"),
		"/etc/openshell-tls/client/tls.key": filepath.Join(k.TLSDir, "client", "tls.key"),
	}
	var agent *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == "agent" {
			agent = &pod.Spec.Containers[i]
		}
	}
	if agent == nil || len(agent.Command) != 1 || agent.Command[0] != "/opt/openshell/bin/openshell-sandbox" {
		t.Fatalf("pod agent container = %+v, want the side-loaded supervisor", agent)
	}
	// The agent runs as an unprivileged user: its workspace must be
	// reachable, which dir (under the 0700 home) is not.
	ws, err := os.MkdirTemp("/var/tmp", "openshell-pod-ws-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(ws) })
	if err := os.Chmod(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + ws, "OPENSHELL_WORKSPACE_DIR=" + ws}
	for _, e := range agent.Env {
		v := e.Value
		if p, ok := paths[v]; ok {
			v = p
		}
		env = append(env, e.Name+"="+v)
	}
	cmd := exec.Command(filepath.Join(k.BinDir, "openshell-sandbox"))
	cmd.Env, cmd.Dir = env, dir
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-done
			}
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("supervisor log (pod %s):\n%s", pod.UID, logs.String())
		}
	})
	return stop
}

// TestKubernetesEndToEnd: a gateway on the kubernetes driver creates the
// Sandbox CR, the agent-sandbox controller creates its pod, the test marks
// the pod Ready and runs the real supervisor outside the cluster with a
// real pod-bound token; it exchanges the token through IssueSandboxToken,
// connects, the sandbox turns READY, exec works, delete removes the CR.
func TestKubernetesEndToEnd(t *testing.T) {
	k := startKubeGateway(t, "")
	c := k.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	const name = "k8s-e2e"
	created, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	id := created.GetSandbox().GetMetadata().GetId()

	cr, err := k.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(k.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Sandbox CR: %v", err)
	}
	if got := cr.GetLabels()["openshell.ai/sandbox-id"]; got != id {
		t.Errorf("CR sandbox-id label = %q, want %q", got, id)
	}
	pod := k.c.WaitForPod(t, k.ns, name)
	if pod.Annotations["openshell.io/sandbox-id"] != id || pod.Spec.ServiceAccountName != kubeSandboxSA {
		t.Fatalf("pod annotation %q service account %q", pod.Annotations["openshell.io/sandbox-id"], pod.Spec.ServiceAccountName)
	}
	k.c.MarkPodReady(t, k.ns, name)

	// The backend is ready but no supervisor is connected: not READY yet.
	sb, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if sb.GetSandbox().GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		t.Errorf("phase READY before the supervisor connected")
	}

	token := k.c.BoundToken(t, k.ns, kubeSandboxSA, pod.Name, pod.UID, "openshell-gateway", time.Hour)
	stopSupervisor := k.runPodSupervisor(t, pod, token)
	WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)

	echo := func(what string) {
		t.Helper()
		stdout, stderr, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"echo", "hi"}})
		if err != nil || code != 0 || strings.TrimSpace(stdout) != "hi" {
			t.Fatalf("Exec(echo hi) %s = %q, %q, %d, %v", what, stdout, stderr, code, err)
		}
	}
	echo("after create")
	if !strings.Contains(k.Logs(), "sandbox bootstrapped from a K8s ServiceAccount token") {
		t.Errorf("gateway log lacks the bootstrap success line")
	}

	// Stop: the Sandbox is suspended, the controller deletes the pod (and
	// with it, in a real cluster, the supervisor).
	if _, err := c.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: name}); err != nil {
		t.Fatalf("StopSandbox: %v", err)
	}
	k.c.WaitPodGone(t, k.ns, name)
	stopSupervisor()
	WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, time.Minute)

	// Start: a new pod, a new pod-bound token, a new supervisor.
	if _, err := c.StartSandbox(ctx, &openshellv1.StartSandboxRequest{Name: name}); err != nil {
		t.Fatalf("StartSandbox: %v", err)
	}
	var pod2 *corev1.Pod
	k.c.Eventually(t, func(ctx context.Context) (bool, error) {
		p, err := k.c.Clientset.CoreV1().Pods(k.ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		pod2 = p
		return err == nil && p.UID != pod.UID, err
	}, "a new pod for %s", name)
	k.c.MarkPodReady(t, k.ns, name)
	k.runPodSupervisor(t, pod2, k.c.BoundToken(t, k.ns, kubeSandboxSA, pod2.Name, pod2.UID, "openshell-gateway", time.Hour))
	WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	echo("after start")
	// The old pod's token no longer bootstraps: its pod is gone.
	oldCtx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	if _, err := c.IssueSandboxToken(oldCtx, &openshellv1.IssueSandboxTokenRequest{}); err == nil {
		t.Errorf("IssueSandboxToken with the deleted pod's token succeeded")
	} else {
		t.Logf("IssueSandboxToken with the deleted pod's token: %v", err)
	}

	if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: name}); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	k.c.Eventually(t, func(ctx context.Context) (bool, error) {
		_, err := k.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(k.ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, "Sandbox CR %s/%s to be deleted", k.ns, name)
}

// TestKubernetesRejectedCreateLeavesNothing: a create the driver refuses
// leaves no Sandbox CR behind and no record in the gateway.
func TestKubernetesRejectedCreateLeavesNothing(t *testing.T) {
	k := startKubeGateway(t, "")
	c := k.Client()
	ctx := t.Context()
	_, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "good", Spec: &openshellv1.SandboxSpec{
		Template: &openshellv1.SandboxTemplate{Image: "agent:1"},
		Command:  []string{"sleep", "infinity"},
	}})
	if err != nil {
		t.Fatalf("CreateSandbox(good) = %v", err)
	}
	_, err = c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "bad-image", Spec: &openshellv1.SandboxSpec{
		Template: &openshellv1.SandboxTemplate{Image: "bad image"},
	}})
	if err == nil {
		t.Fatalf("CreateSandbox(bad image) succeeded")
	}
	l, err := k.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(k.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range l.Items {
		names = append(names, u.GetName())
	}
	if len(names) != 1 || names[0] != "good" {
		t.Errorf("Sandbox CRs = %v, want only good", names)
	}
	if _, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: "bad-image"}); err == nil {
		t.Errorf("GetSandbox(bad-image) found a record of a rejected create")
	}
}

// TestKubernetesServiceAccountSelection: with a bootstrap-only account and a
// selectable one, CreateSandbox honours template.service_account_name for
// selectable accounts only, and only the successful creates leave a CR.
func TestKubernetesServiceAccountSelection(t *testing.T) {
	k := startKubeGateway(t, `additional_bootstrap_service_account_names = ["sa-external"]
selectable_service_account_names = ["sa-2"]
`, "sa-2", "sa-external")
	c := k.Client()
	ctx := t.Context()
	create := func(name, sa string) error {
		_, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{
			Command:  []string{"sleep", "infinity"},
			Template: &openshellv1.SandboxTemplate{ServiceAccountName: sa},
		}})
		return err
	}
	for name, want := range map[string]string{"sa-unset": kubeSandboxSA, "sa-selected": "sa-2"} {
		sa := ""
		if name == "sa-selected" {
			sa = "sa-2"
		}
		if err := create(name, sa); err != nil {
			t.Fatalf("CreateSandbox(%s) error = %v", name, err)
		}
		if got := k.c.WaitForPod(t, k.ns, name).Spec.ServiceAccountName; got != want {
			t.Errorf("%s: pod runs %q, want %q", name, got, want)
		}
	}
	for _, tt := range []struct{ name, sa, msg string }{
		{"sa-external", "sa-external", "service_account_name 'sa-external' is not selectable on this gateway"},
		{"sa-unknown", "unknown", "service_account_name 'unknown' is not selectable on this gateway"},
		{"sa-dns", "Openshell_Sandbox", "template.service_account_name must be a valid Kubernetes ServiceAccount name"},
		{"sa-blank", " ", ""},
		{"sa-long", strings.Repeat("a", 2000), "template.service_account_name exceeds maximum length (2000 > 1024)"},
	} {
		err := create(tt.name, tt.sa)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.msg) {
			t.Errorf("CreateSandbox(%s, %.20q) = %v, want InvalidArgument containing %q", tt.name, tt.sa, err, tt.msg)
		}
	}
	l, err := k.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(k.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range l.Items {
		names = append(names, u.GetName())
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"sa-selected", "sa-unset"}) {
		t.Errorf("Sandbox CRs = %v, want only the two successful creates", names)
	}
}
