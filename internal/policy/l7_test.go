package policy

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

func TestL7Violations(t *testing.T) {
	allowGet := []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{Method: "GET", Path: "/repos/**"}}}
	ep := func(e *sandboxv1.NetworkEndpoint) *sandboxv1.SandboxPolicy {
		e.Host, e.Port = "api.example.com", 443
		return netPolicy(e)
	}
	const at = "network policy 'api': endpoint 0 has invalid L7 configuration: "
	truth := true
	tests := []struct {
		name   string
		policy *sandboxv1.SandboxPolicy
		want   []string
	}{
		{"rest with rules", ep(&sandboxv1.NetworkEndpoint{Protocol: "rest", Rules: allowGet, Path: "/v1", Enforcement: "enforce"}), nil},
		{"rest with access", ep(&sandboxv1.NetworkEndpoint{Protocol: "REST", Access: "read-only"}), nil},
		{"mcp allowing all known methods", ep(&sandboxv1.NetworkEndpoint{Protocol: "mcp", Mcp: &sandboxv1.McpOptions{AllowAllKnownMcpMethods: &truth}}), nil},
		{"graphql operations", ep(&sandboxv1.NetworkEndpoint{Protocol: "graphql", Rules: []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{OperationType: "query"}}}}), nil},
		{"unknown protocol", ep(&sandboxv1.NetworkEndpoint{Protocol: "ftp"}),
			[]string{at + "unknown protocol 'ftp' (expected tcp, rest, websocket, graphql, sql, json-rpc, or mcp)"}},
		{"tcp with L7 fields", ep(&sandboxv1.NetworkEndpoint{Protocol: "tcp", Access: "full", Path: "/x", Mcp: &sandboxv1.McpOptions{}}),
			[]string{
				at + "protocol tcp does not support access, rules, or deny_rules; remove those L7 fields",
				at + "protocol tcp does not support L7-only fields: path, mcp; remove those fields",
				at + "mcp options are only valid for protocol mcp",
			}},
		{"rules and access", ep(&sandboxv1.NetworkEndpoint{Protocol: "rest", Access: "full", Rules: allowGet}),
			[]string{at + "rules and access are mutually exclusive"}},
		{"json-rpc", ep(&sandboxv1.NetworkEndpoint{Protocol: "json-rpc", Access: "full"}),
			[]string{at + `protocol json-rpc does not support access presets; use explicit rules with allow.method such as "*"`}},
		{"json-rpc without rules", ep(&sandboxv1.NetworkEndpoint{Protocol: "json-rpc"}),
			[]string{at + "protocol json-rpc requires explicit rules with allow.method"}},
		{"mcp with access", ep(&sandboxv1.NetworkEndpoint{Protocol: "mcp", Access: "full"}),
			[]string{at + "protocol mcp does not support access presets; use rules/deny_rules or set mcp.allow_all_known_mcp_methods: true for an allow-all MCP policy"}},
		{"mcp without rules", ep(&sandboxv1.NetworkEndpoint{Protocol: "mcp"}),
			[]string{at + "protocol mcp requires rules when mcp.allow_all_known_mcp_methods is false"}},
		{"websocket without rules", ep(&sandboxv1.NetworkEndpoint{Protocol: "websocket"}),
			[]string{at + "protocol requires rules or access to define allowed traffic"}},
		{"rules that allow nothing", ep(&sandboxv1.NetworkEndpoint{Protocol: "rest", Rules: []*sandboxv1.L7Rule{{}}}),
			[]string{at + "rules would deny all traffic (no allow clause found). Use `access: full` or add allow clauses to rules."}},
		{"deny rules without protocol", ep(&sandboxv1.NetworkEndpoint{DenyRules: []*sandboxv1.L7DenyRule{{Method: "DELETE"}}}),
			[]string{
				at + "deny_rules require protocol (L7 inspection must be enabled)",
				at + "deny_rules require rules or access to define the base allow set",
			}},
		{"field values", ep(&sandboxv1.NetworkEndpoint{Protocol: "sql", Access: "full", Enforcement: "enforce", Path: "db", PersistedQueries: "maybe"}),
			[]string{
				at + "path must start with '/' or be '**'",
				at + "persisted_queries must be 'deny' or 'allow_registered', got 'maybe'",
				at + "SQL enforcement requires full SQL parsing; use enforcement: audit",
			}},
		{"graphql operation types", ep(&sandboxv1.NetworkEndpoint{
			Protocol:                "graphql",
			Rules:                   []*sandboxv1.L7Rule{{Allow: &sandboxv1.L7Allow{OperationName: "x"}}},
			DenyRules:               []*sandboxv1.L7DenyRule{{OperationType: "read"}},
			GraphqlPersistedQueries: map[string]*sandboxv1.GraphqlOperation{"b": {OperationType: "query"}, "a": {}},
		}), []string{
			at + "rules[0].allow.operation_type must be query, mutation, or subscription",
			at + "deny_rules[0].operation_type must be query, mutation, or subscription",
			at + "graphql_persisted_queries[a].operation_type must be query, mutation, or subscription",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, Violations(tt.policy)); diff != "" {
				t.Errorf("Violations() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
