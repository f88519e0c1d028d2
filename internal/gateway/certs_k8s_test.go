package gateway

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/openshell-go/openshell/internal/k8stest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRunGenerateCertsSecretsFlags(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"both modes", []string{"--output-dir", t.TempDir(), "--namespace", "ns"}, "--output-dir cannot be combined"},
		{"no namespace", []string{"--jwt-secret-name", "j", "--jwt-only"}, "--namespace (or POD_NAMESPACE) is required"},
		{"no jwt name", []string{"--namespace", "ns", "--server-secret-name", "s", "--client-secret-name", "c"}, "--jwt-secret-name is required"},
		{"no tls names", []string{"--namespace", "ns", "--jwt-secret-name", "j"}, "--server-secret-name and --client-secret-name are required"},
		{"jwt-only with tls names", []string{"--namespace", "ns", "--jwt-only", "--jwt-secret-name", "j", "--server-secret-name", "s"}, "--jwt-only manages only the JWT Secret"},
		{"no kubeconfig outside a cluster", []string{"--namespace", "ns", "--jwt-only", "--jwt-secret-name", "j"}, "outside a cluster, pass --kubeconfig"},
		{"bad kubeconfig", []string{"--namespace", "ns", "--jwt-only", "--jwt-secret-name", "j", "--kubeconfig", "/nonexistent/kubeconfig"}, "kubernetes client"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "no kubeconfig outside a cluster" {
				t.Setenv("KUBERNETES_SERVICE_HOST", "")
			}
			_, err := runCerts(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("generate-certs %v = %v; want %q", tt.args, err, tt.want)
			}
		})
	}
}

func TestRunGenerateCertsSecrets(t *testing.T) {
	c := k8stest.Start(t, k8stest.Options{})
	list := func(ns string) map[string]corev1.Secret {
		t.Helper()
		l, err := c.Clientset.CoreV1().Secrets(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]corev1.Secret{}
		for _, s := range l.Items {
			out[s.Name] = s
		}
		return out
	}

	ns := c.CreateNamespace(t, "")
	t.Setenv("POD_NAMESPACE", ns) // the hook Job's downward-API default
	args := []string{"--kubeconfig", c.Kubeconfig, "--server-secret-name", "srv", "--client-secret-name", "cli", "--jwt-secret-name", "jwt", "--server-san", "openshell." + ns + ".svc"}

	out, err := runCerts(t, append(args, "--dry-run")...)
	if err != nil || !strings.Contains(out, "dry run: would write to Kubernetes Secrets in namespace "+ns) || !strings.Contains(out, "openshell."+ns+".svc") {
		t.Fatalf("dry run = %q, %v", out, err)
	}
	if got := list(ns); len(got) != 0 {
		t.Fatalf("dry run wrote %d secrets", len(got))
	}

	out, err = runCerts(t, args...)
	if err != nil || !strings.Contains(out, "generated PKI in Kubernetes Secrets in namespace "+ns) {
		t.Fatalf("first run = %q, %v", out, err)
	}
	first := list(ns)
	want := map[string]corev1.SecretType{"srv": corev1.SecretTypeTLS, "cli": corev1.SecretTypeTLS, "jwt": corev1.SecretTypeOpaque}
	got := map[string]corev1.SecretType{}
	for n, s := range first {
		got[n] = s.Type
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("secrets (-want +got):\n%s", diff)
	}
	if !strings.Contains(out, "sandbox JWT kid: "+string(first["jwt"].Data["kid"])) {
		t.Errorf("output %q lacks the kid", out)
	}

	out, err = runCerts(t, args...)
	if err != nil || !strings.Contains(out, "skipped generation") {
		t.Fatalf("second run = %q, %v", out, err)
	}
	for n, s := range list(ns) {
		if s.ResourceVersion != first[n].ResourceVersion {
			t.Errorf("second run changed secret %s", n)
		}
	}

	if err := c.Clientset.CoreV1().Secrets(ns).Delete(t.Context(), "srv", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = runCerts(t, args...)
	if err == nil || !strings.Contains(err.Error(), "missing srv (present: cli, jwt)") || !strings.Contains(err.Error(), "run generate-certs again") {
		t.Fatalf("partial run = %v; want an error naming srv with a recovery hint", err)
	}

	// --jwt-only in another namespace, given by flag.
	ns2 := c.CreateNamespace(t, "")
	out, err = runCerts(t, "--kubeconfig", c.Kubeconfig, "--namespace", ns2, "--jwt-only", "--jwt-secret-name", "jwt")
	if err != nil || !strings.Contains(out, "generated PKI") {
		t.Fatalf("jwt-only run = %q, %v", out, err)
	}
	if got := list(ns2); len(got) != 1 || got["jwt"].Type != corev1.SecretTypeOpaque {
		t.Fatalf("jwt-only secrets = %v", got)
	}
}
