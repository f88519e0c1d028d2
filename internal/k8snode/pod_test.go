package k8snode_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openshell-go/openshell/internal/k8stest"
)

// podTimeout bounds a pod's way to Running on a loaded 2-core machine.
const podTimeout = 2 * time.Minute

// eventually polls cond every 100 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, cond func(ctx context.Context) (bool, error), what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		ok, err := cond(ctx)
		if ok {
			return
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %v waiting for %s (last error: %v)", d, what, lastErr)
		case <-tick.C:
		}
	}
}

// TestPodRunsAndLogs proves the node runs pods: a busybox Pod built on this
// machine (imagePullPolicy Never) is scheduled by kube-scheduler, started by
// the kubelet through containerd and runc with an address on the harness's
// bridge, its output is read through the apiserver → kubelet log path, and
// deleting it removes it once the kubelet has stopped its container.
func TestPodRunsAndLogs(t *testing.T) {
	c := k8stest.Start(t, k8stest.Options{Node: true})
	ctx := t.Context()
	ns := c.CreateNamespace(t, "")
	pods := c.Clientset.CoreV1().Pods(ns)

	// The controller-manager creates the namespace's "default" account.
	eventually(t, podTimeout, func(ctx context.Context) (bool, error) {
		_, err := c.Clientset.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	}, "the default ServiceAccount")

	grace := int64(1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "hello",
				Image:           k8stest.BusyboxImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/bin/sh", "-c", "echo hello from $(hostname) uid=$(id -u); exec sleep 3600"},
			}},
		},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}

	var running *corev1.Pod
	eventually(t, podTimeout, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			t.Fatalf("pod ended in phase %s: %+v", p.Status.Phase, p.Status)
		}
		running = p
		return p.Status.Phase == corev1.PodRunning, nil
	}, "pod hello to be Running")

	if running.Spec.NodeName != k8stest.NodeName {
		t.Errorf("pod scheduled to %q, want %q", running.Spec.NodeName, k8stest.NodeName)
	}
	_, subnet, err := net.ParseCIDR(c.Node.Subnet)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(running.Status.PodIP); ip == nil || !subnet.Contains(ip) {
		t.Errorf("pod IP %q is not in the node's pod subnet %s", running.Status.PodIP, c.Node.Subnet)
	}

	const want = "hello from hello uid=0"
	var logs string
	eventually(t, podTimeout, func(ctx context.Context) (bool, error) {
		b, err := pods.GetLogs("hello", &corev1.PodLogOptions{Container: "hello"}).DoRaw(ctx)
		logs = string(b)
		return strings.Contains(logs, want), err
	}, "the container's output")
	if got := strings.TrimSpace(logs); got != want {
		t.Errorf("logs = %q, want %q", got, want)
	}

	if err := pods.Delete(ctx, "hello", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	eventually(t, podTimeout, func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, "hello", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, "pod hello to be gone")
}
