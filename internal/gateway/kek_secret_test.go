package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/config"
	"github.com/openshell-go/openshell/internal/credentials"
	"github.com/openshell-go/openshell/internal/k8stest"
	"github.com/openshell-go/openshell/internal/providers"
	storeopen "github.com/openshell-go/openshell/internal/store/open"
)

// kubeconfigTOML writes a gateway config file whose kubernetes driver table
// names kubeconfig (the driver itself is not selected).
func kubeconfigTOML(t *testing.T, kubeconfig string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gw.toml")
	writeTestFile(t, p, "[openshell]\nversion = 1\n[openshell.drivers.kubernetes]\nkubeconfig = "+strconv.Quote(kubeconfig)+"\n")
	return p
}

// TestKEKSecretGateway: a gateway started with --credentials-kek-secret and
// no Secret creates it (32 random bytes) and seals credentials under that
// key; the key appears in no form in the gateway's log.
func TestKEKSecretGateway(t *testing.T) {
	c := k8stest.Start(t, k8stest.Options{})
	ns := c.CreateNamespace(t, "")
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	db := filepath.Join(t.TempDir(), "gw.db")
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		runErr = Run(ctx, []string{
			"--config", kubeconfigTOML(t, c.Kubeconfig),
			"--bind-address", "127.0.0.1", "--port", strconv.Itoa(l.Addr().(*net.TCPAddr).Port),
			"--disable-tls", "--allow-unauthenticated-users", "--drivers", "process", "--log-level", "trace",
			"--db-url", "sqlite:" + db, "--state-dir", t.TempDir(), "--credentials-kek-secret", ns + "/openshell-kek",
		}, logs, logs)
	}()
	stop := func() {
		cancel()
		<-done
		if runErr != nil {
			t.Errorf("gateway Run() = %v", runErr)
		}
	}
	defer func() {
		if t.Failed() {
			t.Logf("gateway log:\n%s", logs.String())
		}
	}()
	eventually(t, 60*time.Second, "/readyz 200", func() (bool, string) {
		select {
		case <-done:
			t.Fatalf("gateway exited: %v", runErr)
		default:
		}
		code, body := readyz(addr)
		return code == http.StatusOK, strconv.Itoa(code) + " " + body
	})
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := openshellv1.NewOpenShellClient(cc).CreateProvider(t.Context(), &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Type: "github", Credentials: map[string]string{"GITHUB_TOKEN": "tok"},
	}}); err != nil {
		t.Fatal(err)
	}
	stop()

	sec, err := c.Clientset.CoreV1().Secrets(ns).Get(t.Context(), "openshell-kek", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kek := sec.Data[config.DefaultCredentialsKEKSecretKey]
	if len(kek) != credentials.KeySize || sec.Type != corev1.SecretTypeOpaque {
		t.Fatalf("secret %s/openshell-kek: type %s, %d bytes under %q; want Opaque, %d bytes", ns, sec.Type, len(kek), config.DefaultCredentialsKEKSecretKey, credentials.KeySize)
	}
	kr, err := credentials.NewKeyring(kek)
	if err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if !strings.Contains(out, "created the key-encryption key secret") || !strings.Contains(out, kr.ID()) {
		t.Errorf("log does not say the secret was created with id %s", kr.ID())
	}
	for name, form := range map[string]string{
		"raw": string(kek), "base64": base64.StdEncoding.EncodeToString(kek), "base64url": base64.RawURLEncoding.EncodeToString(kek), "hex": hex.EncodeToString(kek),
	} {
		if strings.Contains(strings.ToLower(out), strings.ToLower(form)) {
			t.Errorf("the key appears in the gateway log (%s)", name)
		}
	}
	// The credential was sealed under the Secret's key.
	st, err := storeopen.Open(t.Context(), "sqlite:"+db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ps := providers.NewStore(providers.Options{Objects: st, Keyring: kr})
	p, err := ps.Get(t.Context(), "default", "gh")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := ps.Resolve(p, "GITHUB_TOKEN"); err != nil || v != "tok" {
		t.Fatalf("Resolve with the secret's key = %q, %v", v, err)
	}
}

// TestKEKSecretRotation: with the new key under "kek" and the old one under
// "previous-kek", start-up re-wraps every credential; the new key alone then
// opens them.
func TestKEKSecretRotation(t *testing.T) {
	c := k8stest.Start(t, k8stest.Options{})
	ns := c.CreateNamespace(t, "")
	ctx := t.Context()
	dir := t.TempDir()
	st, err := storeopen.Open(ctx, "sqlite:"+filepath.Join(dir, "gw.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	oldKEK, newKEK := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	oldKR, _ := credentials.NewKeyring(oldKEK)
	newKR, _ := credentials.NewKeyring(newKEK)
	if _, err := providers.NewStore(providers.Options{Objects: st, Keyring: oldKR}).Create(ctx, "default", &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Type: "github", Credentials: map[string]string{"GITHUB_TOKEN": "v"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clientset.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "kek"},
		Data:       map[string][]byte{"kek": newKEK, "previous-kek": []byte(base64.StdEncoding.EncodeToString(oldKEK))},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		CredentialsKEKSecret: ns + "/kek", CredentialsKEKSecretKey: "kek",
		DriverConfigs: map[string]map[string]any{"kubernetes": {"kubeconfig": c.Kubeconfig}},
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	kr, nPrev, err := loadKEK(ctx, cfg, logger)
	if err != nil || nPrev != 1 || kr.ID() != newKR.ID() {
		t.Fatalf("loadKEK = %v, %d, %v; want id %s and one previous key", kr, nPrev, err, newKR.ID())
	}
	if err := rewrapCredentials(ctx, nPrev, logger, providers.NewStore(providers.Options{Objects: st, Keyring: kr})); err != nil {
		t.Fatal(err)
	}
	ps := providers.NewStore(providers.Options{Objects: st, Keyring: newKR})
	p, err := ps.Get(ctx, "default", "gh")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := ps.Resolve(p, "GITHUB_TOKEN"); err != nil || v != "v" {
		t.Fatalf("Resolve with the new KEK only = %q, %v", v, err)
	}
	// A replica not yet restarted in the second step of a rolling rotation
	// (kek = old, previous-kek-next = new) opens the re-wrapped value.
	if _, err := c.Clientset.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "step1"},
		Data:       map[string][]byte{"kek": oldKEK, "previous-kek-next": newKEK},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	step1 := *cfg
	step1.CredentialsKEKSecret = ns + "/step1"
	lagging, _, err := loadKEK(ctx, &step1, logger)
	if err != nil || lagging.ID() != oldKR.ID() {
		t.Fatalf("loadKEK(step 1) = %v, %v", lagging, err)
	}
	lp := providers.NewStore(providers.Options{Objects: st, Keyring: lagging})
	if p, err = lp.Get(ctx, "default", "gh"); err != nil {
		t.Fatal(err)
	}
	if v, err := lp.Resolve(p, "GITHUB_TOKEN"); err != nil || v != "v" {
		t.Fatalf("Resolve on a replica still at step 1 = %q, %v", v, err)
	}
	for _, k := range [][]byte{oldKEK, newKEK} {
		if strings.Contains(logs.String(), base64.StdEncoding.EncodeToString(k)) || strings.Contains(logs.String(), hex.EncodeToString(k)) {
			t.Errorf("a key appears in the log:\n%s", logs.String())
		}
	}
}

// TestKEKSecretStartErrors: conflicting sources are refused before anything
// starts (exit status 1, as every configuration error), and a Secret the gateway cannot read stops the
// start with a message naming it.
func TestKEKSecretStartErrors(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	base := []string{"--disable-tls", "--drivers", "process", "--state-dir", t.TempDir(), "--db-url", "sqlite:" + filepath.Join(t.TempDir(), "gw.db")}
	var out bytes.Buffer
	err := Run(t.Context(), append(base, "--credentials-kek-secret", "ns/kek", "--credentials-kek-file", filepath.Join(t.TempDir(), "k")), &out, &out)
	if err == nil || ExitCode(err) != 1 || !strings.Contains(err.Error(), "--credentials-kek-secret and --credentials-kek-file are exclusive key-encryption key sources: set one") {
		t.Errorf("Run(secret and file) = %v (exit %d)", err, ExitCode(err))
	}
	t.Setenv(config.EnvCredentialsKEK, base64.StdEncoding.EncodeToString(make([]byte, 32)))
	err = Run(t.Context(), append(base, "--credentials-kek-secret", "ns/kek"), &out, &out)
	if err == nil || ExitCode(err) != 1 || !strings.Contains(err.Error(), config.EnvCredentialsKEK+" and --credentials-kek-secret are exclusive") {
		t.Errorf("Run(secret and env) = %v (exit %d)", err, ExitCode(err))
	}
	os.Unsetenv(config.EnvCredentialsKEK)

	// Outside a cluster without the kubernetes driver's kubeconfig.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, _, err = loadKEK(t.Context(), &config.Config{CredentialsKEKSecret: "ns/kek", CredentialsKEKSecretKey: "kek"}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "--credentials-kek-secret: kubernetes client:") || !strings.Contains(err.Error(), "outside a cluster, set kubeconfig in [openshell.drivers.kubernetes]") {
		t.Errorf("loadKEK(no cluster) = %v", err)
	}

	// No rights on the Secret: the start fails naming it.
	c := k8stest.Start(t, k8stest.Options{})
	ns := c.CreateNamespace(t, "")
	c.CreateServiceAccount(t, ns, "gw")
	kc := filepath.Join(t.TempDir(), "sa.kubeconfig")
	rc := c.ServiceAccountConfig(t, ns, "gw")
	writeTestFile(t, kc, "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: "+rc.Host+"\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: "+rc.BearerToken+"\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n")
	cfg := &config.Config{CredentialsKEKSecret: ns + "/kek", CredentialsKEKSecretKey: "kek", DriverConfigs: map[string]map[string]any{"kubernetes": {"kubeconfig": kc}}}
	_, _, err = loadKEK(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "key-encryption key secret "+ns+"/kek: the gateway may not read it") {
		t.Errorf("loadKEK(no rights) = %v", err)
	}
}
