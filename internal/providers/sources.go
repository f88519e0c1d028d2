package providers

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"log/slog"

	"google.golang.org/protobuf/proto"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/providers/profiles"
	"github.com/openshell-go/openshell/internal/store"
)

// Provider profile source names, as in provider_profile_sources.
const (
	SourceNameBuiltin = profiles.SourceBuiltin
	SourceNameUser    = SourceUser
)

// ProfileSource is a profile source outside the gateway (a profile-capable
// interceptor). SnapshotProfiles returns its whole catalog and an opaque
// revision; it must be safe for concurrent use.
type ProfileSource interface {
	SourceID() string
	SnapshotProfiles(ctx context.Context) (revision string, ps []*openshellv1.ProviderProfile, err error)
}

// SourceRef is one entry of the ordered source set: the built-in source,
// the stored user source, or External.
type SourceRef struct {
	Name     string // SourceNameBuiltin, SourceNameUser or External's SourceID
	External ProfileSource
}

// ProfileSources is the ordered provider profile source set. A nil
// *ProfileSources is the default, built-in then user.
type ProfileSources struct {
	refs []SourceRef
	log  *slog.Logger
}

// NewProfileSources returns the source set refs (at least one, no name
// twice); log receives the per-request capture diagnostics.
func NewProfileSources(refs []SourceRef, log *slog.Logger) (*ProfileSources, error) {
	if len(refs) == 0 {
		return nil, errors.New("provider_profile_sources must contain at least one source")
	}
	seen := map[string]bool{}
	for _, r := range refs {
		if seen[r.Name] {
			return nil, fmt.Errorf("duplicate provider profile source '%s' in provider_profile_sources", r.Name)
		}
		seen[r.Name] = true
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &ProfileSources{refs: refs, log: log.With("component", "providers/profile-sources")}, nil
}

// SetProfileSources selects the source set; nil restores the default. It
// must be called before the store serves requests.
func (s *Store) SetProfileSources(ps *ProfileSources) { s.o.Sources = ps }

// effective is one captured, validated, immutable catalog: the profiles of
// the built-in and external sources (user profiles are read from the store
// in their scope) and whether the user source is selected.
type effective struct {
	cat  *profiles.Catalog
	user bool
}

type catalogKey struct{}

// CaptureProfiles captures the effective catalog once and returns a ctx
// carrying it: every profile lookup made with that ctx (one request) sees
// the same catalog, and each source is fetched at most once.
func (s *Store) CaptureProfiles(ctx context.Context) (context.Context, error) {
	if _, ok := ctx.Value(catalogKey{}).(*effective); ok {
		return ctx, nil
	}
	e, err := s.capture(ctx)
	if err != nil {
		return nil, err
	}
	return context.WithValue(ctx, catalogKey{}, e), nil
}

// catalog is ctx's captured catalog, else a fresh capture.
func (s *Store) catalog(ctx context.Context) (*effective, error) {
	if e, ok := ctx.Value(catalogKey{}).(*effective); ok {
		return e, nil
	}
	return s.capture(ctx)
}

func (s *Store) capture(ctx context.Context) (*effective, error) {
	if s.o.Sources == nil {
		return &effective{cat: s.o.Catalog, user: true}, nil
	}
	e := &effective{}
	owner := map[string]string{} // normalized id -> source
	h := sha256.New()
	h.Write([]byte("openshell-effective-provider-profile-catalog-v1"))
	var extra []*openshellv1.ProviderProfile
	var base *profiles.Catalog
	fetches, count := 0, 0
	for _, r := range s.o.Sources.refs {
		switch {
		case r.External != nil:
			fetches++
			rev, ps, err := r.External.SnapshotProfiles(ctx)
			if err != nil {
				return nil, errdefs.Unavailable(fmt.Sprintf("provider profile source '%s' snapshot failed: %v", r.Name, err))
			}
			if rev == "" {
				return nil, errdefs.FailedPrecondition(fmt.Sprintf("provider profile source '%s' returned an empty revision", r.Name))
			}
			if len(ps) == 0 {
				return nil, errdefs.FailedPrecondition(fmt.Sprintf("provider profile source '%s' returned no profiles", r.Name))
			}
			_, _ = fmt.Fprintf(h, "%d:%s%d:%s", len(r.Name), r.Name, len(rev), rev)
			for _, p := range ps {
				id := NormalizeProfileID(p.GetId())
				if !profileIDRe.MatchString(id) {
					return nil, errdefs.FailedPrecondition(fmt.Sprintf("provider profile '%s' in source '%s' has invalid id", p.GetId(), r.Name))
				}
				if d := firstError(checkProfile(r.Name, p)); d != nil {
					return nil, errdefs.FailedPrecondition(fmt.Sprintf("provider profile source '%s' is invalid: provider profile '%s' %s: %s", r.Name, id, d.GetField(), d.GetMessage()))
				}
				if err := claim(owner, id, r.Name); err != nil {
					return nil, err
				}
				p = proto.Clone(p).(*openshellv1.ProviderProfile)
				p.Id, p.Source, p.Scope, p.ResourceVersion = id, r.Name, profiles.ScopePlatform, 0
				extra = append(extra, p)
			}
		case r.Name == SourceNameBuiltin:
			fetches++
			base = s.o.Catalog
			_, _ = fmt.Fprintf(h, "%d:%s", len(r.Name), r.Name)
			for _, id := range base.IDs() {
				if err := claim(owner, id, r.Name); err != nil {
					return nil, err
				}
			}
		case r.Name == SourceNameUser:
			fetches++
			e.user = true
			n, err := s.claimUserProfiles(ctx, owner, h)
			if err != nil {
				return nil, err
			}
			count += n
		}
	}
	e.cat = profiles.Compose(base, extra)
	count += len(e.cat.IDs())
	// Never profile material: the revision, the counts, nothing else.
	s.o.Sources.log.DebugContext(ctx, "captured provider profile catalog snapshot",
		"catalog_revision", fmt.Sprintf("sha256:%x", h.Sum(nil)), "source_fetch_count", fetches, "profile_count", count)
	return e, nil
}

// claim records id as served by source; an id served twice fails.
func claim(owner map[string]string, id, source string) error {
	if prev, ok := owner[id]; ok {
		where := fmt.Sprintf("across configured sources '%s' and '%s'", prev, source)
		if prev == source {
			where = fmt.Sprintf("within source '%s'", source)
		}
		return errdefs.FailedPrecondition(fmt.Sprintf("duplicate provider profile id '%s' %s", id, where))
	}
	owner[id] = source
	return nil
}

// claimUserProfiles checks the stored user profiles of every scope against
// the ids of the other sources (the same id in several scopes is scoping,
// not a duplicate), hashes their versions into h and counts them.
func (s *Store) claimUserProfiles(ctx context.Context, owner map[string]string, h hash.Hash) (int, error) {
	n := 0
	for offset := 0; ; {
		page, err := store.ListAs(ctx, s.o.Objects, TypeProviderProfile, store.ListOptions{AllWorkspaces: true, Limit: store.MaxLimit, Offset: offset}, newStoredProfile)
		if err != nil {
			return 0, err
		}
		for _, sp := range page {
			id := NormalizeProfileID(sp.GetProfile().GetId())
			if prev, ok := owner[id]; ok && prev != SourceNameUser {
				return 0, errdefs.FailedPrecondition(fmt.Sprintf("duplicate provider profile id '%s' across configured sources '%s' and '%s'", id, prev, SourceNameUser))
			}
			owner[id] = SourceNameUser
			_, _ = fmt.Fprintf(h, "%s/%s@%d;", sp.GetMetadata().GetWorkspace(), id, sp.GetMetadata().GetResourceVersion())
			n++
		}
		if len(page) < store.MaxLimit {
			break
		}
		offset += len(page)
	}
	return n, nil
}

// firstError is the first error diagnostic of diags, or nil.
func firstError(diags []*openshellv1.ProviderProfileDiagnostic) *openshellv1.ProviderProfileDiagnostic {
	for _, d := range diags {
		if d.GetSeverity() == "error" {
			return d
		}
	}
	return nil
}
