package gatewaytest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// TestProviderPlaceholderInSandbox: a provider created through the real
// gateway is named by a sandbox create; inside the sandbox, the main
// process and an exec see the credential key with a placeholder, never
// the value; the gateway's database files do not hold the value and its
// key-encryption key file is 0600.
func TestProviderPlaceholderInSandbox(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const secret = "ghp_e2e-secret-value-4711"
	_, err := c.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Type: "github",
		Credentials: map[string]string{"GITHUB_TOKEN": secret},
	}})
	if err != nil {
		t.Fatalf("CreateProvider: %v", err)
	}
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "prov", Spec: &openshellv1.SandboxSpec{
		Providers: []string{"gh"},
		Command:   []string{"sh", "-c", "env > /sandbox/main.env; sleep infinity"},
	}}); err != nil {
		t.Fatalf("CreateSandbox naming provider gh: %v", err)
	}
	sb := WaitPhase(ctx, t, c, "prov", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	id := sb.GetMetadata().GetId()

	const want = "GITHUB_TOKEN=openshell:resolve:env:GITHUB_TOKEN"
	out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"env"}})
	if err != nil || code != 0 {
		t.Fatalf("exec env = %d, %v (stderr %q)", code, err, errOut)
	}
	if !strings.Contains(out, want+"\n") {
		t.Errorf("exec env lacks %q:\n%s", want, out)
	}
	if strings.Contains(out, secret) {
		t.Error("exec env shows the credential value")
	}
	var mainEnv string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		mainEnv, _, code, err = Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"cat", "/sandbox/main.env"}})
		if err == nil && code == 0 && mainEnv != "" {
			break
		}
	}
	if !strings.Contains(mainEnv, want+"\n") || strings.Contains(mainEnv, secret) {
		t.Errorf("main process environment lacks %q or shows the value:\n%s", want, mainEnv)
	}

	files, _ := filepath.Glob(filepath.Join(g.StateDir, "openshell.db*"))
	if len(files) == 0 {
		t.Fatal("no database files under the state directory")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("%s holds the credential value in plaintext", filepath.Base(f))
		}
	}
	fi, err := os.Stat(filepath.Join(g.StateDir, "credentials.kek"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("credentials.kek mode = %04o, want 0600", fi.Mode().Perm())
	}
}
