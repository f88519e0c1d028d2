// Package api composes the API domain packages under internal/api into the
// one openshellv1.OpenShellServer the gateway registers: sandboxes, exec,
// logs, workspaces, identity, policy, providers, supervisors and services each
// implement their RPCs; RPCs no domain implements answer Unimplemented
// (the server adds the gateway-level ones: Health, GetCurrentUser,
// GetGatewayInfo). The inference domain serves the second gRPC service,
// openshell.inference.v1.Inference, exposed as Service.Inference.
//
// The domain packages never import each other; they share only authz.
// What one domain's RPC means for another (a deleted sandbox's buffered
// logs and pooled SSH connection) is wired here.
//
// Authentication and the per-RPC authorization rule are enforced by the
// server's interceptors before a method runs; the domains add the checks
// that need the request body (sandbox scope, workspace membership).
package api

import (
	"context"
	"errors"
	"log/slog"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/api/exec"
	"github.com/openshell-go/openshell/internal/api/identity"
	"github.com/openshell-go/openshell/internal/api/inference"
	"github.com/openshell-go/openshell/internal/api/logs"
	"github.com/openshell-go/openshell/internal/api/policy"
	"github.com/openshell-go/openshell/internal/api/providers"
	"github.com/openshell-go/openshell/internal/api/sandboxes"
	"github.com/openshell-go/openshell/internal/api/services"
	"github.com/openshell-go/openshell/internal/api/supervisors"
	"github.com/openshell-go/openshell/internal/api/workspaces"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	domainproviders "github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/sandboxlog"
	"github.com/openshell-go/openshell/internal/securityevent"
	"github.com/openshell-go/openshell/internal/store"
)

// Options wire the Service.
type Options struct {
	Engine *lifecycle.Engine
	Relay  *relay.Registry
	Logs   *sandboxlog.Buffer // nil: a fresh buffer
	Store  store.Store
	Minter identity.TokenMinter // nil: sandbox token RPCs are Unavailable
	// Providers stores providers with sealed credentials; the gateway
	// shares it with lifecycle's ProviderExists. nil: a store without a
	// key-encryption key (providers with credentials are Unavailable).
	Providers *domainproviders.Store
	// SSHSessionTTL bounds CreateSshSession tokens; 0 means no expiry.
	SSHSessionTTL time.Duration
	// Gateway address reported in CreateSshSession responses.
	GatewayHost   string
	GatewayPort   uint32
	GatewayScheme string
	// Connection caps for ForwardTcp (0 = defaults).
	MaxForwardsPerToken   int
	MaxForwardsPerSandbox int
	// OIDC turns workspace membership checks on; AdminRole is the role
	// that makes a principal a platform admin (membership bypassed; an
	// empty AdminRole bypasses for everyone, as upstream).
	OIDC      bool
	AdminRole string
	// ServiceURLs are the domains, scheme and port of service URLs
	// (ExposeService and the service router).
	ServiceURLs services.URLs
	// SecurityEvents records the decisions supervisors push
	// (PushSandboxLogs) as security events; nil discards them.
	SecurityEvents securityevent.Emitter
	Logger         *slog.Logger
	Now            func() time.Time
}

// Aliases give each embedded domain its own field name.
type (
	sandboxesAPI   = sandboxes.Service
	execAPI        = exec.Service
	logsAPI        = logs.Service
	workspacesAPI  = workspaces.Service
	identityAPI    = identity.Service
	policyAPI      = policy.Service
	providersAPI   = providers.Service
	supervisorsAPI = supervisors.Service
	servicesAPI    = services.Service
)

// unimplemented sits one embedding level below the domains, so a domain's
// method always wins over the Unimplemented answer.
type unimplemented struct {
	openshellv1.UnimplementedOpenShellServer
}

// Service is the composed OpenShell service. Two domains defining the same
// RPC would make that method ambiguous, so Service would no longer satisfy
// openshellv1.OpenShellServer and the assertion below fails to compile.
type Service struct {
	*sandboxesAPI
	*execAPI
	*logsAPI
	*workspacesAPI
	*identityAPI
	*policyAPI
	*providersAPI
	*supervisorsAPI
	*servicesAPI
	unimplemented

	// Authz is the membership authorizer every domain shares.
	Authz *authz.Authorizer
	// Inference serves the second gRPC service, openshell.inference.v1.Inference.
	Inference *inference.Service
	// ServiceRouter serves sandbox service hosts over HTTP.
	ServiceRouter *services.Router
}

var _ openshellv1.OpenShellServer = (*Service)(nil)

// New returns the composed Service.
func New(o Options) *Service {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logs == nil {
		o.Logs = sandboxlog.New(0)
	}
	if o.Providers == nil {
		o.Providers = domainproviders.NewStore(domainproviders.Options{Objects: o.Store, Now: o.Now})
	}
	az := authz.New(authz.Options{Store: o.Store, Sandboxes: o.Engine, OIDC: o.OIDC, AdminRole: o.AdminRole})
	gatewayLog := func(sandboxID, level, msg string) {
		o.Logs.Append(&openshellv1.SandboxLogLine{
			SandboxId: sandboxID, TimestampMs: o.Now().UnixMilli(), Level: level,
			Target: "openshell_gateway", Message: msg, Source: sandboxlog.SourceGateway,
		})
	}
	ex := exec.New(exec.Options{
		Relay: o.Relay, Store: o.Store, Authz: az, SSHSessionTTL: o.SSHSessionTTL,
		GatewayHost: o.GatewayHost, GatewayPort: o.GatewayPort, GatewayScheme: o.GatewayScheme,
		MaxForwardsPerToken: o.MaxForwardsPerToken, MaxForwardsPerSandbox: o.MaxForwardsPerSandbox, Now: o.Now,
	})
	svcs := services.New(services.Options{
		Sandboxes: o.Engine, Store: o.Store, Authz: az, Relay: o.Relay, URLs: o.ServiceURLs, Now: o.Now,
	})
	lg := logs.New(logs.Options{Engine: o.Engine, Logs: o.Logs, Authz: az, SecurityEvents: o.SecurityEvents, Now: o.Now})
	return &Service{
		sandboxesAPI: sandboxes.New(sandboxes.Options{
			Engine: o.Engine, Authz: az, GatewayLog: gatewayLog,
			OnDeleted: func(id string) {
				lg.DropSandbox(id)
				ex.DropSandbox(id)
			},
		}),
		execAPI:       ex,
		logsAPI:       lg,
		workspacesAPI: workspaces.New(workspaces.Options{Store: o.Store, Engine: o.Engine, Authz: az, Logger: o.Logger}),
		identityAPI:   identity.New(identity.Options{Sandboxes: o.Engine, Minter: o.Minter}),
		policyAPI: policy.New(policy.Options{Engine: o.Engine, Store: o.Store, Authz: az, Now: o.Now, CredentialHosts: credentialHosts(o.Providers),
			ProviderRules: providerRules(o.Providers)}),
		providersAPI:   providers.New(providers.Options{Engine: o.Engine, Authz: az, Providers: o.Providers}),
		supervisorsAPI: supervisors.New(supervisors.Options{Engine: o.Engine, Relay: o.Relay, GatewayLog: gatewayLog}),
		servicesAPI:    svcs,
		ServiceRouter:  services.NewRouter(svcs, o.Logger),
		Authz:          az,
		Inference:      inference.New(inference.Options{Store: o.Store, Providers: o.Providers, Authz: az, Logger: o.Logger, Now: o.Now}),
	}
}

// Close ends the long-lived streams (log pushes, watches) so a graceful
// drain does not wait for its deadline, and the pooled SSH connections.
// Unary calls are unaffected.
func (s *Service) Close() {
	s.logsAPI.Close()
	s.execAPI.Close()
	s.ServiceRouter.Close()
}

// credentialHosts tells the policy advisor which hosts a sandbox holds
// credentials for: the endpoints of the profile of each provider attached
// to it (providers whose type has no built-in profile add none).
// providerRules composes the network rules of a sandbox's provider
// profiles into its policy (providers_v2_enabled).
func providerRules(ps *domainproviders.Store) func(context.Context, *openshellv1.Sandbox, *sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error) {
	return func(ctx context.Context, sb *openshellv1.Sandbox, policy *sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error) {
		rules, err := ps.ProfileRules(ctx, sb)
		if err != nil || len(rules) == 0 {
			return policy, err
		}
		return domainproviders.ComposePolicy(policy, rules), nil
	}
}

func credentialHosts(ps *domainproviders.Store) func(context.Context, *openshellv1.Sandbox) ([]string, error) {
	return func(ctx context.Context, sb *openshellv1.Sandbox) ([]string, error) {
		ctx, err := ps.CaptureProfiles(ctx) // one catalog for every provider
		if err != nil {
			return nil, err
		}
		var hosts []string
		for _, name := range sb.GetSpec().GetProviders() {
			p, err := ps.Get(ctx, sb.GetMetadata().GetWorkspace(), name)
			if errors.Is(err, errdefs.ErrNotFound) {
				continue // detached meanwhile
			}
			if err != nil {
				return nil, err
			}
			prof, ok, err := ps.ProfileOf(ctx, p)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			for _, ep := range prof.GetEndpoints() {
				hosts = append(hosts, ep.GetHost())
			}
		}
		return hosts, nil
	}
}
