package interceptor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	gipb "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/providers"
)

// ProfileSource is a profile-capable interceptor (its manifest sets
// provider_profiles) serving as a provider profile source: each
// SnapshotProfiles is one SnapshotProviderProfiles call bounded by the
// interceptor's timeout. It is safe for concurrent use.
type ProfileSource struct {
	name    string
	timeout time.Duration
	client  gipb.GatewayInterceptorClient
}

// SourceID is the interceptor's configured name.
func (p *ProfileSource) SourceID() string { return p.name }

// SnapshotProfiles fetches the interceptor's whole profile catalog.
func (p *ProfileSource) SnapshotProfiles(ctx context.Context) (string, []*openshellv1.ProviderProfile, error) {
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	snap, err := p.client.SnapshotProviderProfiles(cctx, &gipb.ProviderProfileSnapshotRequest{})
	if err != nil {
		return "", nil, err
	}
	return snap.GetRevision(), snap.GetProfiles(), nil
}

// ProfileSource returns the configured interceptor name when its manifest
// declares provider profile capability, else false.
func (r *Runtime) ProfileSource(name string) (*ProfileSource, bool) {
	if r == nil {
		return nil, false
	}
	p, ok := r.profiles[name]
	return p, ok
}

// ProfileSourceConfig is one entry of provider_profile_sources:
// {type = "builtin"}, {type = "user"} or {type = "interceptor", name = N}.
type ProfileSourceConfig struct {
	Type string
	Name string // the interceptor's name; only for type "interceptor"
}

// ParseProfileSources checks the decoded provider_profile_sources array.
func ParseProfileSources(raw []any) ([]ProfileSourceConfig, error) {
	if len(raw) == 0 {
		return nil, errors.New("provider_profile_sources must contain at least one source")
	}
	out := make([]ProfileSourceConfig, 0, len(raw))
	for i, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("[%d]: a source is a table such as { type = \"builtin\" }", i)
		}
		var c ProfileSourceConfig
		for k, v := range m {
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("[%d].%s: not a string", i, k)
			}
			switch k {
			case "type":
				c.Type = s
			case "name":
				c.Name = s
			default:
				return nil, fmt.Errorf("[%d]: unknown key %q", i, k)
			}
		}
		switch c.Type {
		case providers.SourceNameBuiltin, providers.SourceNameUser:
			if c.Name != "" {
				return nil, fmt.Errorf("[%d]: name is only for type \"interceptor\"", i)
			}
		case "interceptor":
			if strings.TrimSpace(c.Name) == "" {
				return nil, fmt.Errorf("[%d]: provider profile interceptor source name must not be empty", i)
			}
		default:
			return nil, fmt.Errorf("[%d]: unknown source type %q (builtin, user or interceptor)", i, c.Type)
		}
		out = append(out, c)
	}
	return out, nil
}

// ProfileSources builds the provider profile source set of cfgs: each
// interceptor entry must name a configured interceptor whose manifest
// declares provider_profiles (rt may be nil when none is configured).
func ProfileSources(cfgs []ProfileSourceConfig, rt *Runtime, log *slog.Logger) (*providers.ProfileSources, error) {
	refs := make([]providers.SourceRef, 0, len(cfgs))
	for _, c := range cfgs {
		if c.Type != "interceptor" {
			refs = append(refs, providers.SourceRef{Name: c.Type})
			continue
		}
		src, ok := rt.ProfileSource(c.Name)
		if !ok {
			return nil, fmt.Errorf("provider profile source interceptor '%s' is not configured or does not advertise provider_profiles", c.Name)
		}
		refs = append(refs, providers.SourceRef{Name: c.Name, External: src})
	}
	return providers.NewProfileSources(refs, log)
}
