package kubernetes_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/kubernetes"
	"github.com/openshell-go/openshell/internal/compute/remote"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// serveRemote serves d on a Unix socket with compute/remote, as
// `openshell-gateway driver serve` does, and returns a dialed client.
func serveRemote(t *testing.T, d compute.Driver) *remote.Driver {
	t.Helper()
	dir, err := os.MkdirTemp("", "k8s-rd")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "driver.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- remote.Serve(ctx, d, path, testLogger(t)) }()
	client, err := remote.Dial(t.Context(), path, testLogger(t))
	if err != nil {
		cancel()
		t.Fatalf("Dial(%s) error = %v (serve: %v)", path, err, <-done)
	}
	t.Cleanup(func() {
		client.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve() = %v, want nil after cancel", err)
		}
		os.RemoveAll(dir)
	})
	return client
}

// TestBootstrapOverRemoteSocket checks the ServiceAccount bootstrap works
// with the kubernetes driver served separately (--compute-driver-socket):
// the gateway side gets an authenticator from the remote driver, a real
// pod-bound token of a driver-created pod yields the sandbox principal,
// the driver's refusals keep their kind and text across the socket, a
// token the platform does not authenticate is "not mine", and a served
// driver with bootstrap_auth off gives no authenticator.
func TestBootstrapOverRemoteSocket(t *testing.T) {
	b := newBootstrapEnv(t)
	rd := serveRemote(t, b.d)
	a, err := rd.BootstrapAuthenticator(t.Context())
	if err != nil || a == nil {
		t.Fatalf("remote BootstrapAuthenticator() = %v, %v, want an authenticator", a, err)
	}
	p, err := a.Authenticate(t.Context(), request(b.token(t, b.pod)))
	if err != nil || p == nil {
		t.Fatalf("Authenticate(driver pod token) = %v, %v, want a principal", p, err)
	}
	want := auth.Principal{Kind: auth.KindSandbox, Source: auth.SourceK8sSABootstrap, Subject: "spiffe://openshell/sandbox/" + b.sb.ID,
		DisplayName: b.ns + "/" + b.pod.Name, SandboxID: b.sb.ID}
	if p.Kind != want.Kind || p.Source != want.Source || p.Subject != want.Subject || p.DisplayName != want.DisplayName || p.SandboxID != want.SandboxID {
		t.Errorf("Authenticate() = %+v, want %+v", *p, want)
	}

	unowned := b.handPod(t, b.ns, testSA, map[string]string{kubernetes.AnnotationSandboxID: b.sb.ID}, []metav1.OwnerReference{})
	wantRejected(t, a, b.token(t, unowned), codes.PermissionDenied, "pod is not controlled by an OpenShell Sandbox")

	other := b.c.BoundToken(t, b.ns, testSA, b.pod.Name, b.pod.UID, "someone-else", tokenTTL)
	if p, err := a.Authenticate(t.Context(), request(other)); p != nil || err != nil {
		t.Errorf("Authenticate(other audience) = %v, %v, want nil, nil", p, err)
	}
	req := request(b.token(t, b.pod))
	req.FullMethod = "/openshell.v1.OpenShell/GetSandbox"
	if p, err := a.Authenticate(t.Context(), req); p != nil || err != nil {
		t.Errorf("Authenticate(other method) = %v, %v, want nil, nil", p, err)
	}

	off := serveRemote(t, b.driver(t, map[string]any{"bootstrap_auth": false}))
	if a, err := off.BootstrapAuthenticator(t.Context()); a != nil || err != nil {
		t.Errorf("remote BootstrapAuthenticator(bootstrap_auth off) = %v, %v, want nil, nil", a, err)
	}
}

// TestAdoptionEnabledOverRemoteSocket checks the allow_adoption switch of
// a separately served kubernetes driver reaches the gateway side.
func TestAdoptionEnabledOverRemoteSocket(t *testing.T) {
	e := newEnv(t)
	if err := serveRemote(t, e.driver(t, map[string]any{"allow_adoption": true})).AdoptionEnabled(t.Context()); err != nil {
		t.Errorf("AdoptionEnabled(allow_adoption) = %v, want nil", err)
	}
	err := serveRemote(t, e.driver(t, nil)).AdoptionEnabled(t.Context())
	if errdefs.Code(err) != codes.FailedPrecondition || err.Error() != "sandbox adoption is disabled on this gateway" {
		t.Errorf("AdoptionEnabled(default) = %v, want FailedPrecondition \"sandbox adoption is disabled on this gateway\"", err)
	}
}
