package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// l7Protocols are the inspection protocols an endpoint may name
// (case-insensitive); "tcp" is the explicit spelling of plain L4 handling.
var l7Protocols = []string{"rest", "websocket", "graphql", "sql", "json-rpc", "mcp"}

// l7Problems returns OpenShell's L7 semantic errors of one endpoint: the
// protocol is known, its fields fit the protocol, and its rules allow
// something. Each message is bare; the caller names the endpoint.
func l7Problems(ep *sandboxv1.NetworkEndpoint) []string {
	var out []string
	protocol := ep.GetProtocol()
	lower := strings.ToLower(protocol)
	known := slices.Contains(l7Protocols, lower)
	tcp := lower == "tcp"
	mcp, jsonRPC := lower == "mcp", lower == "json-rpc"
	access := ep.GetAccess()
	hasRules, hasDeny := len(ep.GetRules()) > 0, len(ep.GetDenyRules()) > 0
	allowAllMCP := ep.GetMcp().GetAllowAllKnownMcpMethods()

	if protocol != "" && !known && !tcp {
		out = append(out, fmt.Sprintf("unknown protocol '%s' (expected tcp, rest, websocket, graphql, sql, json-rpc, or mcp)", protocol))
	}
	if tcp && (access != "" || hasRules || hasDeny) {
		out = append(out, "protocol tcp does not support access, rules, or deny_rules; remove those L7 fields")
	}
	if hasRules && access != "" {
		out = append(out, "rules and access are mutually exclusive")
	}
	if (mcp || jsonRPC) && access != "" {
		if mcp {
			out = append(out, fmt.Sprintf("protocol %s does not support access presets; use rules/deny_rules or set mcp.allow_all_known_mcp_methods: true for an allow-all MCP policy", protocol))
		} else {
			out = append(out, fmt.Sprintf("protocol %s does not support access presets; use explicit rules with allow.method such as \"*\"", protocol))
		}
	}
	if jsonRPC && !hasRules && access == "" {
		out = append(out, fmt.Sprintf("protocol %s requires explicit rules with allow.method", protocol))
	}
	if known && !mcp && !jsonRPC && !hasRules && access == "" {
		out = append(out, "protocol requires rules or access to define allowed traffic")
	}
	if mcp && !hasRules && access == "" && !allowAllMCP {
		out = append(out, "protocol mcp requires rules when mcp.allow_all_known_mcp_methods is false")
	}
	if rulesDenyAll(ep.GetRules()) && !(mcp && allowAllMCP) {
		out = append(out, "rules would deny all traffic (no allow clause found). Use `access: full` or add allow clauses to rules.")
	}
	if hasDeny && !known {
		out = append(out, "deny_rules require protocol (L7 inspection must be enabled)")
	}
	if hasDeny && !mcp && !hasRules && access == "" {
		out = append(out, "deny_rules require rules or access to define the base allow set")
	}
	if tcp {
		if f := l7OnlyFields(ep); len(f) > 0 {
			out = append(out, fmt.Sprintf("protocol tcp does not support L7-only fields: %s; remove those fields", strings.Join(f, ", ")))
		}
	}
	return append(out, l7FieldProblems(ep)...)
}

// rulesDenyAll reports whether rules is non-empty and no rule has an
// allow clause that constrains anything.
func rulesDenyAll(rules []*sandboxv1.L7Rule) bool {
	if len(rules) == 0 {
		return false
	}
	for _, r := range rules {
		a := r.GetAllow()
		if a.GetMethod() != "" || a.GetPath() != "" || a.GetCommand() != "" || a.GetOperationType() != "" ||
			a.GetOperationName() != "" || len(a.GetFields()) > 0 || len(a.GetParams()) > 0 {
			return false
		}
	}
	return true
}

// l7OnlyFields names the L7-only endpoint fields set on ep.
func l7OnlyFields(ep *sandboxv1.NetworkEndpoint) []string {
	var f []string
	for _, c := range []struct {
		name string
		set  bool
	}{
		{"enforcement", ep.GetEnforcement() != ""},
		{"path", ep.GetPath() != ""},
		{"allow_encoded_slash", ep.GetAllowEncodedSlash()},
		{"websocket_credential_rewrite", ep.GetWebsocketCredentialRewrite()},
		{"request_body_credential_rewrite", ep.GetRequestBodyCredentialRewrite()},
		{"persisted_queries", ep.GetPersistedQueries() != ""},
		{"graphql_persisted_queries", len(ep.GetGraphqlPersistedQueries()) > 0},
		{"graphql_max_body_bytes", ep.GetGraphqlMaxBodyBytes() > 0},
		{"json_rpc_max_body_bytes", ep.GetJsonRpcMaxBodyBytes() > 0},
		{"mcp", ep.GetMcp() != nil},
	} {
		if c.set {
			f = append(f, c.name)
		}
	}
	return f
}

// l7FieldProblems checks the values of single L7 fields.
func l7FieldProblems(ep *sandboxv1.NetworkEndpoint) []string {
	var out []string
	if p := ep.GetPath(); p != "" && !strings.HasPrefix(p, "/") && p != "**" {
		out = append(out, "path must start with '/' or be '**'")
	}
	if q := ep.GetPersistedQueries(); q != "" && q != "deny" && q != "allow_registered" {
		out = append(out, fmt.Sprintf("persisted_queries must be 'deny' or 'allow_registered', got '%s'", q))
	}
	if ep.GetProtocol() == "sql" && ep.GetEnforcement() == "enforce" {
		out = append(out, "SQL enforcement requires full SQL parsing; use enforcement: audit")
	}
	if ep.GetMcp() != nil && ep.GetProtocol() != "mcp" {
		out = append(out, "mcp options are only valid for protocol mcp")
	}
	if ep.GetProtocol() != "graphql" {
		return out
	}
	for i, r := range ep.GetRules() {
		if !graphqlOperation(r.GetAllow().GetOperationType()) {
			out = append(out, fmt.Sprintf("rules[%d].allow.operation_type must be query, mutation, or subscription", i))
		}
	}
	for i, r := range ep.GetDenyRules() {
		if !graphqlOperation(r.GetOperationType()) {
			out = append(out, fmt.Sprintf("deny_rules[%d].operation_type must be query, mutation, or subscription", i))
		}
	}
	pq := ep.GetGraphqlPersistedQueries()
	for _, k := range slices.Sorted(maps.Keys(pq)) {
		if !graphqlOperation(pq[k].GetOperationType()) {
			out = append(out, fmt.Sprintf("graphql_persisted_queries[%s].operation_type must be query, mutation, or subscription", k))
		}
	}
	return out
}

func graphqlOperation(t string) bool { return t == "query" || t == "mutation" || t == "subscription" }
