package kubernetes_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/compute/kubernetes"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/k8stest"
)

// bareSandbox creates an agent-sandbox Sandbox no gateway manages: a custom
// image, command, env, port, annotation and a PVC template.
func bareSandbox(t *testing.T, e env, name string, mutate func(podSpec map[string]any)) *unstructured.Unstructured {
	t.Helper()
	podSpec := map[string]any{
		"serviceAccountName": testSA,
		"containers": []any{map[string]any{
			"name": "agent", "image": "custom:2", "command": []any{"python"}, "args": []any{"-m", "agent"},
			"env":          []any{map[string]any{"name": "KEEP", "value": "1"}},
			"ports":        []any{map[string]any{"containerPort": int64(8080)}},
			"volumeMounts": []any{map[string]any{"name": "data", "mountPath": "/data"}},
		}},
	}
	if mutate != nil {
		mutate(podSpec)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": map[string]any{"name": name, "namespace": e.ns, "annotations": map[string]any{"example.com/owner": "me"}},
		"spec": map[string]any{
			"podTemplate": map[string]any{"metadata": map[string]any{"annotations": map[string]any{"example.com/pod-note": "x"}}, "spec": podSpec},
			"volumeClaimTemplates": []any{map[string]any{
				"metadata": map[string]any{"name": "data"},
				"spec":     map[string]any{"accessModes": []any{"ReadWriteOnce"}, "resources": map[string]any{"requests": map[string]any{"storage": "1Gi"}}},
			}},
		},
	}}
	got, err := e.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(e.ns).Create(t.Context(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create bare Sandbox: %v", err)
	}
	return got
}

func adoptReq(name string) compute.AdoptRequest {
	return compute.AdoptRequest{Sandbox: compute.Sandbox{ID: computetest.NewID(), Name: name}}
}

func agentOf(t *testing.T, pod *corev1.Pod) corev1.Container {
	t.Helper()
	for _, c := range pod.Spec.Containers {
		if c.Name == "agent" {
			return c
		}
	}
	t.Fatalf("pod %s has no agent container", pod.Name)
	return corev1.Container{}
}

func TestAdopt(t *testing.T) {
	e := newEnv(t)
	name := computetest.NewName()
	bare := bareSandbox(t, e, name, nil)
	oldPod := e.c.WaitForPod(t, e.ns, name)
	e.c.MarkPodReady(t, e.ns, name)
	pvcs := func() map[string]types.UID {
		l, err := e.c.Clientset.CoreV1().PersistentVolumeClaims(e.ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]types.UID{}
		for _, p := range l.Items {
			m[p.Name] = p.UID
		}
		return m
	}
	pvcBefore := pvcs()
	if len(pvcBefore) == 0 {
		t.Fatalf("the controller created no PVC from the volumeClaimTemplate")
	}

	if _, err := e.driver(t, nil).Adopt(t.Context(), adoptReq(name)); errdefs.Code(err) != codes.FailedPrecondition || err.Error() != "sandbox adoption is disabled on this gateway" {
		t.Errorf("Adopt(disabled) error = %v, want FailedPrecondition", err)
	}
	d := e.driver(t, map[string]any{"allow_adoption": true})
	if _, err := d.Adopt(t.Context(), adoptReq("no-such-sandbox")); errdefs.Code(err) != codes.NotFound {
		t.Errorf("Adopt(missing) error = %v, want NotFound", err)
	}
	wrongNS := adoptReq(name)
	wrongNS.Namespace = "kube-system"
	if _, err := d.Adopt(t.Context(), wrongNS); errdefs.Code(err) != codes.InvalidArgument {
		t.Errorf("Adopt(namespace not accepted) error = %v, want InvalidArgument", err)
	}

	req := adoptReq(name)
	res, err := d.Adopt(t.Context(), req)
	if err != nil {
		t.Fatalf("Adopt() error = %v", err)
	}
	if res.BackendUID != string(bare.GetUID()) || res.Sandbox.ID != req.Sandbox.ID {
		t.Errorf("Adopt() = uid %s id %s, want %s %s", res.BackendUID, res.Sandbox.ID, bare.GetUID(), req.Sandbox.ID)
	}
	cr := getCR(t, e, name)
	if cr.GetUID() != bare.GetUID() || cr.GetAnnotations()["example.com/owner"] != "me" {
		t.Errorf("CR after adoption: uid %s annotations %v, want the same CR", cr.GetUID(), cr.GetAnnotations())
	}
	if l := cr.GetLabels(); l[kubernetes.LabelManagedBy] != "openshell" || l[kubernetes.LabelSandboxID] != req.Sandbox.ID {
		t.Errorf("CR labels = %v", l)
	}
	if m, _, _ := unstructured.NestedString(cr.Object, "spec", "operatingMode"); m != "Running" {
		t.Errorf("operatingMode after adoption = %q, want Running", m)
	}

	// The pod is recreated from the enriched template.
	var pod *corev1.Pod
	e.c.Eventually(t, func(ctx context.Context) (bool, error) {
		p, err := e.c.Clientset.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not recreated yet: keep polling
		}
		pod = p
		return p.UID != oldPod.UID, nil
	}, "the pod of %s to be recreated", name)
	agent := agentOf(t, pod)
	env := envOf(agent)
	if agent.Image != "custom:2" || env["KEEP"] != "1" || env["OPENSHELL_SANDBOX_ID"] != req.Sandbox.ID || env["OPENSHELL_SANDBOX_COMMAND"] != `["python","-m","agent"]` {
		t.Errorf("agent image %q env %v", agent.Image, env)
	}
	if !slices.Equal(agent.Command, []string{"/opt/openshell/bin/openshell-sandbox"}) || len(agent.Args) != 0 {
		t.Errorf("agent command %q args %q", agent.Command, agent.Args)
	}
	// The adopted pod gets the same egress path as a created one: the
	// supervisor fences agent processes onto its proxy with NET_ADMIN.
	if sc := agent.SecurityContext; env["OPENSHELL_EGRESS_FENCE"] != "nftables" || sc == nil || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"CHOWN", "KILL", "NET_ADMIN", "SETGID", "SETPCAP", "SETUID"}) {
		t.Errorf("adopted agent OPENSHELL_EGRESS_FENCE %q securityContext %+v, want nftables and NET_ADMIN among the capabilities", env["OPENSHELL_EGRESS_FENCE"], sc)
	}
	if len(agent.Ports) != 1 || agent.Ports[0].ContainerPort != 8080 {
		t.Errorf("agent ports = %+v", agent.Ports)
	}
	if pod.Annotations["example.com/pod-note"] != "x" || pod.Annotations[kubernetes.AnnotationSandboxID] != req.Sandbox.ID {
		t.Errorf("pod annotations = %v", pod.Annotations)
	}
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Name != "openshell-supervisor-install" {
		t.Errorf("init containers = %+v", pod.Spec.InitContainers)
	}
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool {
		_, ok := pvcBefore[v.Name+"-"+name]
		return v.PersistentVolumeClaim != nil && (ok || pvcBefore[v.PersistentVolumeClaim.ClaimName] != "")
	}) {
		t.Errorf("recreated pod volumes %+v do not use the claim %v", pod.Spec.Volumes, pvcBefore)
	}
	if diff := cmp.Diff(pvcBefore, pvcs()); diff != "" {
		t.Errorf("PVCs changed by adoption (-before +after):\n%s", diff)
	}

	// Twice: idempotent, nothing written.
	rv := getCR(t, e, name).GetResourceVersion()
	if res2, err := d.Adopt(t.Context(), req); err != nil || res2.BackendUID != res.BackendUID {
		t.Errorf("Adopt(again) = %+v, %v", res2, err)
	}
	if got := getCR(t, e, name); got.GetLabels()[kubernetes.LabelSandboxID] != req.Sandbox.ID || got.GetResourceVersion() != rv && !templateEqual(t, got, cr) {
		t.Errorf("Adopt(again) changed the CR")
	}
	// Another sandbox id for the same CR is refused.
	if _, err := d.Adopt(t.Context(), adoptReq(name)); errdefs.Code(err) != codes.FailedPrecondition {
		t.Errorf("Adopt(as another sandbox) error = %v, want FailedPrecondition", err)
	}
	// Re-enrich with a new supervisor image: replaced, not duplicated.
	d2 := e.driver(t, map[string]any{"allow_adoption": true, "supervisor_image": "registry.example/openshell-sandbox:v2"})
	re := req
	re.Reenrich = true
	if _, err := d2.Adopt(t.Context(), re); err != nil {
		t.Fatalf("Adopt(reenrich) error = %v", err)
	}
	spec, _, _ := unstructured.NestedMap(getCR(t, e, name).Object, "spec", "podTemplate", "spec")
	b, _ := json.Marshal(spec)
	var ps corev1.PodSpec
	if err := json.Unmarshal(b, &ps); err != nil {
		t.Fatal(err)
	}
	if len(ps.InitContainers) != 1 || ps.InitContainers[0].Image != "registry.example/openshell-sandbox:v2" || len(ps.Volumes) != 2 {
		t.Errorf("after reenrich: init containers %+v volumes %d (want 1 at v2, 2 volumes)", ps.InitContainers, len(ps.Volumes))
	}
	if env := envOf(ps.Containers[0]); env["OPENSHELL_SANDBOX_COMMAND"] != `["python","-m","agent"]` || env["KEEP"] != "1" {
		t.Errorf("after reenrich env = %v", env)
	}
	// A gateway with another id does not touch it.
	other := e.driver(t, map[string]any{"allow_adoption": true, "gateway_id": "other"})
	if _, err := other.Adopt(t.Context(), req); errdefs.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "another gateway") {
		t.Errorf("Adopt(other gateway) error = %v, want FailedPrecondition", err)
	}
	e.c.DeletePodAndWait(t, e.ns, name)
}

func templateEqual(t *testing.T, a, b *unstructured.Unstructured) bool {
	t.Helper()
	x, _, _ := unstructured.NestedMap(a.Object, "spec", "podTemplate")
	y, _, _ := unstructured.NestedMap(b.Object, "spec", "podTemplate")
	return cmp.Equal(x, y)
}

// TestAdoptFailsClosed: every refusal happens before any write.
func TestAdoptFailsClosed(t *testing.T) {
	e := newEnv(t)
	d := e.driver(t, map[string]any{"allow_adoption": true})
	tests := []struct {
		name   string
		mutate func(map[string]any)
		code   codes.Code
		want   string
	}{
		{"volume name", func(s map[string]any) {
			s["volumes"] = []any{map[string]any{"name": "openshell-sa-token", "emptyDir": map[string]any{}}}
		}, codes.FailedPrecondition, `volume name "openshell-sa-token" is reserved`},
		{"init container name", func(s map[string]any) {
			s["initContainers"] = []any{map[string]any{"name": "openshell-supervisor-install", "image": "x"}}
		}, codes.FailedPrecondition, "reserved for the supervisor installer"},
		{"mount path", func(s map[string]any) {
			c := s["containers"].([]any)[0].(map[string]any)
			c["volumeMounts"] = []any{map[string]any{"name": "data", "mountPath": "/opt/openshell/bin"}}
		}, codes.FailedPrecondition, "already mounts /opt/openshell/bin"},
		{"non-root", func(s map[string]any) {
			s["securityContext"] = map[string]any{"runAsNonRoot": true}
		}, codes.FailedPrecondition, "runAsNonRoot"},
		{"ambiguous container", func(s map[string]any) {
			c := s["containers"].([]any)[0].(map[string]any)
			c["name"] = "main"
			s["containers"] = append(s["containers"].([]any), map[string]any{"name": "proxy", "image": "p:1"})
		}, codes.InvalidArgument, "[main proxy]"},
		{"service account not accepted", func(s map[string]any) {
			delete(s, "serviceAccountName")
		}, codes.FailedPrecondition, "service account 'default'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := computetest.NewName()
			before := bareSandbox(t, e, name, tt.mutate)
			_, err := d.Adopt(t.Context(), adoptReq(name))
			if errdefs.Code(err) != tt.code || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Adopt() error = %v, want %v containing %q", err, tt.code, tt.want)
			}
			after := getCR(t, e, name)
			if !templateEqual(t, before, after) || after.GetLabels()[kubernetes.LabelManagedBy] != "" {
				t.Errorf("Adopt() wrote to the CR although it failed")
			}
		})
	}

	t.Run("concurrent edit", func(t *testing.T) {
		name := computetest.NewName()
		before := bareSandbox(t, e, name, nil)
		kubernetes.SetBeforeAdoptWrite(d, func() {
			patch := []byte(`{"metadata":{"annotations":{"example.com/edited":"yes"}}}`)
			if _, err := e.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(e.ns).Patch(t.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Errorf("concurrent patch: %v", err)
			}
		})
		defer kubernetes.SetBeforeAdoptWrite(d, nil)
		_, err := d.Adopt(t.Context(), adoptReq(name))
		if errdefs.Code(err) != codes.Aborted {
			t.Errorf("Adopt(concurrent edit) error = %v, want Aborted", err)
		}
		after := getCR(t, e, name)
		if !templateEqual(t, before, after) || after.GetLabels()[kubernetes.LabelManagedBy] != "" {
			t.Errorf("Adopt() wrote to the CR although it was aborted")
		}
	})
}
