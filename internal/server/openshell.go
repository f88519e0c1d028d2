package server

import (
	"context"
	"log/slog"
	"time"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/version"
)

// DriverInfo describes one configured compute driver.
type DriverInfo struct {
	// Name is the name the driver is configured under ("process", ...).
	Name         string
	Capabilities compute.Capabilities
}

// SandboxTokenIssuer mints sandbox identity tokens (sandboxjwt.Issuer).
type SandboxTokenIssuer interface {
	Mint(sandboxID string) (token string, expiresAt time.Time, err error)
}

// Deps are what the gRPC handlers need. Fields are interfaces or funcs so
// that packages written later add fields without touching existing ones;
// nil fields mean "not configured" and handlers must cope with that.
type Deps struct {
	// Logger is scoped by the server ("component"="server").
	Logger *slog.Logger
	// Version is reported by Health and GetGatewayInfo (version.Version
	// when empty).
	Version string
	// Status reports the gateway's health; nil = always HEALTHY.
	Status func(ctx context.Context) openshellv1.ServiceStatus
	// Drivers lists the configured compute drivers.
	Drivers func(ctx context.Context) ([]DriverInfo, error)
	// SandboxTokens mints sandbox JWTs; nil when JWT minting is off.
	SandboxTokens SandboxTokenIssuer
	// API implements every RPC but the gateway-level ones above
	// (internal/api.Service, composed of the API domain packages); nil
	// leaves them Unimplemented.
	API openshellv1.OpenShellServer
	// Inference implements openshell.inference.v1.Inference
	// (internal/api/inference); nil leaves GetInferenceBundle answering
	// NotFound and the route RPCs Unimplemented.
	Inference inferencev1.InferenceServer
}

// OpenShellService implements openshell.v1.OpenShell. Its handlers are
// spread over the files of this package; RPCs without a handler answer
// Unimplemented. Handlers return errdefs errors and are safe for
// concurrent use.
type OpenShellService struct {
	// OpenShellServer serves every RPC this type does not define itself:
	// Deps.API, or Unimplemented.
	openshellv1.OpenShellServer
	deps Deps
}

var _ openshellv1.OpenShellServer = (*OpenShellService)(nil)

// NewOpenShellService returns the service for deps.
func NewOpenShellService(deps Deps) *OpenShellService {
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Version == "" {
		deps.Version = version.Version
	}
	var rest openshellv1.OpenShellServer = openshellv1.UnimplementedOpenShellServer{}
	if deps.API != nil {
		rest = deps.API
	}
	return &OpenShellService{OpenShellServer: rest, deps: deps}
}

func (s *OpenShellService) status(ctx context.Context) openshellv1.ServiceStatus {
	if s.deps.Status == nil {
		return openshellv1.ServiceStatus_SERVICE_STATUS_HEALTHY
	}
	return s.deps.Status(ctx)
}

// Health reports HEALTHY (or what Deps.Status says) and the version.
func (s *OpenShellService) Health(ctx context.Context, _ *openshellv1.HealthRequest) (*openshellv1.HealthResponse, error) {
	return &openshellv1.HealthResponse{Status: s.status(ctx), Version: s.deps.Version}, nil
}

// identityProviders maps principal sources to GetCurrentUser's provider.
var identityProviders = map[auth.Source]string{
	auth.SourceOIDC:     "oidc",
	auth.SourceMTLS:     "mtls",
	auth.SourceLocalDev: "local_dev",
}

// GetCurrentUser describes the calling user. Sandbox principals are refused.
func (s *OpenShellService) GetCurrentUser(ctx context.Context, _ *openshellv1.GetCurrentUserRequest) (*openshellv1.GetCurrentUserResponse, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return nil, errdefs.Unauthenticated("missing authorization header")
	}
	if p.IsSandbox() {
		return nil, errdefs.PermissionDenied("sandbox principals may not call this method")
	}
	return &openshellv1.GetCurrentUserResponse{
		Subject:          p.Subject,
		DisplayName:      p.DisplayName,
		Roles:            append([]string(nil), p.Roles...),
		Scopes:           append([]string(nil), p.Scopes...),
		IdentityProvider: identityProviders[p.Source],
	}, nil
}

// GetGatewayInfo reports the gateway version and its compute drivers.
func (s *OpenShellService) GetGatewayInfo(ctx context.Context, _ *openshellv1.GetGatewayInfoRequest) (*openshellv1.GetGatewayInfoResponse, error) {
	resp := &openshellv1.GetGatewayInfoResponse{Status: s.status(ctx), GatewayVersion: s.deps.Version}
	if s.deps.Drivers == nil {
		return resp, nil
	}
	drivers, err := s.deps.Drivers(ctx)
	if err != nil {
		return nil, err
	}
	for _, d := range drivers {
		resp.ComputeDrivers = append(resp.ComputeDrivers, &openshellv1.ComputeDriverInfo{
			Name: d.Name,
			Capabilities: &openshellv1.ComputeDriverCapabilities{
				DriverName:    d.Capabilities.DriverName,
				DriverVersion: d.Capabilities.DriverVersion,
			},
		})
	}
	return resp, nil
}

// InferenceService is the stand-in for openshell.inference.v1.Inference
// when Deps.Inference is nil: the route RPCs answer Unimplemented.
type InferenceService struct {
	inferencev1.UnimplementedInferenceServer
	deps Deps
}

var _ inferencev1.InferenceServer = (*InferenceService)(nil)

// GetInferenceBundle answers NotFound: no inference routes exist on this
// gateway yet (supervisors tolerate NotFound).
func (s *InferenceService) GetInferenceBundle(context.Context, *inferencev1.GetInferenceBundleRequest) (*inferencev1.GetInferenceBundleResponse, error) {
	return nil, errdefs.NotFound("no inference route is configured")
}
