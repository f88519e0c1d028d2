package gatewaytest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/k8stest"
)

// startGatewayOn starts a gateway on the kubernetes driver against an
// existing cluster; extraTOML goes into [openshell.drivers.kubernetes].
func startGatewayOn(t *testing.T, c *k8stest.Cluster, ns, extraTOML string) kubeGateway {
	t.Helper()
	port := freePort(t)
	cfgPath := filepath.Join(TempDir(t), "gateway.toml")
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
	if err := os.WriteFile(cfgPath, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	g := Start(t, Options{Port: port, ExtraArgs: []string{"--drivers", "kubernetes", "--config", cfgPath, "--allow-unauthenticated-users"}})
	return kubeGateway{Gateway: g, c: c, ns: ns}
}

// createBareSandbox creates an agent-sandbox Sandbox no gateway manages,
// with the given containers, an annotation and a PVC template.
func createBareSandbox(t *testing.T, c *k8stest.Cluster, ns, name string, containers []any) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": map[string]any{"name": name, "namespace": ns, "annotations": map[string]any{"example.com/owner": "platform-team"}},
		"spec": map[string]any{
			"podTemplate": map[string]any{"spec": map[string]any{"serviceAccountName": kubeSandboxSA, "containers": containers}},
			"volumeClaimTemplates": []any{map[string]any{
				"metadata": map[string]any{"name": "data"},
				"spec":     map[string]any{"accessModes": []any{"ReadWriteOnce"}, "resources": map[string]any{"requests": map[string]any{"storage": "1Gi"}}},
			}},
		},
	}}
	got, err := c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(ns).Create(t.Context(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create bare Sandbox %s: %v", name, err)
	}
	return got
}

// agentContainer is a container that runs on the host too (the test runs
// the supervisor, and with it the original command, outside the cluster).
func agentContainer(name string) map[string]any {
	return map[string]any{
		"name": name, "image": "registry.example/custom-agent:7", "command": []any{"sleep"}, "args": []any{"infinity"},
		"env":          []any{map[string]any{"name": "AGENT_MODE", "value": "research"}},
		"ports":        []any{map[string]any{"name": "http", "containerPort": int64(8080)}},
		"volumeMounts": []any{map[string]any{"name": "data", "mountPath": "/data"}},
	}
}

func getCR(t *testing.T, k kubeGateway, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := k.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(k.ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Sandbox %s: %v", name, err)
	}
	return u
}

func wantCode(t *testing.T, what string, err error, code codes.Code, msg string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
		t.Errorf("%s = %v, want %v containing %q", what, err, code, msg)
	}
}

func noSandboxRecords(ctx context.Context, t *testing.T, c openshellv1.OpenShellClient, what string) {
	t.Helper()
	l, err := c.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(l.GetSandboxes()); n != 0 {
		t.Errorf("%s left %d sandbox records", what, n)
	}
}

// TestAdoptOnProcessDriver: a gateway on the process driver refuses
// adoption.
func TestAdoptOnProcessDriver(t *testing.T) {
	g := Start(t, Options{})
	_, err := g.Client().AdoptSandbox(t.Context(), &openshellv1.AdoptSandboxRequest{Name: "bare"})
	wantCode(t, "AdoptSandbox on the process driver", err, codes.FailedPrecondition, "adoption is only supported by the kubernetes driver")
	noSandboxRecords(t.Context(), t, g.Client(), "a refused adoption")
}

// TestKubernetesAdopt: a bare Sandbox CR with its running pod is adopted
// through the gateway (real apiserver, real agent-sandbox controller, real
// gateway, real supervisor with a pod-bound token): the CR keeps its UID,
// claim, annotation, env and port, gains the labels and the supervisor, its
// pod is recreated, the sandbox turns READY and exec works. Refusals
// (adoption disabled, missing CR, ambiguous container) leave no record and
// do not write the CR; adopting twice returns the same sandbox; re-enriching
// restarts the pod under a new supervisor and the sandbox is READY again.
func TestKubernetesAdopt(t *testing.T) {
	c := k8stest.Start(t, k8stest.Options{Controller: true})
	ns := c.CreateNamespace(t, "")
	c.CreateServiceAccount(t, ns, kubeSandboxSA)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	const name = "adoptee"
	bare := createBareSandbox(t, c, ns, name, []any{agentContainer("agent")})
	oldPod := c.WaitForPod(t, ns, name)
	c.MarkPodReady(t, ns, name)
	c.WaitSandboxCondition(t, ns, name, "Ready", "True")
	claims := func() map[string]types.UID {
		l, err := c.Clientset.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]types.UID{}
		for _, p := range l.Items {
			if strings.HasSuffix(p.Name, "-"+name) {
				m[p.Name] = p.UID
			}
		}
		return m
	}
	claimsBefore := claims()
	if len(claimsBefore) == 0 {
		t.Fatalf("the controller created no PVC from the volumeClaimTemplate")
	}
	// Two containers, neither named agent: adoption cannot pick one.
	createBareSandbox(t, c, ns, "two-containers", []any{agentContainer("main"), agentContainer("sidecar")})

	// Adoption is opt-in. This gateway runs (and stops) before anything
	// is adopted, so it never sees the other gateway's sandboxes.
	{
		off := startGatewayOn(t, c, ns, "")
		rv := getCR(t, off, name).GetResourceVersion()
		_, err := off.Client().AdoptSandbox(ctx, &openshellv1.AdoptSandboxRequest{Name: name})
		wantCode(t, "AdoptSandbox without allow_adoption", err, codes.FailedPrecondition, "sandbox adoption is disabled on this gateway")
		noSandboxRecords(ctx, t, off.Client(), "adoption while disabled")
		if got := getCR(t, off, name).GetResourceVersion(); got != rv {
			t.Errorf("adoption while disabled wrote the CR: resourceVersion %s → %s", rv, got)
		}
		off.Stop()
	}

	k := startGatewayOn(t, c, ns, "allow_adoption = true\ngateway_id = \"gw-adopt\"\n")
	cl := k.Client()

	_, err := cl.AdoptSandbox(ctx, &openshellv1.AdoptSandboxRequest{Name: "no-such-cr"})
	wantCode(t, "AdoptSandbox(missing CR)", err, codes.NotFound, `"no-such-cr" not found`)
	twoRV := getCR(t, k, "two-containers").GetResourceVersion()
	_, err = cl.AdoptSandbox(ctx, &openshellv1.AdoptSandboxRequest{Name: "two-containers", Namespace: ns})
	wantCode(t, "AdoptSandbox(ambiguous container)", err, codes.InvalidArgument, "main")
	if got := getCR(t, k, "two-containers").GetResourceVersion(); got != twoRV {
		t.Errorf("rejected adoption wrote the CR: resourceVersion %s → %s", twoRV, got)
	}
	noSandboxRecords(ctx, t, cl, "rejected adoptions")

	resp, err := cl.AdoptSandbox(ctx, &openshellv1.AdoptSandboxRequest{Name: name, Namespace: ns, Labels: map[string]string{"origin": "adopted"}})
	if err != nil {
		t.Fatalf("AdoptSandbox: %v", err)
	}
	sb := resp.GetSandbox()
	id := sb.GetMetadata().GetId()
	// The pod restarts under the supervisor: STARTING until it connects.
	if ph := sb.GetStatus().GetPhase(); ph != openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING {
		t.Errorf("adopted sandbox phase = %v, want STARTING", ph)
	}
	if sb.GetMetadata().GetName() != name || sb.GetMetadata().GetLabels()["origin"] != "adopted" {
		t.Errorf("adopted sandbox metadata = %v", sb.GetMetadata())
	}

	// The same CR, labelled, with the user's settings and the supervisor.
	cr := getCR(t, k, name)
	if cr.GetUID() != bare.GetUID() || cr.GetAnnotations()["example.com/owner"] != "platform-team" {
		t.Errorf("CR after adoption: uid %s (was %s), annotations %v", cr.GetUID(), bare.GetUID(), cr.GetAnnotations())
	}
	if l := cr.GetLabels(); l["openshell.ai/managed-by"] != "openshell" || l["openshell.ai/sandbox-id"] != id {
		t.Errorf("CR labels after adoption = %v", l)
	}
	if vct, _, _ := unstructured.NestedSlice(cr.Object, "spec", "volumeClaimTemplates"); len(vct) != 1 {
		t.Errorf("volumeClaimTemplates after adoption = %v", vct)
	}
	if got := claims(); !mapsEqual(got, claimsBefore) {
		t.Errorf("claims after adoption = %v, want %v (same UIDs)", got, claimsBefore)
	}

	// The pod is recreated from the enriched template.
	var pod *corev1.Pod
	c.Eventually(t, func(ctx context.Context) (bool, error) {
		p, err := c.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not recreated yet: keep polling
		}
		pod = p
		return p.UID != oldPod.UID, nil
	}, "the pod of %s to be recreated", name)
	var agent corev1.Container
	for _, ctr := range pod.Spec.Containers {
		if ctr.Name == "agent" {
			agent = ctr
		}
	}
	env := map[string]string{}
	for _, e := range agent.Env {
		env[e.Name] = e.Value
	}
	if agent.Image != "registry.example/custom-agent:7" || env["AGENT_MODE"] != "research" || env["OPENSHELL_SANDBOX_ID"] != id {
		t.Errorf("agent container image %q env %v", agent.Image, env)
	}
	if env["OPENSHELL_SANDBOX_COMMAND"] != `["sleep","infinity"]` {
		t.Errorf("OPENSHELL_SANDBOX_COMMAND = %q, want the CR's original command", env["OPENSHELL_SANDBOX_COMMAND"])
	}
	if len(agent.Ports) != 1 || agent.Ports[0].ContainerPort != 8080 || !slices.ContainsFunc(agent.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/data" }) {
		t.Errorf("agent ports %v mounts %v, want the user's port and /data mount kept", agent.Ports, agent.VolumeMounts)
	}
	if len(pod.Spec.InitContainers) == 0 || len(agent.Command) != 1 || agent.Command[0] != "/opt/openshell/bin/openshell-sandbox" {
		t.Errorf("pod init containers %d, agent command %v: supervisor not injected", len(pod.Spec.InitContainers), agent.Command)
	}

	// Ready pod + real supervisor with a token bound to the new pod.
	c.MarkPodReady(t, ns, name)
	stopSupervisor := k.runPodSupervisor(t, pod, c.BoundToken(t, ns, kubeSandboxSA, pod.Name, pod.UID, "openshell-gateway", time.Hour))
	WaitPhase(ctx, t, cl, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 2*time.Minute)
	stdout, stderr, code, err := Exec(ctx, t, cl, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"echo", "adopted"}})
	if err != nil || code != 0 || strings.TrimSpace(stdout) != "adopted" {
		t.Fatalf("Exec(echo adopted) = %q, %q, %d, %v", stdout, stderr, code, err)
	}

	// WatchSandbox shows the adoption event.
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	stream, err := cl.WatchSandbox(wctx, &openshellv1.WatchSandboxRequest{Id: id, FollowEvents: true, EventTail: 100})
	if err != nil {
		t.Fatal(err)
	}
	var adoptedEvent *openshellv1.PlatformEvent
	for adoptedEvent == nil {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("WatchSandbox ended before the Adopted event: %v", err)
		}
		if e := ev.GetEvent(); e.GetReason() == "Adopted" {
			adoptedEvent = e
		}
	}
	if !strings.Contains(adoptedEvent.GetMessage(), ns+"/"+name) || !strings.Contains(adoptedEvent.GetMessage(), string(bare.GetUID())) {
		t.Errorf("Adopted event message = %q, want the CR and its UID", adoptedEvent.GetMessage())
	}
	wcancel()

	// Adopting again is idempotent: same sandbox, CR not written.
	rv := getCR(t, k, name).GetResourceVersion()
	again, err := cl.AdoptSandbox(ctx, &openshellv1.AdoptSandboxRequest{Name: name, Namespace: ns})
	if err != nil || again.GetSandbox().GetMetadata().GetId() != id {
		t.Fatalf("AdoptSandbox again = %v, %v; want sandbox %s", again.GetSandbox().GetMetadata(), err, id)
	}
	if got := getCR(t, k, name).GetResourceVersion(); got != rv {
		t.Errorf("adopting again wrote the CR: resourceVersion %s → %s", rv, got)
	}
	l, err := cl.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{})
	if err != nil || len(l.GetSandboxes()) != 1 {
		t.Errorf("ListSandboxes after adopting twice = %d records, %v; want 1", len(l.GetSandboxes()), err)
	}

	// Re-enrich (a supervisor upgrade): same sandbox and CR, the pod is
	// recreated again, the new pod's supervisor makes it READY again.
	re, err := cl.AdoptSandbox(ctx, &openshellv1.AdoptSandboxRequest{Name: name, Namespace: ns, Reenrich: true})
	if err != nil || re.GetSandbox().GetMetadata().GetId() != id {
		t.Fatalf("AdoptSandbox(reenrich) = %v, %v; want sandbox %s", re.GetSandbox().GetMetadata(), err, id)
	}
	if ph := re.GetSandbox().GetStatus().GetPhase(); ph != openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING {
		t.Errorf("phase after reenrich = %v, want STARTING", ph)
	}
	stopSupervisor() // the old pod is gone, and with it its supervisor
	var pod3 *corev1.Pod
	c.Eventually(t, func(ctx context.Context) (bool, error) {
		p, err := c.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not recreated yet: keep polling
		}
		pod3 = p
		return p.UID != pod.UID, nil
	}, "the pod of %s to be recreated by the re-enrichment", name)
	c.MarkPodReady(t, ns, name)
	k.runPodSupervisor(t, pod3, c.BoundToken(t, ns, kubeSandboxSA, pod3.Name, pod3.UID, "openshell-gateway", time.Hour))
	WaitPhase(ctx, t, cl, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 2*time.Minute)
	stdout, stderr, code, err = Exec(ctx, t, cl, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"echo", "reenriched"}})
	if err != nil || code != 0 || strings.TrimSpace(stdout) != "reenriched" {
		t.Fatalf("Exec(echo reenriched) = %q, %q, %d, %v", stdout, stderr, code, err)
	}

	// The CR is not deleted by anything above.
	if got := getCR(t, k, name); got.GetUID() != bare.GetUID() {
		t.Errorf("CR UID %s, want %s", got.GetUID(), bare.GetUID())
	}
}

func mapsEqual(a, b map[string]types.UID) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
