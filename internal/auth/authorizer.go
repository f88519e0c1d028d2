package auth

import (
	"fmt"
	"maps"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	// The services' descriptors must be registered for NewAuthorizer.
	_ "github.com/openshell-go/openshell/api/openshell/inference/v1"
	optionsv1 "github.com/openshell-go/openshell/api/openshell/options/v1"
	_ "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Authentication modes of the authorization method option.
const (
	ModeUnauthenticated = "unauthenticated"
	ModeBearer          = "bearer"
	ModeSandbox         = "sandbox"
	ModeDual            = "dual"
)

// ScopeAll is the scope that satisfies every scope requirement.
const ScopeAll = "openshell:all"

// DefaultServices are the services whose methods the gateway serves.
var DefaultServices = []protoreflect.FullName{"openshell.v1.OpenShell", "openshell.inference.v1.Inference"}

// Rule is the authorization rule of one RPC, as declared in the proto.
type Rule struct {
	Mode          string
	WorkspaceRole string
	GlobalRole    string
	Scope         string
}

// AuthorizerOptions configures role and scope checks. Role and scope checks
// run only when OIDC is configured.
type AuthorizerOptions struct {
	// OIDC turns role checks on.
	OIDC bool
	// AdminRole satisfies global_role and workspace_role rules.
	AdminRole string
	// UserRole satisfies workspace_role rules.
	UserRole string
	// Scopes turns scope checks on (OIDC scopes_claim non-empty).
	Scopes bool
}

// Authorizer decides whether a principal may call a method. Its table is
// read once from the compiled descriptors; it is safe for concurrent use.
type Authorizer struct {
	opts  AuthorizerOptions
	rules map[string]Rule
}

// NewAuthorizer reads the authorization option of every method of services
// (DefaultServices when empty) from the global registry.
func NewAuthorizer(opts AuthorizerOptions, services ...protoreflect.FullName) (*Authorizer, error) {
	if len(services) == 0 {
		services = DefaultServices
	}
	a := &Authorizer{opts: opts, rules: make(map[string]Rule)}
	for _, name := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
		if err != nil {
			return nil, fmt.Errorf("service %q: %w", name, err)
		}
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok {
			return nil, fmt.Errorf("%q is not a service", name)
		}
		maps.Copy(a.rules, RulesOf(sd))
	}
	return a, nil
}

// RulesOf returns the rules of the methods of sd that carry the
// authorization option, keyed by full method name ("/pkg.Service/Method").
func RulesOf(sd protoreflect.ServiceDescriptor) map[string]Rule {
	out := make(map[string]Rule)
	methods := sd.Methods()
	for i := range methods.Len() {
		md := methods.Get(i)
		opts, ok := md.Options().(*descriptorpb.MethodOptions)
		if !ok || opts == nil || !proto.HasExtension(opts, optionsv1.E_Authorization) {
			continue
		}
		r, ok := proto.GetExtension(opts, optionsv1.E_Authorization).(*optionsv1.AuthorizationRule)
		if !ok || r == nil {
			continue
		}
		out["/"+string(sd.FullName())+"/"+string(md.Name())] = Rule{
			Mode:          r.GetAuthMode(),
			WorkspaceRole: r.GetWorkspaceRole(),
			GlobalRole:    r.GetGlobalRole(),
			Scope:         r.GetScope(),
		}
	}
	return out
}

// Rule returns the rule of fullMethod.
func (a *Authorizer) Rule(fullMethod string) (Rule, bool) {
	r, ok := a.rules[fullMethod]
	return r, ok
}

// Methods returns every method the authorizer has a rule for.
func (a *Authorizer) Methods() []string {
	out := make([]string, 0, len(a.rules))
	for m := range a.rules {
		out = append(out, m)
	}
	return out
}

// BypassesAuth reports whether fullMethod belongs to a service that needs
// no authentication at all (gRPC health checking and reflection).
func BypassesAuth(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.")
}

// Authorize returns nil when p (nil = anonymous) may call fullMethod, and a
// PermissionDenied or Unauthenticated errdefs error otherwise. A method
// without a rule is denied.
func (a *Authorizer) Authorize(fullMethod string, p *Principal) error {
	if BypassesAuth(fullMethod) {
		return nil
	}
	r, ok := a.rules[fullMethod]
	if !ok {
		return errdefs.PermissionDenied("method has no authorization rule")
	}
	return a.check(r, p)
}

func (a *Authorizer) check(r Rule, p *Principal) error {
	switch r.Mode {
	case ModeUnauthenticated:
		return nil
	case ModeBearer, ModeSandbox, ModeDual:
	default:
		return errdefs.PermissionDenied("method has no authorization rule")
	}
	if p == nil {
		return errdefs.Unauthenticated("missing authorization header")
	}
	switch r.Mode {
	case ModeSandbox:
		if !p.IsSandbox() {
			return errdefs.PermissionDenied("this method requires a sandbox principal")
		}
		return nil
	case ModeBearer:
		if p.IsSandbox() {
			return errdefs.PermissionDenied("sandbox principals may not call this method")
		}
	case ModeDual:
		if p.IsSandbox() {
			return nil
		}
	}
	return a.checkUser(r, p)
}

// checkUser applies role and scope checks to a user principal. They run
// only when OIDC is configured. Scopes come from OIDC tokens only, so the
// scope check applies to OIDC principals; openshell:all bypasses it.
func (a *Authorizer) checkUser(r Rule, p *Principal) error {
	if !a.opts.OIDC {
		return nil
	}
	switch {
	case r.GlobalRole != "":
		if !hasAny(p.Roles, a.opts.AdminRole) {
			return errdefs.PermissionDenied(fmt.Sprintf("role '%s' required", a.opts.AdminRole))
		}
	case r.WorkspaceRole != "":
		if !hasAny(p.Roles, a.opts.UserRole, a.opts.AdminRole) {
			return errdefs.PermissionDenied(fmt.Sprintf("role '%s' required", a.opts.UserRole))
		}
	}
	if a.opts.Scopes && r.Scope != "" && p.Source == SourceOIDC && !hasAny(p.Scopes, ScopeAll, r.Scope) {
		return errdefs.PermissionDenied(fmt.Sprintf("scope '%s' required", r.Scope))
	}
	return nil
}

func hasAny(have []string, want ...string) bool {
	for _, h := range have {
		for _, w := range want {
			if w != "" && h == w {
				return true
			}
		}
	}
	return false
}
