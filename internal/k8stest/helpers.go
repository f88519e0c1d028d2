package k8stest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// WaitTimeout bounds the waits of the helpers below.
const WaitTimeout = 30 * time.Second

// CreateNamespace creates namespace name, or a fresh "test-<random>" one when
// name is empty, and returns its name. Namespaces are never deleted: with no
// controller-manager nothing would finalize them; they go with the cluster.
func (c *Cluster) CreateNamespace(t testing.TB, name string) string {
	t.Helper()
	if name == "" {
		b := make([]byte, 5)
		_, _ = rand.Read(b)
		name = "test-" + hex.EncodeToString(b)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.Clientset.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("k8stest: create namespace %q: %v", name, err)
	}
	return name
}

// CreateServiceAccount creates ServiceAccount ns/name. New namespaces have no
// "default" account here, and the ServiceAccount admission plugin rejects pods
// whose account does not exist.
func (c *Cluster) CreateServiceAccount(t testing.TB, ns, name string) *corev1.ServiceAccount {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	got, err := c.Clientset.CoreV1().ServiceAccounts(ns).Create(t.Context(), sa, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("k8stest: create serviceaccount %s/%s: %v", ns, name, err)
	}
	return got
}

// WaitForPod waits until pod ns/name exists and returns it.
func (c *Cluster) WaitForPod(t testing.TB, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	c.Eventually(t, func(ctx context.Context) (bool, error) {
		p, err := c.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		pod = p
		return err == nil, err
	}, "pod %s/%s to exist", ns, name)
	return pod
}

// MarkPodReady does what a kubelet would: it sets pod ns/name's status to
// Running with PodScheduled, Initialized, ContainersReady and Ready true and
// pod IP 127.0.0.1, and returns the updated pod.
func (c *Cluster) MarkPodReady(t testing.TB, ns, name string) *corev1.Pod {
	t.Helper()
	now := metav1.Now()
	cond := func(typ corev1.PodConditionType) corev1.PodCondition {
		return corev1.PodCondition{Type: typ, Status: corev1.ConditionTrue, LastTransitionTime: now}
	}
	patch := map[string]any{"status": corev1.PodStatus{
		Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{
			cond(corev1.PodScheduled), cond(corev1.PodInitialized), cond(corev1.ContainersReady), cond(corev1.PodReady),
		},
		HostIP:    "127.0.0.1",
		HostIPs:   []corev1.HostIP{{IP: "127.0.0.1"}},
		PodIP:     "127.0.0.1",
		PodIPs:    []corev1.PodIP{{IP: "127.0.0.1"}},
		StartTime: &now,
	}}
	b, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := c.Clientset.CoreV1().Pods(ns).Patch(t.Context(), name, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatalf("k8stest: mark pod %s/%s ready: %v", ns, name, err)
	}
	return pod
}

// BoundToken issues a ServiceAccount token for ns/sa bound to the pod
// podName/podUID (TokenRequest), valid for audience and ttl (the apiserver
// rejects a ttl under 10 minutes). The pod must run as sa.
func (c *Cluster) BoundToken(t testing.TB, ns, sa, podName string, podUID types.UID, audience string, ttl time.Duration) string {
	t.Helper()
	secs := int64(ttl / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:         []string{audience},
		ExpirationSeconds: &secs,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: podName, UID: podUID},
	}}
	got, err := c.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("k8stest: token for serviceaccount %s/%s bound to pod %s: %v", ns, sa, podName, err)
	}
	return got.Status.Token
}

// ServiceAccountConfig returns a rest.Config authenticating as ServiceAccount
// ns/sa (a one-hour token for the apiserver's own audience), for testing what
// RBAC lets that account do.
func (c *Cluster) ServiceAccountConfig(t testing.TB, ns, sa string) *rest.Config {
	t.Helper()
	secs := int64(3600)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}
	got, err := c.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("k8stest: token for serviceaccount %s/%s: %v", ns, sa, err)
	}
	return c.ConfigForToken(got.Status.Token)
}

// DeletePodAndWait deletes pod ns/name at once and waits until it is gone.
// (Pods never bound to a node are removed without a grace period.)
func (c *Cluster) DeletePodAndWait(t testing.TB, ns, name string) {
	t.Helper()
	zero := int64(0)
	err := c.Clientset.CoreV1().Pods(ns).Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("k8stest: delete pod %s/%s: %v", ns, name, err)
	}
	c.WaitPodGone(t, ns, name)
}

// WaitPodGone waits until pod ns/name does not exist.
func (c *Cluster) WaitPodGone(t testing.TB, ns, name string) {
	t.Helper()
	c.Eventually(t, func(ctx context.Context) (bool, error) {
		_, err := c.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, "pod %s/%s to be gone", ns, name)
}

// WaitSandboxCondition waits until Sandbox ns/name (v1beta1) has condition
// typ with status ("True"/"False") and returns the Sandbox.
func (c *Cluster) WaitSandboxCondition(t testing.TB, ns, name, typ, status string) *unstructured.Unstructured {
	t.Helper()
	var sb *unstructured.Unstructured
	c.Eventually(t, func(ctx context.Context) (bool, error) {
		u, err := c.Dynamic.Resource(SandboxGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		sb = u
		return Condition(u, typ) == status, nil
	}, "sandbox %s/%s condition %s=%s", ns, name, typ, status)
	return sb
}

// Condition returns the status ("True", "False", "Unknown") of condition typ
// in u's status.conditions, or "" when absent.
func Condition(u *unstructured.Unstructured, typ string) string {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}

// Eventually polls cond every 20ms until it reports true, failing t when it
// returns an error or WaitTimeout passes; what describes the awaited state.
func (c *Cluster) Eventually(t testing.TB, cond func(ctx context.Context) (bool, error), what string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), WaitTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond(ctx)
		if err != nil && ctx.Err() == nil {
			t.Fatalf("k8stest: waiting for %s: %v", fmt.Sprintf(what, args...), err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("k8stest: timed out after %v waiting for %s", WaitTimeout, fmt.Sprintf(what, args...))
		case <-tick.C:
		}
	}
}
