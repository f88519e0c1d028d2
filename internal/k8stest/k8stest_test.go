package k8stest_test

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/openshell-go/openshell/internal/k8stest"
)

func TestMain(m *testing.M) { k8stest.Main(m) }

func TestVersion(t *testing.T) {
	c := k8stest.Shared(t)
	v, err := c.Clientset.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != k8stest.Version {
		t.Errorf("ServerVersion().GitVersion = %q, want %q", v.GitVersion, k8stest.Version)
	}
}

// TestKubeconfig checks the kubeconfig file and CA verify the apiserver.
func TestKubeconfig(t *testing.T) {
	c := k8stest.Shared(t)
	b, err := os.ReadFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 {
		t.Fatal("empty kubeconfig")
	}
	st, err := os.Stat(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig mode = %v, want 0600", st.Mode().Perm())
	}
	// An unauthenticated request is rejected over a verified connection.
	rc, err := kubernetes.NewForConfig(c.ConfigForToken("not-a-token"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = rc.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{})
	if !apierrors.IsUnauthorized(err) {
		t.Errorf("List with a bad token: err = %v, want Unauthorized", err)
	}
}

// TestSandboxLifecycle runs the agent-sandbox controller's whole loop: a
// Sandbox CR becomes a Pod, the Pod's readiness makes the Sandbox Ready, a
// pod-bound token reviews with the pod's identity, and suspending the Sandbox
// deletes the Pod.
func TestSandboxLifecycle(t *testing.T) {
	c := k8stest.Shared(t)
	ctx := t.Context()
	ns := c.CreateNamespace(t, "")
	c.CreateServiceAccount(t, ns, "sandbox")

	sb := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1",
		"kind":       "Sandbox",
		"metadata":   map[string]any{"name": "box", "namespace": ns},
		"spec": map[string]any{
			"podTemplate": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app": "box"}},
				"spec": map[string]any{
					"serviceAccountName": "sandbox",
					"containers": []any{map[string]any{
						"name": "agent", "image": "example.invalid/agent:1", "command": []any{"sleep", "infinity"},
					}},
				},
			},
		},
	}}
	created, err := c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(ns).Create(ctx, sb, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}

	pod := c.WaitForPod(t, ns, "box")
	ctrl := metav1.GetControllerOf(pod)
	if ctrl == nil {
		t.Fatalf("pod %s/box has no controlling ownerReference: %+v", ns, pod.OwnerReferences)
	}
	wantOwner := metav1.OwnerReference{
		APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: "box", UID: created.GetUID(),
		Controller: ctrl.Controller, BlockOwnerDeletion: ctrl.BlockOwnerDeletion,
	}
	if diff := cmp.Diff(wantOwner, *ctrl); diff != "" {
		t.Errorf("pod controller ownerReference (-want +got):\n%s", diff)
	}
	if pod.Spec.ServiceAccountName != "sandbox" {
		t.Errorf("pod serviceAccountName = %q, want sandbox", pod.Spec.ServiceAccountName)
	}

	c.MarkPodReady(t, ns, "box")
	c.WaitSandboxCondition(t, ns, "box", "Ready", "True")

	// A token bound to the pod reviews as the pod's ServiceAccount, with the
	// pod in its extras, for the audience it was issued for only.
	tok := c.BoundToken(t, ns, "sandbox", pod.Name, pod.UID, "openshell-gateway", 10*time.Minute)
	review := func(aud string) *authenticationv1.TokenReview {
		t.Helper()
		r, err := c.Clientset.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: tok, Audiences: []string{aud}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("TokenReview: %v", err)
		}
		return r
	}
	r := review("openshell-gateway")
	if !r.Status.Authenticated {
		t.Fatalf("TokenReview(openshell-gateway) not authenticated: %q", r.Status.Error)
	}
	if want := "system:serviceaccount:" + ns + ":sandbox"; r.Status.User.Username != want {
		t.Errorf("TokenReview username = %q, want %q", r.Status.User.Username, want)
	}
	extra := r.Status.User.Extra
	if got := extra["authentication.kubernetes.io/pod-name"]; !cmp.Equal(got, authenticationv1.ExtraValue{"box"}) {
		t.Errorf("extra pod-name = %q, want [box]", got)
	}
	if got := extra["authentication.kubernetes.io/pod-uid"]; !cmp.Equal(got, authenticationv1.ExtraValue{string(pod.UID)}) {
		t.Errorf("extra pod-uid = %q, want [%s]", got, pod.UID)
	}
	if r := review("someone-else"); r.Status.Authenticated {
		t.Errorf("TokenReview(someone-else) authenticated, want rejected")
	}

	// Suspending the Sandbox deletes its pod.
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"operatingMode": "Suspended"}})
	if _, err := c.Dynamic.Resource(k8stest.SandboxGVR).Namespace(ns).Patch(ctx, "box", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("suspend sandbox: %v", err)
	}
	c.WaitPodGone(t, ns, "box")
}

func TestBoundTokenWrongServiceAccount(t *testing.T) {
	c := k8stest.Shared(t)
	ns := c.CreateNamespace(t, "")
	c.CreateServiceAccount(t, ns, "a")
	c.CreateServiceAccount(t, ns, "b")
	pod, err := c.Clientset.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
		Spec:       corev1.PodSpec{ServiceAccountName: "a", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secs := int64(600)
	_, err = c.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), "b", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences: []string{"openshell-gateway"}, ExpirationSeconds: &secs,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	const want = `cannot bind token for serviceaccount "b" to pod running with different serviceaccount name.`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("TokenRequest for serviceaccount b bound to a pod running as a: err = %v, want %q", err, want)
	}
	c.DeletePodAndWait(t, ns, "p")
}

// TestStartPrivate starts a cluster of its own, without the controller,
// with an extra static user whom RBAC denies by default.
func TestStartPrivate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second cluster")
	}
	c := k8stest.Start(t, k8stest.Options{ExtensionCRDs: true, Users: []k8stest.User{{Name: "alice", UID: "alice-uid", Token: "alice-token", Groups: []string{"devs"}}}})
	cs, err := kubernetes.NewForConfig(c.ConfigForToken("alice-token"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("alice lists pods: err = %v, want Forbidden", err)
	}
	// The CRDs are served even without the controller, the extensions too
	// when asked for.
	if _, err := c.Dynamic.Resource(k8stest.SandboxGVR).Namespace("default").List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Errorf("list sandboxes: %v", err)
	}
	claims := schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	if _, err := c.Dynamic.Resource(claims).Namespace("default").List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Errorf("list sandboxclaims: %v", err)
	}
	// readyz reflects a healthy apiserver through the admin config.
	hc, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(c.Host + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /readyz = %s, want 200 OK", resp.Status)
	}
}
