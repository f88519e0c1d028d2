package gateway

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openshell-go/openshell/internal/pki"
)

func runCerts(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := RunGenerateCerts(t.Context(), args, &out, &errOut)
	return out.String() + errOut.String(), err
}

func TestRunGenerateCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")

	out, err := runCerts(t, "--output-dir", dir, "--dry-run", "--server-san", "gw.example")
	if err != nil || !strings.Contains(out, "would write") || !strings.Contains(out, "jwt/kid") || !strings.Contains(out, "gw.example") {
		t.Fatalf("dry run = %q, %v; want the planned files", out, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dry run created %s", dir)
	}

	out, err = runCerts(t, "--output-dir", dir, "--server-san", "gw.example,10.0.0.7")
	if err != nil || !strings.Contains(out, "generated PKI") {
		t.Fatalf("first run = %q, %v; want generated", out, err)
	}
	kid, err := os.ReadFile(filepath.Join(dir, "jwt/kid"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, string(kid)) {
		t.Errorf("output %q lacks kid %q", out, kid)
	}

	out, err = runCerts(t, "--output-dir", dir)
	if err != nil || !strings.Contains(out, "skipped") {
		t.Fatalf("second run = %q, %v; want skipped", out, err)
	}

	if err := os.Remove(filepath.Join(dir, pki.ClientKeyFile)); err != nil {
		t.Fatal(err)
	}
	_, err = runCerts(t, "--output-dir", dir)
	if err == nil || !strings.Contains(err.Error(), "missing client/tls.key") {
		t.Fatalf("partial run = %v, want error naming client/tls.key", err)
	}
}

func TestRunGenerateCertsBadArgs(t *testing.T) {
	if _, err := runCerts(t); err == nil || !strings.Contains(err.Error(), "--output-dir is required") {
		t.Errorf("no args = %v, want --output-dir required", err)
	}
	if _, err := runCerts(t, "--output-dir", t.TempDir(), "extra"); err == nil || !strings.Contains(err.Error(), "unexpected argument") {
		t.Errorf("extra arg = %v, want unexpected argument", err)
	}
	if out, err := runCerts(t, "--help"); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out, "--output-dir") {
		t.Errorf("--help = %q, %v; want usage and flag.ErrHelp", out, err)
	}
}
