package kubernetes_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/compute/kubernetes"
)

// logBuffer is an io.Writer safe for concurrent slog handlers.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSpace(l.b.String()), "\n")
}

// TestBootstrapLogs checks what the bootstrap authenticator logs: a
// rejected pod that no OpenShell Sandbox controls gets a WARN line with the
// reason, a success gets its INFO line, and every line carries one
// component attribute (the authenticator's, not also the driver's).
func TestBootstrapLogs(t *testing.T) {
	e := newEnv(t)
	var buf logBuffer
	d, err := kubernetes.Open(e.config(nil), compute.FactoryDeps{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.BootstrapAuthenticator(t.Context())
	if err != nil || a == nil {
		t.Fatalf("BootstrapAuthenticator() = %v, %v", a, err)
	}
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	b := bootstrapEnv{env: e, d: d, a: a, sb: sb, pod: e.c.WaitForPod(t, e.ns, sb.Name)}
	if p, err := a.Authenticate(t.Context(), request(b.token(t, b.pod))); err != nil || p == nil {
		t.Fatalf("Authenticate(driver pod) = %v, %v, want a principal", p, err)
	}
	unowned := b.handPod(t, e.ns, testSA, map[string]string{kubernetes.AnnotationSandboxID: sb.ID}, []metav1.OwnerReference{})
	wantRejected(t, a, b.token(t, unowned), codes.PermissionDenied, "pod is not controlled by an OpenShell Sandbox")

	var sawWarn, sawOK bool
	for _, l := range buf.lines() {
		if n := strings.Count(l, "component="); n > 1 {
			t.Errorf("log line has %d component attributes: %s", n, l)
		}
		switch {
		case strings.Contains(l, "sandbox bootstrapped from a K8s ServiceAccount token"):
			sawOK = strings.Contains(l, "component=auth/k8s_sa") && strings.Contains(l, "sandbox_id="+sb.ID)
		case strings.Contains(l, "level=WARN") && strings.Contains(l, `reason="pod is not controlled by an OpenShell Sandbox"`):
			sawWarn = strings.Contains(l, "pod="+unowned.Name) && strings.Contains(l, "component=auth/k8s_sa")
		}
	}
	if !sawOK || !sawWarn {
		t.Errorf("logs: success line %v, owner rejection WARN line %v, want both with component=auth/k8s_sa; logs:\n%s", sawOK, sawWarn, strings.Join(buf.lines(), "\n"))
	}
}
