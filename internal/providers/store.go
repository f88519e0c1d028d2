package providers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/credentials"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/providers/profiles"
	"github.com/openshell-go/openshell/internal/store"
)

// Redacted replaces every credential value in responses, as OpenShell's.
const Redacted = "REDACTED"

// Options configure a Store.
type Options struct {
	Objects store.Store
	// Keyring seals credential values. Without one, writes carrying
	// credentials and Resolve are Unavailable.
	Keyring *credentials.Keyring
	Catalog *profiles.Catalog // the built-in source; nil: profiles.Builtin()
	// Sources is the provider profile source set; nil: built-in, user.
	Sources *ProfileSources
	Now     func() time.Time
}

// Store keeps providers in the object store with sealed credentials.
type Store struct{ o Options }

// NewStore returns a Store.
func NewStore(o Options) *Store {
	if o.Catalog == nil {
		o.Catalog = profiles.Builtin()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Store{o: o}
}

func newProvider() *datamodelv1.Provider { return &datamodelv1.Provider{} }

// Redact returns a copy of a stored provider fit for a response: every
// credential key maps to "REDACTED" and the handles are gone.
func Redact(stored *datamodelv1.Provider) *datamodelv1.Provider {
	out := proto.Clone(stored).(*datamodelv1.Provider)
	creds := make(map[string]string, len(out.CredentialHandles)+len(out.Credentials))
	for k := range out.Credentials {
		creds[k] = Redacted
	}
	for k := range out.CredentialHandles {
		creds[k] = Redacted
	}
	out.Credentials, out.CredentialHandles = creds, nil
	if len(out.Credentials) == 0 {
		out.Credentials = nil
	}
	return out
}

func aad(providerID, key string) string { return providerID + "/" + key }

// refuseInUse asks inUse who still uses an object and, when anyone does,
// refuses with FailedPrecondition "<what>: <sorted users>".
func refuseInUse(ctx context.Context, inUse func(ctx context.Context) ([]string, error), what string) error {
	users, err := inUse(ctx)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		slices.Sort(users)
		return errdefs.FailedPrecondition(fmt.Sprintf("%s: %s", what, strings.Join(users, ", ")))
	}
	return nil
}

// rewrapHandle re-wraps the data key of the sealed credential handle h
// (bound to aad) under the keyring's current KEK, updating h's metadata in
// place, and reports whether it changed.
func (s *Store) rewrapHandle(h *datamodelv1.CredentialHandle, aad string) (bool, error) {
	sealed := credentials.Sealed{KEKID: h.GetMetadata()[credentials.MetaKEKID], WrappedKey: h.GetMetadata()[credentials.MetaWrappedKey], Ciphertext: h.GetHandle()}
	r, ok, err := s.o.Keyring.Rewrap(sealed, aad)
	if err != nil || !ok {
		return false, err
	}
	h.Metadata[credentials.MetaKEKID], h.Metadata[credentials.MetaWrappedKey] = r.KEKID, r.WrappedKey
	return true, nil
}

// seal moves every credential value of p into a sealed handle.
func (s *Store) seal(p *datamodelv1.Provider, values map[string]string) error {
	if len(values) == 0 {
		return nil
	}
	if s.o.Keyring == nil {
		return errdefs.Unavailable("the gateway's credential store is not configured")
	}
	if p.CredentialHandles == nil {
		p.CredentialHandles = map[string]*datamodelv1.CredentialHandle{}
	}
	for k, v := range values {
		sealed, err := s.o.Keyring.Seal([]byte(v), aad(p.GetMetadata().GetId(), k))
		if err != nil {
			return fmt.Errorf("seal credential %q: %w", k, err)
		}
		p.CredentialHandles[k] = &datamodelv1.CredentialHandle{
			Driver: credentials.Driver, Handle: sealed.Ciphertext,
			Metadata: map[string]string{credentials.MetaKEKID: sealed.KEKID, credentials.MetaWrappedKey: sealed.WrappedKey},
		}
	}
	p.Credentials = nil
	return nil
}

// Create validates p and stores it in workspace with its credentials
// sealed. It returns the stored provider redacted.
func (s *Store) Create(ctx context.Context, workspace string, p *datamodelv1.Provider) (*datamodelv1.Provider, error) {
	p = proto.Clone(p).(*datamodelv1.Provider)
	if p.Metadata == nil {
		p.Metadata = &datamodelv1.ObjectMeta{}
	}
	if p.GetType() == "" {
		return nil, errdefs.InvalidArgument("provider.type is required")
	}
	if err := validateNew(p, workspace); err != nil {
		return nil, err
	}
	// A built-in profile, else the workspace's own, else a platform one;
	// profile_workspace set to the workspace asks for the workspace's own.
	e, err := s.catalog(ctx)
	if err != nil {
		return nil, err
	}
	prof, scope, ok, err := s.lookupProfile(ctx, e, workspace, p.GetType(), p.GetProfileWorkspace() != "")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("unsupported provider type: %s", p.GetType()))
	}
	if len(p.GetCredentials()) == 0 && !allowsEmptyCredentials(e.cat, prof) {
		return nil, errdefs.InvalidArgument("provider.credentials must not be empty")
	}
	p.Type, p.ProfileWorkspace = prof.GetId(), scope
	p.Metadata.Id = uuid.NewString()
	p.Metadata.Workspace = workspace
	p.Metadata.ResourceVersion = 0
	p.Metadata.CreatedAtMs = s.o.Now().UnixMilli()
	if err := s.seal(p, p.GetCredentials()); err != nil {
		return nil, err
	}
	res, err := s.o.Objects.Create(ctx, store.TypeProvider, p)
	if errors.Is(err, errdefs.ErrAlreadyExists) {
		return nil, errdefs.AlreadyExists(fmt.Sprintf("provider '%s' already exists", p.Metadata.Name))
	}
	if err != nil {
		return nil, err
	}
	p.Metadata.ResourceVersion = res.ResourceVersion
	p.Metadata.CreatedAtMs = res.CreatedAtMs
	return Redact(p), nil
}

// allowsEmptyCredentials: as OpenShell, only a profile none of whose
// credentials is required, and not a type without a profile file.
func allowsEmptyCredentials(cat *profiles.Catalog, prof *openshellv1.ProviderProfile) bool {
	if cat.Bare(prof.GetId()) {
		return false
	}
	for _, c := range prof.GetCredentials() {
		if c.GetRequired() {
			return false
		}
	}
	return true
}

// Get returns the stored provider name of workspace, sealed (not
// redacted): callers redact before answering.
func (s *Store) Get(ctx context.Context, workspace, name string) (*datamodelv1.Provider, error) {
	if name == "" {
		return nil, errdefs.InvalidArgument("name is required")
	}
	p := newProvider()
	if err := s.o.Objects.GetByName(ctx, store.TypeProvider, workspace, name, p); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.NotFound(fmt.Sprintf("provider '%s' not found", name))
		}
		return nil, err
	}
	return p, nil
}

// List returns stored providers, sealed.
func (s *Store) List(ctx context.Context, opts store.ListOptions) ([]*datamodelv1.Provider, error) {
	return store.ListAs(ctx, s.o.Objects, store.TypeProvider, opts, newProvider)
}

// Update merges upd into provider upd.metadata.name of workspace, as
// OpenShell: credentials and config merge key by key and an empty value
// removes the key; expiry times merge and 0 removes one. The type and
// profile_workspace cannot change. expectedRV is the version the caller
// read (0: the current one); another version is a *store.ConflictError.
func (s *Store) Update(ctx context.Context, workspace string, upd *datamodelv1.Provider, expiresAtMs map[string]int64) (*datamodelv1.Provider, error) {
	name := upd.GetMetadata().GetName()
	if name == "" {
		return nil, errdefs.InvalidArgument("provider.name is required")
	}
	cur, err := s.Get(ctx, workspace, name)
	if err != nil {
		return nil, err
	}
	if t := upd.GetType(); t != "" && NormalizeProfileID(t) != cur.GetType() {
		return nil, errdefs.InvalidArgument("provider type cannot be changed; delete and recreate the provider")
	}
	if pw := upd.GetProfileWorkspace(); pw != "" && pw != cur.GetProfileWorkspace() {
		return nil, errdefs.InvalidArgument("profile_workspace cannot be changed; delete and recreate the provider")
	}
	if len(upd.GetCredentialHandles()) > 0 {
		return nil, errdefs.InvalidArgument("provider.credential_handles is internal gateway state and cannot be supplied")
	}
	if err := validateMutable(upd); err != nil {
		return nil, err
	}
	expires := maps.Clone(upd.GetCredentialExpiresAtMs())
	if expires == nil {
		expires = map[string]int64{}
	}
	maps.Copy(expires, expiresAtMs)
	id := cur.GetMetadata().GetId()
	out, _, err := store.UpdateCASAs(ctx, s.o.Objects, store.TypeProvider, id, upd.GetMetadata().GetResourceVersion(), newProvider,
		func(p *datamodelv1.Provider) error { return s.merge(p, upd, expires) })
	var ce *store.ConflictError
	if errors.As(err, &ce) {
		if ce.Gone {
			return nil, errdefs.NotFound(fmt.Sprintf("provider '%s' not found", name))
		}
		return nil, fmt.Errorf("provider '%s' was modified concurrently (current resource_version: %d): %w", name, ce.Current, errdefs.ErrConflict)
	}
	if err != nil {
		return nil, err
	}
	return Redact(out), nil
}

func (s *Store) merge(p, upd *datamodelv1.Provider, expires map[string]int64) error {
	set := map[string]string{}
	for k, v := range upd.GetCredentials() {
		if v == "" {
			delete(p.CredentialHandles, k)
			delete(p.CredentialExpiresAtMs, k)
		} else {
			set[k] = v
		}
	}
	if err := s.seal(p, set); err != nil {
		return err
	}
	if len(upd.GetConfig()) > 0 && p.Config == nil {
		p.Config = map[string]string{}
	}
	for k, v := range upd.GetConfig() {
		if v == "" {
			delete(p.Config, k)
		} else {
			p.Config[k] = v
		}
	}
	if len(expires) > 0 && p.CredentialExpiresAtMs == nil {
		p.CredentialExpiresAtMs = map[string]int64{}
	}
	for k, v := range expires {
		if v == 0 {
			delete(p.CredentialExpiresAtMs, k)
		} else {
			p.CredentialExpiresAtMs[k] = v
		}
	}
	if n := len(p.CredentialHandles); n > MaxCredentialEntries {
		return errdefs.InvalidArgument(fmt.Sprintf("provider credential sources exceed maximum entries (%d > %d)", n, MaxCredentialEntries))
	}
	if n := len(p.Config); n > MaxConfigEntries {
		return errdefs.InvalidArgument(fmt.Sprintf("provider.config exceeds maximum entries (%d > %d)", n, MaxConfigEntries))
	}
	return nil
}

// Delete removes provider name of workspace at the version read, unless
// inUse names sandboxes that still use it (FailedPrecondition, as
// OpenShell). A missing provider is (false, nil).
func (s *Store) Delete(ctx context.Context, workspace, name string, inUse func(ctx context.Context) ([]string, error)) (bool, error) {
	cur, err := s.Get(ctx, workspace, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := refuseInUse(ctx, inUse, fmt.Sprintf("provider '%s' is attached to sandbox(es)", name)); err != nil {
		return false, err
	}
	ok, err := s.deleteAt(ctx, store.TypeProvider, cur.GetMetadata(), fmt.Sprintf("provider '%s'", name))
	if ok {
		// Its refresh material goes with it.
		if err := s.deleteRefreshStates(context.WithoutCancel(ctx), workspace, cur.GetMetadata().GetId()); err != nil {
			return true, fmt.Errorf("provider '%s' deleted, its refresh material not: %w", name, err)
		}
	}
	return ok, err
}

// deleteAt removes the object of objType described by m at m's version:
// one already gone is (false, nil), another version Aborted naming what.
func (s *Store) deleteAt(ctx context.Context, objType string, m *datamodelv1.ObjectMeta, what string) (bool, error) {
	err := s.o.Objects.DeleteIf(ctx, objType, m.GetId(), m.GetResourceVersion())
	var ce *store.ConflictError
	switch {
	case errors.As(err, &ce) && ce.Gone, errors.Is(err, errdefs.ErrNotFound):
		return false, nil
	case errors.As(err, &ce):
		return false, fmt.Errorf("%s was modified concurrently (current resource_version: %d): %w", what, ce.Current, errdefs.ErrConflict)
	case err != nil:
		return false, err
	}
	return true, nil
}

// Resolve returns the plaintext of credential key of a stored provider.
// An expired credential (credential_expires_at_ms at or before now) is
// FailedPrecondition; a missing key NotFound. Errors never carry the
// value.
func (s *Store) Resolve(p *datamodelv1.Provider, key string) (string, error) {
	name := p.GetMetadata().GetName()
	h, ok := p.GetCredentialHandles()[key]
	if !ok {
		return "", errdefs.NotFound(fmt.Sprintf("provider '%s' has no credential '%s'", name, key))
	}
	if Expired(p, key, s.o.Now()) {
		return "", errdefs.FailedPrecondition(fmt.Sprintf("credential '%s' of provider '%s' has expired", key, name))
	}
	if s.o.Keyring == nil {
		return "", errdefs.Unavailable("the gateway's credential store is not configured")
	}
	if h.GetDriver() != credentials.Driver {
		return "", fmt.Errorf("credential '%s' of provider '%s': unknown credential driver %q", key, name, h.GetDriver())
	}
	v, err := s.o.Keyring.Open(credentials.Sealed{
		KEKID: h.GetMetadata()[credentials.MetaKEKID], WrappedKey: h.GetMetadata()[credentials.MetaWrappedKey], Ciphertext: h.GetHandle(),
	}, aad(p.GetMetadata().GetId(), key))
	if err != nil {
		return "", fmt.Errorf("credential '%s' of provider '%s': %w", key, name, err)
	}
	return string(v), nil
}

// Expired reports whether credential key of p has an expiry at or before
// now.
func Expired(p *datamodelv1.Provider, key string, now time.Time) bool {
	exp, ok := p.GetCredentialExpiresAtMs()[key]
	return ok && exp > 0 && exp <= now.UnixMilli()
}

// Now is the store's clock.
func (s *Store) Now() time.Time { return s.o.Now() }

// Exists is lifecycle's check for the providers a sandbox create names:
// NotFound when workspace has no provider name.
func (s *Store) Exists(ctx context.Context, workspace, name string) error {
	_, err := s.Get(ctx, workspace, name)
	return err
}

// RewrapAll moves every stored credential whose data key is wrapped under
// a previous KEK to the keyring's current one (see
// credentials.Keyring.WithPrevious); values and ciphertexts are unchanged,
// so it runs while the gateway serves. Each provider is one CAS write,
// retried on a concurrent change; so is each refresh state, whose sealed
// material is rewrapped the same way. It returns how many objects it
// rewrote. A value under a KEK the keyring does not hold is an error
// naming the provider and key.
func (s *Store) RewrapAll(ctx context.Context) (int, error) {
	if s.o.Keyring == nil {
		return 0, errdefs.Unavailable("the gateway's credential store is not configured")
	}
	n := 0
	for offset := 0; ; {
		page, err := s.List(ctx, store.ListOptions{AllWorkspaces: true, Limit: store.MaxLimit, Offset: offset})
		if err != nil {
			return n, err
		}
		for _, p := range page {
			changed, err := s.rewrapOne(ctx, p.GetMetadata().GetId())
			if err != nil {
				return n, fmt.Errorf("provider '%s' in workspace %q: %w", p.GetMetadata().GetName(), p.GetMetadata().GetWorkspace(), err)
			}
			if changed {
				n++
			}
		}
		if len(page) < store.MaxLimit {
			break
		}
		offset += len(page)
	}
	m, err := s.rewrapRefreshMaterial(ctx)
	return n + m, err
}

func (s *Store) rewrapOne(ctx context.Context, id string) (bool, error) {
	for attempt := 0; ; attempt++ {
		changed := false
		_, _, err := store.UpdateCASAs(ctx, s.o.Objects, store.TypeProvider, id, 0, newProvider, func(p *datamodelv1.Provider) error {
			changed = false
			for key, h := range p.GetCredentialHandles() {
				if h.GetDriver() != credentials.Driver {
					continue
				}
				ok, err := s.rewrapHandle(h, aad(id, key))
				if err != nil {
					return fmt.Errorf("credential '%s': %w", key, err)
				}
				changed = changed || ok
			}
			if !changed {
				return errUnchanged
			}
			return nil
		})
		var ce *store.ConflictError
		switch {
		case errors.Is(err, errUnchanged), errors.As(err, &ce) && ce.Gone, errors.Is(err, errdefs.ErrNotFound):
			return false, nil
		case errors.As(err, &ce) && attempt < 3:
			continue
		case err != nil:
			return false, err
		}
		return changed, nil
	}
}

// errUnchanged aborts a CAS write that would change nothing.
var errUnchanged = errors.New("unchanged")
