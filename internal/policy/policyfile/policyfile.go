package policyfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// The file's shape. Field order is the order Marshal writes, OpenShell's.
type fileDoc struct {
	Version            *uint32                   `yaml:"version" json:"version"`
	FilesystemPolicy   *filesystemDoc            `yaml:"filesystem_policy,omitempty" json:"filesystem_policy,omitempty"`
	Landlock           *landlockDoc              `yaml:"landlock,omitempty" json:"landlock,omitempty"`
	Process            *processDoc               `yaml:"process,omitempty" json:"process,omitempty"`
	NetworkPolicies    map[string]*ruleDoc       `yaml:"network_policies,omitempty" json:"network_policies,omitempty"`
	NetworkMiddlewares map[string]*middlewareDoc `yaml:"network_middlewares,omitempty" json:"network_middlewares,omitempty"`
}

type filesystemDoc struct {
	IncludeWorkdir bool     `yaml:"include_workdir" json:"include_workdir"`
	ReadOnly       []string `yaml:"read_only,omitempty" json:"read_only,omitempty"`
	ReadWrite      []string `yaml:"read_write,omitempty" json:"read_write,omitempty"`
}

type landlockDoc struct {
	Compatibility string `yaml:"compatibility,omitempty" json:"compatibility,omitempty"`
}

type processDoc struct {
	RunAsUser  string `yaml:"run_as_user,omitempty" json:"run_as_user,omitempty"`
	RunAsGroup string `yaml:"run_as_group,omitempty" json:"run_as_group,omitempty"`
}

type ruleDoc struct {
	Name      string         `yaml:"name,omitempty" json:"name,omitempty"`
	Endpoints []*endpointDoc `yaml:"endpoints,omitempty" json:"endpoints,omitempty"`
	Binaries  []*binaryDoc   `yaml:"binaries,omitempty" json:"binaries,omitempty"`
}

type endpointDoc struct {
	Host                         string                   `yaml:"host,omitempty" json:"host,omitempty"`
	Path                         string                   `yaml:"path,omitempty" json:"path,omitempty"`
	Port                         uint16                   `yaml:"port,omitempty" json:"port,omitempty"`
	Ports                        []uint16                 `yaml:"ports,omitempty" json:"ports,omitempty"`
	Protocol                     string                   `yaml:"protocol,omitempty" json:"protocol,omitempty"`
	TLS                          string                   `yaml:"tls,omitempty" json:"tls,omitempty"`
	Enforcement                  string                   `yaml:"enforcement,omitempty" json:"enforcement,omitempty"`
	Access                       string                   `yaml:"access,omitempty" json:"access,omitempty"`
	Rules                        []*l7RuleDoc             `yaml:"rules,omitempty" json:"rules,omitempty"`
	AllowedIPs                   []string                 `yaml:"allowed_ips,omitempty" json:"allowed_ips,omitempty"`
	DenyRules                    []*l7Doc                 `yaml:"deny_rules,omitempty" json:"deny_rules,omitempty"`
	AllowEncodedSlash            bool                     `yaml:"allow_encoded_slash,omitempty" json:"allow_encoded_slash,omitempty"`
	WebsocketCredentialRewrite   bool                     `yaml:"websocket_credential_rewrite,omitempty" json:"websocket_credential_rewrite,omitempty"`
	RequestBodyCredentialRewrite bool                     `yaml:"request_body_credential_rewrite,omitempty" json:"request_body_credential_rewrite,omitempty"`
	AllowUninspectedCredentials  bool                     `yaml:"allow_uninspected_credentials,omitempty" json:"allow_uninspected_credentials,omitempty"`
	PersistedQueries             string                   `yaml:"persisted_queries,omitempty" json:"persisted_queries,omitempty"`
	GraphqlPersistedQueries      map[string]*graphqlOpDoc `yaml:"graphql_persisted_queries,omitempty" json:"graphql_persisted_queries,omitempty"`
	GraphqlMaxBodyBytes          uint32                   `yaml:"graphql_max_body_bytes,omitempty" json:"graphql_max_body_bytes,omitempty"`
	CredentialSigning            string                   `yaml:"credential_signing,omitempty" json:"credential_signing,omitempty"`
	SigningService               string                   `yaml:"signing_service,omitempty" json:"signing_service,omitempty"`
	SigningRegion                string                   `yaml:"signing_region,omitempty" json:"signing_region,omitempty"`
	CredentialBinding            *credentialBindingDoc    `yaml:"credential_binding,omitempty" json:"credential_binding,omitempty"`
	JSONRPC                      *jsonRPCDoc              `yaml:"json_rpc,omitempty" json:"json_rpc,omitempty"`
	MCP                          *mcpDoc                  `yaml:"mcp,omitempty" json:"mcp,omitempty"`
}

type credentialBindingDoc struct {
	Provider string `yaml:"provider" json:"provider"`
}

type jsonRPCDoc struct {
	MaxBodyBytes uint32 `yaml:"max_body_bytes,omitempty" json:"max_body_bytes,omitempty"`
}

type mcpDoc struct {
	MaxBodyBytes            uint32 `yaml:"max_body_bytes,omitempty" json:"max_body_bytes,omitempty"`
	StrictToolNames         *bool  `yaml:"strict_tool_names,omitempty" json:"strict_tool_names,omitempty"`
	AllowAllKnownMCPMethods *bool  `yaml:"allow_all_known_mcp_methods,omitempty" json:"allow_all_known_mcp_methods,omitempty"`
}

type graphqlOpDoc struct {
	OperationType string   `yaml:"operation_type,omitempty" json:"operation_type,omitempty"`
	OperationName string   `yaml:"operation_name,omitempty" json:"operation_name,omitempty"`
	Fields        []string `yaml:"fields,omitempty" json:"fields,omitempty"`
}

type l7RuleDoc struct {
	Allow *l7Doc `yaml:"allow" json:"allow"`
}

// l7Doc is an allow rule (under allow:) or a deny rule (directly in
// deny_rules): the two have the same fields.
type l7Doc struct {
	Method        string             `yaml:"method,omitempty" json:"method,omitempty"`
	Path          string             `yaml:"path,omitempty" json:"path,omitempty"`
	Command       string             `yaml:"command,omitempty" json:"command,omitempty"`
	Query         map[string]matcher `yaml:"query,omitempty" json:"query,omitempty"`
	OperationType string             `yaml:"operation_type,omitempty" json:"operation_type,omitempty"`
	OperationName string             `yaml:"operation_name,omitempty" json:"operation_name,omitempty"`
	Fields        []string           `yaml:"fields,omitempty" json:"fields,omitempty"`
	Tool          *matcher           `yaml:"tool,omitempty" json:"tool,omitempty"`
	Params        params             `yaml:"params,omitempty" json:"params,omitzero"`
}

type binaryDoc struct {
	Path string `yaml:"path" json:"path"`
	// Harness is deprecated in OpenShell: accepted, ignored, never written.
	Harness bool `yaml:"harness,omitempty" json:"-"`
}

type middlewareDoc struct {
	Name       string         `yaml:"name,omitempty" json:"name,omitempty"`
	Middleware string         `yaml:"middleware" json:"middleware"`
	Order      int32          `yaml:"order,omitempty" json:"order,omitempty"`
	Config     map[string]any `yaml:"config,omitempty" json:"config,omitempty"`
	OnError    string         `yaml:"on_error,omitempty" json:"on_error,omitempty"`
	Endpoints  *selectorDoc   `yaml:"endpoints,omitempty" json:"endpoints,omitempty"`
}

type selectorDoc struct {
	Include []string `yaml:"include,omitempty" json:"include,omitempty"`
	Exclude []string `yaml:"exclude,omitempty" json:"exclude,omitempty"`
}

// matcher is a query or params matcher: a glob string, or {any: [globs]}.
type matcher struct {
	Glob string
	Any  []string
}

func (m *matcher) UnmarshalYAML(n *yaml.Node) error {
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str":
		*m = matcher{Glob: n.Value}
		return nil
	case n.Kind == yaml.MappingNode:
		any, err := anyMatcher(n)
		if err != nil {
			return err
		}
		*m = matcher{Any: any}
		return nil
	}
	return typeErrorf(n, "a matcher must be a glob string or {any: [globs]}")
}

// anyMatcher decodes {any: [globs]}.
func anyMatcher(n *yaml.Node) ([]string, error) {
	var out []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Value != "any" {
			return nil, typeErrorf(k, "unknown field %q in a matcher (want a glob string or {any: [globs]})", k.Value)
		}
		if v.Kind != yaml.SequenceNode {
			return nil, typeErrorf(v, "a matcher's any must be a list of globs")
		}
		for _, g := range v.Content {
			if g.Kind != yaml.ScalarNode || g.ShortTag() != "!!str" {
				return nil, typeErrorf(g, "a matcher's any must be a list of glob strings")
			}
			out = append(out, g.Value)
		}
	}
	return out, nil
}

// isAnyMatcher reports whether the mapping n is {any: [...]}.
func isAnyMatcher(n *yaml.Node) bool {
	return n.Kind == yaml.MappingNode && len(n.Content) == 2 && n.Content[0].Value == "any" && n.Content[1].Kind == yaml.SequenceNode
}

func (m matcher) value() any {
	if len(m.Any) == 0 {
		return m.Glob
	}
	return map[string][]string{"any": m.Any}
}

func (m matcher) MarshalYAML() (any, error)    { return m.value(), nil }
func (m matcher) MarshalJSON() ([]byte, error) { return json.Marshal(m.value()) }

// params are the params matchers of a rule. Read, nested maps are
// flattened to dotted keys (flat); written, out is what Marshal emits
// (nested for MCP, flat otherwise).
type params struct {
	flat map[string]matcher
	out  map[string]any
}

func (p params) IsZero() bool { return len(p.flat) == 0 && len(p.out) == 0 }

func (p *params) UnmarshalYAML(n *yaml.Node) error {
	p.flat = map[string]matcher{}
	return flattenParams(n, "", p.flat)
}

func flattenParams(n *yaml.Node, prefix string, out map[string]matcher) error {
	if n.Kind != yaml.MappingNode {
		return typeErrorf(n, "params must be a map of matchers")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := prefix + k.Value
		switch {
		case v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str":
			out[key] = matcher{Glob: v.Value}
		case isAnyMatcher(v):
			any, err := anyMatcher(v)
			if err != nil {
				return err
			}
			out[key] = matcher{Any: any}
		case v.Kind == yaml.MappingNode:
			if err := flattenParams(v, key+".", out); err != nil {
				return err
			}
		default:
			return typeErrorf(v, "params %q must be a glob string, {any: [globs]} or a map", key)
		}
	}
	return nil
}

func (p params) MarshalYAML() (any, error)    { return p.out, nil }
func (p params) MarshalJSON() ([]byte, error) { return json.Marshal(p.out) }

func typeErrorf(n *yaml.Node, format string, args ...any) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %s", n.Line, fmt.Sprintf(format, args...))}}
}

// Parse reads a policy file. Errors name the line and the field at fault.
func Parse(data []byte) (*sandboxv1.SandboxPolicy, error) {
	var doc fileDoc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the policy file is empty")
		}
		return nil, friendly(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, errors.New("the policy file holds more than one YAML document")
	}
	if doc.Version == nil {
		return nil, errors.New(`missing field "version" (policy schema version, must be 1)`)
	}
	return doc.toProto()
}

// friendly rewrites the YAML decoder's Go type names into the policy's
// section names.
func friendly(err error) error {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "yaml: unmarshal errors:\n")
	msg = strings.TrimPrefix(msg, "yaml: ")
	var lines []string
	for _, l := range strings.Split(msg, "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		if m := unknownFieldRE.FindStringSubmatch(l); m != nil {
			l = strings.Replace(l, m[0], fmt.Sprintf("unknown field %q in %s", m[1], sectionNames[m[2]]), 1)
		} else if m := cannotRE.FindStringSubmatch(l); m != nil {
			want, ok := typeNames[m[2]]
			switch {
			case ok:
			case strings.HasPrefix(m[2], "[]"):
				want = "a list"
			default:
				want = "a map"
			}
			l = strings.Replace(l, m[0], fmt.Sprintf("got %s, want %s", m[1], want), 1)
		}
		lines = append(lines, l)
	}
	return errors.New(strings.Join(lines, "; "))
}

var (
	unknownFieldRE = regexp.MustCompile(`field (\S+) not found in type policyfile\.(\w+)`)
	cannotRE       = regexp.MustCompile(`cannot unmarshal (.+) into (\S+)$`)
	sectionNames   = map[string]string{
		"fileDoc":              "the policy (top level)",
		"filesystemDoc":        "filesystem_policy",
		"landlockDoc":          "landlock",
		"processDoc":           "process",
		"ruleDoc":              "a network_policies entry",
		"endpointDoc":          "an endpoint",
		"credentialBindingDoc": "credential_binding",
		"jsonRPCDoc":           "json_rpc",
		"mcpDoc":               "mcp",
		"graphqlOpDoc":         "a graphql_persisted_queries entry",
		"l7RuleDoc":            "a rules entry (want allow:)",
		"l7Doc":                "an allow or deny rule",
		"binaryDoc":            "a binaries entry",
		"middlewareDoc":        "a network_middlewares entry",
		"selectorDoc":          "a middleware endpoints selector",
	}
	typeNames = map[string]string{
		"uint16":   "a port number (1-65535)",
		"uint32":   "a non-negative integer",
		"int32":    "an integer",
		"*uint32":  "a non-negative integer",
		"bool":     "true or false",
		"*bool":    "true or false",
		"string":   "a string",
		"[]string": "a list of strings",
		"[]uint16": "a list of port numbers",
	}
)

func (d *fileDoc) toProto() (*sandboxv1.SandboxPolicy, error) {
	p := &sandboxv1.SandboxPolicy{Version: *d.Version}
	if fs := d.FilesystemPolicy; fs != nil {
		p.Filesystem = &sandboxv1.FilesystemPolicy{IncludeWorkdir: fs.IncludeWorkdir, ReadOnly: fs.ReadOnly, ReadWrite: fs.ReadWrite}
	}
	if d.Landlock != nil {
		p.Landlock = &sandboxv1.LandlockPolicy{Compatibility: d.Landlock.Compatibility}
	}
	if d.Process != nil {
		p.Process = &sandboxv1.ProcessPolicy{RunAsUser: d.Process.RunAsUser, RunAsGroup: d.Process.RunAsGroup}
	}
	if len(d.NetworkPolicies) > 0 {
		p.NetworkPolicies = make(map[string]*sandboxv1.NetworkPolicyRule, len(d.NetworkPolicies))
	}
	for key, r := range d.NetworkPolicies {
		if r == nil {
			r = &ruleDoc{}
		}
		rule := &sandboxv1.NetworkPolicyRule{Name: r.Name}
		if rule.Name == "" {
			rule.Name = key
		}
		for i, e := range r.Endpoints {
			where := fmt.Sprintf("network_policies.%s.endpoints[%d]", key, i)
			if e == nil {
				return nil, fmt.Errorf("%s: an endpoint must be a map", where)
			}
			ep, err := e.toProto(where)
			if err != nil {
				return nil, err
			}
			rule.Endpoints = append(rule.Endpoints, ep)
		}
		for i, b := range r.Binaries {
			if b == nil || b.Path == "" {
				return nil, fmt.Errorf("network_policies.%s.binaries[%d]: missing field \"path\"", key, i)
			}
			rule.Binaries = append(rule.Binaries, &sandboxv1.NetworkBinary{Path: b.Path})
		}
		p.NetworkPolicies[key] = rule
	}
	if len(d.NetworkMiddlewares) > 0 {
		p.NetworkMiddlewares = make(map[string]*sandboxv1.NetworkMiddlewareConfig, len(d.NetworkMiddlewares))
	}
	for key, m := range d.NetworkMiddlewares {
		if m == nil {
			m = &middlewareDoc{}
		}
		cfg, err := structpb.NewStruct(m.Config)
		if err != nil {
			return nil, fmt.Errorf("network_middlewares.%s.config: %w", key, err)
		}
		mw := &sandboxv1.NetworkMiddlewareConfig{Name: m.Name, Middleware: m.Middleware, Order: m.Order, Config: cfg, OnError: m.OnError}
		if mw.Name == "" {
			mw.Name = key
		}
		if m.Endpoints != nil {
			mw.Endpoints = &sandboxv1.MiddlewareEndpointSelector{Include: m.Endpoints.Include, Exclude: m.Endpoints.Exclude}
		}
		p.NetworkMiddlewares[key] = mw
	}
	return p, nil
}

func (e *endpointDoc) toProto(where string) (*sandboxv1.NetworkEndpoint, error) {
	ep := &sandboxv1.NetworkEndpoint{
		Host: e.Host, Path: e.Path, Protocol: e.Protocol, Tls: e.TLS, Enforcement: e.Enforcement, Access: e.Access,
		AllowedIps: e.AllowedIPs, AllowEncodedSlash: e.AllowEncodedSlash,
		WebsocketCredentialRewrite: e.WebsocketCredentialRewrite, RequestBodyCredentialRewrite: e.RequestBodyCredentialRewrite,
		AllowUninspectedCredentials: e.AllowUninspectedCredentials,
		PersistedQueries:            e.PersistedQueries, GraphqlMaxBodyBytes: e.GraphqlMaxBodyBytes,
		CredentialSigning: e.CredentialSigning, SigningService: e.SigningService, SigningRegion: e.SigningRegion,
	}
	// ports wins over port; a single port becomes a one-entry ports list.
	switch {
	case len(e.Ports) > 0:
		for _, p := range e.Ports {
			ep.Ports = append(ep.Ports, uint32(p))
		}
	case e.Port > 0:
		ep.Ports = []uint32{uint32(e.Port)}
	}
	if len(ep.Ports) > 0 {
		ep.Port = ep.Ports[0]
	}
	for i, r := range e.Rules {
		if r == nil || r.Allow == nil {
			return nil, fmt.Errorf("%s.rules[%d]: missing field \"allow\"", where, i)
		}
		a := r.Allow
		ep.Rules = append(ep.Rules, &sandboxv1.L7Rule{Allow: &sandboxv1.L7Allow{
			Method: a.Method, Path: a.Path, Command: a.Command, Query: matchersToProto(a.Query),
			OperationType: a.OperationType, OperationName: a.OperationName, Fields: a.Fields,
			Params: matchersToProto(a.paramsWithTool()),
		}})
	}
	for i, d := range e.DenyRules {
		if d == nil {
			return nil, fmt.Errorf("%s.deny_rules[%d]: a deny rule must be a map", where, i)
		}
		ep.DenyRules = append(ep.DenyRules, &sandboxv1.L7DenyRule{
			Method: d.Method, Path: d.Path, Command: d.Command, Query: matchersToProto(d.Query),
			OperationType: d.OperationType, OperationName: d.OperationName, Fields: d.Fields,
			Params: matchersToProto(d.paramsWithTool()),
		})
	}
	if len(e.GraphqlPersistedQueries) > 0 {
		ep.GraphqlPersistedQueries = make(map[string]*sandboxv1.GraphqlOperation, len(e.GraphqlPersistedQueries))
		for k, op := range e.GraphqlPersistedQueries {
			if op == nil {
				op = &graphqlOpDoc{}
			}
			ep.GraphqlPersistedQueries[k] = &sandboxv1.GraphqlOperation{OperationType: op.OperationType, OperationName: op.OperationName, Fields: op.Fields}
		}
	}
	if e.CredentialBinding != nil {
		ep.CredentialBinding = &sandboxv1.NetworkCredentialBinding{Provider: e.CredentialBinding.Provider}
	}
	// One body limit for the JSON-RPC family; the mcp stanza wins.
	switch {
	case e.MCP != nil:
		ep.JsonRpcMaxBodyBytes = e.MCP.MaxBodyBytes
		if e.MCP.StrictToolNames != nil || e.MCP.AllowAllKnownMCPMethods != nil {
			ep.Mcp = &sandboxv1.McpOptions{StrictToolNames: e.MCP.StrictToolNames, AllowAllKnownMcpMethods: e.MCP.AllowAllKnownMCPMethods}
		}
	case e.JSONRPC != nil:
		ep.JsonRpcMaxBodyBytes = e.JSONRPC.MaxBodyBytes
	}
	return ep, nil
}

// paramsWithTool is the rule's params with tool as params.name (an MCP
// convenience), unless params.name is given.
func (l *l7Doc) paramsWithTool() map[string]matcher {
	if l.Tool == nil {
		return l.Params.flat
	}
	out := make(map[string]matcher, len(l.Params.flat)+1)
	for k, v := range l.Params.flat {
		out[k] = v
	}
	if _, ok := out["name"]; !ok {
		out["name"] = *l.Tool
	}
	return out
}

func matchersToProto(m map[string]matcher) map[string]*sandboxv1.L7QueryMatcher {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]*sandboxv1.L7QueryMatcher, len(m))
	for k, v := range m {
		out[k] = &sandboxv1.L7QueryMatcher{Glob: v.Glob, Any: v.Any}
	}
	return out
}

func matchersFromProto(m map[string]*sandboxv1.L7QueryMatcher) map[string]matcher {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]matcher, len(m))
	for k, v := range m {
		out[k] = matcher{Glob: v.GetGlob(), Any: v.GetAny()}
	}
	return out
}

// Marshal writes p as a policy file, the form Parse reads back.
func Marshal(p *sandboxv1.SandboxPolicy) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(fromProto(p)); err != nil {
		return nil, fmt.Errorf("encode policy: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode policy: %w", err)
	}
	return buf.Bytes(), nil
}

// Document returns p in the file's shape, for embedding in JSON or YAML
// output (encoding/json and YAML encoders write it with the file's field
// names).
func Document(p *sandboxv1.SandboxPolicy) any { return fromProto(p) }

func fromProto(p *sandboxv1.SandboxPolicy) *fileDoc {
	v := p.GetVersion()
	d := &fileDoc{Version: &v}
	if fs := p.GetFilesystem(); fs != nil {
		d.FilesystemPolicy = &filesystemDoc{IncludeWorkdir: fs.GetIncludeWorkdir(), ReadOnly: fs.GetReadOnly(), ReadWrite: fs.GetReadWrite()}
	}
	if ll := p.GetLandlock(); ll != nil {
		d.Landlock = &landlockDoc{Compatibility: ll.GetCompatibility()}
	}
	if pr := p.GetProcess(); pr.GetRunAsUser() != "" || pr.GetRunAsGroup() != "" {
		d.Process = &processDoc{RunAsUser: pr.GetRunAsUser(), RunAsGroup: pr.GetRunAsGroup()}
	}
	if len(p.GetNetworkPolicies()) > 0 {
		d.NetworkPolicies = make(map[string]*ruleDoc, len(p.GetNetworkPolicies()))
	}
	for key, r := range p.GetNetworkPolicies() {
		rd := &ruleDoc{Name: r.GetName()}
		for _, e := range r.GetEndpoints() {
			rd.Endpoints = append(rd.Endpoints, endpointFromProto(e))
		}
		for _, b := range r.GetBinaries() {
			rd.Binaries = append(rd.Binaries, &binaryDoc{Path: b.GetPath()})
		}
		d.NetworkPolicies[key] = rd
	}
	if len(p.GetNetworkMiddlewares()) > 0 {
		d.NetworkMiddlewares = make(map[string]*middlewareDoc, len(p.GetNetworkMiddlewares()))
	}
	for key, m := range p.GetNetworkMiddlewares() {
		md := &middlewareDoc{Name: m.GetName(), Middleware: m.GetMiddleware(), Order: m.GetOrder(), OnError: m.GetOnError()}
		if c := m.GetConfig(); len(c.GetFields()) > 0 {
			md.Config = c.AsMap()
		}
		if s := m.GetEndpoints(); s != nil {
			md.Endpoints = &selectorDoc{Include: s.GetInclude(), Exclude: s.GetExclude()}
		}
		d.NetworkMiddlewares[key] = md
	}
	return d
}

func clampPort(p uint32) uint16 { return uint16(min(p, 65535)) }

func endpointFromProto(e *sandboxv1.NetworkEndpoint) *endpointDoc {
	d := &endpointDoc{
		Host: e.GetHost(), Path: e.GetPath(), Protocol: e.GetProtocol(), TLS: e.GetTls(), Enforcement: e.GetEnforcement(),
		Access: e.GetAccess(), AllowedIPs: e.GetAllowedIps(), AllowEncodedSlash: e.GetAllowEncodedSlash(),
		WebsocketCredentialRewrite: e.GetWebsocketCredentialRewrite(), RequestBodyCredentialRewrite: e.GetRequestBodyCredentialRewrite(),
		AllowUninspectedCredentials: e.GetAllowUninspectedCredentials(), PersistedQueries: e.GetPersistedQueries(),
		GraphqlMaxBodyBytes: e.GetGraphqlMaxBodyBytes(), CredentialSigning: e.GetCredentialSigning(),
		SigningService: e.GetSigningService(), SigningRegion: e.GetSigningRegion(),
	}
	// One port is written as port, several as ports.
	if ports := e.GetPorts(); len(ports) > 1 {
		for _, p := range ports {
			d.Ports = append(d.Ports, clampPort(p))
		}
	} else if len(ports) == 1 {
		d.Port = clampPort(ports[0])
	} else {
		d.Port = clampPort(e.GetPort())
	}
	mcp := isMCP(e.GetProtocol())
	// Under the MCP method profile a tools/call method is implied by tool.
	allowAll := !mcp || e.GetMcp().GetAllowAllKnownMcpMethods()
	for _, r := range e.GetRules() {
		a := r.GetAllow()
		d.Rules = append(d.Rules, &l7RuleDoc{Allow: l7FromProto(mcp, allowAll, a.GetMethod(), a.GetPath(), a.GetCommand(),
			a.GetQuery(), a.GetOperationType(), a.GetOperationName(), a.GetFields(), a.GetParams())})
	}
	for _, r := range e.GetDenyRules() {
		d.DenyRules = append(d.DenyRules, l7FromProto(mcp, allowAll, r.GetMethod(), r.GetPath(), r.GetCommand(),
			r.GetQuery(), r.GetOperationType(), r.GetOperationName(), r.GetFields(), r.GetParams()))
	}
	if len(e.GetGraphqlPersistedQueries()) > 0 {
		d.GraphqlPersistedQueries = make(map[string]*graphqlOpDoc, len(e.GetGraphqlPersistedQueries()))
		for k, op := range e.GetGraphqlPersistedQueries() {
			d.GraphqlPersistedQueries[k] = &graphqlOpDoc{OperationType: op.GetOperationType(), OperationName: op.GetOperationName(), Fields: op.GetFields()}
		}
	}
	if b := e.GetCredentialBinding(); b != nil {
		d.CredentialBinding = &credentialBindingDoc{Provider: b.GetProvider()}
	}
	maxBody := e.GetJsonRpcMaxBodyBytes()
	switch {
	case mcp && (maxBody > 0 || e.GetMcp().StrictToolNames != nil || e.GetMcp().AllowAllKnownMcpMethods != nil):
		d.MCP = &mcpDoc{MaxBodyBytes: maxBody, StrictToolNames: e.GetMcp().StrictToolNames, AllowAllKnownMCPMethods: e.GetMcp().AllowAllKnownMcpMethods}
	case !mcp && maxBody > 0:
		d.JSONRPC = &jsonRPCDoc{MaxBodyBytes: maxBody}
	}
	return d
}

func isMCP(protocol string) bool { return strings.EqualFold(protocol, "mcp") }

func l7FromProto(mcp, allowAll bool, method, path, command string, query map[string]*sandboxv1.L7QueryMatcher,
	opType, opName string, fields []string, ps map[string]*sandboxv1.L7QueryMatcher) *l7Doc {
	d := &l7Doc{Method: method, Path: path, Command: command, Query: matchersFromProto(query),
		OperationType: opType, OperationName: opName, Fields: fields}
	flat := matchersFromProto(ps)
	if mcp {
		if name, ok := flat["name"]; ok {
			d.Tool = &name
			delete(flat, "name")
		}
		if (d.Tool == nil && method == "*") || (d.Tool != nil && method == "tools/call" && allowAll) {
			d.Method = ""
		}
		d.Params.out = nestParams(flat)
	} else if len(flat) > 0 {
		d.Params.out = make(map[string]any, len(flat))
		for k, v := range flat {
			d.Params.out[k] = v
		}
	}
	return d
}

// nestParams turns dotted keys into nested maps, or keeps them flat when
// they cannot be split losslessly (both "a" and "a.b").
func nestParams(flat map[string]matcher) map[string]any {
	if len(flat) == 0 {
		return nil
	}
	keys := make([]string, 0, len(flat))
	for k := range flat {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	root := map[string]any{}
	for _, k := range keys {
		if !insertNested(root, strings.Split(k, "."), flat[k]) {
			out := make(map[string]any, len(flat))
			for k, v := range flat {
				out[k] = v
			}
			return out
		}
	}
	return root
}

func insertNested(m map[string]any, parts []string, v matcher) bool {
	if len(parts) == 1 {
		if _, taken := m[parts[0]]; taken {
			return false
		}
		m[parts[0]] = v
		return true
	}
	child, ok := m[parts[0]]
	if !ok {
		child = map[string]any{}
		m[parts[0]] = child
	}
	cm, ok := child.(map[string]any)
	if !ok {
		return false
	}
	return insertNested(cm, parts[1:], v)
}

// ParseRule reads one network_policies entry (name, endpoints, binaries),
// as 'openshell rule edit' takes it; key names the rule when it has no
// name of its own.
func ParseRule(data []byte, key string) (*sandboxv1.NetworkPolicyRule, error) {
	var r ruleDoc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&r); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the rule file is empty")
		}
		return nil, friendly(err)
	}
	v := uint32(1)
	p, err := (&fileDoc{Version: &v, NetworkPolicies: map[string]*ruleDoc{key: &r}}).toProto()
	if err != nil {
		return nil, err
	}
	return p.GetNetworkPolicies()[key], nil
}

// MarshalRule writes one network rule in the form ParseRule reads.
func MarshalRule(r *sandboxv1.NetworkPolicyRule) ([]byte, error) {
	d := fromProto(&sandboxv1.SandboxPolicy{NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"r": r}})
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(d.NetworkPolicies["r"]); err != nil {
		return nil, fmt.Errorf("encode rule: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode rule: %w", err)
	}
	return buf.Bytes(), nil
}
