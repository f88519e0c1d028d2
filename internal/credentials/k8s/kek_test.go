package k8s_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/openshell-go/openshell/internal/credentials"
	credk8s "github.com/openshell-go/openshell/internal/credentials/k8s"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/k8stest"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func key(b byte) []byte {
	k := make([]byte, credentials.KeySize)
	for i := range k {
		k[i] = b + byte(i)
	}
	return k
}

func id(t *testing.T, k []byte) string {
	t.Helper()
	kr, err := credentials.NewKeyring(k)
	if err != nil {
		t.Fatal(err)
	}
	return kr.ID()
}

func putSecret(t *testing.T, c kubernetes.Interface, ns, name string, data map[string][]byte) {
	t.Helper()
	_, err := c.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// grant gives ServiceAccount ns/sa the rules and returns a client acting as it.
func grant(t *testing.T, c *k8stest.Cluster, ns, sa string, rules ...rbacv1.PolicyRule) kubernetes.Interface {
	t.Helper()
	c.CreateServiceAccount(t, ns, sa)
	ctx := t.Context()
	if _, err := c.Clientset.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: sa}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clientset.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: sa},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(c.ServiceAccountConfig(t, ns, sa))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestSecretSource(t *testing.T) {
	c := k8stest.Start(t, k8stest.Options{})
	admin := c.Clientset

	t.Run("absent is created with 32 random bytes and used", func(t *testing.T) {
		ns := c.CreateNamespace(t, "")
		s := &credk8s.Secret{Client: admin, Namespace: ns, Name: "kek"}
		got, err := s.Load(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		sec, err := admin.CoreV1().Secrets(ns).Get(t.Context(), "kek", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sec.Type != corev1.SecretTypeOpaque || len(sec.Data) != 1 || len(sec.Data[credk8s.DefaultKey]) != credentials.KeySize {
			t.Fatalf("created secret: type %s, %d data keys, %d bytes under %q; want Opaque, one key of %d bytes", sec.Type, len(sec.Data), len(sec.Data[credk8s.DefaultKey]), credk8s.DefaultKey, credentials.KeySize)
		}
		if !got.Created || got.Current.ID() != id(t, sec.Data[credk8s.DefaultKey]) || len(got.Previous) != 0 {
			t.Fatalf("Load() = created %v, id %s, %d previous; want created, id of the stored key, none", got.Created, got.Current.ID(), len(got.Previous))
		}
		// A second start reads the same key and creates nothing.
		again, err := s.Load(t.Context())
		if err != nil || again.Created || again.Current.ID() != got.Current.ID() {
			t.Fatalf("second Load() = %+v, %v; want the same key, not created", again, err)
		}
	})

	t.Run("present raw, base64 and hex values are used", func(t *testing.T) {
		ns := c.CreateNamespace(t, "")
		k := key(1)
		for name, v := range map[string][]byte{
			"raw": k, "b64": []byte(base64.StdEncoding.EncodeToString(k) + "\n"), "hex": []byte(hex.EncodeToString(k)),
		} {
			putSecret(t, admin, ns, name, map[string][]byte{"custom": v})
			got, err := (&credk8s.Secret{Client: admin, Namespace: ns, Name: name, Key: "custom"}).Load(t.Context())
			if err != nil || got.Created || got.Current.ID() != id(t, k) {
				t.Errorf("Load(%s) = %+v, %v; want id %s", name, got, err, id(t, k))
			}
		}
	})

	t.Run("wrong length or missing data key is a clear error", func(t *testing.T) {
		ns := c.CreateNamespace(t, "")
		short := []byte("0123456789abcdef") // 16 bytes
		putSecret(t, admin, ns, "short", map[string][]byte{"kek": short})
		_, err := (&credk8s.Secret{Client: admin, Namespace: ns, Name: "short"}).Load(t.Context())
		want := `key-encryption key secret ` + ns + `/short, data key "kek": value is 16 bytes: want 32 raw bytes or their base64 or hex text`
		if err == nil || err.Error() != want || !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("Load(short) = %v; want %q", err, want)
		}
		putSecret(t, admin, ns, "other", map[string][]byte{"something": key(2)})
		_, err = (&credk8s.Secret{Client: admin, Namespace: ns, Name: "other"}).Load(t.Context())
		if err == nil || !strings.Contains(err.Error(), `key-encryption key secret `+ns+`/other has no data key "kek"`) {
			t.Errorf("Load(no data key) = %v", err)
		}
		sec, _ := admin.CoreV1().Secrets(ns).Get(t.Context(), "other", metav1.GetOptions{})
		if diff := cmp.Diff(map[string][]byte{"something": key(2)}, sec.Data); diff != "" {
			t.Errorf("a secret without the data key was changed (-want +got):\n%s", diff)
		}
	})

	t.Run("previous keys for rotation", func(t *testing.T) {
		ns := c.CreateNamespace(t, "")
		putSecret(t, admin, ns, "kek", map[string][]byte{
			"kek": key(3), "previous-kek": key(4), "previous-kek-2025": []byte(base64.StdEncoding.EncodeToString(key(5))),
			"previous-kekx": key(6), "unrelated": []byte("x"),
		})
		got, err := (&credk8s.Secret{Client: admin, Namespace: ns, Name: "kek"}).Load(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var prev []string
		for _, p := range got.Previous {
			prev = append(prev, p.ID())
		}
		if got.Current.ID() != id(t, key(3)) {
			t.Errorf("current = %s, want %s", got.Current.ID(), id(t, key(3)))
		}
		if diff := cmp.Diff([]string{id(t, key(4)), id(t, key(5))}, prev); diff != "" {
			t.Errorf("previous ids (-want +got):\n%s", diff)
		}
		putSecret(t, admin, ns, "badprev", map[string][]byte{"kek": key(3), "previous-kek": []byte("short")})
		_, err = (&credk8s.Secret{Client: admin, Namespace: ns, Name: "badprev"}).Load(t.Context())
		if err == nil || !strings.Contains(err.Error(), `data key "previous-kek": value is 5 bytes`) {
			t.Errorf("Load(bad previous) = %v", err)
		}
	})

	t.Run("rbac", func(t *testing.T) {
		ns := c.CreateNamespace(t, "")
		getOnly := grant(t, c, ns, "get-only", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"kek"}, Verbs: []string{"get"}})
		_, err := (&credk8s.Secret{Client: getOnly, Namespace: ns, Name: "kek"}).Load(t.Context())
		want := "key-encryption key secret " + ns + "/kek does not exist and the gateway may not create it: create it with 32 random bytes under data key \"kek\""
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("Load(get only, absent) = %v; want %q", err, want)
		}
		none := grant(t, c, ns, "none")
		_, err = (&credk8s.Secret{Client: none, Namespace: ns, Name: "kek"}).Load(t.Context())
		want = "key-encryption key secret " + ns + "/kek: the gateway may not read it (grant get on secrets \"kek\" in namespace " + ns + ")"
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("Load(no rights) = %v; want %q", err, want)
		}
		// The chart's rules: get on the one name, create on secrets.
		chart := grant(t, c, ns, "chart",
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"kek"}, Verbs: []string{"get"}},
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}})
		got, err := (&credk8s.Secret{Client: chart, Namespace: ns, Name: "kek"}).Load(t.Context())
		if err != nil || !got.Created {
			t.Fatalf("Load(chart rules) = %+v, %v; want created", got, err)
		}
		if again, err := (&credk8s.Secret{Client: chart, Namespace: ns, Name: "kek"}).Load(t.Context()); err != nil || again.Current.ID() != got.Current.ID() {
			t.Fatalf("second Load(chart rules) = %+v, %v", again, err)
		}
	})

	t.Run("another replica creates it first", func(t *testing.T) {
		ns := c.CreateNamespace(t, "")
		theirs := key(7)
		// The other replica's Create lands between this one's Get (not
		// found) and its Create.
		rc := rest.CopyConfig(c.Config)
		rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/namespaces/"+ns+"/secrets") {
					putSecret(t, admin, ns, "kek", map[string][]byte{"kek": theirs})
				}
				return rt.RoundTrip(r)
			})
		}
		racer, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		got, err := (&credk8s.Secret{Client: racer, Namespace: ns, Name: "kek"}).Load(t.Context())
		if err != nil || got.Created || got.Current.ID() != id(t, theirs) {
			t.Fatalf("Load() = %+v, %v; want the other replica's key %s, not created", got, err, id(t, theirs))
		}
		sec, _ := admin.CoreV1().Secrets(ns).Get(t.Context(), "kek", metav1.GetOptions{})
		if !bytes.Equal(sec.Data["kek"], theirs) {
			t.Error("the other replica's Secret was changed")
		}
	})

	t.Run("refs", func(t *testing.T) {
		for _, bad := range []string{"", "name", "/name", "ns/", "Bad_NS/name", "ns/Bad_Name"} {
			if _, _, err := credk8s.ParseRef(bad); err == nil {
				t.Errorf("ParseRef(%q) accepted", bad)
			}
		}
		if ns, n, err := credk8s.ParseRef("openshell/openshell-kek"); err != nil || ns != "openshell" || n != "openshell-kek" {
			t.Errorf("ParseRef = %q, %q, %v", ns, n, err)
		}
	})
}
