package kubernetes_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/compute/kubernetes"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/k8stest"
)

func TestMain(m *testing.M) { k8stest.Main(m) }

const testSA = "openshell-sandbox"

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// env is one test's namespace on the shared cluster.
type env struct {
	c  *k8stest.Cluster
	ns string
}

func newEnv(t *testing.T) env {
	t.Helper()
	c := k8stest.Shared(t)
	ns := c.CreateNamespace(t, "")
	c.CreateServiceAccount(t, ns, testSA)
	return env{c: c, ns: ns}
}

func (e env) config(extra map[string]any) map[string]any {
	cfg := map[string]any{
		"kubeconfig":        e.c.Kubeconfig,
		"sandbox_namespace": e.ns,
		"gateway_endpoint":  "https://gateway.openshell.svc:17670",
		"default_image":     "registry.example/agent:1",
		"supervisor_image":  "registry.example/openshell-sandbox:test",
	}
	for k, v := range extra {
		cfg[k] = v
	}
	return cfg
}

func (e env) driver(t *testing.T, extra map[string]any) *kubernetes.Driver {
	t.Helper()
	d, err := kubernetes.Open(e.config(extra), compute.FactoryDeps{Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("Open() error = %v", err)
	}
	return d
}

// readyMaker stands in for a kubelet: it waits for a fresh pod of the
// sandbox (one it has not marked before) and marks it Ready.
func (e env) readyMaker() func(t *testing.T, sb compute.Sandbox) {
	var mu sync.Mutex
	marked := map[types.UID]bool{}
	return func(t *testing.T, sb compute.Sandbox) {
		t.Helper()
		var pod *corev1.Pod
		e.c.Eventually(t, func(ctx context.Context) (bool, error) {
			p, err := e.c.Clientset.CoreV1().Pods(e.ns).Get(ctx, sb.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			} else if err != nil {
				return false, err
			}
			mu.Lock()
			defer mu.Unlock()
			if p.DeletionTimestamp != nil || marked[p.UID] {
				return false, nil
			}
			pod = p
			return true, nil
		}, "a new pod for sandbox %s", sb.Name)
		mu.Lock()
		marked[pod.UID] = true
		mu.Unlock()
		e.c.MarkPodReady(t, e.ns, sb.Name)
	}
}

func goodSandbox(id, name string) compute.Sandbox {
	return compute.Sandbox{ID: id, Name: name, Spec: compute.Spec{
		LogLevel: "debug",
		Command:  []string{"sleep", "infinity"},
		Template: compute.Template{Resources: compute.Resources{CPURequest: "100m", MemoryLimit: "256Mi"}},
	}}
}

func TestConformance(t *testing.T) {
	e := newEnv(t)
	computetest.Run(t, func(t *testing.T) compute.Driver { return e.driver(t, nil) }, computetest.Options{
		Sandbox:   goodSandbox,
		MakeReady: e.readyMaker(),
		Timeout:   30 * time.Second,
		Invalid: map[string]func(id, name string) compute.Sandbox{
			"bad cpu quantity": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.Resources.CPURequest = "lots"
				return sb
			},
			"request above limit": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.Resources.MemoryRequest, sb.Spec.Template.Resources.MemoryLimit = "2Gi", "1Gi"
				return sb
			},
			"image with space": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.Image = "bad image"
				return sb
			},
			"name not DNS-1123": func(id, _ string) compute.Sandbox { return goodSandbox(id, "Bad_Name") },
			"other namespace": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Namespace = "kube-system"
				return sb
			},
			"service account not selectable": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.ServiceAccountName = "admin"
				return sb
			},
			"unknown driver_config key": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.DriverConfig = map[string]any{"hostNetwork": true}
				return sb
			},
		},
	})
}

func getCR(t *testing.T, e env, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := e.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(e.ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Sandbox %s/%s: %v", e.ns, name, err)
	}
	return u
}

func envOf(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

func waitEvent(t *testing.T, ch <-chan compute.Event, what string, pred func(compute.Event) bool) compute.Event {
	t.Helper()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("watch closed while waiting for %s", what)
			}
			if pred(ev) {
				return ev
			}
		case <-timer.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestGPULimit checks a sandbox asking for GPUs gets them as an
// nvidia.com/gpu limit on its agent container (the pod the real controller
// creates), and that a sandbox asking for none gets no GPU resource.
func TestGPULimit(t *testing.T) {
	e := newEnv(t)
	d := e.driver(t, nil)
	for _, gpus := range []uint32{2, 0} {
		sb := goodSandbox(computetest.NewID(), computetest.NewName())
		sb.Spec.Template.Resources.GPUs = gpus
		if err := d.Create(t.Context(), sb); err != nil {
			t.Fatalf("Create(gpus %d) error = %v", gpus, err)
		}
		pod := e.c.WaitForPod(t, e.ns, sb.Name)
		agent := pod.Spec.Containers[0]
		lim, hasLim := agent.Resources.Limits[kubernetes.ResourceGPU]
		req, hasReq := agent.Resources.Requests[kubernetes.ResourceGPU]
		switch {
		case gpus == 0 && (hasLim || hasReq):
			t.Errorf("gpus 0: agent resources = %+v, want no %s", agent.Resources, kubernetes.ResourceGPU)
		case gpus > 0 && (lim.Value() != int64(gpus) || req.Value() != int64(gpus)):
			t.Errorf("gpus %d: agent %s limit %s request %s, want %d each", gpus, kubernetes.ResourceGPU, lim.String(), req.String(), gpus)
		}
	}
}

// TestCreateEnrichedPod follows one sandbox through the real controller:
// the CR carries the enriched podTemplate, the controller creates the pod
// from it, marking the pod Ready yields a backend Ready event with
// progress events before it, stop/start flips operatingMode and recreates
// the pod, and delete removes the CR.
func TestCreateEnrichedPod(t *testing.T) {
	e := newEnv(t)
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor-" + e.ns}, Handler: "runsc"}
	if _, err := e.c.Clientset.NodeV1().RuntimeClasses().Create(t.Context(), rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := e.driver(t, map[string]any{"client_tls_secret_name": "openshell-client-tls", "runtime_class_name": rc.Name, "sa_token_ttl_secs": int64(1800), "image_pull_policy": "IfNotPresent"})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events, _, err := d.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Spec.Environment = map[string]string{"FOO": "bar"}
	sb.Spec.TTY = true
	sb.Spec.Template.Labels = map[string]string{"team": "a"}
	sb.Spec.Template.Annotations = map[string]string{"example.com/note": "hi"}
	sb.Spec.Template.DriverConfig = map[string]any{"node_selector": map[string]any{"pool": "sandboxes"}}
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatalf("Create() error = %v", err)
	}

	cr := getCR(t, e, sb.Name)
	if got := cr.GetLabels(); got[kubernetes.LabelManagedBy] != "openshell" || got[kubernetes.LabelSandboxID] != sb.ID {
		t.Errorf("CR labels = %v, want managed-by and sandbox-id", got)
	}
	if m, _, _ := unstructured.NestedString(cr.Object, "spec", "operatingMode"); m != "Running" {
		t.Errorf("CR spec.operatingMode = %q, want Running", m)
	}

	pod := e.c.WaitForPod(t, e.ns, sb.Name)
	if !slices.ContainsFunc(pod.OwnerReferences, func(o metav1.OwnerReference) bool {
		return o.Kind == "Sandbox" && o.UID == cr.GetUID() && o.Controller != nil && *o.Controller
	}) {
		t.Errorf("pod owner references = %+v, want controller Sandbox %s", pod.OwnerReferences, cr.GetUID())
	}
	if pod.Annotations[kubernetes.AnnotationSandboxID] != sb.ID || pod.Annotations["example.com/note"] != "hi" {
		t.Errorf("pod annotations = %v", pod.Annotations)
	}
	if pod.Labels["team"] != "a" || pod.Labels[kubernetes.LabelSandboxID] != sb.ID {
		t.Errorf("pod labels = %v", pod.Labels)
	}
	s := pod.Spec
	if s.ServiceAccountName != testSA || s.RuntimeClassName == nil || *s.RuntimeClassName != rc.Name || s.NodeSelector["pool"] != "sandboxes" {
		t.Errorf("pod spec: serviceAccountName %q runtimeClassName %v nodeSelector %v", s.ServiceAccountName, s.RuntimeClassName, s.NodeSelector)
	}
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken || s.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("pod spec: automountServiceAccountToken %v restartPolicy %q, want false, Never", s.AutomountServiceAccountToken, s.RestartPolicy)
	}
	if len(s.InitContainers) != 1 || s.InitContainers[0].Name != "openshell-supervisor-install" || s.InitContainers[0].Image != "registry.example/openshell-sandbox:test" {
		t.Errorf("init containers = %+v", s.InitContainers)
	}
	if len(s.Containers) != 1 {
		t.Fatalf("containers = %d, want 1", len(s.Containers))
	}
	agent := s.Containers[0]
	if agent.Image != "registry.example/agent:1" || agent.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("agent image %q policy %q", agent.Image, agent.ImagePullPolicy)
	}
	if !slices.Equal(agent.Command, []string{"/opt/openshell/bin/openshell-sandbox"}) {
		t.Errorf("agent command = %q", agent.Command)
	}
	wantEnv := map[string]string{
		"FOO":                         "bar",
		"OPENSHELL_SANDBOX_ID":        sb.ID,
		"OPENSHELL_SANDBOX_NAME":      sb.Name,
		"OPENSHELL_ENDPOINT":          "https://gateway.openshell.svc:17670",
		"OPENSHELL_LOG_LEVEL":         "debug",
		"OPENSHELL_SANDBOX_COMMAND":   `["sleep","infinity"]`,
		"OPENSHELL_SANDBOX_TTY":       "true",
		"OPENSHELL_K8S_SA_TOKEN_FILE": "/var/run/secrets/openshell/token",
		"OPENSHELL_EGRESS_FENCE":      "nftables",
		"OPENSHELL_TLS_CA":            "/etc/openshell-tls/client/ca.crt",
		"OPENSHELL_TLS_CERT":          "/etc/openshell-tls/client/tls.crt",
		"OPENSHELL_TLS_KEY":           "/etc/openshell-tls/client/tls.key",
	}
	gotEnv := envOf(agent)
	for k, v := range wantEnv {
		if gotEnv[k] != v {
			t.Errorf("agent env %s = %q, want %q", k, gotEnv[k], v)
		}
	}
	if q := agent.Resources.Requests[corev1.ResourceCPU]; q.String() != "100m" {
		t.Errorf("cpu request = %s, want 100m", q.String())
	}
	var tokenVol *corev1.Volume
	for i := range s.Volumes {
		if s.Volumes[i].Name == "openshell-sa-token" {
			tokenVol = &s.Volumes[i]
		}
	}
	if tokenVol == nil || tokenVol.Projected == nil || len(tokenVol.Projected.Sources) != 1 || tokenVol.Projected.Sources[0].ServiceAccountToken == nil {
		t.Fatalf("projected token volume = %+v", tokenVol)
	}
	if sat := tokenVol.Projected.Sources[0].ServiceAccountToken; sat.Audience != "openshell-gateway" || *sat.ExpirationSeconds != 1800 || sat.Path != "token" {
		t.Errorf("serviceAccountToken = %+v", sat)
	}
	mounts := map[string]string{}
	for _, m := range agent.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts["openshell-sa-token"] != "/var/run/secrets/openshell" || mounts["openshell-supervisor-bin"] != "/opt/openshell/bin" || mounts["openshell-client-tls"] != "/etc/openshell-tls/client" {
		t.Errorf("agent mounts = %v", mounts)
	}

	// Progress, then Ready once the "kubelet" marks the pod ready.
	waitEvent(t, events, "pod created progress", func(ev compute.Event) bool {
		return ev.Kind == compute.EventPlatform && ev.SandboxID == sb.ID && ev.Platform.Metadata[kubernetes.ProgressCompleteStep] == "requesting_sandbox"
	})
	e.c.MarkPodReady(t, e.ns, sb.Name)
	ev := waitEvent(t, events, "Ready=True", func(ev compute.Event) bool {
		return ev.Kind == compute.EventSandbox && ev.SandboxID == sb.ID && computetest.IsReady(ev.Sandbox)
	})
	if ev.Sandbox.Status.InstanceID != string(pod.UID) {
		t.Errorf("InstanceID = %q, want pod UID %q", ev.Sandbox.Status.InstanceID, pod.UID)
	}

	// Stop: operatingMode Suspended, the controller deletes the pod.
	if err := d.Stop(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatal(err)
	}
	if m, _, _ := unstructured.NestedString(getCR(t, e, sb.Name).Object, "spec", "operatingMode"); m != "Suspended" {
		t.Errorf("after Stop spec.operatingMode = %q, want Suspended", m)
	}
	e.c.WaitPodGone(t, e.ns, sb.Name)
	e.c.WaitSandboxCondition(t, e.ns, sb.Name, "Suspended", "True")
	// Start: Running, the controller recreates the pod.
	if err := d.Start(t.Context(), compute.Ref{Name: sb.Name}); err != nil {
		t.Fatal(err)
	}
	pod2 := e.c.WaitForPod(t, e.ns, sb.Name)
	if pod2.UID == pod.UID {
		t.Errorf("pod not recreated (same UID %s)", pod.UID)
	}
	e.c.MarkPodReady(t, e.ns, sb.Name)
	waitEvent(t, events, "Ready=True after start", func(ev compute.Event) bool {
		return ev.Kind == compute.EventSandbox && ev.SandboxID == sb.ID && computetest.IsReady(ev.Sandbox) && ev.Sandbox.Status.InstanceID == string(pod2.UID)
	})

	deleted, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID})
	if err != nil || !deleted {
		t.Fatalf("Delete = %v, %v", deleted, err)
	}
	_, err = e.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(e.ns).Get(t.Context(), sb.Name, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("Sandbox CR after Delete: err = %v, want NotFound", err)
	}
	waitEvent(t, events, "deleted", func(ev compute.Event) bool { return ev.Kind == compute.EventDeleted && ev.SandboxID == sb.ID })
	e.c.DeletePodAndWait(t, e.ns, sb.Name) // no garbage collector here
}

// TestRejectedCreateLeavesNothing: a create the driver rejects writes no
// Sandbox CR (and, in managed mode, no namespace).
func TestRejectedCreateLeavesNothing(t *testing.T) {
	e := newEnv(t)
	d := e.driver(t, nil)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Spec.Template.Resources.CPULimit = "-1"
	if err := d.Create(t.Context(), sb); errdefs.Code(err) != codes.InvalidArgument {
		t.Fatalf("Create(bad) error = %v, want InvalidArgument", err)
	}
	l, err := e.c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(e.ns).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(l.Items) != 0 {
		t.Errorf("Sandboxes after rejected create = %d (%v), want 0", len(l.Items), err)
	}

	m := e.driver(t, map[string]any{"workspace_mode": "managed", "gateway_id": "gw" + strings.ToLower(computetest.NewName()[3:])})
	sb = goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Workspace = "Not_A_Label"
	if err := m.Create(t.Context(), sb); errdefs.Code(err) != codes.InvalidArgument {
		t.Errorf("managed Create(bad workspace) error = %v, want InvalidArgument", err)
	}
	nss, err := e.c.Clientset.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{LabelSelector: kubernetes.LabelGatewayID + "=" + m.Config().GatewayID})
	if err != nil || len(nss.Items) != 0 {
		t.Errorf("namespaces after rejected create = %v (%v), want none", nss.Items, err)
	}
}

// TestManagedWorkspace: EnsureWorkspace creates openshell-<gw>-<ws> with the
// sandbox ServiceAccount; sandboxes of that workspace go there.
func TestManagedWorkspace(t *testing.T) {
	e := newEnv(t)
	gw := "gw" + computetest.NewName()[3:]
	d := e.driver(t, map[string]any{"workspace_mode": "managed", "gateway_id": gw, "selectable_service_account_names": []any{"sa-2"}})
	for range 2 { // idempotent
		if err := d.EnsureWorkspace(t.Context(), "team-a"); err != nil {
			t.Fatalf("EnsureWorkspace() error = %v", err)
		}
	}
	ns := "openshell-" + gw + "-team-a"
	if _, err := e.c.Clientset.CoreV1().ServiceAccounts(ns).Get(t.Context(), testSA, metav1.GetOptions{}); err != nil {
		t.Fatalf("service account in %s: %v", ns, err)
	}
	// A selectable account must exist in the workspace namespace.
	sel := goodSandbox(computetest.NewID(), computetest.NewName())
	sel.Workspace = "team-a"
	sel.Spec.Template.ServiceAccountName = "sa-2"
	err := d.Create(t.Context(), sel)
	if errdefs.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "'sa-2'") {
		t.Errorf("Create(sa-2 missing) error = %v, want FailedPrecondition naming sa-2", err)
	}
	e.c.CreateServiceAccount(t, ns, "sa-2")
	if err := d.ValidateCreate(t.Context(), sel); err != nil {
		t.Errorf("ValidateCreate(sa-2 present) error = %v", err)
	}
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Workspace = "team-a"
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatalf("Create() error = %v", err)
	}
	got, err := d.Get(t.Context(), compute.Ref{ID: sb.ID})
	if err != nil || got.Namespace != ns {
		t.Fatalf("Get() = %+v, %v, want namespace %s", got, err, ns)
	}
	if ok, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID}); err != nil || !ok {
		t.Fatalf("Delete() = %v, %v", ok, err)
	}
	if err := d.DeleteWorkspace(t.Context(), "team-a"); err != nil {
		t.Fatalf("DeleteWorkspace() error = %v", err)
	}
	n, err := e.c.Clientset.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{})
	if err == nil && n.DeletionTimestamp == nil {
		t.Errorf("namespace %s still active after DeleteWorkspace", ns)
	}
}

func TestOpenConfigErrors(t *testing.T) {
	e := env{c: &k8stest.Cluster{Kubeconfig: "/nonexistent"}, ns: "openshell"}
	for name, extra := range map[string]map[string]any{
		"unknown key":               {"bogus": 1},
		"bad mode":                  {"workspace_mode": "cluster"},
		"managed without id":        {"workspace_mode": "managed"},
		"operator without list":     {"workspace_mode": "operator"},
		"bad pull policy":           {"image_pull_policy": "Sometimes"},
		"ttl too small":             {"sa_token_ttl_secs": int64(60)},
		"bad service account":       {"service_account_name": "Bad_Name"},
		"no endpoint":               {"gateway_endpoint": ""},
		"endpoint not url":          {"gateway_endpoint": "unix:///x.sock"},
		"bad namespace":             {"sandbox_namespace": "Open_Shell"},
		"pvc without size":          {"workspace_pvc": map[string]any{"storage_class": "fast"}},
		"ttl wrong type":            {"sa_token_ttl_secs": "3600"},
		"allow_adoption not bool":   {"allow_adoption": "yes"},
		"allowed_namespaces not []": {"workspace_mode": "operator", "allowed_namespaces": "a,b"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := kubernetes.ParseConfig(e.config(extra))
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("ParseConfig(%v) error = %v, want InvalidArgument", extra, err)
			}
		})
	}
	c, err := kubernetes.ParseConfig(e.config(map[string]any{"allow_adoption": true, "workspace_mode": "operator", "allowed_namespaces": []any{"a", "b"}, "workspace_pvc": map[string]any{"size": "10Gi"}}))
	if err != nil {
		t.Fatalf("ParseConfig(good) error = %v", err)
	}
	if !c.AllowAdoption || c.WorkspacePVC.Size != "10Gi" || !c.NamespaceValidator().Accepts("b") || c.NamespaceValidator().Accepts("c") {
		t.Errorf("ParseConfig(good) = %+v", c)
	}
}

func TestNamespaceValidator(t *testing.T) {
	tests := []struct {
		v    kubernetes.NamespaceValidator
		ns   string
		want bool
	}{
		{kubernetes.ExactNamespace("openshell"), "openshell", true},
		{kubernetes.ExactNamespace("openshell"), "openshell-x", false},
		{kubernetes.PrefixNamespace("openshell-gw1-"), "openshell-gw1-team", true},
		{kubernetes.PrefixNamespace("openshell-gw1-"), "openshell-gw1-", false},
		{kubernetes.PrefixNamespace("openshell-gw1-"), "openshell-gw2-team", false},
		{kubernetes.AllowlistNamespaces("b", "a"), "a", true},
		{kubernetes.AllowlistNamespaces("b", "a"), "c", false},
		{kubernetes.NamespaceValidator{}, "", false},
		{kubernetes.NamespaceValidator{}, "openshell", false},
	}
	for _, tt := range tests {
		if got := tt.v.Accepts(tt.ns); got != tt.want {
			t.Errorf("%v.Accepts(%q) = %v, want %v", tt.v, tt.ns, got, tt.want)
		}
	}
	sav := kubernetes.NewServiceAccountValidator(" sa ", "", "sa", "sb")
	if !sav.Accepts("sa") || !sav.Accepts("sb") || sav.Accepts(" sa ") || sav.Accepts("") || len(sav.Names()) != 2 {
		t.Errorf("ServiceAccountValidator = %v", sav.Names())
	}
}

// TestV1alpha1 pins the deprecated API version: Stop and Start flip
// spec.replicas 0/1 and the driver reports Suspended from it. It runs on a
// cluster of its own, without the controller, whose CRD stores v1alpha1:
// the harness's CRD stores v1beta1 without conversion, which would prune the
// v1alpha1-only replicas field on every write.
func TestV1alpha1(t *testing.T) {
	c := k8stest.Start(t, k8stest.Options{})
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crd, err := c.Dynamic.Resource(crdGVR).Get(t.Context(), "sandboxes.agents.x-k8s.io", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		m := v.(map[string]any)
		m["storage"] = m["name"] == "v1alpha1"
	}
	if err := unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Dynamic.Resource(crdGVR).Update(t.Context(), crd, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("make v1alpha1 the storage version: %v", err)
	}
	e := env{c: c, ns: c.CreateNamespace(t, "")}
	c.CreateServiceAccount(t, e.ns, testSA)
	d := e.driver(t, map[string]any{"sandbox_api_version": "v1alpha1"})
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	replicas := func() int64 {
		u, err := e.c.Dynamic.Resource(k8stest.SandboxV1alpha1GVR).Namespace(e.ns).Get(t.Context(), sb.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, found, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
		if !found {
			t.Fatalf("v1alpha1 Sandbox has no spec.replicas: %v", u.Object["spec"])
		}
		return r
	}
	if r := replicas(); r != 1 {
		t.Errorf("replicas after Create = %d, want 1", r)
	}
	if err := d.Stop(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatal(err)
	}
	if r := replicas(); r != 0 {
		t.Errorf("replicas after Stop = %d, want 0", r)
	}
	got, err := d.Get(t.Context(), compute.Ref{ID: sb.ID})
	if c, _ := computetest.Cond(got, compute.ConditionSuspended); err != nil || c.Status != "True" {
		t.Errorf("Get after Stop = %+v, %v, want Suspended=True", got.Status, err)
	}
	if err := d.Start(t.Context(), compute.Ref{Name: sb.Name}); err != nil {
		t.Fatal(err)
	}
	if r := replicas(); r != 1 {
		t.Errorf("replicas after Start = %d, want 1", r)
	}
	if ok, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID}); err != nil || !ok {
		t.Fatalf("Delete = %v, %v", ok, err)
	}

	// Adoption of a bare v1alpha1 Sandbox (no controller here: no pod to restart).
	bare := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox",
		"metadata": map[string]any{"name": "bare-alpha", "namespace": e.ns},
		"spec": map[string]any{"replicas": int64(1), "podTemplate": map[string]any{"spec": map[string]any{
			"serviceAccountName": testSA, "containers": []any{map[string]any{"name": "main", "image": "custom:1"}},
		}}},
	}}
	if _, err := c.Dynamic.Resource(k8stest.SandboxV1alpha1GVR).Namespace(e.ns).Create(t.Context(), bare, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ad := e.driver(t, map[string]any{"sandbox_api_version": "v1alpha1", "allow_adoption": true})
	id := computetest.NewID()
	if _, err := ad.Adopt(t.Context(), compute.AdoptRequest{Sandbox: compute.Sandbox{ID: id, Name: "bare-alpha"}}); err != nil {
		t.Fatalf("Adopt(v1alpha1) error = %v", err)
	}
	u, err := c.Dynamic.Resource(k8stest.SandboxV1alpha1GVR).Namespace(e.ns).Get(t.Context(), "bare-alpha", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inits, _, _ := unstructured.NestedSlice(u.Object, "spec", "podTemplate", "spec", "initContainers")
	if u.GetLabels()[kubernetes.LabelSandboxID] != id || len(inits) != 1 {
		t.Errorf("adopted v1alpha1 Sandbox: labels %v, %d init containers", u.GetLabels(), len(inits))
	}
	if r, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas"); r != 1 {
		t.Errorf("adopted v1alpha1 Sandbox replicas = %d, want 1", r)
	}
}

// TestPodSecurityContext reads back the pod the real controller creates
// from the driver's Sandbox (with and without user namespaces): the agent
// container, where the supervisor runs as PID 1, is root with every
// capability dropped but the six the supervisor uses to confine agent
// processes and fence their network (NET_ADMIN, for the nftables fence),
// without privilege escalation; the installer has no
// capabilities and a read-only root; the pod runs under the runtime's
// default seccomp profile. The apiserver's own validation accepts it (the
// pod exists).
func TestPodSecurityContext(t *testing.T) {
	e := newEnv(t)
	for _, userns := range []bool{false, true} {
		d := e.driver(t, map[string]any{"enable_user_namespaces": userns})
		sb := goodSandbox(computetest.NewID(), computetest.NewName())
		if err := d.Create(t.Context(), sb); err != nil {
			t.Fatalf("Create(user namespaces %v) error = %v", userns, err)
		}
		pod := e.c.WaitForPod(t, e.ns, sb.Name)
		s := pod.Spec
		if s.SecurityContext == nil || s.SecurityContext.SeccompProfile == nil || s.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("userns %v: pod securityContext = %+v, want seccompProfile RuntimeDefault", userns, s.SecurityContext)
		}
		if got := s.HostUsers != nil && !*s.HostUsers; got != userns {
			t.Errorf("userns %v: hostUsers = %v", userns, s.HostUsers)
		}
		if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
			t.Errorf("userns %v: automountServiceAccountToken = %v, want false", userns, s.AutomountServiceAccountToken)
		}
		sc := s.Containers[0].SecurityContext
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Privileged != nil && *sc.Privileged || sc.Capabilities == nil {
			t.Fatalf("userns %v: agent securityContext = %+v, want runAsUser 0, allowPrivilegeEscalation false, capabilities", userns, sc)
		}
		if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
			!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"CHOWN", "KILL", "NET_ADMIN", "SETGID", "SETPCAP", "SETUID"}) {
			t.Errorf("userns %v: agent capabilities = %+v, want drop ALL, add CHOWN KILL NET_ADMIN SETGID SETPCAP SETUID", userns, sc.Capabilities)
		}
		if env := envOf(s.Containers[0]); env["OPENSHELL_EGRESS_FENCE"] != "nftables" {
			t.Errorf("userns %v: agent env OPENSHELL_EGRESS_FENCE = %q, want nftables", userns, env["OPENSHELL_EGRESS_FENCE"])
		}
		isc := s.InitContainers[0].SecurityContext
		if isc == nil || isc.AllowPrivilegeEscalation == nil || *isc.AllowPrivilegeEscalation || isc.ReadOnlyRootFilesystem == nil || !*isc.ReadOnlyRootFilesystem ||
			isc.Capabilities == nil || !slices.Equal(isc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(isc.Capabilities.Add) != 0 {
			t.Errorf("userns %v: installer securityContext = %+v, want no capabilities, no escalation, read-only root", userns, isc)
		}
		if ok, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID}); err != nil || !ok {
			t.Fatalf("Delete = %v, %v", ok, err)
		}
		e.c.DeletePodAndWait(t, e.ns, sb.Name)
	}
}
