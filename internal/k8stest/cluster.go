package k8stest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/openshell-go/openshell/internal/citest"
)

// EnvBinDir names the environment variable holding the directory built by
// test/k8s/build.sh.
const EnvBinDir = "OPENSHELL_K8S_BIN_DIR"

// Version is the Kubernetes version the harness runs.
const Version = "v1.37.2"

// Issuer is the apiserver's ServiceAccount token issuer, also its API audience.
const Issuer = "https://kubernetes.default.svc.cluster.local"

// SandboxGVR is the agent-sandbox Sandbox resource at its storage version.
var SandboxGVR = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}

// SandboxV1alpha1GVR is the deprecated v1alpha1 version of the Sandbox resource.
var SandboxV1alpha1GVR = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1alpha1", Resource: "sandboxes"}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// startTimeout bounds each startup phase; the machines tests run on are shared.
const startTimeout = 2 * time.Minute

// Options configures a cluster.
type Options struct {
	// Controller starts the agent-sandbox controller once its CRDs are served.
	Controller bool
	// ExtensionCRDs also installs the extensions.agents.x-k8s.io CRDs
	// (SandboxClaim, SandboxTemplate, SandboxWarmPool); they add ~1 s to
	// startup. The Sandbox CRD is always installed.
	ExtensionCRDs bool
	// Users are extra static-token users (for RBAC tests). Their tokens
	// authenticate them; RBAC decides what they may do.
	Users []User
	// Node also starts a node: containerd, kubelet, kube-scheduler and
	// kube-controller-manager (see [Node]), so pods run. It needs root, the
	// binaries of test/k8s/node/build.sh ([EnvNodeBinDir]), runc, the CNI
	// plugins and busybox-static; without them the test skips (fails under
	// CI=true). The controller-manager also brings what a bare control plane
	// lacks: "default" ServiceAccounts, garbage collection and namespace
	// deletion.
	Node bool
}

// User is a static-token apiserver user.
type User struct {
	Name, UID, Token string
	Groups           []string
}

// Cluster is a running etcd + kube-apiserver (+ agent-sandbox controller).
type Cluster struct {
	// Config authenticates as the admin user (group system:masters).
	// Callers must copy it (rest.CopyConfig) before changing it.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file for the admin user.
	Kubeconfig string
	// Clientset and Dynamic are admin clients.
	Clientset kubernetes.Interface
	Dynamic   dynamic.Interface
	// Host is the apiserver URL (https://127.0.0.1:PORT); CAFile holds the
	// certificate that verifies it.
	Host   string
	CAFile string
	// Dir holds the cluster's state and the processes' logs
	// (etcd.log, kube-apiserver.log, agent-sandbox-controller.log).
	Dir string
	// Node is the running node when [Options].Node was set, else nil.
	Node *Node

	adminToken string
	procs      []*proc // in start order
	stopOnce   sync.Once
}

// BinDir returns the directory holding the harness binaries (see
// test/k8s/build.sh), or an error naming what is missing.
func BinDir() (string, error) {
	dir := os.Getenv(EnvBinDir)
	if dir == "" {
		return "", fmt.Errorf("%s is not set; run: eval \"$(test/k8s/build.sh)\"", EnvBinDir)
	}
	for _, name := range []string{"etcd", "kube-apiserver", "agent-sandbox-controller", "crds"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("%s=%s: %w; run test/k8s/build.sh", EnvBinDir, dir, err)
		}
	}
	return dir, nil
}

// unavailable skips the test, or fails it under CI=true.
func unavailable(t testing.TB, err error) {
	t.Helper()
	citest.SkipOrFail(t, "k8stest: kubernetes harness unavailable: %v", err)
}

// Start starts a cluster for t alone and stops it in t.Cleanup (the
// apiserver before etcd). When t has failed, the tails of the processes' logs
// are logged. It skips t when the binaries are missing (fails under CI=true).
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		unavailable(t, err)
	}
	if opts.Node {
		if _, err := nodePreflight(); err != nil {
			unavailable(t, err)
		}
	}
	t0 := time.Now()
	c, err := start(t.Context(), t.TempDir(), bin, opts)
	if err != nil {
		t.Fatalf("k8stest: %v", err)
	}
	t.Logf("k8stest: cluster up in %v (state and logs in %s)", time.Since(t0).Round(time.Millisecond), c.Dir)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("k8stest: cluster logs in %s\n%s", c.Dir, c.logTails(40))
		}
		c.stop()
	})
	return c
}

var shared struct {
	mu      sync.Mutex
	inMain  bool
	started bool
	c       *Cluster
	err     error
	dir     string
}

// Main runs the tests of a package that uses [Shared] and then stops the
// shared cluster; call it from TestMain:
//
//	func TestMain(m *testing.M) { k8stest.Main(m) }
//
// It does not return.
func Main(m *testing.M) {
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()

	code := m.Run()

	shared.mu.Lock()
	c, dir := shared.c, shared.dir
	shared.mu.Unlock()
	if c != nil {
		if code != 0 {
			fmt.Fprintf(os.Stderr, "k8stest: shared cluster logs in %s\n%s\n", c.Dir, c.logTails(40))
		}
		c.stop()
	}
	if dir != "" {
		_ = os.RemoveAll(dir) // best effort: the test run is over
	}
	os.Exit(code)
}

// Shared returns the test binary's shared cluster (with the agent-sandbox
// controller), starting it on first use. It needs [Main] in TestMain. It
// skips t when the binaries are missing (fails under CI=true); if the cluster
// failed to start, every test using it fails.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.inMain {
		t.Fatal("k8stest.Shared needs func TestMain(m *testing.M) { k8stest.Main(m) } in the package")
	}
	bin, err := BinDir()
	if err != nil {
		unavailable(t, err)
	}
	if !shared.started {
		shared.started = true
		shared.dir, shared.err = os.MkdirTemp("", "k8stest-")
		if shared.err == nil {
			// Not t.Context: the cluster outlives this test.
			t0 := time.Now()
			shared.c, shared.err = start(context.Background(), shared.dir, bin, Options{Controller: true})
			if shared.err == nil {
				t.Logf("k8stest: shared cluster up in %v (state and logs in %s)", time.Since(t0).Round(time.Millisecond), shared.dir)
			}
		}
	}
	if shared.err != nil {
		t.Fatalf("k8stest: shared cluster: %v", shared.err)
	}
	return shared.c
}

// start brings a cluster up in dir. On error everything started is stopped
// and the error carries the tail of the failing process's log.
func start(ctx context.Context, dir, bin string, opts Options) (_ *Cluster, err error) {
	c := &Cluster{Dir: dir}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()

	ports, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	etcdPort, etcdPeer, apiPort, metricsPort, probePort := ports[0], ports[1], ports[2], ports[3], ports[4]

	users := opts.Users
	var kubeletToken string
	// Node mode gives each cluster its own pod and Service networks (a /24
	// each, see startNode), so clusters on one machine do not collide.
	serviceRange := "10.96.0.0/16"
	var nodeID [4]byte
	if opts.Node {
		if _, err := rand.Read(nodeID[:]); err != nil {
			return nil, err
		}
		serviceRange = nodeServiceRange(nodeID)
		tok := make([]byte, 32)
		if _, err := rand.Read(tok); err != nil {
			return nil, err
		}
		kubeletToken = hex.EncodeToString(tok)
		users = append(append([]User(nil), users...), User{Name: "system:node:" + NodeName, UID: "k8stest-node", Token: kubeletToken, Groups: []string{"system:nodes"}})
	}
	if err := c.writeAuthFiles(users); err != nil {
		return nil, err
	}

	// etcd.
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	etcd, err := startProc(dir, "etcd", filepath.Join(bin, "etcd"), []string{
		"--name=k8stest",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + etcdURL,
		"--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=k8stest=" + peerURL,
		"--unsafe-no-fsync",
		"--log-level=warn",
	}, nil)
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, etcd)
	plain := &http.Client{Timeout: 5 * time.Second}
	if err := waitHTTP(ctx, etcd, plain, etcdURL+"/health", nil); err != nil {
		return nil, err
	}

	// kube-apiserver.
	c.Host = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	certDir := filepath.Join(dir, "certs")
	apiArgs := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + certDir,
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=" + Issuer,
		"--service-account-key-file=" + filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--api-audiences=" + Issuer,
		"--service-cluster-ip-range=" + serviceRange,
		"--endpoint-reconciler-type=none",
		"--enable-admission-plugins=NamespaceLifecycle,ServiceAccount",
		"--disable-admission-plugins=DefaultStorageClass,StorageObjectInUseProtection,PersistentVolumeClaimResize,TaintNodesByCondition",
		"--profiling=false",
	}
	if opts.Node {
		// The kubelet registers the bridge address as its InternalIP; its
		// serving certificate is self-signed (not verified on loopback).
		apiArgs = append(apiArgs, "--kubelet-preferred-address-types=InternalIP", "--allow-privileged=true")
	}
	api, err := startProc(dir, "kube-apiserver", filepath.Join(bin, "kube-apiserver"), apiArgs, nil)
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, api)
	insecure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the serving cert is read once ready
	}}
	if err := waitHTTP(ctx, api, insecure, c.Host+"/readyz", http.Header{"Authorization": {"Bearer " + c.adminToken}}); err != nil {
		return nil, err
	}
	insecure.CloseIdleConnections()
	c.CAFile = filepath.Join(certDir, "apiserver.crt")
	if err := c.connect(); err != nil {
		return nil, err
	}

	if err := c.installCRDs(ctx, filepath.Join(bin, "crds"), opts.ExtensionCRDs); err != nil {
		return nil, err
	}
	// The apiextensions server holds a custom resource created within 2 s of
	// its CRD becoming Established for the rest of those 2 s; let that window
	// pass during startup so tests see steady latencies.
	settled := time.Now().Add(2 * time.Second)

	if opts.Controller {
		ctrl, err := startProc(dir, "agent-sandbox-controller", filepath.Join(bin, "agent-sandbox-controller"), []string{
			"--kubeconfig=" + c.Kubeconfig,
			"--leader-elect=false",
			"--enable-webhook=false",
			"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(metricsPort),
			"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(probePort),
		}, nil)
		if err != nil {
			return nil, err
		}
		c.procs = append(c.procs, ctrl)
		if err := waitHTTP(ctx, ctrl, plain, "http://127.0.0.1:"+strconv.Itoa(probePort)+"/readyz", nil); err != nil {
			return nil, err
		}
	}
	if opts.Node {
		nodeBin, err := NodeBinDir()
		if err != nil {
			return nil, err
		}
		if err := c.startNode(ctx, nodeBin, kubeletToken, nodeID, apiPort); err != nil {
			return nil, err
		}
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Until(settled)):
	}
	return c, nil
}

// stop kills the processes in reverse start order (controller, apiserver, etcd).
func (c *Cluster) stop() {
	c.stopOnce.Do(func() {
		for i := len(c.procs) - 1; i >= 0; i-- {
			c.procs[i].stop()
		}
		if c.Node != nil {
			c.Node.stop()
		}
	})
}

func (c *Cluster) logTails(n int) string {
	var b strings.Builder
	for _, p := range c.procs {
		fmt.Fprintf(&b, "--- %s (last %d lines of %s)\n%s\n", p.name, n, p.logPath, p.tail(n))
	}
	return b.String()
}

// writeAuthFiles writes the static token file (admin + users), the
// ServiceAccount signing key pair and nothing else; secrets are 0600.
func (c *Cluster) writeAuthFiles(users []User) error {
	tok := make([]byte, 32)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	c.adminToken = hex.EncodeToString(tok)
	var csv strings.Builder
	fmt.Fprintf(&csv, "%s,admin,admin-uid,system:masters\n", c.adminToken)
	for _, u := range users {
		if u.Token == "" || u.Name == "" || strings.ContainsAny(u.Token+u.Name+u.UID+strings.Join(u.Groups, ""), ",\"\n") {
			return fmt.Errorf("static user %q: needs a token and a name without commas, quotes or newlines", u.Name)
		}
		fmt.Fprintf(&csv, "%s,%s,%s", u.Token, u.Name, u.UID)
		if len(u.Groups) > 0 {
			fmt.Fprintf(&csv, ",\"%s\"", strings.Join(u.Groups, ","))
		}
		csv.WriteString("\n")
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "tokens.csv"), []byte(csv.String()), 0o600); err != nil {
		return err
	}

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.Dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

// connect builds the admin rest.Config, clients and kubeconfig file.
func (c *Cluster) connect() error {
	c.Config = c.ConfigForToken(c.adminToken)
	var err error
	if c.Clientset, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	if c.Dynamic, err = dynamic.NewForConfig(c.Config); err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8stest
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: k8stest
  context:
    cluster: k8stest
    user: admin
current-context: k8stest
`, c.Host, c.CAFile, c.adminToken)
	return os.WriteFile(c.Kubeconfig, []byte(kc), 0o600)
}

// ConfigForToken returns a rest.Config for this cluster authenticating with
// a bearer token (a static user's, or one from TokenRequest).
func (c *Cluster) ConfigForToken(token string) *rest.Config {
	return &rest.Config{
		Host:            c.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.CAFile},
		QPS:             -1, // no client-side throttling in tests
	}
}

// installCRDs creates the CRDs in dir (the extensions ones only when asked)
// with conversion strategy None, waits until each is Established and until
// discovery serves the Sandbox resource.
func (c *Cluster) installCRDs(ctx context.Context, dir string, extensions bool) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no CRDs in %s", dir)
	}
	var names []string
	for _, f := range files {
		if !extensions && strings.HasPrefix(filepath.Base(f), "extensions.") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var obj map[string]any
		if err := yaml.Unmarshal(b, &obj); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		u := &unstructured.Unstructured{Object: obj}
		// The stock CRDs convert between versions through a webhook that
		// does not run here; the versions share one schema shape.
		if err := unstructured.SetNestedMap(u.Object, map[string]any{"strategy": "None"}, "spec", "conversion"); err != nil {
			return err
		}
		if _, err := c.Dynamic.Resource(crdGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create CRD %s: %w", u.GetName(), err)
		}
		names = append(names, u.GetName())
	}
	for _, name := range names {
		err := poll(ctx, func() (bool, error) {
			u, err := c.Dynamic.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, cond := range conds {
				m, _ := cond.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", name, err)
		}
	}
	// The controller gives up for 10 s when discovery lacks its resources.
	return poll(ctx, func() (bool, error) {
		list, err := c.Clientset.Discovery().ServerResourcesForGroupVersion(SandboxGVR.GroupVersion().String())
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		for _, r := range list.APIResources {
			if r.Name == SandboxGVR.Resource {
				return true, nil
			}
		}
		return false, nil
	})
}

// freePorts reserves n distinct loopback ports and releases them.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitHTTP polls url until it answers 200, p exits, or the start timeout passes.
func waitHTTP(ctx context.Context, p *proc, client *http.Client, url string, h http.Header) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	var last string
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if done, err := p.exited(); done {
			return fmt.Errorf("%s exited (%v) before %s was ready:\n%s", p.name, err, url, p.tail(30)) //nolint:errorlint // err is nil on a clean exit
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s after %v (last: %s):\n%s", p.name, url, startTimeout, last, p.tail(30))
		case <-p.done:
		case <-tick.C:
		}
	}
}

// poll calls cond until it reports true, fails, or the start timeout passes.
func poll(ctx context.Context, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("timed out")
		case <-tick.C:
		}
	}
}
