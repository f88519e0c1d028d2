package supervisor

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestCopySelf(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "shared", "bin", "openshell-sandbox")
	var out bytes.Buffer
	if err := Run(t.Context(), []string{"copy-self", dst}, &out, &out); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(self)
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("copied %d bytes (err %v), want %d identical bytes", len(got), err, len(want))
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode = %v, want 0755", fi.Mode().Perm())
	}
	if err := Run(t.Context(), []string{"copy-self"}, &out, &out); err == nil {
		t.Fatal("copy-self without a destination succeeded")
	}
}
