package cli

import (
	"strings"
	"testing"
)

// TestProviderCommandsRealGateway drives the provider commands against the
// real gateway: a credential taken from the CLI's environment is stored, no
// command prints it (table, json, yaml, errors), sandbox create --provider
// and attach/detach work, and delete is refused while attached.
func TestProviderCommandsRealGateway(t *testing.T) {
	tt, _ := realGatewayTester(t)
	const secret = "sk-cli-e2e-secret-value-5f1c"
	tt.env["OPENAI_API_KEY"] = secret
	noSecret := func(what string, r result) {
		t.Helper()
		if strings.Contains(r.stdout, secret) || strings.Contains(r.stderr, secret) || (r.err != nil && strings.Contains(r.err.Error(), secret)) {
			t.Errorf("%s printed the credential value:\nstdout: %s\nstderr: %s\nerr: %v", what, r.stdout, r.stderr, r.err)
		}
	}
	run := func(args ...string) result {
		t.Helper()
		r := tt.run(args...)
		noSecret(strings.Join(args, " "), r)
		return r
	}
	must := func(args ...string) string {
		t.Helper()
		r := run(args...)
		if r.err != nil {
			t.Fatalf("openshell %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.err, r.stdout, r.stderr)
		}
		return r.stdout
	}

	if out := must("provider", "create", "work-openai", "--type", "openai", "--credential", "OPENAI_API_KEY", "--config", "region=eu"); out != "Created provider work-openai\n" {
		t.Errorf("create = %q", out)
	}
	// A value typed without its key is not echoed in the error.
	if r := run("provider", "create", "p2", "--type", "openai", "--credential", "sk-typed-secret-77"); r.err == nil || ExitCode(r.err) != 2 || strings.Contains(r.err.Error(), "sk-typed-secret-77") {
		t.Errorf("bare value as credential: %v", r.err)
	}
	if r := run("provider", "create", "work-openai", "--type", "openai", "--credential", "OPENAI_API_KEY"); r.err == nil || r.err.Error() != `provider "work-openai" already exists in workspace "default"` {
		t.Errorf("create twice: %v", r.err)
	}

	out := must("provider", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME TYPE CREDENTIAL_KEYS CONFIG_KEYS AGE" {
		t.Fatalf("list = %q", out)
	}
	if f := strings.Fields(lines[1]); len(f) < 4 || f[0] != "work-openai" || f[1] != "openai" || f[2] != "OPENAI_API_KEY" || f[3] != "region" {
		t.Errorf("list row = %q", lines[1])
	}
	for _, o := range []string{"json", "yaml"} {
		if out := must("provider", "get", "work-openai", "-o", o); !strings.Contains(out, "REDACTED") || !strings.Contains(out, "OPENAI_API_KEY") {
			t.Errorf("get -o %s = %s, want the key with REDACTED", o, out)
		}
		must("provider", "list", "-o", o)
	}
	if out := squash(must("provider", "get", "work-openai")); !strings.Contains(out, "Credential keys: OPENAI_API_KEY\n") || !strings.Contains(out, "Config: region=eu\n") {
		t.Errorf("get = %s", out)
	}
	if out := must("provider", "list-profiles"); !strings.Contains(out, "github") || !strings.Contains(out, "openai") {
		t.Errorf("list-profiles = %s", out)
	}

	tt.env["OPENAI_API_KEY"] = secret + "-rotated"
	if out := must("provider", "update", "work-openai", "--credential", "OPENAI_API_KEY", "--config", "region="); out != "Updated provider work-openai\n" {
		t.Errorf("update = %q", out)
	}
	if out := squash(must("provider", "get", "work-openai")); !strings.Contains(out, "Config: -\n") {
		t.Errorf("config key not removed: %s", out)
	}

	// --from-existing: the profile's environment variables (github:
	// GITHUB_TOKEN, GH_TOKEN) found in the CLI's environment.
	if r := run("provider", "create", "gh", "--type", "github", "--from-existing"); r.code() != 2 || !strings.Contains(r.err.Error(), "none of the environment variables of provider type github is set (GITHUB_TOKEN, GH_TOKEN)") {
		t.Errorf("from-existing with nothing set: %v", r.err)
	}
	tt.env["GH_TOKEN"] = secret + "-gh"
	must("provider", "create", "gh", "--type", "github", "--from-existing")
	if out := squash(must("provider", "get", "gh")); !strings.Contains(out, "Credential keys: GH_TOKEN\n") {
		t.Errorf("from-existing get = %s", out)
	}
	tt.env["GITHUB_TOKEN"] = secret + "-github"
	must("provider", "update", "gh", "--from-existing")
	if out := squash(must("provider", "get", "gh")); !strings.Contains(out, "Credential keys: GH_TOKEN,GITHUB_TOKEN\n") {
		t.Errorf("update --from-existing get = %s", out)
	}
	must("provider", "delete", "gh")

	// Completion of provider names.
	r := run("__complete", "provider", "get", "wo")
	if got, _, _ := strings.Cut(r.stdout, "Completion ended"); got != "work-openai\n:4\n" {
		t.Errorf("complete = %q", r.stdout)
	}

	// sandbox create --provider, then attach/detach.
	must("sandbox", "create", "--name", "sb1", "--provider", "work-openai", "--detach", "--", "sleep", "600")
	t.Cleanup(func() { tt.run("sandbox", "delete", "sb1") })
	if out := must("sandbox", "provider", "list", "sb1"); !strings.Contains(out, "work-openai") {
		t.Errorf("sandbox provider list = %q", out)
	}
	if r := run("provider", "delete", "work-openai"); r.err == nil || !strings.Contains(r.err.Error(), "attached to sandbox(es): sb1") {
		t.Errorf("delete while attached: %v", r.err)
	}
	if out := must("sandbox", "provider", "detach", "sb1", "work-openai"); out != "Detached provider work-openai from sandbox sb1\n" {
		t.Errorf("detach = %q", out)
	}
	if out := must("sandbox", "provider", "detach", "sb1", "work-openai"); out != "Provider work-openai is not attached to sandbox sb1\n" {
		t.Errorf("detach again = %q", out)
	}
	if out := must("sandbox", "provider", "attach", "sb1", "work-openai"); out != "Attached provider work-openai to sandbox sb1\n" {
		t.Errorf("attach = %q", out)
	}
	if r := run("sandbox", "provider", "attach", "sb1", "nope"); r.err == nil || !strings.Contains(r.err.Error(), "provider 'nope' not found") {
		t.Errorf("attach unknown: %v", r.err)
	}
	must("sandbox", "provider", "detach", "sb1", "work-openai")
	if r := run("sandbox", "provider", "list", "sb1"); r.err != nil || r.stdout != "" || !strings.Contains(r.stderr, "No providers attached") {
		t.Errorf("list after detach = %q %q %v", r.stdout, r.stderr, r.err)
	}

	if out := must("provider", "delete", "work-openai"); out != "Deleted provider work-openai\n" {
		t.Errorf("delete = %q", out)
	}
	if r := run("provider", "delete", "work-openai"); r.err == nil || r.err.Error() != `provider "work-openai" not found in workspace "default"` {
		t.Errorf("delete twice: %v", r.err)
	}
	if r := run("provider", "list"); r.err != nil || r.stdout != "" {
		t.Errorf("list after delete = %q %v", r.stdout, r.err)
	}
}

// squash collapses the padding of each line of a two-column table.
func squash(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}
