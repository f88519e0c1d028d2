package kubernetes_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/compute/kubernetes"
	"github.com/openshell-go/openshell/internal/errdefs"
)

const tokenTTL = time.Hour

func request(token string) *auth.Request {
	return &auth.Request{FullMethod: auth.IssueSandboxTokenMethod, Metadata: metadata.Pairs("authorization", "Bearer "+token)}
}

// bootstrapEnv is a namespace with a driver-created sandbox (CR + pod).
type bootstrapEnv struct {
	env
	d    *kubernetes.Driver
	a    auth.Authenticator
	sb   compute.Sandbox
	cr   metav1.Object
	pod  *corev1.Pod
	refs []metav1.OwnerReference
}

func newBootstrapEnv(t *testing.T) bootstrapEnv {
	t.Helper()
	e := newEnv(t)
	d := e.driver(t, nil)
	a, err := d.BootstrapAuthenticator(t.Context())
	if err != nil || a == nil {
		t.Fatalf("BootstrapAuthenticator() = %v, %v", a, err)
	}
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	cr := getCR(t, e, sb.Name)
	pod := e.c.WaitForPod(t, e.ns, sb.Name)
	return bootstrapEnv{env: e, d: d, a: a, sb: sb, cr: cr, pod: pod, refs: pod.OwnerReferences}
}

// handPod creates a pod in ns running sa with the given metadata.
func (b bootstrapEnv) handPod(t *testing.T, ns, sa string, annotations map[string]string, owners []metav1.OwnerReference) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "hand-", Namespace: ns, Annotations: annotations, OwnerReferences: owners},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "agent", Image: "agent:1"}}},
	}
	got, err := b.c.Clientset.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	return got
}

func (b bootstrapEnv) token(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	return b.c.BoundToken(t, pod.Namespace, pod.Spec.ServiceAccountName, pod.Name, pod.UID, kubernetes.SATokenAudience, tokenTTL)
}

func wantRejected(t *testing.T, a auth.Authenticator, token string, code codes.Code, msg string) {
	t.Helper()
	p, err := a.Authenticate(t.Context(), request(token))
	if p != nil || errdefs.Code(err) != code || err.Error() != msg {
		t.Errorf("Authenticate() = %+v, %v (code %v), want %v %q", p, err, errdefs.Code(err), code, msg)
	}
}

func controller(ref metav1.OwnerReference, c bool) metav1.OwnerReference {
	ref.Controller = &c
	return ref
}

func TestBootstrapAccepts(t *testing.T) {
	b := newBootstrapEnv(t)
	p, err := b.a.Authenticate(t.Context(), request(b.token(t, b.pod)))
	if err != nil {
		t.Fatalf("Authenticate() error = %v", err)
	}
	want := auth.Principal{Kind: auth.KindSandbox, Source: auth.SourceK8sSABootstrap, Subject: "spiffe://openshell/sandbox/" + b.sb.ID, SandboxID: b.sb.ID}
	if p.Kind != want.Kind || p.Source != want.Source || p.Subject != want.Subject || p.SandboxID != want.SandboxID {
		t.Errorf("Authenticate() = %+v, want %+v", p, want)
	}
	// A pod owned through the deprecated v1alpha1 API version is accepted.
	o := b.refs[0]
	o.APIVersion = "agents.x-k8s.io/v1alpha1"
	pod := b.handPod(t, b.ns, testSA, map[string]string{kubernetes.AnnotationSandboxID: b.sb.ID}, []metav1.OwnerReference{o})
	if p, err := b.a.Authenticate(t.Context(), request(b.token(t, pod))); err != nil || p.SandboxID != b.sb.ID {
		t.Errorf("Authenticate(v1alpha1 owner) = %+v, %v, want sandbox %s", p, err, b.sb.ID)
	}
	// Other methods and requests without a bearer token are not its business.
	req := request(b.token(t, b.pod))
	req.FullMethod = "/openshell.v1.OpenShell/GetSandbox"
	if p, err := b.a.Authenticate(t.Context(), req); p != nil || err != nil {
		t.Errorf("Authenticate(other method) = %v, %v, want nil, nil", p, err)
	}
	if p, err := b.a.Authenticate(t.Context(), &auth.Request{FullMethod: auth.IssueSandboxTokenMethod}); p != nil || err != nil {
		t.Errorf("Authenticate(no token) = %v, %v, want nil, nil", p, err)
	}
}

func TestBootstrapRejects(t *testing.T) {
	b := newBootstrapEnv(t)
	id := map[string]string{kubernetes.AnnotationSandboxID: b.sb.ID}
	owner := b.refs[0]

	t.Run("wrong audience falls through", func(t *testing.T) {
		tok := b.c.BoundToken(t, b.ns, testSA, b.pod.Name, b.pod.UID, "someone-else", tokenTTL)
		if p, err := b.a.Authenticate(t.Context(), request(tok)); p != nil || err != nil {
			t.Errorf("Authenticate() = %v, %v, want nil, nil", p, err)
		}
	})
	t.Run("audience not accepted", func(t *testing.T) {
		// A TokenReview for audience X authenticates only tokens for X, so
		// this check guards against a misbehaving reviewer: configure the
		// authenticator to ask for another audience than it accepts.
		tok := b.c.BoundToken(t, b.ns, testSA, b.pod.Name, b.pod.UID, kubernetes.SATokenAudience, tokenTTL)
		a := kubernetes.NewAuthenticator(kubernetes.AuthenticatorOptions{
			Kube: reviewRewriter{b.c.Clientset, []string{"other"}}, Dynamic: b.c.Dynamic,
			Namespaces: kubernetes.ExactNamespace(b.ns), ServiceAccounts: kubernetes.NewServiceAccountValidator(testSA),
		})
		wantRejected(t, a, tok, codes.Unauthenticated, "SA token audience not accepted")
	})
	t.Run("unbound token", func(t *testing.T) {
		secs := int64(3600)
		tr, err := b.c.Clientset.CoreV1().ServiceAccounts(b.ns).CreateToken(t.Context(), testSA, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			Audiences: []string{kubernetes.SATokenAudience}, ExpirationSeconds: &secs,
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wantRejected(t, b.a, tr.Status.Token, codes.PermissionDenied, "SA token is not pod-bound")
	})
	t.Run("other service account", func(t *testing.T) {
		b.c.CreateServiceAccount(t, b.ns, "intruder")
		pod := b.handPod(t, b.ns, "intruder", id, []metav1.OwnerReference{owner})
		wantRejected(t, b.a, b.token(t, pod), codes.PermissionDenied, "SA token is not from an accepted sandbox service account")
	})
	t.Run("namespace not accepted", func(t *testing.T) {
		other := b.c.CreateNamespace(t, "")
		b.c.CreateServiceAccount(t, other, testSA)
		pod := b.handPod(t, other, testSA, id, nil)
		wantRejected(t, b.a, b.token(t, pod), codes.PermissionDenied, "SA token is not from an accepted sandbox namespace")
	})
	t.Run("missing annotation", func(t *testing.T) {
		pod := b.handPod(t, b.ns, testSA, nil, []metav1.OwnerReference{owner})
		wantRejected(t, b.a, b.token(t, pod), codes.PermissionDenied, "pod is not bound to a sandbox identity")
	})
	t.Run("no owner", func(t *testing.T) {
		pod := b.handPod(t, b.ns, testSA, id, nil)
		wantRejected(t, b.a, b.token(t, pod), codes.PermissionDenied, "pod is not controlled by an OpenShell Sandbox")
	})
	t.Run("unsupported owner version", func(t *testing.T) {
		o := owner
		o.APIVersion = "agents.x-k8s.io/v2"
		pod := b.handPod(t, b.ns, testSA, id, []metav1.OwnerReference{o})
		wantRejected(t, b.a, b.token(t, pod), codes.PermissionDenied, "pod is not controlled by an OpenShell Sandbox")
	})
	t.Run("two owners", func(t *testing.T) {
		second := controller(owner, false)
		second.Name, second.UID = "another", types.UID("00000000-0000-0000-0000-000000000001")
		pod := b.handPod(t, b.ns, testSA, id, []metav1.OwnerReference{owner, second})
		wantRejected(t, b.a, b.token(t, pod), codes.PermissionDenied, "pod has multiple OpenShell Sandbox owners")
	})
	t.Run("not controlling", func(t *testing.T) {
		pod := b.handPod(t, b.ns, testSA, id, []metav1.OwnerReference{controller(owner, false)})
		wantRejected(t, b.a, b.token(t, pod), codes.PermissionDenied, "pod Sandbox ownerReference is not controlling")
	})
	t.Run("owner not found", func(t *testing.T) {
		o := owner
		o.Name = "no-such-sandbox"
		pod := b.handPod(t, b.ns, testSA, id, []metav1.OwnerReference{o})
		wantRejected(t, b.a, b.token(t, pod), codes.PermissionDenied, "sandbox owner not found")
	})
	t.Run("owner UID mismatch", func(t *testing.T) {
		o := owner
		o.UID = types.UID("00000000-0000-0000-0000-000000000002")
		pod := b.handPod(t, b.ns, testSA, id, []metav1.OwnerReference{o})
		wantRejected(t, b.a, b.token(t, pod), codes.PermissionDenied, "sandbox owner UID mismatch")
	})
	t.Run("owner label mismatch", func(t *testing.T) {
		pod := b.handPod(t, b.ns, testSA, map[string]string{kubernetes.AnnotationSandboxID: computetest.NewID()}, []metav1.OwnerReference{owner})
		wantRejected(t, b.a, b.token(t, pod), codes.PermissionDenied, "sandbox owner ID mismatch")
	})
	t.Run("pod UID mismatch", func(t *testing.T) {
		// The token names the pod by name and UID; a new pod under the
		// same name has another UID. The apiserver's TokenReview cache
		// still authenticates the token for a few seconds after the first
		// pod is gone, which is the window this check closes.
		pod := b.handPod(t, b.ns, testSA, id, []metav1.OwnerReference{owner})
		tok := b.token(t, pod)
		if p, err := b.a.Authenticate(t.Context(), request(tok)); p == nil || err != nil {
			t.Fatalf("Authenticate(before) = %v, %v, want a principal", p, err)
		}
		b.c.DeletePodAndWait(t, b.ns, pod.Name)
		again := pod.DeepCopy()
		again.ResourceVersion, again.UID, again.GenerateName = "", "", ""
		again.Status = corev1.PodStatus{}
		if _, err := b.c.Clientset.CoreV1().Pods(b.ns).Create(t.Context(), again, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		wantRejected(t, b.a, tok, codes.PermissionDenied, "SA token pod UID mismatch")
	})
}

// TestBootstrapDeletedPod: the token of a deleted pod never authenticates.
// Within the apiserver's TokenReview cache window (~10 s) the review still
// succeeds and the live pod lookup answers "sandbox pod not found"; after
// it the review fails and the authenticator falls through (nil, nil).
func TestBootstrapDeletedPod(t *testing.T) {
	b := newBootstrapEnv(t)
	pod := b.handPod(t, b.ns, testSA, map[string]string{kubernetes.AnnotationSandboxID: b.sb.ID}, b.refs)
	tok := b.token(t, pod)
	if p, err := b.a.Authenticate(t.Context(), request(tok)); p == nil || err != nil {
		t.Fatalf("Authenticate(live pod) = %v, %v, want a principal", p, err)
	}
	b.c.DeletePodAndWait(t, b.ns, pod.Name)
	sawNotFound := false
	b.c.Eventually(t, func(ctx context.Context) (bool, error) {
		p, err := b.a.Authenticate(ctx, request(tok))
		switch {
		case p != nil:
			t.Fatalf("Authenticate(deleted pod) = %+v, want no principal", p)
		case err == nil:
			return true, nil // review no longer authenticates the token
		case errdefs.Code(err) == codes.NotFound && err.Error() == "sandbox pod not found":
			sawNotFound = true
			return false, nil
		default:
			t.Fatalf("Authenticate(deleted pod) error = %v, want NotFound \"sandbox pod not found\" or nil", err)
		}
		return false, nil
	}, "the token of a deleted pod to stop authenticating")
	t.Logf("saw \"sandbox pod not found\" inside the cache window: %v", sawNotFound)
}

// TestBootstrapServiceAccountSets: which pod ServiceAccounts bootstrap, with
// pods whose account the driver did not assign and real pod-bound tokens.
func TestBootstrapServiceAccountSets(t *testing.T) {
	b := newBootstrapEnv(t)
	for _, sa := range []string{"sa-2", "sa-external", "sa-other"} {
		b.c.CreateServiceAccount(t, b.ns, sa)
	}
	id := map[string]string{kubernetes.AnnotationSandboxID: b.sb.ID}
	tests := []struct {
		name       string
		additional []any
		presented  string
		ok         bool
	}{
		{"default only, other presented", nil, "sa-2", false},
		{"default only, default presented", nil, testSA, true},
		{"plus sa-2, sa-2 presented", []any{"sa-2"}, "sa-2", true},
		{"plus sa-2, default presented", []any{"sa-2"}, testSA, true},
		{"padded in config", []any{" sa-2 "}, "sa-2", true},
		{"qualified for this namespace", []any{b.ns + ":sa-2"}, "sa-2", true},
		{"qualified for another namespace", []any{"elsewhere:sa-2"}, "sa-2", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := b.driver(t, map[string]any{"additional_bootstrap_service_account_names": tt.additional})
			a, err := d.BootstrapAuthenticator(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			tok := b.token(t, b.handPod(t, b.ns, tt.presented, id, b.refs))
			if !tt.ok {
				wantRejected(t, a, tok, codes.PermissionDenied, "SA token is not from an accepted sandbox service account")
				return
			}
			if p, err := a.Authenticate(t.Context(), request(tok)); err != nil || p.SandboxID != b.sb.ID {
				t.Errorf("Authenticate() = %+v, %v, want sandbox %s", p, err, b.sb.ID)
			}
		})
	}

	// Selectable and bootstrap-only accounts together.
	d := b.driver(t, map[string]any{
		"additional_bootstrap_service_account_names": []any{"sa-external"},
		"selectable_service_account_names":           []any{"sa-2"},
	})
	a, err := d.BootstrapAuthenticator(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	selected := goodSandbox(computetest.NewID(), computetest.NewName())
	selected.Spec.Template.ServiceAccountName = "sa-2"
	if err := d.Create(t.Context(), selected); err != nil {
		t.Fatalf("Create(sa-2) error = %v", err)
	}
	pod := b.c.WaitForPod(t, b.ns, selected.Name)
	if pod.Spec.ServiceAccountName != "sa-2" {
		t.Fatalf("pod runs %q, want sa-2", pod.Spec.ServiceAccountName)
	}
	if p, err := a.Authenticate(t.Context(), request(b.token(t, pod))); err != nil || p.SandboxID != selected.ID {
		t.Errorf("Authenticate(selected sa-2) = %+v, %v, want sandbox %s", p, err, selected.ID)
	}
	external := b.handPod(t, b.ns, "sa-external", id, b.refs)
	if p, err := a.Authenticate(t.Context(), request(b.token(t, external))); err != nil || p.SandboxID != b.sb.ID {
		t.Errorf("Authenticate(sa-external, assigned out of band) = %+v, %v", p, err)
	}
	neither := b.handPod(t, b.ns, "sa-other", id, b.refs)
	wantRejected(t, a, b.token(t, neither), codes.PermissionDenied, "SA token is not from an accepted sandbox service account")

	for _, sa := range []string{"sa-external", "unknown"} {
		sb := goodSandbox(computetest.NewID(), computetest.NewName())
		sb.Spec.Template.ServiceAccountName = sa
		if err := d.Create(t.Context(), sb); errdefs.Code(err) != codes.InvalidArgument {
			t.Errorf("Create(%s) error = %v, want InvalidArgument", sa, err)
		}
	}
}
