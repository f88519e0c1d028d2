package interceptor

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	gipb "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// fakeBin is the fakeinterceptor binary, built once by TestMain.
var fakeBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakeinterceptor")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fakeBin = filepath.Join(dir, "fakeinterceptor")
	out, err := exec.Command("go", "build", "-o", fakeBin, "./testdata/fakeinterceptor").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build fakeinterceptor: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fake is one running fakeinterceptor process.
type fake struct {
	endpoint string
	record   string
}

// startFake runs fakeinterceptor with the manifest (ProtoJSON), behavior
// and patches (JSON array) and waits until it listens.
func startFake(t testing.TB, manifest, behavior, patches string, extra ...string) *fake {
	t.Helper()
	if patches == "" {
		patches = "[]"
	}
	rec := filepath.Join(t.TempDir(), "record.jsonl")
	cmd := exec.Command(fakeBin, append([]string{"-manifest", manifest, "-behavior", behavior, "-patches", patches, "-record", rec}, extra...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			addr <- strings.TrimPrefix(sc.Text(), "listening ")
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok || a == "" {
			t.Fatal("fakeinterceptor exited before listening")
		}
		if strings.HasPrefix(a, "/") {
			return &fake{endpoint: "unix://" + a, record: rec}
		}
		return &fake{endpoint: "http://" + a, record: rec}
	case <-time.After(30 * time.Second):
		t.Fatal("fakeinterceptor did not start within 30s")
	}
	return nil
}

// evaluations returns what the interceptor received, in order, with the
// raw wire bytes of each.
func (f *fake) evaluations(t *testing.T) ([]*gipb.InterceptorEvaluation, [][]byte) {
	t.Helper()
	b, err := os.ReadFile(f.record)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var evs []*gipb.InterceptorEvaluation
	var raws [][]byte
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" || line == snapshotLine {
			continue
		}
		var l struct {
			JSON json.RawMessage `json:"json"`
			Raw  string          `json:"raw"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		ev := &gipb.InterceptorEvaluation{}
		if err := protojson.Unmarshal(l.JSON, ev); err != nil {
			t.Fatal(err)
		}
		raw, err := base64.StdEncoding.DecodeString(l.Raw)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
		raws = append(raws, raw)
	}
	return evs, raws
}

// authorizations returns the authorization metadata of each Evaluate the
// fake received, in order.
func (f *fake) authorizations(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(f.record)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" || line == snapshotLine {
			continue
		}
		var l struct {
			Authorization []string `json:"authorization"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l.Authorization)
	}
	return out
}

// snapshotLine is what the fake records for a SnapshotProviderProfiles.
const snapshotLine = `{"snapshot":true}`

// snapshots counts the SnapshotProviderProfiles calls the fake answered.
func (f *fake) snapshots(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(f.record)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Count(string(b), snapshotLine)
}

// manifest renders a manifest with one binding per (id, rpc, phases, policy).
func manifest(defaultPolicy string, bindings ...*gipb.InterceptorBinding) string {
	m := &gipb.InterceptorManifest{Name: "fake", FailurePolicy: defaultPolicy, Bindings: bindings}
	b, err := protojson.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func bind(id, rpc, policy string, phases ...Phase) *gipb.InterceptorBinding {
	return &gipb.InterceptorBinding{Id: id, Selector: &gipb.InterceptorSelector{Rpc: rpc}, Phases: phases, FailurePolicy: policy}
}

const (
	rpcCreateProvider = "openshell.v1.OpenShell/CreateProvider"
	rpcUpdateConfig   = "openshell.v1.OpenShell/UpdateConfig"
)

func config(name string, f *fake) Config {
	return Config{Name: name, Endpoint: f.endpoint, AllowInsecureTransport: true, Audience: "urn:openshell:extension:interceptor:" + name,
		BindingPolicy: Dynamic, Timeout: 2 * time.Second, MaxResponseBytes: DefaultMaxResponseBytes, MaxPatches: DefaultMaxPatches}
}

// fakeAPI is the handler side: it records what it was dispatched.
type fakeAPI struct {
	openshellv1.UnimplementedOpenShellServer
	mu  sync.Mutex
	got []proto.Message
}

func (a *fakeAPI) keep(m proto.Message) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, proto.Clone(m))
}

func (a *fakeAPI) received() []proto.Message {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]proto.Message(nil), a.got...)
}

func (a *fakeAPI) CreateProvider(ctx context.Context, r *openshellv1.CreateProviderRequest) (*openshellv1.ProviderResponse, error) {
	a.keep(r)
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-handler-header", "h"))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-handler-trailer", "t"))
	return &openshellv1.ProviderResponse{Provider: r.GetProvider()}, nil
}

func (a *fakeAPI) SubmitPolicyAnalysis(_ context.Context, r *openshellv1.SubmitPolicyAnalysisRequest) (*openshellv1.SubmitPolicyAnalysisResponse, error) {
	a.keep(r)
	return &openshellv1.SubmitPolicyAnalysisResponse{}, nil
}

func (a *fakeAPI) UpdateConfig(_ context.Context, r *openshellv1.UpdateConfigRequest) (*openshellv1.UpdateConfigResponse, error) {
	a.keep(r)
	if r.GetName() == "fail" {
		return nil, errdefs.NotFound("sandbox \"fail\"")
	}
	return &openshellv1.UpdateConfigResponse{Version: 7}, nil
}

// serve starts an OpenShell gRPC server whose chain is: a stand-in for the
// gateway's authentication (a user principal), then rt (if not nil).
func serve(t testing.TB, rt *Runtime) (openshellv1.OpenShellClient, *grpc.ClientConn, *fakeAPI) {
	t.Helper()
	api := &fakeAPI{}
	authn := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(auth.NewContext(ctx, &auth.Principal{Kind: auth.KindUser, Subject: "alice", Roles: []string{"openshell-user"}}), req)
		if _, ok := status.FromError(err); !ok {
			err = errdefs.ToGRPC(err) // as the gateway's pipeline does
		}
		return resp, err
	}
	chain := []grpc.UnaryServerInterceptor{authn}
	if rt != nil {
		chain = append(chain, rt.UnaryServerInterceptor())
	}
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	openshellv1.RegisterOpenShellServer(g, api)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return openshellv1.NewOpenShellClient(conn), conn, api
}

func start(t *testing.T, cfgs ...Config) *Runtime {
	t.Helper()
	rt, err := Start(t.Context(), Options{Configs: cfgs, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(rt.Close)
	return rt
}
