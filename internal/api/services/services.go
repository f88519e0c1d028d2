// Package services implements the service endpoint RPCs (ExposeService,
// GetService, ListServices, DeleteService) and the HTTP router that serves
// an exposed service at https://<sandbox>--<service>.<domain>/ over the
// supervisor relay (router.go).
//
// An endpoint is a scoped record of type service_endpoint whose scope is
// the sandbox id and whose dedup key is the endpoint name
// ("<sandbox>--<service>", or "<sandbox>" for the unnamed service), so
// there is at most one record per sandbox and service, it can only be
// created while the sandbox exists, and the store deletes it in the same
// transaction as the sandbox.
//
// Names follow OpenShell: the sandbox and service names are lowercase DNS
// labels of at most 28 characters without "--" (the separator of the
// host name); the service name may be empty. A user needs membership of
// the sandbox's workspace (role user); a missing sandbox and a refused one
// read alike. A Service is safe for concurrent use.
package services

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/store"
)

// MaxNameLen bounds sandbox and service names used in service host names.
const MaxNameLen = 28

// LocalDomain is the service domain of gateways bound to loopback:
// browsers resolve every *.localhost name to the loopback address.
const LocalDomain = "openshell.localhost"

// Sandboxes loads sandboxes (lifecycle.Engine).
type Sandboxes interface {
	Get(ctx context.Context, workspace, name string) (*openshellv1.Sandbox, error)
	GetByID(ctx context.Context, id string) (*openshellv1.Sandbox, error)
	List(ctx context.Context, o lifecycle.ListOptions) ([]*openshellv1.Sandbox, error)
}

// URLs describes how service URLs are written.
type URLs struct {
	// Domains are the accepted service domains, the first one is used in
	// URLs; empty: no routing and empty URLs.
	Domains []string
	// Scheme is "https" or "http"; Port is the gateway's port.
	Scheme string
	Port   int
}

// Options wire a Service.
type Options struct {
	Sandboxes Sandboxes
	Store     store.Store
	Authz     *authz.Authorizer
	// Relay opens connections to the sandboxes (the router); nil: the
	// router answers 502.
	Relay *relay.Registry
	URLs  URLs
	Now   func() time.Time
}

// Service implements the service endpoint RPCs.
type Service struct{ o Options }

// New returns a Service.
func New(o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	for i, d := range o.URLs.Domains {
		o.URLs.Domains[i] = strings.ToLower(strings.TrimSuffix(d, "."))
	}
	return &Service{o: o}
}

// EndpointKey is the endpoint's name: "<sandbox>--<service>", or the
// sandbox name for the unnamed service.
func EndpointKey(sandbox, service string) string {
	if service == "" {
		return sandbox
	}
	return sandbox + "--" + service
}

// ValidateName checks a sandbox or service name used in service hosts.
func ValidateName(field, value string, required bool) error {
	switch {
	case value == "" && required:
		return errdefs.InvalidArgument(field + " is required")
	case value == "":
		return nil
	case len(value) > MaxNameLen:
		return errdefs.InvalidArgument(fmt.Sprintf("%s must be at most %d characters for sandbox service routing", field, MaxNameLen))
	case strings.Contains(value, "--"):
		return errdefs.InvalidArgument(field + " must not contain '--'")
	case !isDNSLabel(value):
		return errdefs.InvalidArgument(field + " must be a lowercase DNS label")
	}
	return nil
}

func isDNSLabel(v string) bool {
	if strings.HasPrefix(v, "-") || strings.HasSuffix(v, "-") {
		return false
	}
	for i := range len(v) {
		c := v[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// hostLabel is the first label of a service host: the endpoint key, with
// "--<workspace>" appended outside the default workspace.
func hostLabel(workspace, sandbox, service string) string {
	if lifecycle.NormalizeWorkspace(workspace) == lifecycle.DefaultWorkspace {
		return EndpointKey(sandbox, service)
	}
	return sandbox + "--" + service + "--" + workspace
}

// URL is the service's URL, or "" when no domain is configured or the
// host label would not be a DNS label.
func (u URLs) URL(workspace, sandbox, service string) string {
	if len(u.Domains) == 0 {
		return ""
	}
	label := hostLabel(workspace, sandbox, service)
	if len(label) > 63 {
		return ""
	}
	host := label + "." + u.Domains[0]
	if !(u.Scheme == "https" && u.Port == 443) && !(u.Scheme == "http" && u.Port == 80) && u.Port != 0 {
		host = net.JoinHostPort(host, strconv.Itoa(u.Port))
	}
	return u.Scheme + "://" + host + "/"
}

// sandbox loads the sandbox a request names, after the membership check.
func (s *Service) sandbox(ctx context.Context, workspace, name string) (*openshellv1.Sandbox, error) {
	if err := ValidateName("sandbox", name, true); err != nil {
		return nil, err
	}
	if err := s.o.Authz.Sandbox(ctx, workspace, name, openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	return s.o.Sandboxes.Get(ctx, workspace, name)
}

// endpoints returns the endpoint records of sandbox id.
func (s *Service) endpoints(ctx context.Context, sandboxID string) ([]store.Record, error) {
	return s.o.Store.ListScoped(ctx, store.TypeServiceEndpoint, sandboxID, store.MaxLimit, 0)
}

// find returns the record and endpoint of service in sandbox sb.
func (s *Service) find(ctx context.Context, sb *openshellv1.Sandbox, service string) (store.Record, *openshellv1.ServiceEndpoint, error) {
	recs, err := s.endpoints(ctx, sb.GetMetadata().GetId())
	if err != nil {
		return store.Record{}, nil, err
	}
	key := EndpointKey(sb.GetMetadata().GetName(), service)
	for _, r := range recs {
		if r.DedupKey != key {
			continue
		}
		ep, err := decode(r)
		return r, ep, err
	}
	return store.Record{}, nil, errdefs.NotFound("service endpoint not found")
}

func decode(r store.Record) (*openshellv1.ServiceEndpoint, error) {
	ep := &openshellv1.ServiceEndpoint{}
	if err := proto.Unmarshal(r.Payload, ep); err != nil {
		return nil, fmt.Errorf("decode service endpoint %s: %w", r.ID, err)
	}
	if ep.Metadata == nil {
		ep.Metadata = &datamodelv1.ObjectMeta{}
	}
	ep.Metadata.Id = r.ID
	ep.Metadata.ResourceVersion = r.ResourceVersion
	return ep, nil
}

func (s *Service) response(ep *openshellv1.ServiceEndpoint) *openshellv1.ServiceEndpointResponse {
	return &openshellv1.ServiceEndpointResponse{
		Endpoint: ep,
		Url:      s.o.URLs.URL(ep.GetMetadata().GetWorkspace(), ep.GetSandboxName(), ep.GetServiceName()),
	}
}

// ExposeService creates or updates the endpoint of a sandbox's service.
func (s *Service) ExposeService(ctx context.Context, req *openshellv1.ExposeServiceRequest) (*openshellv1.ServiceEndpointResponse, error) {
	if err := ValidateName("service", req.GetService(), false); err != nil {
		return nil, err
	}
	if req.GetTargetPort() == 0 || req.GetTargetPort() > 65535 {
		return nil, errdefs.InvalidArgument("target_port must be in 1..=65535")
	}
	sb, err := s.sandbox(ctx, req.GetWorkspace(), req.GetSandbox())
	if err != nil {
		return nil, err
	}
	if sb.GetMetadata().GetDeletionTimestampMs() != 0 || sb.GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING {
		return nil, errdefs.FailedPrecondition(fmt.Sprintf("sandbox %q is being deleted", sb.GetMetadata().GetName()))
	}
	name := sb.GetMetadata().GetName()
	key := EndpointKey(name, req.GetService())
	ep := &openshellv1.ServiceEndpoint{
		Metadata: &datamodelv1.ObjectMeta{
			Id: uuid.NewString(), Name: key, Workspace: sb.GetMetadata().GetWorkspace(),
			CreatedAtMs: s.o.Now().UnixMilli(), Labels: map[string]string{"sandbox": name},
		},
		SandboxId: sb.GetMetadata().GetId(), SandboxName: name, ServiceName: req.GetService(),
		TargetPort: req.GetTargetPort(), Domain: true,
	}
	payload, err := proto.Marshal(ep)
	if err != nil {
		return nil, err
	}
	rec, created, err := s.o.Store.RecordHit(ctx, store.Record{
		ID: ep.Metadata.Id, Type: store.TypeServiceEndpoint, Scope: ep.SandboxId, DedupKey: key, Payload: payload,
	})
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, errdefs.NotFound(fmt.Sprintf("sandbox %q not found in workspace %q", name, sb.GetMetadata().GetWorkspace()))
	}
	if err != nil {
		return nil, err
	}
	if !created {
		// Keep the stored identity, replace the target.
		ep.Metadata.Id = rec.ID
		if old, err := decode(rec); err == nil && old.GetMetadata().GetCreatedAtMs() != 0 {
			ep.Metadata.CreatedAtMs = old.GetMetadata().GetCreatedAtMs()
		}
		if rec.Payload, err = proto.Marshal(ep); err != nil {
			return nil, err
		}
		wr, err := s.o.Store.UpdateScoped(ctx, rec, rec.ResourceVersion)
		if err != nil {
			return nil, err
		}
		rec.ResourceVersion = wr.ResourceVersion
	}
	ep.Metadata.ResourceVersion = rec.ResourceVersion
	return s.response(ep), nil
}

// GetService returns one endpoint.
func (s *Service) GetService(ctx context.Context, req *openshellv1.GetServiceRequest) (*openshellv1.ServiceEndpointResponse, error) {
	if err := ValidateName("service", req.GetService(), false); err != nil {
		return nil, err
	}
	sb, err := s.sandbox(ctx, req.GetWorkspace(), req.GetSandbox())
	if err != nil {
		return nil, err
	}
	_, ep, err := s.find(ctx, sb, req.GetService())
	if err != nil {
		return nil, err
	}
	return s.response(ep), nil
}

// ListServices lists the endpoints of one sandbox, of a workspace, or of
// every workspace (platform admins), ordered by sandbox, then name.
func (s *Service) ListServices(ctx context.Context, req *openshellv1.ListServicesRequest) (*openshellv1.ListServicesResponse, error) {
	if req.GetLimit() > store.MaxLimit {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("limit exceeds maximum (%d > %d)", req.GetLimit(), store.MaxLimit))
	}
	var sandboxes []*openshellv1.Sandbox
	switch {
	case req.GetSandbox() != "":
		if req.GetAllWorkspaces() {
			return nil, errdefs.InvalidArgument("sandbox filter is not supported with all_workspaces")
		}
		sb, err := s.sandbox(ctx, req.GetWorkspace(), req.GetSandbox())
		if err != nil {
			return nil, err
		}
		sandboxes = []*openshellv1.Sandbox{sb}
	default:
		if req.GetAllWorkspaces() {
			if !s.o.Authz.PlatformAdmin(ctx) {
				return nil, errdefs.PermissionDenied("all_workspaces requires the platform admin role")
			}
		} else if err := s.o.Authz.Workspace(ctx, req.GetWorkspace(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
			return nil, err
		}
		var err error
		if sandboxes, err = s.allSandboxes(ctx, req.GetWorkspace(), req.GetAllWorkspaces()); err != nil {
			return nil, err
		}
	}
	var out []*openshellv1.ServiceEndpointResponse
	for _, sb := range sandboxes {
		recs, err := s.endpoints(ctx, sb.GetMetadata().GetId())
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			ep, err := decode(r)
			if err != nil {
				return nil, err
			}
			out = append(out, s.response(ep))
		}
	}
	out = page(out, int(req.GetOffset()), int(req.GetLimit()))
	return &openshellv1.ListServicesResponse{Services: out}, nil
}

func (s *Service) allSandboxes(ctx context.Context, workspace string, all bool) ([]*openshellv1.Sandbox, error) {
	var out []*openshellv1.Sandbox
	for offset := 0; ; offset += store.MaxLimit {
		o := lifecycle.ListOptions{Limit: store.MaxLimit, Offset: offset, AllWorkspaces: all}
		if !all {
			o.Workspace = workspace
		}
		list, err := s.o.Sandboxes.List(ctx, o)
		if err != nil {
			return nil, err
		}
		out = append(out, list...)
		if len(list) < store.MaxLimit {
			return out, nil
		}
	}
}

func page[T any](in []T, offset, limit int) []T {
	if limit == 0 {
		limit = store.DefaultLimit
	}
	if offset >= len(in) {
		return nil
	}
	in = in[offset:]
	return in[:min(limit, len(in))]
}

// DeleteService removes an endpoint; deleted is false when there was none.
func (s *Service) DeleteService(ctx context.Context, req *openshellv1.DeleteServiceRequest) (*openshellv1.DeleteServiceResponse, error) {
	if err := ValidateName("service", req.GetService(), false); err != nil {
		return nil, err
	}
	sb, err := s.sandbox(ctx, req.GetWorkspace(), req.GetSandbox())
	if err != nil {
		return nil, err
	}
	rec, _, err := s.find(ctx, sb, req.GetService())
	if errors.Is(err, errdefs.ErrNotFound) {
		return &openshellv1.DeleteServiceResponse{Deleted: false}, nil
	}
	if err != nil {
		return nil, err
	}
	deleted, err := s.o.Store.Delete(ctx, store.TypeServiceEndpoint, rec.ID)
	if err != nil {
		return nil, err
	}
	return &openshellv1.DeleteServiceResponse{Deleted: deleted}, nil
}
