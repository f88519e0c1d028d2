package gatewaytest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// TestDockerFileTransfer moves a 32 MiB file and a small tree into a
// Docker-driver sandbox and back with the CLI (SFTP over the relay, the
// SFTP server confined as the agent inside the container), comparing
// SHA-256, modes and mtimes on both ends, checks the container sees the
// same bytes owned by the agent (uid 1000), and that an escape is refused.
func TestDockerFileTransfer(t *testing.T) {
	g, _, img := dockerGateway(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	sb := createDocker(ctx, t, c, "dfiles", img)
	WaitPhase(ctx, t, c, "dfiles", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 90*time.Second)
	cl := newCLI(t, g)
	local := TempDir(t)
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

	big := filepath.Join(local, "big.bin")
	data := make([]byte, 32<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, data, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(big, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	tree := filepath.Join(local, "tree")
	for i := range 50 {
		p := filepath.Join(tree, fmt.Sprintf("d%d", i%5), fmt.Sprintf("f%02d.txt", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(strings.Repeat(fmt.Sprint(i), i+1)), os.FileMode(0o600|(i%2)*0o044)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"d0", "d1", "d2", "d3", "d4"} {
		_ = os.Chtimes(filepath.Join(tree, d), mtime, mtime)
	}

	run := func(script string) string {
		t.Helper()
		out, stderr, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"sh", "-c", script}})
		if err != nil || code != 0 {
			t.Fatalf("exec %q = %q %q exit %d, %v", script, out, stderr, code, err)
		}
		return out
	}
	t.Run("file", func(t *testing.T) {
		if _, stderr, code := cl.run("", "sandbox", "upload", "dfiles", big); code != 0 {
			t.Fatalf("upload = exit %d %q", code, stderr)
		}
		got := run("sha256sum /sandbox/big.bin; stat -c '%u %a %Y' /sandbox/big.bin")
		want := fmt.Sprintf("%s  /sandbox/big.bin\n1000 640 %d\n", hex.EncodeToString(sum[:]), mtime.Unix())
		if got != want {
			t.Errorf("in the container: %q, want %q", got, want)
		}
		back := TempDir(t)
		cl.ok("sandbox", "download", "dfiles", "big.bin", back)
		diffTrees(t, "downloaded file", treeSums(t, big), treeSums(t, filepath.Join(back, "big.bin")))
	})
	t.Run("tree", func(t *testing.T) {
		cl.ok("sandbox", "upload", "dfiles", tree, "in")
		if got := strings.TrimSpace(run("find /sandbox/in -type f | wc -l; find /sandbox/in ! -user 1000 | wc -l")); got != "50\n0" {
			t.Errorf("uploaded tree in the container: files, not agent-owned = %q, want 50 and 0", got)
		}
		back := TempDir(t)
		cl.ok("sandbox", "download", "dfiles", "in", filepath.Join(back, "out"))
		diffTrees(t, "tree through the container", treeSums(t, tree), treeSums(t, filepath.Join(back, "out")))
	})
	t.Run("escape refused", func(t *testing.T) {
		run("ln -s /etc /sandbox/escape")
		_, stderr, code := cl.run("", "sandbox", "download", "dfiles", "escape/passwd", local)
		if code == 0 || !strings.Contains(stderr, "outside the sandbox workspace") {
			t.Errorf("download through a symlink out = exit %d %q, want refused", code, stderr)
		}
	})
}
