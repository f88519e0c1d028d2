package cli

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/citest"
)

// buildOpenshell builds the real openshell binary for tests that need a
// separate process. It skips when the toolchain is unavailable, but fails
// under CI=true.
func buildOpenshell(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "openshell")
	cmd := exec.Command("go", "build", "-o", bin, "../../cmd/openshell")
	if out, err := cmd.CombinedOutput(); err != nil {
		citest.SkipOrFail(t, "cannot build openshell: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestForwardBackgroundListStop(t *testing.T) {
	bin := buildOpenshell(t)
	ff := newForwardFake()
	ep := ff.serve(t)
	tt := newTester(t)
	tt.setup = func(a *app) { a.executable = func() (string, error) { return bin, nil } }
	port := freePort(t)
	spec := strconv.Itoa(port) + ":8080"

	r := tt.run("--gateway-endpoint", ep, "forward", "start", "box", spec, "--background")
	if r.err != nil {
		t.Fatalf("forward start --background: %v (%q)", r.err, r.stderr)
	}
	m := regexp.MustCompile(`\(pid (\d+)\)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no pid in %q", r.stdout)
	}
	pid, _ := strconv.Atoi(m[1])
	t.Cleanup(func() {
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
	})
	stateFile := filepath.Join(tt.env["XDG_STATE_HOME"], "openshell", "forwards", strconv.Itoa(port)+".json")
	if got := mode(t, stateFile); got != 0o600 {
		t.Errorf("state file mode %o, want 600", got)
	}

	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ping through background forward")); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	c.Close()
	if err != nil || string(got) != "ping through background forward" {
		t.Errorf("echo = %q (%v)", got, err)
	}

	r = tt.run("forward", "list")
	if r.err != nil || !strings.Contains(r.stdout, "127.0.0.1:"+strconv.Itoa(port)+"   box       8080     "+m[1]) {
		t.Errorf("forward list = %q (%v)", r.stdout, r.err)
	}
	if r := tt.run("--gateway-endpoint", ep, "forward", "start", "box", spec, "--background"); r.code() != 1 || !strings.Contains(r.err.Error(), "already forwarded") {
		t.Errorf("second background forward on the same port = %v", r.err)
	}

	r = tt.run("forward", "stop", strconv.Itoa(port))
	if r.err != nil || !strings.Contains(r.stdout, "Stopped forward") {
		t.Fatalf("forward stop = %q (%v)", r.stdout, r.err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("forward process %d still alive after stop", pid)
		}
		time.Sleep(20 * time.Millisecond) // polling a process we do not own, with a deadline
	}
	if r := tt.run("forward", "list"); r.stdout != "" || !strings.Contains(r.stderr, "No background forwards") {
		t.Errorf("forward list after stop = %q / %q", r.stdout, r.stderr)
	}
	if r := tt.run("forward", "stop", "box"); r.code() != 1 {
		t.Errorf("stop with nothing running = %v", r.err)
	}
	if r := tt.run("forward", "stop"); r.code() != 2 {
		t.Errorf("stop without arguments = code %d", r.code())
	}
}

func TestParsePortSpec(t *testing.T) {
	for _, tc := range []struct {
		in            string
		local, remote uint16
		ok            bool
	}{
		{"8080", 8080, 8080, true},
		{"9000:8080", 9000, 8080, true},
		{"0:22", 0, 22, true},
		{"x", 0, 0, false},
		{"80:0", 0, 0, false},
		{"70000", 0, 0, false},
	} {
		l, r, err := parsePortSpec(tc.in)
		if (err == nil) != tc.ok || l != tc.local || r != tc.remote {
			t.Errorf("parsePortSpec(%q) = %d, %d, %v; want %d, %d, ok=%v", tc.in, l, r, err, tc.local, tc.remote, tc.ok)
		}
	}
}
