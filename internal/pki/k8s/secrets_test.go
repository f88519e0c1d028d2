package k8s_test

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/k8stest"
	"github.com/openshell-go/openshell/internal/pki"
	pkik8s "github.com/openshell-go/openshell/internal/pki/k8s"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestMain(m *testing.M) { k8stest.Main(m) }

func sink(client kubernetes.Interface, ns string) *pkik8s.Secrets {
	return &pkik8s.Secrets{
		Client: client, Namespace: ns,
		ServerSecretName: "gw-server-tls", ClientSecretName: "gw-client-tls", JWTSecretName: "gw-jwt",
	}
}

func secrets(t *testing.T, c *k8stest.Cluster, ns string) map[string]corev1.Secret {
	t.Helper()
	list, err := c.Clientset.CoreV1().Secrets(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Secret{}
	for _, s := range list.Items {
		out[s.Name] = s
	}
	return out
}

func names(m map[string]corev1.Secret) []string {
	var out []string
	for n := range m {
		out = append(out, n)
	}
	return out
}

func parseCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		t.Fatalf("not a certificate PEM: %q", b)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkTLS verifies a kubernetes.io/tls Secret: key pair matches, the leaf
// chains to ca.crt for usage.
func checkTLS(t *testing.T, s corev1.Secret, usage x509.ExtKeyUsage, dnsName string) *x509.Certificate {
	t.Helper()
	if s.Type != corev1.SecretTypeTLS {
		t.Errorf("secret %s type = %s, want kubernetes.io/tls", s.Name, s.Type)
	}
	if diff := cmp.Diff([]string{"ca.crt", "tls.crt", "tls.key"}, sortedKeys(s.Data)); diff != "" {
		t.Errorf("secret %s keys (-want +got):\n%s", s.Name, diff)
	}
	if _, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"]); err != nil {
		t.Errorf("secret %s: key pair: %v", s.Name, err)
	}
	ca := parseCert(t, s.Data["ca.crt"])
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	leaf := parseCert(t, s.Data["tls.crt"])
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}, DNSName: dnsName}); err != nil {
		t.Errorf("secret %s: certificate does not verify against its ca.crt: %v", s.Name, err)
	}
	return ca
}

func sortedKeys(m map[string][]byte) []string {
	var out []string
	for _, k := range []string{"ca.crt", "kid", "public.pem", "signing.pem", "tls.crt", "tls.key"} {
		if _, ok := m[k]; ok {
			out = append(out, k)
		}
	}
	if len(out) != len(m) {
		out = append(out, fmt.Sprintf("(%d keys in all)", len(m)))
	}
	return out
}

func checkJWT(t *testing.T, s corev1.Secret) {
	t.Helper()
	if s.Type != corev1.SecretTypeOpaque {
		t.Errorf("secret %s type = %s, want Opaque", s.Name, s.Type)
	}
	if diff := cmp.Diff([]string{"kid", "public.pem", "signing.pem"}, sortedKeys(s.Data)); diff != "" {
		t.Errorf("secret %s keys (-want +got):\n%s", s.Name, diff)
	}
	blk, _ := pem.Decode(s.Data["signing.pem"])
	if blk == nil {
		t.Fatalf("signing.pem is not PEM")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		t.Fatalf("signing key is %T, want ed25519", k)
	}
	blk, _ = pem.Decode(s.Data["public.pem"])
	if blk == nil {
		t.Fatalf("public.pem is not PEM")
	}
	pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !priv.Public().(ed25519.PublicKey).Equal(pub) {
		t.Errorf("public.pem does not match signing.pem")
	}
	if got, want := string(s.Data["kid"]), pki.KID(pub.(ed25519.PublicKey)); got != want {
		t.Errorf("kid = %q, want %q", got, want)
	}
}

func TestEnsureSecrets(t *testing.T) {
	c := k8stest.Shared(t)
	ns := c.CreateNamespace(t, "")
	s := sink(c.Clientset, ns)
	opts := pki.Options{ServerSANs: []string{"openshell." + ns + ".svc"}}

	// Dry run on an empty namespace writes nothing.
	rep, err := pkik8s.Ensure(t.Context(), s, opts, true)
	if err != nil || rep.Outcome != pki.WouldGenerate {
		t.Fatalf("dry run = %+v, %v; want WouldGenerate", rep, err)
	}
	if diff := cmp.Diff([]string{"gw-server-tls", "gw-client-tls", "gw-jwt"}, rep.Items); diff != "" {
		t.Errorf("dry-run items (-want +got):\n%s", diff)
	}
	if got := secrets(t, c, ns); len(got) != 0 {
		t.Fatalf("dry run created %v", names(got))
	}

	// Fresh: three Secrets with the documented layout.
	rep, err = pkik8s.Ensure(t.Context(), s, opts, false)
	if err != nil || rep.Outcome != pki.Generated || rep.KID == "" {
		t.Fatalf("first run = %+v, %v; want Generated with a kid", rep, err)
	}
	first := secrets(t, c, ns)
	if len(first) != 3 {
		t.Fatalf("secrets after first run = %v, want 3", names(first))
	}
	serverCA := checkTLS(t, first["gw-server-tls"], x509.ExtKeyUsageServerAuth, "openshell."+ns+".svc")
	clientCA := checkTLS(t, first["gw-client-tls"], x509.ExtKeyUsageClientAuth, "")
	if !serverCA.Equal(clientCA) {
		t.Errorf("server and client secrets carry different CAs")
	}
	checkJWT(t, first["gw-jwt"])
	if got := string(first["gw-jwt"].Data["kid"]); got != rep.KID {
		t.Errorf("report kid %q != secret kid %q", rep.KID, got)
	}
	if got := first["gw-jwt"].Labels["app.kubernetes.io/managed-by"]; got != "openshell-generate-certs" {
		t.Errorf("managed-by label = %q", got)
	}

	// Second run: skipped, nothing changed (same data, same resourceVersion).
	rep, err = pkik8s.Ensure(t.Context(), s, opts, false)
	if err != nil || rep.Outcome != pki.Skipped {
		t.Fatalf("second run = %+v, %v; want Skipped", rep, err)
	}
	second := secrets(t, c, ns)
	for name, a := range first {
		b := second[name]
		if a.ResourceVersion != b.ResourceVersion || !cmp.Equal(a.Data, b.Data) {
			t.Errorf("secret %s changed on the second run", name)
		}
	}

	// Partial: one Secret deleted → error naming it, nothing created.
	if err := c.Clientset.CoreV1().Secrets(ns).Delete(t.Context(), "gw-client-tls", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{true, false} {
		_, err = pkik8s.Ensure(t.Context(), s, opts, dry)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) ||
			!strings.Contains(err.Error(), "missing gw-client-tls (present: gw-server-tls, gw-jwt)") ||
			!strings.Contains(err.Error(), "kubectl -n "+ns+" delete secret gw-server-tls gw-client-tls gw-jwt") {
			t.Errorf("partial run (dry=%v) = %v; want FailedPrecondition naming gw-client-tls with a recovery hint", dry, err)
		}
	}
	if got := secrets(t, c, ns); len(got) != 2 {
		t.Errorf("partial run changed the secrets: %v", names(got))
	}
}

func TestEnsureSecretsJWTOnly(t *testing.T) {
	c := k8stest.Shared(t)
	ns := c.CreateNamespace(t, "")
	s := &pkik8s.Secrets{Client: c.Clientset, Namespace: ns, JWTSecretName: "gw-jwt", JWTOnly: true}
	rep, err := pkik8s.Ensure(t.Context(), s, pki.Options{}, false)
	if err != nil || rep.Outcome != pki.Generated {
		t.Fatalf("jwt-only run = %+v, %v", rep, err)
	}
	got := secrets(t, c, ns)
	if diff := cmp.Diff([]string{"gw-jwt"}, names(got)); diff != "" {
		t.Fatalf("secrets (-want +got):\n%s", diff)
	}
	checkJWT(t, got["gw-jwt"])
	rep, err = pkik8s.Ensure(t.Context(), s, pki.Options{}, false)
	if err != nil || rep.Outcome != pki.Skipped {
		t.Fatalf("second jwt-only run = %+v, %v; want Skipped", rep, err)
	}
}

func TestEnsureSecretsForeignSecret(t *testing.T) {
	c := k8stest.Shared(t)
	ns := c.CreateNamespace(t, "")
	tests := []struct {
		name    string
		secret  *corev1.Secret
		wantErr string
	}{
		{"wrong type", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gw-jwt"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": []byte("x"), "tls.key": []byte("y")}},
			"secret " + ns + "/gw-jwt has type kubernetes.io/tls, want Opaque"},
		{"missing key", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gw-jwt"}, Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{"signing.pem": []byte("x")}},
			"secret " + ns + "/gw-jwt lacks public.pem, kid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := c.Clientset.CoreV1().Secrets(ns)
			if _, err := api.Create(t.Context(), tt.secret, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { api.Delete(context.Background(), tt.secret.Name, metav1.DeleteOptions{}) })
			_, err := pkik8s.Ensure(t.Context(), sink(c.Clientset, ns), pki.Options{}, false)
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Ensure = %v; want FailedPrecondition %q", err, tt.wantErr)
			}
			got, err := api.Get(t.Context(), tt.secret.Name, metav1.GetOptions{})
			if err != nil || !cmp.Equal(got.Data, tt.secret.Data) {
				t.Errorf("foreign secret was changed: %v", err)
			}
			if all := secrets(t, c, ns); len(all) != 1 {
				t.Errorf("secrets = %v, want only the foreign one", names(all))
			}
		})
	}
}

// hookTransport runs before on each request (before the apiserver sees it);
// a non-nil response short-circuits the request.
type hookTransport struct {
	rt     http.RoundTripper
	before func(*http.Request) *http.Response
}

func (h hookTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if resp := h.before(r); resp != nil {
		return resp, nil
	}
	return h.rt.RoundTrip(r)
}

func hookedClient(t *testing.T, c *k8stest.Cluster, before func(*http.Request) *http.Response) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(c.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return hookTransport{rt, before} })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func isCreate(r *http.Request, ns string) bool {
	return r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/"+ns+"/secrets"
}

func TestEnsureSecretsFailureRollsBack(t *testing.T) {
	c := k8stest.Shared(t)
	ns := c.CreateNamespace(t, "")
	// The apiserver accepts the first two creates; the third (the JWT
	// Secret) fails with a server error.
	var creates atomic.Int32
	client := hookedClient(t, c, func(r *http.Request) *http.Response {
		if isCreate(r, ns) && creates.Add(1) == 3 {
			body := `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected failure","reason":"InternalError","code":500}`
			return &http.Response{StatusCode: 500, Header: http.Header{"Content-Type": {"application/json"}},
				Body: io.NopCloser(strings.NewReader(body)), Request: r}
		}
		return nil
	})
	_, err := pkik8s.Ensure(t.Context(), sink(client, ns), pki.Options{}, false)
	if err == nil || !strings.Contains(err.Error(), "create secret "+ns+"/gw-jwt") {
		t.Fatalf("Ensure = %v; want the failed create of gw-jwt", err)
	}
	if got := secrets(t, c, ns); len(got) != 0 {
		t.Fatalf("a failed run left %v behind", names(got))
	}
	// The namespace is clean again: a later run succeeds.
	if rep, err := pkik8s.Ensure(t.Context(), sink(c.Clientset, ns), pki.Options{}, false); err != nil || rep.Outcome != pki.Generated {
		t.Fatalf("run after the failure = %+v, %v", rep, err)
	}
}

func TestEnsureSecretsRace(t *testing.T) {
	c := k8stest.Shared(t)
	ns := c.CreateNamespace(t, "")
	// Another writer completes the whole bundle between this run's check
	// (all absent) and its first create: this run must not overwrite
	// anything and reports Skipped.
	var once atomic.Bool
	var otherErr error
	client := hookedClient(t, c, func(r *http.Request) *http.Response {
		if isCreate(r, ns) && once.CompareAndSwap(false, true) {
			_, otherErr = pkik8s.Ensure(r.Context(), sink(c.Clientset, ns), pki.Options{}, false)
		}
		return nil
	})
	rep, err := pkik8s.Ensure(t.Context(), sink(client, ns), pki.Options{}, false)
	if otherErr != nil {
		t.Fatalf("racing writer: %v", otherErr)
	}
	if err != nil || rep.Outcome != pki.Skipped {
		t.Fatalf("Ensure = %+v, %v; want Skipped after the race", rep, err)
	}
	got := secrets(t, c, ns)
	if len(got) != 3 {
		t.Fatalf("secrets = %v", names(got))
	}
	a := checkTLS(t, got["gw-server-tls"], x509.ExtKeyUsageServerAuth, "localhost")
	b := checkTLS(t, got["gw-client-tls"], x509.ExtKeyUsageClientAuth, "")
	if !a.Equal(b) {
		t.Errorf("the race mixed two bundles")
	}
}

func TestSecretsValidate(t *testing.T) {
	var cs kubernetes.Interface = &kubernetes.Clientset{}
	tests := []struct {
		name string
		s    pkik8s.Secrets
		want string
	}{
		{"no namespace", pkik8s.Secrets{Client: cs, ServerSecretName: "a", ClientSecretName: "b", JWTSecretName: "c"}, "namespace is required"},
		{"bad namespace", pkik8s.Secrets{Client: cs, Namespace: "Bad_NS", ServerSecretName: "a", ClientSecretName: "b", JWTSecretName: "c"}, `namespace "Bad_NS" is not valid`},
		{"no server", pkik8s.Secrets{Client: cs, Namespace: "n", ClientSecretName: "b", JWTSecretName: "c"}, "server secret name is required"},
		{"no jwt", pkik8s.Secrets{Client: cs, Namespace: "n", JWTOnly: true}, "jwt secret name is required"},
		{"bad name", pkik8s.Secrets{Client: cs, Namespace: "n", ServerSecretName: "a", ClientSecretName: "B_b", JWTSecretName: "c"}, `client secret name "B_b" is not valid`},
		{"duplicate", pkik8s.Secrets{Client: cs, Namespace: "n", ServerSecretName: "a", ClientSecretName: "b", JWTSecretName: "a"}, `server and jwt secrets must have different names (both "a")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.s.Validate()
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate = %v; want InvalidArgument %q", err, tt.want)
			}
		})
	}
	ok := pkik8s.Secrets{Client: cs, Namespace: "n", JWTSecretName: "c", JWTOnly: true}
	if err := ok.Validate(); err != nil {
		t.Errorf("jwt-only without TLS names: %v", err)
	}
}

// TestEnsureSecretsLeastPrivilege runs generate-certs as a ServiceAccount with
// exactly the Helm chart's hook Role (create secrets; get and delete the
// three named ones): enough for generate, skip, partial detection and
// rollback, and nothing else in the namespace is readable.
func TestEnsureSecretsLeastPrivilege(t *testing.T) {
	c := k8stest.Shared(t)
	ns := c.CreateNamespace(t, "")
	c.CreateServiceAccount(t, ns, "pki-hook")
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pki-hook", Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
			{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"gw-server-tls", "gw-client-tls", "gw-jwt"}, Verbs: []string{"get", "delete"}},
		},
	}
	if _, err := c.Clientset.RbacV1().Roles(ns).Create(t.Context(), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pki-hook", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pki-hook"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "pki-hook", Namespace: ns}},
	}
	if _, err := c.Clientset.RbacV1().RoleBindings(ns).Create(t.Context(), rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := c.ServiceAccountConfig(t, ns, "pki-hook")
	hookClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// RBAC is evaluated from an informer cache: wait until the binding applies.
	c.Eventually(t, func(ctx context.Context) (bool, error) {
		_, err := hookClient.CoreV1().Secrets(ns).Get(ctx, "gw-jwt", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}, "hook role to apply")

	// Rollback under the restricted account: the third create fails, the
	// first two are deleted (delete is limited to the named Secrets).
	var creates atomic.Int32
	failing := rest.CopyConfig(cfg)
	failing.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return hookTransport{rt, func(r *http.Request) *http.Response {
			if isCreate(r, ns) && creates.Add(1) == 3 {
				return &http.Response{StatusCode: 500, Header: http.Header{"Content-Type": {"application/json"}},
					Body: io.NopCloser(strings.NewReader(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected","reason":"InternalError","code":500}`)), Request: r}
			}
			return nil
		}}
	})
	failClient, err := kubernetes.NewForConfig(failing)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pkik8s.Ensure(t.Context(), sink(failClient, ns), pki.Options{}, false); err == nil || strings.Contains(err.Error(), "rollback") {
		t.Fatalf("failing run = %v; want a create error with a clean rollback", err)
	}
	if got := secrets(t, c, ns); len(got) != 0 {
		t.Fatalf("restricted rollback left %v", names(got))
	}

	for i, want := range []pki.Outcome{pki.Generated, pki.Skipped} {
		rep, err := pkik8s.Ensure(t.Context(), sink(hookClient, ns), pki.Options{}, false)
		if err != nil || rep.Outcome != want {
			t.Fatalf("run %d as the hook account = %+v, %v; want outcome %v", i+1, rep, err, want)
		}
	}
	if err := c.Clientset.CoreV1().Secrets(ns).Delete(t.Context(), "gw-jwt", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pkik8s.Ensure(t.Context(), sink(hookClient, ns), pki.Options{}, false); err == nil || !strings.Contains(err.Error(), "missing gw-jwt") {
		t.Fatalf("partial run as the hook account = %v", err)
	}
	// The account cannot read other Secrets.
	if _, err := hookClient.CoreV1().Secrets(ns).List(t.Context(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("hook account list secrets = %v; want Forbidden", err)
	}
}
