package providers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/credentials"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/providers/profiles"
	"github.com/openshell-go/openshell/internal/store"
)

// User provider profiles are stored as object type "provider_profile"
// (StoredProviderProfile), named by the profile id, in their scope: the
// workspace "" for platform profiles (visible in every workspace), a
// workspace's name for that workspace's profiles (visible there only,
// shadowing a platform profile of the same id). Built-in profiles cannot
// be imported over, updated or deleted.
const TypeProviderProfile = store.TypeProviderProfile

// Profile sources and scopes of user profiles, as OpenShell reports them.
const (
	SourceUser     = "user"
	ScopeWorkspace = "workspace"
)

func newStoredProfile() *openshellv1.StoredProviderProfile {
	return &openshellv1.StoredProviderProfile{}
}

// NormalizeProfileID is a profile id as stored and looked up.
func NormalizeProfileID(id string) string { return strings.ToLower(strings.TrimSpace(id)) }

// storedProfile reads user profile id of scope; NotFound when absent.
func (s *Store) storedProfile(ctx context.Context, scope, id string) (*openshellv1.StoredProviderProfile, error) {
	sp := newStoredProfile()
	if err := s.o.Objects.GetByName(ctx, TypeProviderProfile, scope, NormalizeProfileID(id), sp); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.NotFound("provider profile not found")
		}
		return nil, err
	}
	return sp, nil
}

// withVersion is sp's profile with its resource version, as returned.
func withVersion(sp *openshellv1.StoredProviderProfile) *openshellv1.ProviderProfile {
	p := proto.Clone(sp.GetProfile()).(*openshellv1.ProviderProfile)
	p.ResourceVersion = sp.GetMetadata().GetResourceVersion()
	return p
}

// lookupProfile finds the profile of type t for a provider in workspace:
// a built-in one, else workspace's own, else a platform one. It returns
// the profile and the scope it came from ("" for built-in and platform).
// only limits the user profiles searched to workspace's own.
func (s *Store) lookupProfile(ctx context.Context, e *effective, workspace, t string, only bool) (*openshellv1.ProviderProfile, string, bool, error) {
	if p, ok := e.cat.Get(t); ok {
		return p, "", true, nil
	}
	scopes := []string{workspace, ""}
	if only {
		scopes = scopes[:1]
	}
	if !e.user {
		scopes = nil
	}
	for _, scope := range scopes {
		sp, err := s.storedProfile(ctx, scope, t)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, "", false, err
		}
		return sp.GetProfile(), scope, true, nil
	}
	return nil, "", false, nil
}

// ProfileOf returns the profile a stored provider was created against (by
// its type and profile_workspace), or false when it has none (a type
// without a profile file, or a user profile deleted since).
func (s *Store) ProfileOf(ctx context.Context, p *datamodelv1.Provider) (*openshellv1.ProviderProfile, bool, error) {
	e, err := s.catalog(ctx)
	if err != nil {
		return nil, false, err
	}
	if prof, ok := e.cat.Get(p.GetType()); ok {
		return prof, !e.cat.Bare(p.GetType()), nil
	}
	if !e.user {
		return nil, false, nil
	}
	sp, err := s.storedProfile(ctx, p.GetProfileWorkspace(), p.GetType())
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return sp.GetProfile(), true, nil
}

// Profiles returns the profiles visible in workspace: the built-in ones,
// then platform profiles and workspace's own (which shadow platform ones
// of the same id), each group sorted by id.
func (s *Store) Profiles(ctx context.Context, workspace string) ([]*openshellv1.ProviderProfile, error) {
	e, err := s.catalog(ctx)
	if err != nil {
		return nil, err
	}
	var out []*openshellv1.ProviderProfile
	for _, id := range e.cat.IDs() {
		p, _ := e.cat.Get(id)
		out = append(out, proto.Clone(p).(*openshellv1.ProviderProfile))
	}
	user := map[string]*openshellv1.ProviderProfile{}
	for _, scope := range []string{"", workspace} {
		if !e.user {
			break
		}
		sps, err := s.listStoredProfiles(ctx, scope)
		if err != nil {
			return nil, err
		}
		for _, sp := range sps {
			user[sp.GetProfile().GetId()] = withVersion(sp)
		}
		if workspace == "" {
			break
		}
	}
	for _, id := range slices.Sorted(maps.Keys(user)) {
		out = append(out, user[id])
	}
	return out, nil
}

func (s *Store) listStoredProfiles(ctx context.Context, scope string) ([]*openshellv1.StoredProviderProfile, error) {
	var out []*openshellv1.StoredProviderProfile
	for offset := 0; ; {
		page, err := store.ListAs(ctx, s.o.Objects, TypeProviderProfile, store.ListOptions{Workspace: scope, Limit: store.MaxLimit, Offset: offset}, newStoredProfile)
		if err != nil {
			return nil, err
		}
		for _, sp := range page {
			if sp.GetMetadata().GetWorkspace() == scope {
				out = append(out, sp)
			}
		}
		if len(page) < store.MaxLimit {
			return out, nil
		}
		offset += len(page)
	}
}

// Profile returns profile id as visible in workspace (see Profiles).
func (s *Store) Profile(ctx context.Context, workspace, id string) (*openshellv1.ProviderProfile, error) {
	e, err := s.catalog(ctx)
	if err != nil {
		return nil, err
	}
	if p, ok := e.cat.Get(id); ok {
		return proto.Clone(p).(*openshellv1.ProviderProfile), nil
	}
	scopes := []string{workspace, ""}
	if !e.user {
		scopes = nil
	}
	for _, scope := range scopes {
		sp, err := s.storedProfile(ctx, scope, id)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return withVersion(sp), nil
	}
	return nil, errdefs.NotFound(fmt.Sprintf("provider profile '%s' not found", id))
}

// diag is one error or warning about a profile in a request.
func diag(source, id, field, severity, format string, args ...any) *openshellv1.ProviderProfileDiagnostic {
	return &openshellv1.ProviderProfileDiagnostic{Source: source, ProfileId: id, Field: field, Severity: severity, Message: fmt.Sprintf(format, args...)}
}

// HasErrors reports whether diags holds an error.
func HasErrors(diags []*openshellv1.ProviderProfileDiagnostic) bool {
	return slices.ContainsFunc(diags, func(d *openshellv1.ProviderProfileDiagnostic) bool { return d.GetSeverity() == "error" })
}

// profileIDRe is OpenShell's custom profile id: lowercase kebab-case.
var profileIDRe = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// checkProfiles validates the profiles of items on their own and as a
// set; it returns them (ids normalized) with the diagnostics.
func checkProfiles(items []*openshellv1.ProviderProfileImportItem) ([]*openshellv1.ProviderProfile, []string, []*openshellv1.ProviderProfileDiagnostic) {
	var out []*openshellv1.ProviderProfile
	var sources []string
	var diags []*openshellv1.ProviderProfileDiagnostic
	seen := map[string]bool{}
	for _, it := range items {
		src := it.GetSource()
		if it.GetProfile() == nil {
			diags = append(diags, diag(src, "", "profile", "error", "provider profile is required"))
			continue
		}
		p := proto.Clone(it.GetProfile()).(*openshellv1.ProviderProfile)
		p.Id = NormalizeProfileID(p.GetId())
		id := p.GetId()
		switch {
		case len(id) > 64 || !profileIDRe.MatchString(id):
			diags = append(diags, diag(src, id, "id", "error", "provider profile id must be lowercase kebab-case (a-z, 0-9 and single '-' between them), at most 64 characters"))
		case seen[id]:
			diags = append(diags, diag(src, id, "id", "error", "duplicate provider profile id: %s", id))
		}
		seen[id] = true
		diags = append(diags, checkProfile(src, p)...)
		out = append(out, p)
		sources = append(sources, src)
	}
	if len(out) == 0 && len(diags) == 0 {
		diags = append(diags, diag("", "", "profiles", "error", "at least one provider profile is required"))
	}
	return out, sources, diags
}

// checkProfile validates one profile's credentials, endpoints and
// binaries.
func checkProfile(src string, p *openshellv1.ProviderProfile) []*openshellv1.ProviderProfileDiagnostic {
	id := p.GetId()
	var diags []*openshellv1.ProviderProfileDiagnostic
	names, envs := map[string]bool{}, map[string]bool{}
	for i, c := range p.GetCredentials() {
		f := fmt.Sprintf("credentials[%d]", i)
		switch {
		case c.GetName() == "":
			diags = append(diags, diag(src, id, f+".name", "error", "credential name is required"))
		case names[c.GetName()]:
			diags = append(diags, diag(src, id, f+".name", "error", "duplicate credential name: %s", c.GetName()))
		}
		names[c.GetName()] = true
		for j, e := range c.GetEnvVars() {
			switch {
			case !credentials.ValidKey(e):
				diags = append(diags, diag(src, id, fmt.Sprintf("%s.env_vars[%d]", f, j), "error", "credential env var '%s' is not a valid environment variable name", e))
			case envs[e]:
				diags = append(diags, diag(src, id, fmt.Sprintf("%s.env_vars[%d]", f, j), "error", "duplicate credential env var '%s'", e))
			}
			envs[e] = true
		}
		if u := c.GetRefresh().GetTokenUrl(); u != "" {
			if msg := checkTokenURL(u); msg != "" {
				diags = append(diags, diag(src, id, f+".refresh.token_url", "error", "%s", msg))
			}
		}
	}
	for i, e := range p.GetEndpoints() {
		f := fmt.Sprintf("endpoints[%d]", i)
		if e.GetHost() == "" {
			diags = append(diags, diag(src, id, f+".host", "error", "endpoint host is required"))
		}
		if e.GetPort() == 0 && len(e.GetPorts()) == 0 {
			diags = append(diags, diag(src, id, f+".port", "error", "endpoint port is required"))
		}
		for _, port := range append([]uint32{e.GetPort()}, e.GetPorts()...) {
			if port > 65535 {
				diags = append(diags, diag(src, id, f+".port", "error", "endpoint port %d is out of range", port))
			}
		}
		if e.GetCredentialBinding() != nil {
			diags = append(diags, diag(src, id, f+".credential_binding", "error", "credential_binding references a concrete sandbox provider and is only valid in sandbox policy"))
		}
	}
	for i, b := range p.GetBinaries() {
		if b.GetPath() == "" {
			diags = append(diags, diag(src, id, fmt.Sprintf("binaries[%d].path", i), "error", "binary path is required"))
		}
	}
	return diags
}

// checkTokenURL refuses token endpoints other than https, or http on a
// loopback address.
func checkTokenURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "refresh token_url must be an absolute URL"
	}
	if u.Scheme == "https" {
		return ""
	}
	if ip := net.ParseIP(u.Hostname()); u.Scheme == "http" && (u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback())) {
		return ""
	}
	return "refresh token_url must use https (http only on a loopback address)"
}

// conflicts reports profiles of a batch that collide with a built-in
// profile (error), an existing user profile of scope (error) or, for a
// workspace scope, a platform profile they would shadow (warning).
func (s *Store) conflicts(ctx context.Context, scope string, ps []*openshellv1.ProviderProfile, sources []string) ([]*openshellv1.ProviderProfileDiagnostic, error) {
	e, err := s.catalog(ctx)
	if err != nil {
		return nil, err
	}
	var diags []*openshellv1.ProviderProfileDiagnostic
	for i, p := range ps {
		id := p.GetId()
		if mp, ok := e.cat.Get(id); ok {
			diags = append(diags, diag(sources[i], id, "id", "error", "provider profile '%s' is managed by source '%s' and cannot be overwritten", id, mp.GetSource()))
			continue
		}
		_, err := s.storedProfile(ctx, scope, id)
		switch {
		case err == nil:
			diags = append(diags, diag(sources[i], id, "id", "error", "custom provider profile '%s' already exists", id))
			continue
		case !errors.Is(err, errdefs.ErrNotFound):
			return nil, err
		}
		if scope == "" {
			continue
		}
		if _, err := s.storedProfile(ctx, "", id); err == nil {
			diags = append(diags, diag(sources[i], id, "id", "warning", "profile '%s' shadows a platform-scoped profile in this workspace", id))
		} else if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
	}
	return diags, nil
}

// LintProfiles checks profiles for an import into scope ("" platform)
// without storing anything.
func (s *Store) LintProfiles(ctx context.Context, scope string, items []*openshellv1.ProviderProfileImportItem) ([]*openshellv1.ProviderProfileDiagnostic, error) {
	ps, sources, diags := checkProfiles(items)
	more, err := s.conflicts(ctx, scope, ps, sources)
	return append(diags, more...), err
}

// ImportProfiles stores new user profiles in scope ("" platform), all or
// none: with any error diagnostic nothing is stored and imported is false.
func (s *Store) ImportProfiles(ctx context.Context, scope string, items []*openshellv1.ProviderProfileImportItem) (stored []*openshellv1.ProviderProfile, diags []*openshellv1.ProviderProfileDiagnostic, err error) {
	ps, sources, diags := checkProfiles(items)
	more, err := s.conflicts(ctx, scope, ps, sources)
	if err != nil {
		return nil, nil, err
	}
	diags = append(diags, more...)
	if HasErrors(diags) {
		return nil, diags, nil
	}
	var created []string
	for _, p := range ps {
		sp := s.storedFor(scope, p)
		res, err := s.o.Objects.Create(ctx, TypeProviderProfile, sp)
		if err != nil {
			// Take back what this import stored: all or none.
			for _, id := range created {
				_, _ = s.o.Objects.Delete(context.WithoutCancel(ctx), TypeProviderProfile, id)
			}
			if errors.Is(err, errdefs.ErrAlreadyExists) {
				return nil, nil, errdefs.AlreadyExists(fmt.Sprintf("custom provider profile '%s' already exists", p.GetId()))
			}
			return nil, nil, err
		}
		created = append(created, sp.GetMetadata().GetId())
		sp.Metadata.ResourceVersion = res.ResourceVersion
		stored = append(stored, withVersion(sp))
	}
	return stored, diags, nil
}

func (s *Store) storedFor(scope string, p *openshellv1.ProviderProfile) *openshellv1.StoredProviderProfile {
	p = proto.Clone(p).(*openshellv1.ProviderProfile)
	p.Source, p.ResourceVersion = SourceUser, 0
	p.Scope = ScopeWorkspace
	if scope == "" {
		p.Scope = profiles.ScopePlatform
	}
	return &openshellv1.StoredProviderProfile{Metadata: &datamodelv1.ObjectMeta{Name: p.GetId(), Workspace: scope}, Profile: p}
}

// UpdateProfile replaces user profile id of scope with item's profile, at
// version expectedRV (0: the version item's profile carries; one of them
// is required). Problems with the payload are diagnostics (updated
// false); a version conflict is Aborted.
func (s *Store) UpdateProfile(ctx context.Context, scope, id string, item *openshellv1.ProviderProfileImportItem, expectedRV uint64) (*openshellv1.ProviderProfile, []*openshellv1.ProviderProfileDiagnostic, error) {
	id = NormalizeProfileID(id)
	if id == "" {
		return nil, nil, errdefs.InvalidArgument("id is required")
	}
	var items []*openshellv1.ProviderProfileImportItem
	if item != nil {
		items = append(items, item)
	}
	ps, _, diags := checkProfiles(items)
	if len(ps) == 1 && ps[0].GetId() != id {
		diags = append(diags, diag(item.GetSource(), ps[0].GetId(), "id", "error", "provider profile update target '%s' does not match payload id '%s'", id, ps[0].GetId()))
	}
	e, err := s.catalog(ctx)
	if err != nil {
		return nil, nil, err
	}
	if mp, ok := e.cat.Get(id); ok {
		diags = append(diags, diag(id, id, "id", "error", "provider profile '%s' is managed by source '%s' and cannot be updated", id, mp.GetSource()))
		return nil, diags, nil
	}
	cur, err := s.storedProfile(ctx, scope, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		diags = append(diags, diag(id, id, "id", "error", "custom provider profile '%s' does not exist", id))
	} else if err != nil {
		return nil, nil, err
	}
	if expectedRV == 0 && len(ps) == 1 {
		expectedRV = ps[0].GetResourceVersion()
	}
	if expectedRV == 0 && len(ps) == 1 {
		diags = append(diags, diag(item.GetSource(), id, "resource_version", "error", "custom provider profile update requires a non-zero resource_version; export the current profile before editing it"))
	}
	if HasErrors(diags) {
		return nil, diags, nil
	}
	sp := s.storedFor(scope, ps[0])
	sp.Metadata = cur.GetMetadata()
	res, err := s.o.Objects.Update(ctx, TypeProviderProfile, sp, expectedRV)
	var ce *store.ConflictError
	if errors.As(err, &ce) {
		if ce.Gone {
			return nil, nil, errdefs.NotFound("provider profile not found")
		}
		return nil, nil, fmt.Errorf("provider profile was modified concurrently (current resource_version: %d): %w", ce.Current, errdefs.ErrConflict)
	}
	if err != nil {
		return nil, nil, err
	}
	sp.Metadata.ResourceVersion = res.ResourceVersion
	return withVersion(sp), diags, nil
}

// DeleteProfile removes user profile id of scope unless inUse names
// providers created against it (FailedPrecondition). A built-in profile
// is FailedPrecondition, a missing one NotFound.
func (s *Store) DeleteProfile(ctx context.Context, scope, id string, inUse func(context.Context) ([]string, error)) (bool, error) {
	id = NormalizeProfileID(id)
	if id == "" {
		return false, errdefs.InvalidArgument("id is required")
	}
	e, err := s.catalog(ctx)
	if err != nil {
		return false, err
	}
	if mp, ok := e.cat.Get(id); ok {
		return false, errdefs.FailedPrecondition(fmt.Sprintf("provider profile '%s' is managed by source '%s' and cannot be deleted", id, mp.GetSource()))
	}
	cur, err := s.storedProfile(ctx, scope, id)
	if err != nil {
		return false, err
	}
	if err := refuseInUse(ctx, inUse, fmt.Sprintf("provider profile '%s' is in use by providers", id)); err != nil {
		return false, err
	}
	return s.deleteAt(ctx, TypeProviderProfile, cur.GetMetadata(), "provider profile")
}

// ProvidersUsingProfile lists the providers (as "workspace/name") whose
// type is profile id of scope: for a platform profile, providers of every
// workspace that resolve to it.
func (s *Store) ProvidersUsingProfile(ctx context.Context, scope, id string) ([]string, error) {
	id = NormalizeProfileID(id)
	var users []string
	for offset := 0; ; {
		page, err := s.List(ctx, store.ListOptions{AllWorkspaces: true, Limit: store.MaxLimit, Offset: offset})
		if err != nil {
			return nil, err
		}
		for _, p := range page {
			if p.GetType() == id && p.GetProfileWorkspace() == scope {
				users = append(users, p.GetMetadata().GetWorkspace()+"/"+p.GetMetadata().GetName())
			}
		}
		if len(page) < store.MaxLimit {
			return users, nil
		}
		offset += len(page)
	}
}
