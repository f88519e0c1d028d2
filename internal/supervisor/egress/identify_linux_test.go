package egress

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// needTool returns the path of a real client binary; under CI=true a
// missing one fails the test.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is required: %v", name, err)
		}
		t.Skipf("%s not installed", name)
	}
	p, err = filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func copyFile(t *testing.T, src, dst string, extra []byte) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	// Write a new file and rename it over dst: a replaced binary is a new
	// inode at the same path.
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, append(b, extra...), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// TestBinaryIdentity runs real clients through the proxy: the process
// holding the client socket is found through /proc, and only the allowed
// executable at the allowed path with its first-seen content gets through.
func TestBinaryIdentity(t *testing.T) {
	curl := needTool(t, "curl")
	wget := needTool(t, "wget")
	port := upstream(t)
	dir := t.TempDir()
	allowed := filepath.Join(dir, "allowed", "curl")
	elsewhere := filepath.Join(dir, "elsewhere", "curl")
	copyFile(t, curl, allowed, nil)
	copyFile(t, curl, elsewhere, nil)
	rules := map[string]*sandboxv1.NetworkPolicyRule{"up": {Name: "up",
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: port, AllowedIps: []string{"127.0.0.1"}}},
		Binaries:  []*sandboxv1.NetworkBinary{{Path: allowed}}}}
	id := &ProcIdentifier{Root: "/proc"}
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: id.Identify}, rules)
	target := fmt.Sprintf("http://allowed.test:%d/x", port)

	run := func(bin string, args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "http_proxy=" + tp.url.String(), "no_proxy="}
		out, _ := cmd.CombinedOutput() // the status is in the output
		return strings.TrimSpace(string(out))
	}
	curlStatus := func(bin string) string {
		return run(bin, "-s", "-o", "/dev/null", "-w", "%{http_code}", "-x", tp.url.String(), target)
	}
	wantEvent := func(decision, binary, reason string) {
		t.Helper()
		ev := tp.events.last(t)
		if ev.Decision != decision || ev.Binary != binary || ev.PID <= 1 || !strings.Contains(ev.Reason, reason) {
			t.Errorf("event = %+v, want %s by %s (reason containing %q)", ev, decision, binary, reason)
		}
	}

	if got := curlStatus(allowed); got != "200" {
		t.Fatalf("allowed binary: status %s, want 200", got)
	}
	wantEvent("allow", allowed, "")
	if got := curlStatus(elsewhere); got != "403" {
		t.Errorf("same content at another path: status %s, want 403", got)
	}
	wantEvent("deny", elsewhere, "not allowed in policy 'up'")
	if out := run(wget, "-q", "-O", "-", target); strings.Contains(out, "hello") {
		t.Errorf("wget got through: %q", out)
	}
	wantEvent("deny", wget, "not allowed in policy 'up'")
	// The allowed path now holds different content: trust on first use
	// denies it.
	copyFile(t, curl, allowed, []byte("changed"))
	if got := curlStatus(allowed); got != "403" {
		t.Errorf("replaced binary at the allowed path: status %s, want 403", got)
	}
	wantEvent("deny", allowed, "changed since its first use")
	// A shell parent running the allowed binary: the exe is the curl copy,
	// the ancestor /bin/sh is not trusted for anything.
	copyFile(t, curl, filepath.Join(dir, "allowed2", "curl"), nil)
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	rules["up"].Binaries = []*sandboxv1.NetworkBinary{{Path: sh}}
	tp.proxy.SetSnapshot(mustCompile(t, rules))
	out := run(sh, "-c", fmt.Sprintf("%s -s -o /dev/null -w %%{http_code} -x %s %s; echo", filepath.Join(dir, "allowed2", "curl"), tp.url, target))
	if out != "200" {
		t.Errorf("binary allowed through its ancestor %s: status %q, want 200", sh, out)
	}
	wantEvent("allow", filepath.Join(dir, "allowed2", "curl"), "")
}
