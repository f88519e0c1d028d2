package cli

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestInferenceCommandsRealGateway drives the inference commands against
// the real gateway and a loopback OpenAI-compatible fake that the gateway
// verifies with the provider's key; no command prints the key.
func TestInferenceCommandsRealGateway(t *testing.T) {
	const secret = "sk-cli-inference-secret-91"
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+secret {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		fmt.Fprint(w, `{"choices":[]}`)
	}))
	defer fake.Close()
	tt, _ := realGatewayTester(t)
	tt.env["OPENAI_API_KEY"] = secret
	run := func(args ...string) result {
		t.Helper()
		r := tt.run(args...)
		if strings.Contains(r.stdout+r.stderr, secret) || (r.err != nil && strings.Contains(r.err.Error(), secret)) {
			t.Errorf("openshell %s printed the key", strings.Join(args, " "))
		}
		return r
	}
	must := func(args ...string) string {
		t.Helper()
		r := run(args...)
		if r.err != nil {
			t.Fatalf("openshell %s: %v\nstderr: %s", strings.Join(args, " "), r.err, r.stderr)
		}
		return r.stdout
	}
	must("provider", "create", "oa", "--type", "openai", "--credential", "OPENAI_API_KEY", "--config", "OPENAI_BASE_URL="+fake.URL+"/v1")
	must("provider", "create", "gh", "--type", "github", "--credential", "GITHUB_TOKEN=ghp-x")

	if out := must("inference", "get"); out != "Inference:\n\n  Not configured\n\nSystem inference:\n\n  Not configured\n" {
		t.Errorf("get before set = %q", out)
	}
	want := "Inference configured:\n\n  Workspace: default\n  Route: inference.local\n  Provider: oa\n  Model: gpt-cli\n  Version: 1\n  Timeout: 60s (default)\n" +
		"  Validated Endpoints:\n    - " + fake.URL + "/v1/chat/completions (openai_chat_completions)\n"
	if out := must("inference", "set", "--provider", "oa", "--model", "gpt-cli"); out != want {
		t.Errorf("set = %q, want %q", out, want)
	}
	if out := must("inference", "update", "--timeout", "120", "--no-verify"); out != "Inference updated:\n\n  Workspace: default\n  Route: inference.local\n  Provider: oa\n  Model: gpt-cli\n  Version: 2\n  Timeout: 120s\n" {
		t.Errorf("update = %q", out)
	}
	if r := run("inference", "update"); ExitCode(r.err) != 2 || !strings.Contains(r.err.Error(), "at least one of --provider, --model, or --timeout") {
		t.Errorf("update without flags = %v", r.err)
	}
	if r := run("inference", "set", "--provider", "oa"); ExitCode(r.err) != 2 {
		t.Errorf("set without --model = %v", r.err)
	}
	if r := run("inference", "set", "--provider", "gh", "--model", "m", "--no-verify"); r.err == nil || !strings.Contains(r.err.Error(), "provider 'gh' has unsupported type 'github' for cluster inference") {
		t.Errorf("set with a github provider = %v", r.err)
	}
	if r := run("inference", "set", "--provider", "nope", "--model", "m"); r.err == nil || !strings.Contains(r.err.Error(), "provider 'nope' not found in workspace 'default'") {
		t.Errorf("set with a missing provider = %v", r.err)
	}
	must("inference", "set", "--system", "--provider", "oa", "--model", "gpt-sys", "--no-verify")
	out := must("inference", "get")
	if !strings.Contains(out, "Inference:\n\n  Workspace: default\n  Provider: oa\n  Model: gpt-cli\n  Version: 2\n  Timeout: 120s\n") ||
		!strings.Contains(out, "System inference:\n\n  Workspace: default\n  Provider: oa\n  Model: gpt-sys\n  Version: 1\n") {
		t.Errorf("get = %q", out)
	}
	if out := must("inference", "get", "--system", "-o", "json"); !strings.Contains(out, `"model_id": "gpt-sys"`) && !strings.Contains(out, `"modelId": "gpt-sys"`) {
		t.Errorf("get --system -o json = %q", out)
	}
	if out := must("inference", "delete"); out != "Inference route deleted.\n" {
		t.Errorf("delete = %q", out)
	}
	if out := must("inference", "delete"); out != "Inference route not found (already deleted).\n" {
		t.Errorf("second delete = %q", out)
	}
	if r := run("inference", "get", "--system=false", "--workspace", "default"); r.err != nil || !strings.Contains(r.stdout, "Inference:\n\n  Not configured") {
		t.Errorf("get after delete = %q, %v", r.stdout, r.err)
	}
}
