package policyfile

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// TestRoundTrip parses policies written in the shapes OpenShell's policy
// schema documents, writes them back and parses the result: the policy
// must survive unchanged, and writing it again must give the same bytes.
func TestRoundTrip(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("testdata: %v %v", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			p1, err := Parse(data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			out1, err := Marshal(p1)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			p2, err := Parse(out1)
			if err != nil {
				t.Fatalf("Parse(Marshal): %v\n%s", err, out1)
			}
			if diff := cmp.Diff(p1, p2, protocmp.Transform()); diff != "" {
				t.Errorf("policy changed by a round trip (-first +second):\n%s\nwritten:\n%s", diff, out1)
			}
			out2, err := Marshal(p2)
			if err != nil {
				t.Fatal(err)
			}
			if string(out1) != string(out2) {
				t.Errorf("Marshal is not stable:\n%s\n---\n%s", out1, out2)
			}
			// The JSON form uses the same field names and parses as YAML.
			js, err := json.Marshal(Document(p1))
			if err != nil {
				t.Fatal(err)
			}
			p3, err := Parse(js)
			if err != nil {
				t.Fatalf("Parse(json): %v\n%s", err, js)
			}
			if diff := cmp.Diff(p1, p3, protocmp.Transform()); diff != "" {
				t.Errorf("JSON form differs (-yaml +json):\n%s", diff)
			}
		})
	}
}

func boolp(b bool) *bool { return &b }

// TestParseMapping pins the places where the file's shape differs from the
// protobuf policy.
func TestParseMapping(t *testing.T) {
	cfg, _ := structpb.NewStruct(map[string]any{"mode": "redact", "limit": 3})
	for _, tc := range []struct {
		name string
		in   string
		want *sandboxv1.SandboxPolicy
	}{
		{
			name: "filesystem_policy, landlock and process",
			in: `version: 1
filesystem_policy: {include_workdir: true, read_only: [/usr], read_write: [/tmp]}
landlock: {compatibility: hard_requirement}
process: {run_as_user: "1500"}`,
			want: &sandboxv1.SandboxPolicy{
				Version:    1,
				Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true, ReadOnly: []string{"/usr"}, ReadWrite: []string{"/tmp"}},
				Landlock:   &sandboxv1.LandlockPolicy{Compatibility: "hard_requirement"},
				Process:    &sandboxv1.ProcessPolicy{RunAsUser: "1500"},
			},
		},
		{
			name: "name defaults to the key, port becomes ports, ports wins",
			in: `version: 1
network_policies:
  pypi:
    endpoints:
      - {host: pypi.org, port: 443}
      - {host: files.pythonhosted.org, port: 80, ports: [443, 8443]}
    binaries: [{path: /usr/bin/pip}]`,
			want: &sandboxv1.SandboxPolicy{Version: 1, NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"pypi": {
				Name: "pypi",
				Endpoints: []*sandboxv1.NetworkEndpoint{
					{Host: "pypi.org", Port: 443, Ports: []uint32{443}},
					{Host: "files.pythonhosted.org", Port: 443, Ports: []uint32{443, 8443}},
				},
				Binaries: []*sandboxv1.NetworkBinary{{Path: "/usr/bin/pip"}},
			}}},
		},
		{
			name: "query matchers, MCP tool and nested params, mcp stanza",
			in: `version: 1
network_policies:
  m:
    name: mcp-server
    endpoints:
      - host: mcp.example.com
        port: 443
        protocol: mcp
        mcp: {max_body_bytes: 1024, allow_all_known_mcp_methods: true}
        json_rpc: {max_body_bytes: 9}
        rules:
          - allow: {method: tools/call, tool: {any: [a, b]}, params: {arguments: {owner: acme}}}
          - allow: {method: GET, path: /x, query: {q: "v*", r: {any: ["1", "2"]}}}
        deny_rules:
          - {tool: rm}`,
			want: &sandboxv1.SandboxPolicy{Version: 1, NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"m": {
				Name: "mcp-server",
				Endpoints: []*sandboxv1.NetworkEndpoint{{
					Host: "mcp.example.com", Port: 443, Ports: []uint32{443}, Protocol: "mcp",
					JsonRpcMaxBodyBytes: 1024, Mcp: &sandboxv1.McpOptions{AllowAllKnownMcpMethods: boolp(true)},
					Rules: []*sandboxv1.L7Rule{
						{Allow: &sandboxv1.L7Allow{Method: "tools/call", Params: map[string]*sandboxv1.L7QueryMatcher{
							"name": {Any: []string{"a", "b"}}, "arguments.owner": {Glob: "acme"}}}},
						{Allow: &sandboxv1.L7Allow{Method: "GET", Path: "/x", Query: map[string]*sandboxv1.L7QueryMatcher{
							"q": {Glob: "v*"}, "r": {Any: []string{"1", "2"}}}}},
					},
					DenyRules: []*sandboxv1.L7DenyRule{{Params: map[string]*sandboxv1.L7QueryMatcher{"name": {Glob: "rm"}}}},
				}},
			}}},
		},
		{
			name: "middleware name defaults to the key",
			in: `version: 1
network_middlewares:
  redact:
    middleware: openshell/regex
    order: 10
    config: {mode: redact, limit: 3}
    endpoints: {include: ["*.example.com"]}`,
			want: &sandboxv1.SandboxPolicy{Version: 1, NetworkMiddlewares: map[string]*sandboxv1.NetworkMiddlewareConfig{"redact": {
				Name: "redact", Middleware: "openshell/regex", Order: 10, Config: cfg,
				Endpoints: &sandboxv1.MiddlewareEndpointSelector{Include: []string{"*.example.com"}},
			}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Parse mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseErrors: a file that is not a valid policy document is refused
// with an error naming the line and the field.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"empty", "", []string{"the policy file is empty"}},
		{"comments only", "# nothing\n", []string{"the policy file is empty"}},
		{"missing version", "filesystem_policy: {read_only: [/usr]}\n", []string{`missing field "version"`}},
		{"proto name instead of the file's", "version: 1\nfilesystem:\n  read_only: [/usr]\n",
			[]string{`line 2: unknown field "filesystem" in the policy (top level)`}},
		{"unknown endpoint field", "version: 1\nnetwork_policies:\n  a:\n    endpoints:\n      - host: x.com\n        prot: 443\n",
			[]string{`line 6: unknown field "prot" in an endpoint`}},
		{"port out of range", "version: 1\nnetwork_policies:\n  a:\n    endpoints:\n      - {host: x.com, port: 70000}\n",
			[]string{"line 5:", "a port number (1-65535)"}},
		{"bool expected", "version: 1\nfilesystem_policy:\n  include_workdir: maybe\n", []string{"line 3:", "true or false"}},
		{"rule without allow", "version: 1\nnetwork_policies:\n  a:\n    endpoints:\n      - host: x.com\n        rules:\n          - method: GET\n",
			[]string{`line 7: unknown field "method" in a rules entry (want allow:)`}},
		{"empty rules entry", "version: 1\nnetwork_policies:\n  a:\n    endpoints:\n      - host: x.com\n        rules:\n          - {}\n",
			[]string{`network_policies.a.endpoints[0].rules[0]: missing field "allow"`}},
		{"bad matcher", "version: 1\nnetwork_policies:\n  a:\n    endpoints:\n      - host: x.com\n        rules:\n          - allow: {query: {q: {all: [x]}}}\n",
			[]string{`line 7: unknown field "all" in a matcher`}},
		{"binary without path", "version: 1\nnetwork_policies:\n  a:\n    binaries:\n      - {}\n",
			[]string{`network_policies.a.binaries[0]: missing field "path"`}},
		{"duplicate key", "version: 1\nversion: 1\n", []string{`"version" already defined`}},
		{"two documents", "version: 1\n---\nversion: 1\n", []string{"more than one YAML document"}},
		{"not a map", "- version\n", []string{"line 1:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(tc.in))
			if err == nil {
				t.Fatalf("Parse = %v, want an error", p)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Parse error = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

// TestMarshalForm pins the written form of the fields that differ from the
// proto: a single port as port, the MCP tool, the mcp and json_rpc stanzas.
func TestMarshalForm(t *testing.T) {
	p := &sandboxv1.SandboxPolicy{Version: 1, NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
		"m": {Name: "m", Endpoints: []*sandboxv1.NetworkEndpoint{
			{Host: "a.com", Port: 443, Ports: []uint32{443}, Protocol: "mcp", JsonRpcMaxBodyBytes: 10,
				Mcp: &sandboxv1.McpOptions{AllowAllKnownMcpMethods: boolp(true)},
				Rules: []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "tools/call",
					Params: map[string]*sandboxv1.L7QueryMatcher{"name": {Glob: "s"}}}}},
				AdvisorProposed: true, ProviderCredentialed: true},
			{Host: "b.com", Ports: []uint32{80, 443}, Protocol: "json-rpc", JsonRpcMaxBodyBytes: 20},
		}},
	}}
	out, err := Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	want := `version: 1
network_policies:
  m:
    name: m
    endpoints:
      - host: a.com
        port: 443
        protocol: mcp
        rules:
          - allow:
              tool: s
        mcp:
          max_body_bytes: 10
          allow_all_known_mcp_methods: true
      - host: b.com
        ports:
          - 80
          - 443
        protocol: json-rpc
        json_rpc:
          max_body_bytes: 20
`
	if diff := cmp.Diff(want, string(out)); diff != "" {
		t.Errorf("Marshal mismatch (-want +got):\n%s", diff)
	}
	// Gateway-owned flags are not part of the file.
	back, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	ep := back.GetNetworkPolicies()["m"].GetEndpoints()[0]
	if ep.GetAdvisorProposed() || ep.GetProviderCredentialed() {
		t.Errorf("gateway-owned flags survived a round trip: %v", ep)
	}
	// Under the MCP method profile the tool implies tools/call, so the
	// method is not written (as OpenShell writes it).
	if r := ep.GetRules()[0].GetAllow(); r.GetMethod() != "" || r.GetParams()["name"].GetGlob() != "s" {
		t.Errorf("MCP tool rule after a round trip = %v, want params.name s and no method", r)
	}
}

// TestParseRule: one network_policies entry, as 'rule edit' reads it.
func TestParseRule(t *testing.T) {
	in := "endpoints:\n  - {host: pypi.org, port: 443}\nbinaries:\n  - path: /usr/bin/pip\n"
	r, err := ParseRule([]byte(in), "allow_pypi_org_443")
	if err != nil {
		t.Fatal(err)
	}
	want := &sandboxv1.NetworkPolicyRule{Name: "allow_pypi_org_443",
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443, Ports: []uint32{443}}},
		Binaries:  []*sandboxv1.NetworkBinary{{Path: "/usr/bin/pip"}}}
	if diff := cmp.Diff(want, r, protocmp.Transform()); diff != "" {
		t.Errorf("ParseRule mismatch (-want +got):\n%s", diff)
	}
	out, err := MarshalRule(r)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseRule(out, "other")
	if err != nil || !cmp.Equal(r, back, protocmp.Transform()) {
		t.Errorf("ParseRule(MarshalRule) = %v, %v\n%s", back, err, out)
	}
	if _, err := ParseRule([]byte("endpoint:\n  - host: x\n"), "k"); err == nil || err.Error() != `line 1: unknown field "endpoint" in a network_policies entry` {
		t.Errorf("ParseRule(unknown field) = %v", err)
	}
}
