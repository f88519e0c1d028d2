// Package inference implements openshell.inference.v1.Inference: the
// inference routes of a workspace (Set/Get/DeleteInferenceRoute) and the
// bundle a sandbox's supervisor reads (GetInferenceBundle).
//
// A route stores only what the user set: provider name, model id and
// timeout, as object type "inference_route" named "inference.local" (the
// route sandboxes reach at http://inference.local) or "sandbox-system",
// in the workspace. Endpoint, protocols, credential and route shaping are
// resolved from the provider each time a supervisor asks for its bundle
// (package internal/inference), so provider changes and credential
// rotation reach sandboxes without touching the route.
//
// Authorization: setting and deleting a route needs the admin role in
// the workspace, reading it the user role (the server's per-RPC rule, and
// here membership of the named workspace). GetInferenceBundle is served
// to sandbox principals only, for the workspace of the calling sandbox.
//
// Writes are conditional: a new route is created (MustCreate), an
// existing one is updated or deleted on the resource version read, and a
// concurrent change answers Aborted. Error texts never carry a credential.
package inference

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/errdefs"
	domain "github.com/openshell-go/openshell/internal/inference"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/store"
)

// Options wire a Service.
type Options struct {
	Store     store.Objects
	Providers *providers.Store
	Authz     *authz.Authorizer
	// Client sends the verification probes of SetInferenceRoute; nil is
	// a client with a 30 s timeout that does not follow redirects.
	Client *http.Client
	Logger *slog.Logger // nil: discard
	Now    func() time.Time
}

// Service implements inferencev1.InferenceServer. It is safe for
// concurrent use.
type Service struct {
	inferencev1.UnimplementedInferenceServer
	o Options
}

var _ inferencev1.InferenceServer = (*Service)(nil)

// New returns a Service.
func New(o Options) *Service {
	if o.Client == nil {
		// Redirects are not followed: the probe carries the key.
		o.Client = &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{o: o}
}

const (
	roleUser  = openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER
	roleAdmin = openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN
)

func newRoute() *inferencev1.InferenceRoute { return &inferencev1.InferenceRoute{} }

// routeRequest is what the route RPCs' requests share.
type routeRequest interface {
	GetWorkspace() string
	GetRouteName() string
}

// target authorizes req with check (need in its workspace) and returns
// the workspace and the stored route name.
func (s *Service) target(ctx context.Context, req routeRequest, check func(context.Context, string, openshellv1.WorkspaceRole) error, need openshellv1.WorkspaceRole) (ws, name string, err error) {
	ws = lifecycle.NormalizeWorkspace(req.GetWorkspace())
	if err := check(ctx, ws, need); err != nil {
		return "", "", err
	}
	name, err = domain.RouteName(req.GetRouteName())
	return ws, name, err
}

// SetInferenceRoute creates or replaces a route after resolving it
// against its provider and, unless no_verify, probing the endpoint.
func (s *Service) SetInferenceRoute(ctx context.Context, req *inferencev1.SetInferenceRouteRequest) (*inferencev1.SetInferenceRouteResponse, error) {
	ws, name, err := s.target(ctx, req, s.o.Authz.Create, roleAdmin)
	if err != nil {
		return nil, err
	}
	switch {
	case isBlank(req.GetProviderName()):
		return nil, errdefs.InvalidArgument("provider_name is required")
	case isBlank(req.GetModelId()):
		return nil, errdefs.InvalidArgument("model_id is required")
	}
	p, err := s.provider(ctx, ws, req.GetProviderName(), fmt.Sprintf("provider '%s' not found in workspace '%s'", req.GetProviderName(), ws))
	if err != nil {
		return nil, err
	}
	resolved, err := domain.Resolve(domain.Route{Name: name, ProviderName: p.Name, ModelID: req.GetModelId(), TimeoutSecs: req.GetTimeoutSecs()}, p)
	if err != nil {
		return nil, err
	}
	var validated []*inferencev1.ValidatedEndpoint
	if !req.GetNoVerify() {
		v, err := verify(ctx, s.o.Client, p.Name, req.GetModelId(), resolved)
		if err != nil {
			return nil, err
		}
		validated = append(validated, v)
	}
	cfg := &inferencev1.InferenceRouteConfig{ProviderName: p.Name, ModelId: req.GetModelId(), TimeoutSecs: req.GetTimeoutSecs()}
	r, err := s.upsert(ctx, ws, name, cfg)
	if err != nil {
		return nil, err
	}
	return &inferencev1.SetInferenceRouteResponse{
		ProviderName: cfg.GetProviderName(), ModelId: cfg.GetModelId(), Version: r.GetVersion(), RouteName: name,
		ValidationPerformed: len(validated) > 0, ValidatedEndpoints: validated, TimeoutSecs: cfg.GetTimeoutSecs(), Workspace: ws,
	}, nil
}

func isBlank(s string) bool {
	for _, r := range s {
		if r != ' ' && r != '\t' && r != '\n' && r != '\r' {
			return false
		}
	}
	return true
}

// upsert creates route name of ws or updates it on the version read.
func (s *Service) upsert(ctx context.Context, ws, name string, cfg *inferencev1.InferenceRouteConfig) (*inferencev1.InferenceRoute, error) {
	cur := newRoute()
	err := s.o.Store.GetByName(ctx, store.TypeInferenceRoute, ws, name, cur)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		r := &inferencev1.InferenceRoute{Metadata: &datamodelv1.ObjectMeta{Name: name, Workspace: ws}, Config: cfg, Version: 1}
		if _, err := s.o.Store.Create(ctx, store.TypeInferenceRoute, r); err != nil {
			if errors.Is(err, errdefs.ErrAlreadyExists) {
				return nil, errdefs.Conflict(fmt.Sprintf("inference route '%s' in workspace '%s' was created concurrently", name, ws))
			}
			return nil, err
		}
		return r, nil
	case err != nil:
		return nil, err
	}
	_, err = s.o.Store.UpdateCAS(ctx, store.TypeInferenceRoute, cur.GetMetadata().GetId(), cur.GetMetadata().GetResourceVersion(), cur, func(m proto.Message) error {
		r := m.(*inferencev1.InferenceRoute)
		r.Config = cfg
		r.Version++
		return nil
	})
	if err != nil {
		return nil, err
	}
	return cur, nil
}

// GetInferenceRoute returns a route of the workspace.
func (s *Service) GetInferenceRoute(ctx context.Context, req *inferencev1.GetInferenceRouteRequest) (*inferencev1.GetInferenceRouteResponse, error) {
	ws, name, err := s.target(ctx, req, s.o.Authz.Workspace, roleUser)
	if err != nil {
		return nil, err
	}
	r, err := s.route(ctx, ws, name)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, errdefs.NotFound(fmt.Sprintf("inference route '%s' is not configured in workspace '%s'; run 'openshell inference set --provider <name> --model <id>'", name, ws))
	}
	c := r.GetConfig()
	return &inferencev1.GetInferenceRouteResponse{
		ProviderName: c.GetProviderName(), ModelId: c.GetModelId(), Version: r.GetVersion(), RouteName: name,
		TimeoutSecs: c.GetTimeoutSecs(), Workspace: ws,
	}, nil
}

// route reads route name of ws; nil when there is none.
func (s *Service) route(ctx context.Context, ws, name string) (*inferencev1.InferenceRoute, error) {
	r := newRoute()
	err := s.o.Store.GetByName(ctx, store.TypeInferenceRoute, ws, name, r)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if c := r.GetConfig(); isBlank(c.GetProviderName()) || isBlank(c.GetModelId()) {
		return nil, errdefs.FailedPrecondition(fmt.Sprintf("route '%s' is missing provider/model metadata", name))
	}
	return r, nil
}

// DeleteInferenceRoute removes a route of the workspace, conditioned on
// the version read; deleted is false when there was none.
func (s *Service) DeleteInferenceRoute(ctx context.Context, req *inferencev1.DeleteInferenceRouteRequest) (*inferencev1.DeleteInferenceRouteResponse, error) {
	ws, name, err := s.target(ctx, req, s.o.Authz.Workspace, roleAdmin)
	if err != nil {
		return nil, err
	}
	r := newRoute()
	err = s.o.Store.GetByName(ctx, store.TypeInferenceRoute, ws, name, r)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &inferencev1.DeleteInferenceRouteResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	if err := s.o.Store.DeleteIf(ctx, store.TypeInferenceRoute, r.GetMetadata().GetId(), r.GetMetadata().GetResourceVersion()); err != nil {
		return nil, err
	}
	return &inferencev1.DeleteInferenceRouteResponse{Deleted: true}, nil
}

// GetInferenceBundle resolves the routes of the calling sandbox's
// workspace. The revision changes whenever a resolved field does (a
// rotated credential included); a workspace without routes answers an
// empty bundle. A route that no longer resolves (its provider deleted,
// no unexpired credential, an unsupported configuration) is left out and
// logged, so that supervisors stop using it; store failures are errors.
func (s *Service) GetInferenceBundle(ctx context.Context, _ *inferencev1.GetInferenceBundleRequest) (*inferencev1.GetInferenceBundleResponse, error) {
	id, err := authz.RequireSandboxPrincipal(ctx)
	if err != nil {
		return nil, errdefs.PermissionDenied("GetInferenceBundle requires a sandbox principal")
	}
	sb, err := s.o.Authz.SandboxForCaller(ctx, id)
	if err != nil {
		return nil, err
	}
	ws := lifecycle.NormalizeWorkspace(sb.GetMetadata().GetWorkspace())
	resp := &inferencev1.GetInferenceBundleResponse{GeneratedAtMs: s.o.Now().UnixMilli()}
	h := fnv.New64a()
	for _, name := range []string{domain.RouteLocal, domain.RouteSystem} {
		r, err := s.route(ctx, ws, name)
		if err != nil {
			return nil, err
		}
		if r == nil {
			continue
		}
		c := r.GetConfig()
		p, err := s.provider(ctx, ws, c.GetProviderName(), fmt.Sprintf("configured provider '%s' was not found in workspace '%s'", c.GetProviderName(), ws))
		var rr *inferencev1.ResolvedRoute
		if err == nil {
			rr, err = domain.Resolve(domain.Route{Name: name, ProviderName: p.Name, ModelID: c.GetModelId(), TimeoutSecs: c.GetTimeoutSecs()}, p)
		}
		if unusable(err) {
			// The route is left out, so that the supervisor drops what it
			// had (a deleted provider's key, an expired credential).
			s.o.Logger.Warn("inference route left out of the bundle", "sandbox_id", id, "workspace", ws, "route", name, "reason", err.Error())
			continue
		}
		if err != nil {
			return nil, err
		}
		resp.Routes = append(resp.Routes, rr)
		for _, f := range []string{rr.GetName(), rr.GetBaseUrl(), rr.GetModelId(), rr.GetApiKey(), fmt.Sprint(rr.GetProtocols()), rr.GetProviderType(),
			strconv.FormatUint(rr.GetTimeoutSecs(), 10), strconv.FormatBool(rr.GetModelInPath()), fmt.Sprint(rr.RequestPathOverride != nil), rr.GetRequestPathOverride()} {
			_, _ = h.Write([]byte(f))
			_, _ = h.Write([]byte{0})
		}
	}
	resp.Revision = fmt.Sprintf("%016x", h.Sum64())
	return resp, nil
}

// unusable reports whether err says a route cannot be resolved from its
// provider (as opposed to the store failing).
func unusable(err error) bool {
	return errors.Is(err, errdefs.ErrFailedPrecondition) || errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, errdefs.ErrNotFound)
}

// provider loads provider name of ws with its unexpired credentials
// opened; a missing provider is FailedPrecondition missing.
func (s *Service) provider(ctx context.Context, ws, name, missing string) (domain.Provider, error) {
	p, err := s.o.Providers.Get(ctx, ws, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return domain.Provider{}, errdefs.FailedPrecondition(missing)
	}
	if err != nil {
		return domain.Provider{}, err
	}
	out := domain.Provider{Name: name, Type: p.GetType(), Config: p.GetConfig(), Credentials: map[string]string{}}
	now := s.o.Providers.Now()
	for key := range p.GetCredentialHandles() {
		if providers.Expired(p, key, now) {
			continue
		}
		v, err := s.o.Providers.Resolve(p, key)
		if err != nil {
			return domain.Provider{}, err
		}
		out.Credentials[key] = v
	}
	return out, nil
}
