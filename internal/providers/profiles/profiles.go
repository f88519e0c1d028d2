// Package profiles is the catalog of built-in provider profiles: what a
// provider type's credentials are called (the environment variables a
// sandbox sees), which endpoints they belong to and which binaries use
// them. The profiles are data files in builtin/, written from the facts of
// OpenShell's providers/*.yaml (names, credential keys, endpoints); types
// OpenShell accepts without a profile file (openai, anthropic, generic, …)
// are listed in bareTypes. The catalog is read-only and safe for
// concurrent use.
package profiles

import (
	"embed"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

//go:embed builtin/*.yaml
var builtinFS embed.FS

// SourceBuiltin is the source of built-in profiles; Scope is "platform".
const (
	SourceBuiltin = "builtin"
	ScopePlatform = "platform"
)

type fileCredential struct {
	Name        string   `json:"name"`
	Description string   `json:"description"`
	EnvVars     []string `json:"env_vars"`
	Required    bool     `json:"required"`
	AuthStyle   string   `json:"auth_style"`
	HeaderName  string   `json:"header_name"`
	QueryParam  string   `json:"query_param"`
	PathTmpl    string   `json:"path_template"`
}

type fileProfile struct {
	ID               string           `json:"id"`
	DisplayName      string           `json:"display_name"`
	Description      string           `json:"description"`
	Category         string           `json:"category"`
	InferenceCapable bool             `json:"inference_capable"`
	Credentials      []fileCredential `json:"credentials"`
	// Endpoints are network endpoints (sandbox.v1.NetworkEndpoint in its
	// JSON form: host, port, path, protocol, access, rules, ...).
	Endpoints []json.RawMessage `json:"endpoints"`
	Binaries  []string          `json:"binaries"`
}

// bareTypes are provider types OpenShell accepts without a profile file,
// with the environment variables their credentials are known by
// (docs/sandboxes/manage-providers.mdx, "Supported Provider Types").
var bareTypes = []fileProfile{
	{ID: "anthropic", DisplayName: "Anthropic", Description: "Anthropic API", Category: "inference", InferenceCapable: true,
		Credentials: []fileCredential{{Name: "api_key", EnvVars: []string{"ANTHROPIC_API_KEY"}}}},
	{ID: "claude", DisplayName: "Claude", Description: "Claude Code, Anthropic API", Category: "agent",
		Credentials: []fileCredential{{Name: "api_key", EnvVars: []string{"ANTHROPIC_API_KEY", "CLAUDE_API_KEY"}}}},
	{ID: "generic", DisplayName: "Generic", Description: "Any service with user-defined credentials", Category: "other"},
	{ID: "gitlab", DisplayName: "GitLab", Description: "GitLab API, glab CLI", Category: "source_control",
		Credentials: []fileCredential{{Name: "api_token", EnvVars: []string{"GITLAB_TOKEN", "GLAB_TOKEN", "CI_JOB_TOKEN"}}}},
	{ID: "openai", DisplayName: "OpenAI", Description: "Any OpenAI-compatible endpoint", Category: "inference", InferenceCapable: true,
		Credentials: []fileCredential{{Name: "api_key", EnvVars: []string{"OPENAI_API_KEY"}}}},
	{ID: "opencode", DisplayName: "OpenCode", Description: "OpenCode", Category: "agent",
		Credentials: []fileCredential{{Name: "api_key", EnvVars: []string{"OPENCODE_API_KEY", "OPENROUTER_API_KEY", "OPENAI_API_KEY"}}}},
}

var categories = map[string]openshellv1.ProviderProfileCategory{
	"other":          openshellv1.ProviderProfileCategory_PROVIDER_PROFILE_CATEGORY_OTHER,
	"inference":      openshellv1.ProviderProfileCategory_PROVIDER_PROFILE_CATEGORY_INFERENCE,
	"agent":          openshellv1.ProviderProfileCategory_PROVIDER_PROFILE_CATEGORY_AGENT,
	"source_control": openshellv1.ProviderProfileCategory_PROVIDER_PROFILE_CATEGORY_SOURCE_CONTROL,
	"messaging":      openshellv1.ProviderProfileCategory_PROVIDER_PROFILE_CATEGORY_MESSAGING,
	"data":           openshellv1.ProviderProfileCategory_PROVIDER_PROFILE_CATEGORY_DATA,
	"knowledge":      openshellv1.ProviderProfileCategory_PROVIDER_PROFILE_CATEGORY_KNOWLEDGE,
}

// Catalog is an immutable set of profiles by id.
type Catalog struct {
	byID map[string]*openshellv1.ProviderProfile
	bare map[string]bool // types without a profile file
	ids  []string
}

// Builtin returns the built-in catalog. It panics if an embedded file is
// malformed (a build defect, caught by the package's tests).
func Builtin() *Catalog {
	c, err := load()
	if err != nil {
		panic(err)
	}
	return c
}

func load() (*Catalog, error) {
	c := &Catalog{byID: map[string]*openshellv1.ProviderProfile{}, bare: map[string]bool{}}
	add := func(fp fileProfile, src string) error {
		p, err := toProto(fp)
		if err != nil {
			return fmt.Errorf("profile %s: %w", src, err)
		}
		if _, dup := c.byID[p.Id]; dup {
			return fmt.Errorf("profile %s: duplicate id %q", src, p.Id)
		}
		c.byID[p.Id] = p
		c.ids = append(c.ids, p.Id)
		return nil
	}
	entries, err := builtinFS.ReadDir("builtin")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		b, err := builtinFS.ReadFile(path.Join("builtin", e.Name()))
		if err != nil {
			return nil, err
		}
		var fp fileProfile
		if err := yaml.UnmarshalStrict(b, &fp); err != nil {
			return nil, fmt.Errorf("profile %s: %w", e.Name(), err)
		}
		if fp.ID+".yaml" != e.Name() {
			return nil, fmt.Errorf("profile %s: id %q does not match the file name", e.Name(), fp.ID)
		}
		if err := add(fp, e.Name()); err != nil {
			return nil, err
		}
	}
	for _, fp := range bareTypes {
		if err := add(fp, fp.ID); err != nil {
			return nil, err
		}
		c.bare[fp.ID] = true
	}
	slices.Sort(c.ids)
	return c, nil
}

func toProto(fp fileProfile) (*openshellv1.ProviderProfile, error) {
	cat, ok := categories[fp.Category]
	if !ok {
		return nil, fmt.Errorf("unknown category %q", fp.Category)
	}
	p := &openshellv1.ProviderProfile{
		Id: fp.ID, DisplayName: fp.DisplayName, Description: fp.Description, Category: cat,
		InferenceCapable: fp.InferenceCapable, Source: SourceBuiltin, Scope: ScopePlatform,
	}
	var discovery []string
	for _, fc := range fp.Credentials {
		p.Credentials = append(p.Credentials, &openshellv1.ProviderProfileCredential{
			Name: fc.Name, Description: fc.Description, EnvVars: fc.EnvVars, Required: fc.Required,
			AuthStyle: fc.AuthStyle, HeaderName: fc.HeaderName, QueryParam: fc.QueryParam, PathTemplate: fc.PathTmpl,
		})
		discovery = append(discovery, fc.Name)
	}
	if len(discovery) > 0 {
		p.Discovery = &openshellv1.ProviderProfileDiscovery{Credentials: discovery}
	}
	for i, raw := range fp.Endpoints {
		e := &sandboxv1.NetworkEndpoint{}
		if err := protojson.Unmarshal(raw, e); err != nil {
			return nil, fmt.Errorf("endpoint %d: %w", i, err)
		}
		if e.GetHost() == "" || e.GetPort() == 0 {
			return nil, fmt.Errorf("endpoint %q:%d needs a host and a port", e.GetHost(), e.GetPort())
		}
		p.Endpoints = append(p.Endpoints, e)
	}
	for _, b := range fp.Binaries {
		p.Binaries = append(p.Binaries, &sandboxv1.NetworkBinary{Path: b})
	}
	return p, nil
}

// Get returns the profile of a provider type (case-insensitive), or false.
// The returned message is shared: callers clone before changing it.
func (c *Catalog) Get(providerType string) (*openshellv1.ProviderProfile, bool) {
	p, ok := c.byID[strings.ToLower(strings.TrimSpace(providerType))]
	return p, ok
}

// Bare reports whether providerType is a type OpenShell accepts without a
// profile file (no endpoints, no binaries).
func (c *Catalog) Bare(providerType string) bool {
	p, ok := c.Get(providerType)
	return ok && c.bare[p.GetId()]
}

// Compose returns a catalog of base's profiles (none when base is nil)
// and extra, whose ids must be normalized and distinct from base's.
func Compose(base *Catalog, extra []*openshellv1.ProviderProfile) *Catalog {
	if base != nil && len(extra) == 0 {
		return base
	}
	c := &Catalog{byID: map[string]*openshellv1.ProviderProfile{}, bare: map[string]bool{}}
	if base != nil {
		maps.Copy(c.byID, base.byID)
		maps.Copy(c.bare, base.bare)
		c.ids = slices.Clone(base.ids)
	}
	for _, p := range extra {
		c.byID[p.GetId()] = p
		c.ids = append(c.ids, p.GetId())
	}
	slices.Sort(c.ids)
	return c
}

// IDs returns the profile ids in sorted order.
func (c *Catalog) IDs() []string { return slices.Clone(c.ids) }

// AllowsEmptyCredentials reports whether a provider of providerType may be
// created without credentials: as OpenShell, only a type with a profile
// file none of whose credentials is required.
func (c *Catalog) AllowsEmptyCredentials(providerType string) bool {
	p, ok := c.Get(providerType)
	if !ok || c.bare[p.GetId()] {
		return false
	}
	for _, cr := range p.GetCredentials() {
		if cr.GetRequired() {
			return false
		}
	}
	return true
}
