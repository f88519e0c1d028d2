// Package gatewaytest is the end-to-end harness: it runs the real
// openshell-gateway binary (with the real openshell-sandbox supervisor next
// to it) on loopback with a private state directory, SQLite file and PKI,
// and hands tests an authenticated gRPC connection.
//
// Binaries come from OPENSHELL_TEST_BIN_DIR (set by `make test`), or are
// built once per test binary into a temporary directory.
package gatewaytest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/pki"
	"github.com/openshell-go/openshell/internal/testdirs"
)

var (
	buildOnce sync.Once
	builtDir  string
	buildErr  error
)

// BinDir returns the directory holding openshell-gateway, openshell-sandbox
// and openshell, building them when OPENSHELL_TEST_BIN_DIR is not set.
func BinDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("OPENSHELL_TEST_BIN_DIR"); d != "" {
		for _, b := range []string{"openshell-gateway", "openshell-sandbox", "openshell"} {
			if _, err := os.Stat(filepath.Join(d, b)); err != nil {
				t.Fatalf("OPENSHELL_TEST_BIN_DIR=%s lacks %s (run make build): %v", d, b, err)
			}
		}
		return d
	}
	buildOnce.Do(func() {
		dir, err := processDir(t, "bin-")
		if err != nil {
			buildErr = err
			return
		}
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/openshell-gateway", "./cmd/openshell-sandbox", "./cmd/openshell")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
			return
		}
		builtDir = dir
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtDir
}

// Options tune a gateway.
type Options struct {
	// ExtraArgs are appended to the gateway's command line.
	ExtraArgs []string
	// Env adds environment variables.
	Env []string
	// StateDir reuses a state directory (restart tests); empty = new.
	StateDir string
	// TLSDir reuses a PKI directory; empty = generated under the state dir.
	TLSDir string
	// Port reuses a port (restart tests); 0 = pick a free one.
	Port int
	// BinDir runs the binaries of another build (paired benchmarks);
	// empty = BinDir(t).
	BinDir string
}

// Gateway is a running openshell-gateway process.
type Gateway struct {
	t        testing.TB
	BinDir   string
	StateDir string
	TLSDir   string
	Port     int
	Addr     string
	cmd      *exec.Cmd
	logs     *syncBuffer
	done     chan struct{}
	conn     *grpc.ClientConn
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// baseDir is where harness files live. It is outside /tmp on purpose:
// process-driver sandboxes get a private /tmp, and tests run helper
// binaries from harness directories inside them.
func baseDir(t testing.TB) string {
	t.Helper()
	base := os.Getenv("OPENSHELL_TEST_TMPDIR")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		base = filepath.Join(home, ".cache", "openshell-go-test")
	}
	if err := os.MkdirAll(base, 0o700); err != nil {
		t.Fatal(err)
	}
	return base
}

// processDir makes a directory under baseDir named for this test process
// (prefix, pid, random suffix); the first call for a prefix removes the
// directories of test processes that have exited, since binaries are built
// per test process (about 140 MB each) and a killed test never runs its
// cleanups.
func processDir(t testing.TB, prefix string) (string, error) {
	t.Helper()
	return testdirs.MkdirTemp(baseDir(t), prefix)
}

// TempDir returns a directory under baseDir removed at cleanup.
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := processDir(t, "t-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// builtOnce is a Go main package built on first use into a directory of
// this test process.
type builtOnce struct {
	prefix string // processDir prefix
	pkg    string // package path relative to the module root
	name   string // binary name

	once sync.Once
	path string
	err  error
}

func (b *builtOnce) get(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		dir, err := processDir(t, b.prefix)
		if err != nil {
			b.err = err
			return
		}
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.name), b.pkg)
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
			return
		}
		b.path = filepath.Join(dir, b.name)
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

var sbhelper = builtOnce{prefix: "helper-", pkg: "./internal/gatewaytest/testdata/sbhelper", name: "sbhelper"}

// HelperBinary builds testdata/sbhelper (echo server and friends used
// inside sandboxes) once and returns its path.
func HelperBinary(t testing.TB) string {
	t.Helper()
	return sbhelper.get(t)
}

// helperInWorkspace is where InstallHelper puts the helper binary inside
// a process-driver sandbox (the host's paths are not visible there).
const helperInWorkspace = "/sandbox/.sbhelper"

// HelperCommand is the argv of a sandbox main process that runs the helper
// binary with args once InstallHelper has copied it into the workspace.
func HelperCommand(args ...string) []string {
	return append([]string{"sh", "-c", `until [ -x ` + helperInWorkspace + ` ]; do sleep 0.05; done; exec ` + helperInWorkspace + ` "$@"`, "sbhelper"}, args...)
}

// InstallHelper copies the helper binary into the workspace of the
// process-driver sandbox id and returns its path inside the sandbox.
func (g *Gateway) InstallHelper(t testing.TB, id string) string {
	t.Helper()
	data, err := os.ReadFile(HelperBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(g.StateDir, "sandboxes", id, "workspace")
	tmp := filepath.Join(ws, ".sbhelper.partial")
	if err := os.WriteFile(tmp, data, 0o755); err != nil {
		t.Fatal(err)
	}
	// Renamed into place whole: the waiting sandbox never runs a partial file.
	if err := os.Rename(tmp, filepath.Join(ws, filepath.Base(helperInWorkspace))); err != nil {
		t.Fatal(err)
	}
	return helperInWorkspace
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs a gateway and waits until /readyz answers.
func Start(t testing.TB, o Options) *Gateway {
	t.Helper()
	bin := o.BinDir
	if bin == "" {
		bin = BinDir(t)
	}
	g := &Gateway{t: t, BinDir: bin, StateDir: o.StateDir, TLSDir: o.TLSDir, Port: o.Port, logs: &syncBuffer{}, done: make(chan struct{})}
	if g.StateDir == "" {
		g.StateDir = TempDir(t)
	}
	if g.TLSDir == "" {
		g.TLSDir = filepath.Join(g.StateDir, "tls")
	}
	if g.Port == 0 {
		g.Port = freePort(t)
	}
	g.Addr = "127.0.0.1:" + strconv.Itoa(g.Port)
	if out, err := exec.Command(filepath.Join(bin, "openshell-gateway"), "generate-certs", "--output-dir", g.TLSDir).CombinedOutput(); err != nil {
		t.Fatalf("generate-certs: %v\n%s", err, out)
	}
	args := append([]string{
		"--port", strconv.Itoa(g.Port), "--bind-address", "127.0.0.1",
		"--db-url", "sqlite:" + filepath.Join(g.StateDir, "openshell.db"),
		"--state-dir", g.StateDir, "--log-level", "debug",
	}, o.ExtraArgs...)
	cmd := exec.Command(filepath.Join(bin, "openshell-gateway"), args...)
	cmd.Env = append(os.Environ(), "OPENSHELL_LOCAL_TLS_DIR="+g.TLSDir, "XDG_CONFIG_HOME="+filepath.Join(g.StateDir, "config"))
	cmd.Env = append(cmd.Env, o.Env...)
	cmd.Stdout, cmd.Stderr = g.logs, g.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g.cmd = cmd
	go func() { _ = cmd.Wait(); close(g.done) }() // exit status is not asserted; done signals the exit
	t.Cleanup(func() {
		g.Stop()
		if t.Failed() {
			t.Logf("gateway log:\n%s", g.logs.String())
		}
	})
	g.waitReady()
	return g
}

// Logs returns what the gateway printed so far.
func (g *Gateway) Logs() string { return g.logs.String() }

// Done is closed when the gateway process has exited.
func (g *Gateway) Done() <-chan struct{} { return g.done }

func (g *Gateway) clientTLS() *tls.Config {
	tc, err := pki.ClientTLSConfig(filepath.Join(g.TLSDir, "ca.crt"), filepath.Join(g.TLSDir, "client", "tls.crt"), filepath.Join(g.TLSDir, "client", "tls.key"), "localhost")
	if err != nil {
		g.t.Fatal(err)
	}
	return tc
}

func (g *Gateway) waitReady() {
	g.t.Helper()
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: g.clientTLS()}}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-g.done:
			g.t.Fatalf("gateway exited before becoming ready:\n%s", g.logs.String())
		default:
		}
		resp, err := hc.Get("https://" + g.Addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	g.t.Fatalf("gateway not ready after 30s:\n%s", g.logs.String())
}

// Conn returns an mTLS-authenticated connection (the local client cert).
func (g *Gateway) Conn() *grpc.ClientConn {
	g.t.Helper()
	if g.conn != nil {
		return g.conn
	}
	conn, err := grpc.NewClient(g.Addr, grpc.WithTransportCredentials(credentials.NewTLS(g.clientTLS())))
	if err != nil {
		g.t.Fatal(err)
	}
	g.conn = conn
	g.t.Cleanup(func() { conn.Close() })
	return conn
}

// Client returns an OpenShell client over Conn.
func (g *Gateway) Client() openshellv1.OpenShellClient {
	return openshellv1.NewOpenShellClient(g.Conn())
}

// Stop terminates the gateway gracefully (SIGTERM, then SIGKILL).
func (g *Gateway) Stop() {
	select {
	case <-g.done:
		return
	default:
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(40 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}

// Kill sends SIGKILL to the gateway process only (not its sandboxes).
func (g *Gateway) Kill() {
	_ = g.cmd.Process.Kill()
	<-g.done
}

// WaitPhase polls GetSandbox until the sandbox reaches phase or the
// deadline passes, as OpenShell's Go SDK does.
func WaitPhase(ctx context.Context, t testing.TB, c openshellv1.OpenShellClient, name string, phase openshellv1.SandboxPhase, timeout time.Duration) *openshellv1.Sandbox {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last *openshellv1.Sandbox
	for time.Now().Before(deadline) {
		resp, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: name})
		if err == nil {
			last = resp.GetSandbox()
			if last.GetStatus().GetPhase() == phase {
				return last
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("sandbox %s did not reach %v within %v; last: %v", name, phase, timeout, last.GetStatus())
	return nil
}

// Exec runs a command with ExecSandbox and returns stdout, stderr and the
// exit code.
func Exec(ctx context.Context, t testing.TB, c openshellv1.OpenShellClient, req *openshellv1.ExecSandboxRequest) (string, string, int32, error) {
	t.Helper()
	stream, err := c.ExecSandbox(ctx, req)
	if err != nil {
		return "", "", 0, err
	}
	var stdout, stderr strings.Builder
	exit := int32(-1)
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if exit < 0 {
				return stdout.String(), stderr.String(), exit, errors.New("exec stream ended without an exit event")
			}
			return stdout.String(), stderr.String(), exit, nil
		}
		if err != nil {
			return stdout.String(), stderr.String(), exit, err
		}
		if exit >= 0 {
			t.Fatalf("event after exit: %v", ev)
		}
		switch p := ev.GetPayload().(type) {
		case *openshellv1.ExecSandboxEvent_Stdout:
			stdout.Write(p.Stdout.GetData())
		case *openshellv1.ExecSandboxEvent_Stderr:
			stderr.Write(p.Stderr.GetData())
		case *openshellv1.ExecSandboxEvent_Exit:
			exit = p.Exit.GetExitCode()
		}
	}
}
