// Package providers implements the provider RPCs of openshell.v1.OpenShell:
// provider CRUD (Create/Get/List/Update/DeleteProvider), provider profiles
// (the built-in catalog plus user profiles: List/Get/Import/Update/Lint/
// DeleteProviderProfile, profiles.go), sandbox attachments
// (List/Attach/DetachSandboxProvider), credential refresh (Configure/
// Delete/GetProviderRefresh*, RotateProviderCredential; refresh.go) and the
// provider environment a sandbox's supervisor reads
// (GetSandboxProviderEnvironment).
//
// Authorization: provider reads need the user role in the workspace,
// writes the admin role (the server's per-RPC rule), and here membership
// of the named workspace; profile writes in the platform scope (workspace
// "") need a platform admin; attachments need the user role like other
// sandbox writes; the environment is served to the sandbox's own
// supervisor only.
//
// Responses to users never carry a credential value: every credential key
// maps to "REDACTED", as OpenShell's. Only the sandbox environment, served
// to the sandbox's own supervisor, carries values, bound to the endpoints
// of each provider's profile; the supervisor gives agent processes
// placeholders and resolves them in its egress proxy. Error texts never
// name a value.
package providers

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/credentials"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	domain "github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/store"
)

// Options wire a Service.
type Options struct {
	Engine    *lifecycle.Engine
	Authz     *authz.Authorizer
	Providers *domain.Store
}

// Service implements the provider RPCs. It is safe for concurrent use.
type Service struct{ o Options }

// New returns a Service.
func New(o Options) *Service { return &Service{o: o} }

const (
	roleUser  = openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER
	roleAdmin = openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN
)

// CreateProvider stores a provider with its credentials sealed.
func (s *Service) CreateProvider(ctx context.Context, req *openshellv1.CreateProviderRequest) (*openshellv1.ProviderResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Create(ctx, ws, roleAdmin); err != nil {
		return nil, err
	}
	if req.GetProvider() == nil {
		return nil, errdefs.InvalidArgument("provider is required")
	}
	p, err := s.o.Providers.Create(ctx, ws, req.GetProvider())
	if err != nil {
		return nil, err
	}
	// A workspace being deleted marks itself TERMINATING before it counts
	// its providers: either that count sees this row or this check sees
	// TERMINATING (or the workspace gone), and the row is removed again.
	if err := s.o.Authz.WorkspaceAcceptsSandboxes(ctx, ws); err != nil {
		if _, derr := s.o.Providers.Delete(context.WithoutCancel(ctx), ws, p.GetMetadata().GetName(), noUsers); derr != nil {
			return nil, fmt.Errorf("workspace %q stopped accepting providers and removing provider '%s' failed: %w", ws, p.GetMetadata().GetName(), derr)
		}
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.FailedPrecondition(fmt.Sprintf("workspace %q was deleted", ws))
		}
		return nil, err
	}
	return &openshellv1.ProviderResponse{Provider: p}, nil
}

func noUsers(context.Context) ([]string, error) { return nil, nil }

// GetProvider returns a provider, redacted.
func (s *Service) GetProvider(ctx context.Context, req *openshellv1.GetProviderRequest) (*openshellv1.ProviderResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Workspace(ctx, ws, roleUser); err != nil {
		return nil, err
	}
	p, err := s.o.Providers.Get(ctx, ws, req.GetName())
	if err != nil {
		return nil, err
	}
	return &openshellv1.ProviderResponse{Provider: domain.Redact(p)}, nil
}

// ListProviders lists a workspace's providers, or every workspace's for a
// platform admin.
func (s *Service) ListProviders(ctx context.Context, req *openshellv1.ListProvidersRequest) (*openshellv1.ListProvidersResponse, error) {
	opts := store.ListOptions{Limit: int(req.GetLimit()), Offset: int(req.GetOffset())}
	switch {
	case req.GetAllWorkspaces() && req.GetWorkspace() != "":
		return nil, errdefs.InvalidArgument("all_workspaces and workspace are mutually exclusive")
	case req.GetAllWorkspaces():
		if err := s.o.Authz.RequirePlatformAdmin(ctx); err != nil {
			return nil, err
		}
		opts.AllWorkspaces = true
	default:
		opts.Workspace = lifecycle.NormalizeWorkspace(req.GetWorkspace())
		if err := s.o.Authz.Workspace(ctx, opts.Workspace, roleUser); err != nil {
			return nil, err
		}
	}
	ps, err := s.o.Providers.List(ctx, opts)
	if err != nil {
		return nil, err
	}
	resp := &openshellv1.ListProvidersResponse{}
	for _, p := range ps {
		resp.Providers = append(resp.Providers, domain.Redact(p))
	}
	return resp, nil
}

// UpdateProvider merges credentials, config and expiry times into a
// provider, conditioned on provider.metadata.resource_version when set
// (Aborted on a mismatch).
func (s *Service) UpdateProvider(ctx context.Context, req *openshellv1.UpdateProviderRequest) (*openshellv1.ProviderResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Workspace(ctx, ws, roleAdmin); err != nil {
		return nil, err
	}
	if req.GetProvider() == nil {
		return nil, errdefs.InvalidArgument("provider is required")
	}
	p, err := s.o.Providers.Update(ctx, ws, req.GetProvider(), req.GetCredentialExpiresAtMs())
	if err != nil {
		return nil, err
	}
	return &openshellv1.ProviderResponse{Provider: p}, nil
}

// DeleteProvider removes a provider no sandbox uses; deleted is false when
// there was none.
func (s *Service) DeleteProvider(ctx context.Context, req *openshellv1.DeleteProviderRequest) (*openshellv1.DeleteProviderResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Workspace(ctx, ws, roleAdmin); err != nil {
		return nil, err
	}
	if req.GetName() == "" {
		return nil, errdefs.InvalidArgument("name is required")
	}
	ok, err := s.o.Providers.Delete(ctx, ws, req.GetName(), func(ctx context.Context) ([]string, error) {
		return s.sandboxesUsing(ctx, ws, req.GetName())
	})
	if err != nil {
		return nil, err
	}
	return &openshellv1.DeleteProviderResponse{Deleted: ok}, nil
}

// sandboxesUsing lists the sandboxes of ws whose spec names provider.
func (s *Service) sandboxesUsing(ctx context.Context, ws, provider string) ([]string, error) {
	var users []string
	for offset := 0; ; {
		page, err := s.o.Engine.List(ctx, lifecycle.ListOptions{Workspace: ws, Limit: store.MaxLimit, Offset: offset})
		if err != nil {
			return nil, err
		}
		for _, sb := range page {
			if slices.Contains(sb.GetSpec().GetProviders(), provider) {
				users = append(users, sb.GetMetadata().GetName())
			}
		}
		if len(page) < store.MaxLimit {
			return users, nil
		}
		offset += len(page)
	}
}

// ListSandboxProviders lists the providers attached to a sandbox,
// redacted, in attachment order.
func (s *Service) ListSandboxProviders(ctx context.Context, req *openshellv1.ListSandboxProvidersRequest) (*openshellv1.ListSandboxProvidersResponse, error) {
	if err := s.o.Authz.Sandbox(ctx, req.GetWorkspace(), req.GetSandboxName(), roleUser); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Get(ctx, req.GetWorkspace(), req.GetSandboxName())
	if err != nil {
		return nil, err
	}
	ps, err := s.attached(ctx, sb)
	if err != nil {
		return nil, err
	}
	resp := &openshellv1.ListSandboxProvidersResponse{}
	for _, p := range ps {
		resp.Providers = append(resp.Providers, domain.Redact(p))
	}
	return resp, nil
}

// attached loads the providers a sandbox names. One that no longer exists
// is FailedPrecondition, as OpenShell.
func (s *Service) attached(ctx context.Context, sb *openshellv1.Sandbox) ([]*datamodelv1.Provider, error) {
	ws := sb.GetMetadata().GetWorkspace()
	var out []*datamodelv1.Provider
	for _, name := range sb.GetSpec().GetProviders() {
		p, err := s.o.Providers.Get(ctx, ws, name)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.FailedPrecondition(fmt.Sprintf("provider '%s' not found", name))
		}
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func validateProviderName(name string) error {
	if name == "" {
		return errdefs.InvalidArgument("provider_name is required")
	}
	if len(name) > domain.MaxNameLen {
		return errdefs.InvalidArgument(fmt.Sprintf("provider_name exceeds maximum length (%d > %d)", len(name), domain.MaxNameLen))
	}
	return nil
}

// AttachSandboxProvider adds a provider to a sandbox's spec (a no-op,
// attached=false, when it is already there), conditioned on
// expected_resource_version when set.
func (s *Service) AttachSandboxProvider(ctx context.Context, req *openshellv1.AttachSandboxProviderRequest) (*openshellv1.AttachSandboxProviderResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Sandbox(ctx, ws, req.GetSandboxName(), roleUser); err != nil {
		return nil, err
	}
	if err := validateProviderName(req.GetProviderName()); err != nil {
		return nil, err
	}
	name := req.GetProviderName()
	if err := s.o.Providers.Exists(ctx, ws, name); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.FailedPrecondition(fmt.Sprintf("provider '%s' not found", name))
		}
		return nil, err
	}
	var refuse error
	sb, changed, err := s.o.Engine.EditProviders(ctx, ws, req.GetSandboxName(), req.GetExpectedResourceVersion(), func(cur []string) ([]string, bool) {
		refuse = nil
		if slices.Contains(cur, name) {
			return cur, false
		}
		if len(cur) >= domain.MaxProvidersInSandbox {
			refuse = errdefs.InvalidArgument(fmt.Sprintf("providers list exceeds maximum (%d)", domain.MaxProvidersInSandbox))
			return cur, false
		}
		return append(slices.Clone(cur), name), true
	})
	if err != nil {
		return nil, casError(err, req.GetSandboxName())
	}
	if refuse != nil {
		return nil, refuse
	}
	// DeleteProvider scans sandboxes before it removes the provider: either
	// that scan saw this attachment or this check sees the provider gone,
	// and the attachment is taken back.
	if changed {
		if err := s.o.Providers.Exists(ctx, ws, name); errors.Is(err, errdefs.ErrNotFound) {
			if _, _, derr := s.o.Engine.EditProviders(context.WithoutCancel(ctx), ws, req.GetSandboxName(), 0, without(name)); derr != nil {
				return nil, fmt.Errorf("provider '%s' was deleted during the attach and detaching it failed: %w", name, derr)
			}
			return nil, errdefs.FailedPrecondition(fmt.Sprintf("provider '%s' not found", name))
		}
	}
	return &openshellv1.AttachSandboxProviderResponse{Sandbox: sb, Attached: changed}, nil
}

// DetachSandboxProvider removes a provider from a sandbox's spec
// (detached=false when it was not there), conditioned on
// expected_resource_version when set.
func (s *Service) DetachSandboxProvider(ctx context.Context, req *openshellv1.DetachSandboxProviderRequest) (*openshellv1.DetachSandboxProviderResponse, error) {
	ws := lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := s.o.Authz.Sandbox(ctx, ws, req.GetSandboxName(), roleUser); err != nil {
		return nil, err
	}
	if err := validateProviderName(req.GetProviderName()); err != nil {
		return nil, err
	}
	name := req.GetProviderName()
	sb, changed, err := s.o.Engine.EditProviders(ctx, ws, req.GetSandboxName(), req.GetExpectedResourceVersion(), without(name))
	if err != nil {
		return nil, casError(err, req.GetSandboxName())
	}
	return &openshellv1.DetachSandboxProviderResponse{Sandbox: sb, Detached: changed}, nil
}

// without is the provider-list edit that removes name.
func without(name string) func([]string) ([]string, bool) {
	return func(cur []string) ([]string, bool) {
		if !slices.Contains(cur, name) {
			return cur, false
		}
		return slices.DeleteFunc(slices.Clone(cur), func(n string) bool { return n == name }), true
	}
}

// casError words a sandbox version conflict for the caller (Aborted).
func casError(err error, sandbox string) error {
	var ce *store.ConflictError
	if errors.As(err, &ce) && !ce.Gone {
		return fmt.Errorf("sandbox %q was modified concurrently (current resource_version: %d): %w", sandbox, ce.Current, errdefs.ErrConflict)
	}
	return err
}

// GetSandboxProviderEnvironment returns, to the sandbox's own supervisor,
// as OpenShell's gateway does: for a supervisor that enforces endpoint
// bindings (supports_static_credential_bindings), every attached
// provider's credential values by key, each with the endpoints of its
// provider's profile (static_credential_bindings) and its expiry; the
// supervisor hands agent processes placeholders and resolves them in its
// egress proxy. A supervisor without that ability gets no credential
// (OpenShell withholds them too). Left out always: expired credentials,
// keys that are not environment variable names, credentials of providers
// whose profile names no endpoint (nowhere they could be sent), and a key
// an earlier attached provider already gave. provider_env_revision
// changes whenever an attached provider or the attachment list does.
func (s *Service) GetSandboxProviderEnvironment(ctx context.Context, req *openshellv1.GetSandboxProviderEnvironmentRequest) (*openshellv1.GetSandboxProviderEnvironmentResponse, error) {
	if err := authz.RequireOwnSandbox(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	sb, err := s.o.Authz.SandboxForCaller(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	ps, err := s.attached(ctx, sb)
	if err != nil {
		return nil, err
	}
	// One profile catalog for every provider of this request.
	ctx, err = s.o.Providers.CaptureProfiles(ctx)
	if err != nil {
		return nil, err
	}
	resp := &openshellv1.GetSandboxProviderEnvironmentResponse{
		Environment: map[string]string{}, CredentialExpiresAtMs: map[string]int64{},
		StaticCredentialBindings: map[string]*openshellv1.StaticCredentialBinding{},
	}
	h := fnv.New64a()
	now := s.o.Providers.Now()
	for _, p := range ps {
		m := p.GetMetadata()
		_, _ = h.Write([]byte(m.GetId() + "@" + strconv.FormatUint(m.GetResourceVersion(), 10) + ";"))
		endpoints, err := s.bindingEndpoints(ctx, p)
		if err != nil {
			return nil, err
		}
		if !req.GetSupportsStaticCredentialBindings() || len(endpoints) == 0 {
			continue
		}
		for _, key := range slices.Sorted(maps.Keys(p.GetCredentialHandles())) {
			if _, taken := resp.Environment[key]; taken || !credentials.ValidKey(key) || domain.Expired(p, key, now) {
				continue
			}
			v, err := s.o.Providers.Resolve(p, key)
			if errors.Is(err, errdefs.ErrFailedPrecondition) {
				continue // expired since the check above
			}
			if err != nil {
				return nil, err
			}
			resp.Environment[key] = v
			resp.StaticCredentialBindings[key] = &openshellv1.StaticCredentialBinding{
				Endpoints: endpoints, CredentialIdentity: m.GetId() + ":" + key,
			}
			if exp, ok := p.GetCredentialExpiresAtMs()[key]; ok && exp > 0 {
				resp.CredentialExpiresAtMs[key] = exp
			}
		}
	}
	if len(ps) > 0 {
		resp.ProviderEnvRevision = h.Sum64()
	}
	return resp, nil
}

// bindingEndpoints are the endpoints of p's profile (built-in or user),
// one per port, where p's credentials may be sent.
func (s *Service) bindingEndpoints(ctx context.Context, p *datamodelv1.Provider) ([]*openshellv1.StaticCredentialEndpointBinding, error) {
	prof, ok, err := s.o.Providers.ProfileOf(ctx, p)
	if err != nil || !ok {
		return nil, err
	}
	var out []*openshellv1.StaticCredentialEndpointBinding
	for _, e := range prof.GetEndpoints() {
		ports := e.GetPorts()
		if len(ports) == 0 && e.GetPort() != 0 {
			ports = []uint32{e.GetPort()}
		}
		for _, port := range ports {
			out = append(out, &openshellv1.StaticCredentialEndpointBinding{Host: e.GetHost(), Port: port, Path: e.GetPath()})
		}
	}
	return out, nil
}
