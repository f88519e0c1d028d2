package profiles_test

import (
	"slices"
	"testing"

	"github.com/openshell-go/openshell/internal/providers/profiles"
)

// TestBuiltin: every profile OpenShell ships and every bare type is in
// the catalog, with the facts callers rely on.
func TestBuiltin(t *testing.T) {
	c := profiles.Builtin()
	want := []string{"anthropic", "aws", "aws-bedrock", "aws-s3", "claude", "claude-code", "codex", "copilot", "cursor",
		"deepinfra", "generic", "github", "gitlab", "google-cloud", "google-vertex-ai", "nvidia", "openai", "opencode", "pypi"}
	if got := c.IDs(); !slices.Equal(got, want) {
		t.Errorf("IDs() = %v, want %v", got, want)
	}
	gh, ok := c.Get("GitHub")
	if !ok {
		t.Fatal(`Get("GitHub") not found`)
	}
	if env := gh.GetCredentials()[0].GetEnvVars(); !slices.Equal(env, []string{"GITHUB_TOKEN", "GH_TOKEN"}) {
		t.Errorf("github credential env vars = %v", env)
	}
	if h := gh.GetEndpoints()[0].GetHost(); h != "api.github.com" {
		t.Errorf("github first endpoint = %q", h)
	}
	// Endpoints carry OpenShell's L7 settings: protocol, access, rules.
	if e := gh.GetEndpoints()[0]; e.GetProtocol() != "rest" || e.GetAccess() != "read-only" || e.GetEnforcement() != "enforce" {
		t.Errorf("api.github.com endpoint = %v, want protocol rest, read-only, enforce", e)
	}
	if e := gh.GetEndpoints()[2]; e.GetHost() != "github.com" || len(e.GetRules()) != 4 || e.GetRules()[3].GetAllow().GetPath() != "/**/git-upload-pack" {
		t.Errorf("github.com endpoint = %v, want its four allow rules", e)
	}
	if c.AllowsEmptyCredentials("github") {
		t.Error("github allows empty credentials; its token is required")
	}
	if !c.AllowsEmptyCredentials("pypi") {
		t.Error("pypi refuses empty credentials; it has none")
	}
	if c.AllowsEmptyCredentials("generic") {
		t.Error("generic allows empty credentials; OpenShell refuses them for types without a profile file")
	}
	if _, ok := c.Get("no-such-type"); ok {
		t.Error("unknown type found")
	}
}
