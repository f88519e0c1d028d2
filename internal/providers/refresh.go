package providers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/credentials"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

// Credential refresh keeps its material (client id, client secret, refresh
// token, ...) in an object of its own, object type "provider_refresh"
// (StoredProviderCredentialRefreshState), in the provider's workspace, named
// "<provider id>.<credential key>". Secret material never stays inline: it
// is sealed like credential values (secret_material_handles, associated
// data "<state id>/material/<key>").
const TypeProviderRefresh = store.TypeProviderRefresh

// Refresh states, as OpenShell reports them.
const (
	RefreshConfigured = "configured"
	RefreshRefreshed  = "refreshed"
	RefreshError      = "error"
)

const (
	strategyRefreshToken      = openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_OAUTH2_REFRESH_TOKEN
	strategyClientCredentials = openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_OAUTH2_CLIENT_CREDENTIALS
	// defaultLifetime applies when the token endpoint names no expiry.
	defaultLifetime = time.Hour
)

// strategySecretKeys are the material keys always sealed for a strategy,
// and strategyRequired the keys a strategy cannot mint without.
var (
	strategySecretKeys = map[openshellv1.ProviderCredentialRefreshStrategy][]string{
		strategyRefreshToken:      {"refresh_token", "client_secret"},
		strategyClientCredentials: {"client_secret"},
	}
	strategyRequired = map[openshellv1.ProviderCredentialRefreshStrategy][]string{
		strategyRefreshToken:      {"client_id", "refresh_token"},
		strategyClientCredentials: {"client_id", "client_secret"},
	}
)

func strategyName(s openshellv1.ProviderCredentialRefreshStrategy) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "PROVIDER_CREDENTIAL_REFRESH_STRATEGY_"))
}

func newRefreshState() *openshellv1.StoredProviderCredentialRefreshState {
	return &openshellv1.StoredProviderCredentialRefreshState{}
}

func refreshName(providerID, key string) string { return providerID + "." + key }

func materialAAD(stateID, key string) string { return stateID + "/material/" + key }

// RefreshStatus is the public view of a refresh state.
func RefreshStatus(st *openshellv1.StoredProviderCredentialRefreshState) *openshellv1.ProviderCredentialRefreshStatus {
	return &openshellv1.ProviderCredentialRefreshStatus{
		ProviderName: st.GetProviderName(), ProviderId: st.GetProviderId(), CredentialKey: st.GetCredentialKey(),
		Strategy: st.GetStrategy(), Status: st.GetStatus(), ExpiresAtMs: st.GetExpiresAtMs(),
		NextRefreshAtMs: st.GetNextRefreshAtMs(), LastRefreshAtMs: st.GetLastRefreshAtMs(), LastError: st.GetLastError(),
	}
}

// refreshProfile returns the refresh block of the profile credential of p
// named key (by credential name or environment variable), if any.
func (s *Store) refreshProfile(ctx context.Context, p *datamodelv1.Provider, key string) (*openshellv1.ProviderCredentialRefresh, error) {
	prof, ok, err := s.ProfileOf(ctx, p)
	if err != nil || !ok {
		return nil, err
	}
	for _, c := range prof.GetCredentials() {
		if c.GetName() == key || slices.Contains(c.GetEnvVars(), key) {
			return c.GetRefresh(), nil
		}
	}
	return nil, nil
}

// ConfigureRefresh stores (or replaces) how credential key of provider
// name in workspace is minted, as OpenShell's ConfigureProviderRefresh:
// only the gateway-mintable OAuth2 strategies, the token endpoint from the
// provider's profile (never from material), secret material sealed. It
// mints nothing; RotateCredential does.
func (s *Store) ConfigureRefresh(ctx context.Context, workspace string, req *openshellv1.ConfigureProviderRefreshRequest) (*openshellv1.ProviderCredentialRefreshStatus, error) {
	name, key := strings.TrimSpace(req.GetProvider()), strings.TrimSpace(req.GetCredentialKey())
	switch {
	case name == "":
		return nil, errdefs.InvalidArgument("provider is required")
	case key == "":
		return nil, errdefs.InvalidArgument("credential_key is required")
	case !credentials.ValidKey(key):
		return nil, errdefs.InvalidArgument("credential_key must be a valid environment variable name")
	}
	strategy := req.GetStrategy()
	switch strategy {
	case openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_UNSPECIFIED:
		return nil, errdefs.InvalidArgument("refresh strategy is required")
	case openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_STATIC,
		openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_EXTERNAL:
		return nil, errdefs.InvalidArgument(fmt.Sprintf("refresh strategy '%s' is not gateway-mintable; update current credentials with provider update instead", strategyName(strategy)))
	case strategyRefreshToken, strategyClientCredentials:
	default:
		return nil, errdefs.InvalidArgument(fmt.Sprintf("refresh strategy '%s' is not supported by this gateway", strategyName(strategy)))
	}
	if err := checkMaterial(req); err != nil {
		return nil, err
	}
	if s.o.Keyring == nil {
		return nil, errdefs.Unavailable("the gateway's credential store is not configured")
	}
	p, err := s.Get(ctx, workspace, name)
	if err != nil {
		return nil, err
	}
	defaults, err := s.refreshProfile(ctx, p, key)
	if err != nil {
		return nil, err
	}
	if defaults.GetTokenUrl() == "" {
		return nil, errdefs.FailedPrecondition(fmt.Sprintf("provider '%s' profile defines no refresh token endpoint for credential '%s'", name, key))
	}
	st, err := s.newRefreshState(p, key, req, defaults)
	if err != nil {
		return nil, err
	}
	cur, err := s.refreshState(ctx, workspace, p.GetMetadata().GetId(), key)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		_, err = s.o.Objects.Create(ctx, TypeProviderRefresh, st)
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			err = fmt.Errorf("provider refresh was concurrently modified during configuration: %w", errdefs.ErrConflict)
		}
	case err == nil:
		st.Metadata = cur.GetMetadata()
		st.LastRefreshAtMs = cur.GetLastRefreshAtMs()
		if err := s.sealMaterial(st, req); err != nil { // sealed again under the kept id
			return nil, err
		}
		_, err = s.o.Objects.Update(ctx, TypeProviderRefresh, st, cur.GetMetadata().GetResourceVersion())
		var ce *store.ConflictError
		if errors.As(err, &ce) {
			err = fmt.Errorf("provider refresh was concurrently modified during configuration: %w", errdefs.ErrConflict)
		}
	}
	if err != nil {
		return nil, err
	}
	if req.ExpiresAtMs != nil {
		if _, err := s.Update(ctx, workspace, &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: name}}, map[string]int64{key: req.GetExpiresAtMs()}); err != nil {
			return nil, err
		}
	}
	return RefreshStatus(st), nil
}

// checkMaterial applies OpenShell's limits and rules to a configure
// request's material.
func checkMaterial(req *openshellv1.ConfigureProviderRefreshRequest) error {
	m := req.GetMaterial()
	if n := len(m); n > MaxConfigEntries {
		return errdefs.InvalidArgument(fmt.Sprintf("material exceeds maximum entries (%d > %d)", n, MaxConfigEntries))
	}
	for k, v := range m {
		if len(k) > MaxMapKeyLen {
			return errdefs.InvalidArgument(fmt.Sprintf("material key exceeds maximum length (%d > %d)", len(k), MaxMapKeyLen))
		}
		if len(v) > MaxMapValueLen {
			return errdefs.InvalidArgument(fmt.Sprintf("material value exceeds maximum length (%d > %d)", len(v), MaxMapValueLen))
		}
	}
	if strings.TrimSpace(m["token_url"]) != "" || strings.TrimSpace(m["token_uri"]) != "" {
		return errdefs.InvalidArgument("refresh token endpoints must be defined by the provider profile, not material")
	}
	for _, k := range req.GetSecretMaterialKeys() {
		if _, ok := m[k]; !ok {
			return errdefs.InvalidArgument(fmt.Sprintf("secret_material_keys entry '%s' is not present in material", k))
		}
	}
	for _, k := range strategyRequired[req.GetStrategy()] {
		if strings.TrimSpace(m[k]) == "" {
			return errdefs.InvalidArgument(fmt.Sprintf("%s material is required", k))
		}
	}
	if req.ExpiresAtMs != nil && req.GetExpiresAtMs() < 0 {
		return errdefs.InvalidArgument("expires_at_ms must be greater than or equal to 0")
	}
	for _, k := range []string{"refresh_before_seconds", "max_lifetime_seconds"} {
		if v, ok := m[k]; ok {
			if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
				return errdefs.InvalidArgument(fmt.Sprintf("%s material must be an integer greater than or equal to 0", k))
			}
		}
	}
	return nil
}

// newRefreshState builds the state for a configure request, its secret
// material sealed.
func (s *Store) newRefreshState(p *datamodelv1.Provider, key string, req *openshellv1.ConfigureProviderRefreshRequest, defaults *openshellv1.ProviderCredentialRefresh) (*openshellv1.StoredProviderCredentialRefreshState, error) {
	m := req.GetMaterial()
	st := &openshellv1.StoredProviderCredentialRefreshState{
		Metadata:   &datamodelv1.ObjectMeta{Id: uuid.NewString(), Name: refreshName(p.GetMetadata().GetId(), key), Workspace: p.GetMetadata().GetWorkspace()},
		ProviderId: p.GetMetadata().GetId(), ProviderName: p.GetMetadata().GetName(), CredentialKey: key,
		Strategy: req.GetStrategy(), Status: RefreshConfigured, TokenUrl: defaults.GetTokenUrl(), Scopes: defaults.GetScopes(),
		RefreshBeforeSeconds: defaults.GetRefreshBeforeSeconds(), MaxLifetimeSeconds: defaults.GetMaxLifetimeSeconds(),
		ExpiresAtMs: req.GetExpiresAtMs(),
	}
	if v, ok := m["scope"]; ok {
		st.Scopes = strings.Fields(strings.ReplaceAll(v, ",", " "))
	}
	if v, ok := m["refresh_before_seconds"]; ok {
		st.RefreshBeforeSeconds, _ = strconv.ParseInt(v, 10, 64)
	}
	if v, ok := m["max_lifetime_seconds"]; ok {
		st.MaxLifetimeSeconds, _ = strconv.ParseInt(v, 10, 64)
	}
	return st, s.sealMaterial(st, req)
}

// sealMaterial splits req's material into inline (not secret) and sealed
// secret material of st.
func (s *Store) sealMaterial(st *openshellv1.StoredProviderCredentialRefreshState, req *openshellv1.ConfigureProviderRefreshRequest) error {
	secret := map[string]bool{}
	for _, k := range req.GetSecretMaterialKeys() {
		secret[k] = true
	}
	for _, k := range strategySecretKeys[req.GetStrategy()] {
		if _, ok := req.GetMaterial()[k]; ok {
			secret[k] = true
		}
	}
	st.Material, st.SecretMaterialHandles = map[string]string{}, map[string]*datamodelv1.CredentialHandle{}
	st.SecretMaterialKeys = slices.Sorted(maps.Keys(secret))
	for k, v := range req.GetMaterial() {
		if !secret[k] {
			st.Material[k] = v
			continue
		}
		h, err := s.sealHandle(v, materialAAD(st.GetMetadata().GetId(), k))
		if err != nil {
			return fmt.Errorf("seal refresh material %q: %w", k, err)
		}
		st.SecretMaterialHandles[k] = h
	}
	return nil
}

func (s *Store) sealHandle(v, aad string) (*datamodelv1.CredentialHandle, error) {
	sealed, err := s.o.Keyring.Seal([]byte(v), aad)
	if err != nil {
		return nil, err
	}
	return &datamodelv1.CredentialHandle{Driver: credentials.Driver, Handle: sealed.Ciphertext,
		Metadata: map[string]string{credentials.MetaKEKID: sealed.KEKID, credentials.MetaWrappedKey: sealed.WrappedKey}}, nil
}

func (s *Store) openHandle(h *datamodelv1.CredentialHandle, aad string) (string, error) {
	if h.GetDriver() != credentials.Driver {
		return "", fmt.Errorf("unknown credential driver %q", h.GetDriver())
	}
	v, err := s.o.Keyring.Open(credentials.Sealed{KEKID: h.GetMetadata()[credentials.MetaKEKID], WrappedKey: h.GetMetadata()[credentials.MetaWrappedKey], Ciphertext: h.GetHandle()}, aad)
	return string(v), err
}

// refreshState reads the refresh state of credential key of provider id.
func (s *Store) refreshState(ctx context.Context, workspace, providerID, key string) (*openshellv1.StoredProviderCredentialRefreshState, error) {
	st := newRefreshState()
	if err := s.o.Objects.GetByName(ctx, TypeProviderRefresh, workspace, refreshName(providerID, key), st); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.NotFound("provider refresh state not found")
		}
		return nil, err
	}
	return st, nil
}

// refreshStates lists the refresh states of provider id.
func (s *Store) refreshStates(ctx context.Context, workspace, providerID string) ([]*openshellv1.StoredProviderCredentialRefreshState, error) {
	var out []*openshellv1.StoredProviderCredentialRefreshState
	for offset := 0; ; {
		page, err := store.ListAs(ctx, s.o.Objects, TypeProviderRefresh, store.ListOptions{Workspace: workspace, Limit: store.MaxLimit, Offset: offset}, newRefreshState)
		if err != nil {
			return nil, err
		}
		for _, st := range page {
			if st.GetProviderId() == providerID {
				out = append(out, st)
			}
		}
		if len(page) < store.MaxLimit {
			return out, nil
		}
		offset += len(page)
	}
}

// RefreshStatuses returns the refresh status of credential key of
// provider name (every configured key when key is empty).
func (s *Store) RefreshStatuses(ctx context.Context, workspace, name, key string) ([]*openshellv1.ProviderCredentialRefreshStatus, error) {
	if strings.TrimSpace(name) == "" {
		return nil, errdefs.InvalidArgument("provider is required")
	}
	p, err := s.Get(ctx, workspace, strings.TrimSpace(name))
	if err != nil {
		return nil, err
	}
	var sts []*openshellv1.StoredProviderCredentialRefreshState
	if key = strings.TrimSpace(key); key != "" {
		st, err := s.refreshState(ctx, workspace, p.GetMetadata().GetId(), key)
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
		if st != nil {
			sts = append(sts, st)
		}
	} else if sts, err = s.refreshStates(ctx, workspace, p.GetMetadata().GetId()); err != nil {
		return nil, err
	}
	var out []*openshellv1.ProviderCredentialRefreshStatus
	for _, st := range sts {
		out = append(out, RefreshStatus(st))
	}
	return out, nil
}

// DeleteRefresh removes the refresh of credential key of provider name;
// the credential's current value stays, and its expiry too unless it came
// from the refresh (as OpenShell: a manually set expiry is kept). A
// missing one is (false, nil).
func (s *Store) DeleteRefresh(ctx context.Context, workspace, name, key string) (bool, error) {
	name, key = strings.TrimSpace(name), strings.TrimSpace(key)
	switch {
	case name == "":
		return false, errdefs.InvalidArgument("provider is required")
	case key == "":
		return false, errdefs.InvalidArgument("credential_key is required")
	}
	p, err := s.Get(ctx, workspace, name)
	if err != nil {
		return false, err
	}
	st, err := s.refreshState(ctx, workspace, p.GetMetadata().GetId(), key)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	ok, err := s.deleteAt(ctx, TypeProviderRefresh, st.GetMetadata(), "provider refresh")
	if !ok || err != nil || st.GetExpiresAtMs() <= 0 {
		return ok, err
	}
	_, _, err = store.UpdateCASAs(ctx, s.o.Objects, store.TypeProvider, p.GetMetadata().GetId(), 0, newProvider, func(p *datamodelv1.Provider) error {
		if p.GetCredentialExpiresAtMs()[key] != st.GetExpiresAtMs() {
			return errUnchanged
		}
		delete(p.CredentialExpiresAtMs, key)
		return nil
	})
	if errors.Is(err, errUnchanged) {
		err = nil
	}
	return true, err
}

// deleteRefreshStates removes every refresh state of a deleted provider.
func (s *Store) deleteRefreshStates(ctx context.Context, workspace, providerID string) error {
	sts, err := s.refreshStates(ctx, workspace, providerID)
	if err != nil {
		return err
	}
	for _, st := range sts {
		if _, err := s.o.Objects.Delete(ctx, TypeProviderRefresh, st.GetMetadata().GetId()); err != nil {
			return err
		}
	}
	return nil
}

// RotateCredential mints a new value for credential key of provider name
// with its refresh's OAuth2 grant and swaps it in with one conditional
// write of the provider (value and expiry together). A failed mint revokes
// the current value (the key is removed from the provider, so sandboxes
// stop resolving it) and records the error in the refresh state; the
// error is returned. A refresh token the token endpoint rotates is sealed
// in place of the old one.
func (s *Store) RotateCredential(ctx context.Context, workspace, name, key string) (*openshellv1.ProviderCredentialRefreshStatus, error) {
	name, key = strings.TrimSpace(name), strings.TrimSpace(key)
	switch {
	case name == "":
		return nil, errdefs.InvalidArgument("provider is required")
	case key == "":
		return nil, errdefs.InvalidArgument("credential_key is required")
	}
	if s.o.Keyring == nil {
		return nil, errdefs.Unavailable("the gateway's credential store is not configured")
	}
	p, err := s.Get(ctx, workspace, name)
	if err != nil {
		return nil, err
	}
	st, err := s.refreshState(ctx, workspace, p.GetMetadata().GetId(), key)
	if err != nil {
		return nil, err
	}
	tok, mintErr := s.mint(ctx, st)
	now := s.o.Now()
	next := proto.Clone(st).(*openshellv1.StoredProviderCredentialRefreshState)
	if mintErr != nil {
		// The background refresher retries; a success restores a value.
		next.Status, next.LastError = RefreshError, mintErr.Error()
		next.NextRefreshAtMs = now.Add(refreshRetry).UnixMilli()
	} else {
		expires := tok.Expiry
		if tok.ExpiresIn > 0 { // on the store's clock
			expires = now.Add(time.Duration(tok.ExpiresIn) * time.Second)
		}
		lifetime := time.Duration(st.GetMaxLifetimeSeconds()) * time.Second
		if lifetime <= 0 {
			lifetime = defaultLifetime
		}
		if expires.IsZero() || expires.After(now.Add(lifetime)) {
			expires = now.Add(lifetime)
		}
		next.Status, next.LastError = RefreshRefreshed, ""
		next.ExpiresAtMs, next.LastRefreshAtMs = expires.UnixMilli(), now.UnixMilli()
		next.NextRefreshAtMs = expires.Add(-time.Duration(st.GetRefreshBeforeSeconds()) * time.Second).UnixMilli()
		if rt := tok.RefreshToken; rt != "" && st.GetStrategy() == strategyRefreshToken {
			h, err := s.sealHandle(rt, materialAAD(st.GetMetadata().GetId(), "refresh_token"))
			if err != nil {
				return nil, err
			}
			next.SecretMaterialHandles["refresh_token"] = h
		}
	}
	// Claim this generation of the refresh first: a concurrent rotation or
	// delete wins and nothing minted here is written.
	if _, err := s.o.Objects.Update(ctx, TypeProviderRefresh, next, st.GetMetadata().GetResourceVersion()); err != nil {
		var ce *store.ConflictError
		if errors.As(err, &ce) {
			return nil, fmt.Errorf("provider refresh was deleted or superseded during rotation: %w", errdefs.ErrConflict)
		}
		return nil, err
	}
	if err := s.swapCredential(ctx, p.GetMetadata().GetId(), key, tok, next.GetExpiresAtMs()); err != nil {
		return nil, err
	}
	if mintErr != nil {
		return nil, errdefs.FailedPrecondition(fmt.Sprintf("credential '%s' of provider '%s' was revoked: %v", key, name, mintErr))
	}
	return RefreshStatus(next), nil
}

// swapCredential writes the minted value of key (with its expiry) into
// the provider in one conditional write, retried on concurrent changes of
// other fields; tok nil removes the key (revocation).
func (s *Store) swapCredential(ctx context.Context, providerID, key string, tok *oauth2.Token, expiresAtMs int64) error {
	for attempt := 0; ; attempt++ {
		_, _, err := store.UpdateCASAs(ctx, s.o.Objects, store.TypeProvider, providerID, 0, newProvider, func(p *datamodelv1.Provider) error {
			if tok == nil {
				delete(p.CredentialHandles, key)
				delete(p.CredentialExpiresAtMs, key)
				return nil
			}
			if err := s.seal(p, map[string]string{key: tok.AccessToken}); err != nil {
				return err
			}
			if p.CredentialExpiresAtMs == nil {
				p.CredentialExpiresAtMs = map[string]int64{}
			}
			p.CredentialExpiresAtMs[key] = expiresAtMs
			return nil
		})
		var ce *store.ConflictError
		if errors.As(err, &ce) && !ce.Gone && attempt < 3 {
			continue
		}
		if errors.As(err, &ce) && ce.Gone {
			return errdefs.NotFound("provider not found")
		}
		return err
	}
}

// tokenHTTP is the client the token endpoint is called with.
var tokenHTTP = &http.Client{Timeout: 30 * time.Second}

// mint runs st's OAuth2 grant against its token endpoint. Errors name the
// endpoint's answer (HTTP status and OAuth2 error code), never material.
func (s *Store) mint(ctx context.Context, st *openshellv1.StoredProviderCredentialRefreshState) (*oauth2.Token, error) {
	if msg := checkTokenURL(st.GetTokenUrl()); msg != "" {
		return nil, errors.New(msg)
	}
	m := maps.Clone(st.GetMaterial())
	if m == nil {
		m = map[string]string{}
	}
	for k, h := range st.GetSecretMaterialHandles() {
		v, err := s.openHandle(h, materialAAD(st.GetMetadata().GetId(), k))
		if err != nil {
			return nil, fmt.Errorf("refresh material %q cannot be opened: %w", k, err)
		}
		m[k] = v
	}
	ctx = context.WithValue(ctx, oauth2.HTTPClient, tokenHTTP)
	var tok *oauth2.Token
	var err error
	switch st.GetStrategy() {
	case strategyRefreshToken:
		c := &oauth2.Config{ClientID: m["client_id"], ClientSecret: m["client_secret"], Scopes: st.GetScopes(),
			Endpoint: oauth2.Endpoint{TokenURL: st.GetTokenUrl(), AuthStyle: oauth2.AuthStyleInParams}}
		tok, err = c.TokenSource(ctx, &oauth2.Token{RefreshToken: m["refresh_token"]}).Token()
	case strategyClientCredentials:
		c := &clientcredentials.Config{ClientID: m["client_id"], ClientSecret: m["client_secret"], TokenURL: st.GetTokenUrl(),
			Scopes: st.GetScopes(), AuthStyle: oauth2.AuthStyleInParams}
		tok, err = c.Token(ctx)
	default:
		return nil, fmt.Errorf("refresh strategy '%s' is not supported by this gateway", strategyName(st.GetStrategy()))
	}
	var re *oauth2.RetrieveError
	var ue *url.Error
	switch {
	case errors.As(err, &re):
		msg := fmt.Sprintf("token endpoint returned HTTP %d", re.Response.StatusCode)
		if re.ErrorCode != "" {
			msg += " (" + re.ErrorCode + ")"
		}
		return nil, errors.New(msg)
	case errors.As(err, &ue):
		return nil, fmt.Errorf("token endpoint request failed: %w", ue.Err)
	case err != nil:
		return nil, fmt.Errorf("token endpoint: %w", err)
	case tok.AccessToken == "":
		return nil, errors.New("token endpoint returned empty access_token")
	}
	return tok, nil
}

// rewrapRefreshMaterial moves the sealed refresh material of every
// refresh state to the keyring's current KEK (one CAS write per state,
// retried on a concurrent change). It returns how many states it rewrote.
func (s *Store) rewrapRefreshMaterial(ctx context.Context) (int, error) {
	sts, err := s.allRefreshStates(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, st := range sts {
		id := st.GetMetadata().GetId()
		for attempt := 0; ; attempt++ {
			changed := false
			_, _, err := store.UpdateCASAs(ctx, s.o.Objects, TypeProviderRefresh, id, 0, newRefreshState, func(st *openshellv1.StoredProviderCredentialRefreshState) error {
				changed = false
				for k, h := range st.GetSecretMaterialHandles() {
					ok, err := s.rewrapHandle(h, materialAAD(id, k))
					if err != nil {
						return fmt.Errorf("refresh of credential '%s' of provider '%s', material %q: %w", st.GetCredentialKey(), st.GetProviderName(), k, err)
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
			case errors.As(err, &ce) && attempt < 3:
				continue
			case err != nil:
				return n, err
			default:
				n++
			}
			break
		}
	}
	return n, nil
}

// allRefreshStates lists the refresh states of every workspace.
func (s *Store) allRefreshStates(ctx context.Context) ([]*openshellv1.StoredProviderCredentialRefreshState, error) {
	var out []*openshellv1.StoredProviderCredentialRefreshState
	for offset := 0; ; {
		page, err := store.ListAs(ctx, s.o.Objects, TypeProviderRefresh, store.ListOptions{AllWorkspaces: true, Limit: store.MaxLimit, Offset: offset}, newRefreshState)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(page) < store.MaxLimit {
			return out, nil
		}
		offset += len(page)
	}
}

// refreshClaim is how long a gateway replica holds a due refresh it is
// minting: other replicas see next_refresh_at_ms moved by this much and
// leave it alone.
const refreshClaim = 2 * time.Minute

// refreshRetry is when a failed refresh is tried again.
const refreshRetry = time.Minute

// RefreshDue mints every refreshed credential whose next_refresh_at_ms
// has come (credentials never minted yet wait for a first
// RotateProviderCredential). Each due refresh is first claimed with a
// conditional write, so that of several gateway replicas one mints it (a
// token endpoint that rotates refresh tokens sees one use). It returns
// how many it minted; failures are recorded in the refresh states (and
// revoke the value) and logged.
func (s *Store) RefreshDue(ctx context.Context, log *slog.Logger) (int, error) {
	if s.o.Keyring == nil {
		return 0, nil
	}
	sts, err := s.allRefreshStates(ctx)
	if err != nil {
		return 0, err
	}
	now := s.o.Now()
	n := 0
	for _, st := range sts {
		if st.GetNextRefreshAtMs() <= 0 || st.GetNextRefreshAtMs() > now.UnixMilli() || st.GetStatus() == RefreshConfigured {
			continue
		}
		claimed := proto.Clone(st).(*openshellv1.StoredProviderCredentialRefreshState)
		claimed.NextRefreshAtMs = now.Add(refreshClaim).UnixMilli()
		if _, err := s.o.Objects.Update(ctx, TypeProviderRefresh, claimed, st.GetMetadata().GetResourceVersion()); err != nil {
			continue // another replica claimed it, or it changed: the next pass sees it
		}
		ws, name, key := st.GetMetadata().GetWorkspace(), st.GetProviderName(), st.GetCredentialKey()
		if _, err := s.RotateCredential(ctx, ws, name, key); err != nil {
			log.Warn("provider credential refresh failed", "workspace", ws, "provider", name, "credential_key", key, "err", err)
			continue
		}
		n++
	}
	return n, nil
}

// RunRefresher calls RefreshDue every interval until ctx ends.
func (s *Store) RunRefresher(ctx context.Context, log *slog.Logger, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := s.RefreshDue(ctx, log); err != nil && ctx.Err() == nil {
			log.Warn("provider credential refresh pass failed", "err", err)
		} else if n > 0 {
			log.Info("provider credentials refreshed", "credentials", n)
		}
	}
}
