package interceptor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	gipb "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// Phase is one point of a call a binding can see.
type Phase = gipb.GatewayInterceptorPhase

// The phases, in the order they run.
const (
	ModifyOperation = gipb.GatewayInterceptorPhase_GATEWAY_INTERCEPTOR_PHASE_MODIFY_OPERATION
	Validate        = gipb.GatewayInterceptorPhase_GATEWAY_INTERCEPTOR_PHASE_VALIDATE
	PostCommit      = gipb.GatewayInterceptorPhase_GATEWAY_INTERCEPTOR_PHASE_POST_COMMIT
)

var phaseByName = map[string]Phase{"modify_operation": ModifyOperation, "validate": Validate, "post_commit": PostCommit}

func phaseName(p Phase) string {
	for n, v := range phaseByName {
		if v == p {
			return n
		}
	}
	return p.String()
}

// openShellService is the only service whose methods can be intercepted.
const openShellService = "openshell.v1.OpenShell"

// interceptable lists the unary openshell.v1.OpenShell methods an
// interceptor may bind: the calls that change state. A method not listed,
// including every RPC added later, cannot be bound until it is added here.
// SubmitPolicyAnalysis is listed because its proposed chunks can become
// active policy through the approval workflow.
var interceptable = []string{
	"CreateSandbox", "AdoptSandbox", "DeleteSandbox", "StopSandbox", "StartSandbox",
	"AttachSandboxProvider", "DetachSandboxProvider",
	"CreateSshSession", "RevokeSshSession", "ExposeService", "DeleteService",
	"CreateProvider", "UpdateProvider", "DeleteProvider",
	"ImportProviderProfiles", "UpdateProviderProfiles", "DeleteProviderProfile",
	"ConfigureProviderRefresh", "RotateProviderCredential", "DeleteProviderRefresh",
	"UpdateConfig", "SubmitPolicyAnalysis",
	"ApproveDraftChunk", "RejectDraftChunk", "ApproveAllDraftChunks", "EditDraftChunk", "UndoDraftChunk", "ClearDraftChunks",
	"CreateWorkspace", "DeleteWorkspace", "AddWorkspaceMember", "RemoveWorkspaceMember",
}

// Interceptable reports whether fullMethod ("/svc/Method" or "svc/Method")
// can be bound.
func Interceptable(fullMethod string) bool {
	svc, m, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	return ok && svc == openShellService && slices.Contains(interceptable, m)
}

// resolveRPC finds "svc/Method" in the compiled descriptors and checks it
// is interceptable.
func resolveRPC(rpc string) (protoreflect.MethodDescriptor, error) {
	svc, m, ok := strings.Cut(rpc, "/")
	if !ok || svc == "" || m == "" {
		return nil, fmt.Errorf("rpc %q: want service/Method, e.g. openshell.v1.OpenShell/CreateSandbox", rpc)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("rpc %q: no service %s in the OpenShell API", rpc, svc)
	}
	sd, isSvc := d.(protoreflect.ServiceDescriptor)
	if !isSvc {
		return nil, fmt.Errorf("rpc %q: %s is not a service", rpc, svc)
	}
	md := sd.Methods().ByName(protoreflect.Name(m))
	if md == nil {
		return nil, fmt.Errorf("rpc %q: service %s has no method %s", rpc, svc, m)
	}
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, fmt.Errorf("rpc %q is streaming: only unary methods can be intercepted", rpc)
	}
	if !Interceptable(rpc) {
		return nil, fmt.Errorf("rpc %q is not interceptable", rpc)
	}
	return md, nil
}

// binding is one step of the execution plan: one interceptor, one manifest
// binding, one RPC, one phase.
type binding struct {
	interceptor   string
	id            string
	phase         Phase
	failurePolicy FailurePolicy
	timeout       time.Duration
	maxPatches    int
	client        gipb.GatewayInterceptorClient
}

type key struct {
	method string // "/openshell.v1.OpenShell/CreateSandbox"
	phase  Phase
}

// Options configure Start.
type Options struct {
	Configs []Config
	Logger  *slog.Logger
	// Metrics receives the interceptor metrics; nil = not registered.
	Metrics Registerer
	// Tokens mints the extension token sent to each unix:// and https://
	// interceptor as "authorization: Bearer", for the interceptor's exact
	// audience; nil = no credential. http:// endpoints
	// (allow_insecure_transport) never get one.
	Tokens TokenMinter
}

// Runtime is the immutable execution plan plus the connections it uses.
// It is safe for concurrent use.
type Runtime struct {
	tokens  TokenMinter
	log     *slog.Logger
	plan    map[key][]binding
	methods map[string]protoreflect.MethodDescriptor
	conns   []*grpc.ClientConn
	metrics *metrics
	// profiles are the profile-capable interceptors by name.
	profiles map[string]*ProfileSource
}

// Start connects to every configured interceptor in order (order, then
// name), asks each for its manifest and builds the execution plan. Any
// invalid manifest, binding or setting is an error naming the interceptor.
func Start(ctx context.Context, o Options) (*Runtime, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(o.Metrics)
	if err != nil {
		return nil, err
	}
	r := &Runtime{tokens: o.Tokens, log: o.Logger.With("component", "interceptor"), plan: map[key][]binding{}, methods: map[string]protoreflect.MethodDescriptor{}, metrics: m, profiles: map[string]*ProfileSource{}}
	cfgs := slices.Clone(o.Configs)
	sort.SliceStable(cfgs, func(i, j int) bool {
		if cfgs[i].Order != cfgs[j].Order {
			return cfgs[i].Order < cfgs[j].Order
		}
		return cfgs[i].Name < cfgs[j].Name
	})
	for _, c := range cfgs {
		if err := r.add(ctx, c); err != nil {
			r.Close()
			return nil, fmt.Errorf("interceptor %q: %w", c.Name, err)
		}
	}
	n := 0
	for _, bs := range r.plan {
		n += len(bs)
	}
	r.log.Info("gateway interceptors initialized", "interceptors", len(cfgs), "bindings", n)
	return r, nil
}

// Close closes the connections to the interceptors.
func (r *Runtime) Close() {
	for _, c := range r.conns {
		_ = c.Close()
	}
}

func dial(c Config, tokens TokenMinter) (*grpc.ClientConn, error) {
	target := c.Endpoint
	var creds credentials.TransportCredentials
	switch {
	case strings.HasPrefix(target, "unix://"):
		creds = insecure.NewCredentials()
	case strings.HasPrefix(target, "http://"):
		target = "passthrough:///" + strings.TrimPrefix(target, "http://")
		creds = insecure.NewCredentials()
	default: // https://
		host := strings.TrimPrefix(target, "https://")
		target = "dns:///" + host
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLSCACertPath != "" {
			pem, err := os.ReadFile(c.TLSCACertPath)
			if err != nil {
				return nil, fmt.Errorf("tls_ca_cert_path: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("tls_ca_cert_path %s: no PEM certificate", c.TLSCACertPath)
			}
			tc.RootCAs = pool
		}
		creds = credentials.NewTLS(tc)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.MaxResponseBytes))}
	if tokens != nil && !strings.HasPrefix(c.Endpoint, "http://") {
		opts = append(opts, grpc.WithPerRPCCredentials(&extensionCredential{minter: tokens, audience: c.Audience, now: time.Now}))
	}
	return grpc.NewClient(target, opts...)
}

type rpcPhase struct {
	rpc   string
	phase Phase
}

func (r *Runtime) add(ctx context.Context, c Config) error {
	if strings.HasPrefix(c.Endpoint, "http://") {
		r.log.Warn("interceptor uses a plaintext endpoint and gets no extension token (allow_insecure_transport)", "interceptor", c.Name, "endpoint", c.Endpoint)
	}
	conn, err := dial(c, r.tokens)
	if err != nil {
		return err
	}
	r.conns = append(r.conns, conn)
	client := gipb.NewGatewayInterceptorClient(conn)
	dctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	man, err := client.Describe(dctx, &gipb.DescribeRequest{})
	if err != nil {
		return fmt.Errorf("describe: %w", err)
	}
	if man.GetExpectedAudience() != "" && man.GetExpectedAudience() != c.Audience {
		return fmt.Errorf("manifest expects audience %q, configured audience is %q", man.GetExpectedAudience(), c.Audience)
	}
	if man.GetProviderProfiles() {
		r.profiles[c.Name] = &ProfileSource{name: c.Name, timeout: c.Timeout, client: client}
	}
	manifestDefault, err := parseFailurePolicy(man.GetFailurePolicy())
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	configured := map[rpcPhase]bool{}
	override := map[string]FailurePolicy{}
	for _, b := range c.Bindings {
		override[b.RPC] = b.FailurePolicy
		for _, p := range b.Phases {
			configured[rpcPhase{b.RPC, p}] = true
		}
	}
	declared := map[rpcPhase]bool{}
	ids := map[string]bool{}
	var steps []struct {
		k key
		b binding
	}
	for _, mb := range man.GetBindings() {
		id := mb.GetId()
		if id == "" {
			return errors.New("manifest: a binding has no id")
		}
		if ids[id] {
			return fmt.Errorf("manifest: binding id %q declared twice", id)
		}
		ids[id] = true
		rpc := selectorRPC(mb.GetSelector())
		md, err := resolveRPC(rpc)
		if err != nil {
			return fmt.Errorf("binding %q: %w", id, err)
		}
		if len(mb.GetPhases()) == 0 {
			return fmt.Errorf("binding %q: no phases", id)
		}
		bp, err := parseFailurePolicy(mb.GetFailurePolicy())
		if err != nil {
			return fmt.Errorf("binding %q: %w", id, err)
		}
		fp := firstPolicy(override[rpc], c.FailurePolicy, bp, manifestDefault, FailClosed)
		seen := map[Phase]bool{}
		for _, p := range mb.GetPhases() {
			if _, ok := phaseByName[phaseName(p)]; !ok {
				return fmt.Errorf("binding %q: phase %s is not one of modify_operation, validate, post_commit", id, p)
			}
			if seen[p] {
				return fmt.Errorf("binding %q: phase %s listed twice", id, phaseName(p))
			}
			seen[p] = true
			rp := rpcPhase{rpc, p}
			if declared[rp] {
				return fmt.Errorf("binding %q: %s %s is declared by two bindings", id, rpc, phaseName(p))
			}
			declared[rp] = true
			if c.BindingPolicy != Dynamic && !configured[rp] {
				return fmt.Errorf("binding %q: %s %s is not configured (binding_policy %s)", id, rpc, phaseName(p), c.BindingPolicy)
			}
			if p == PostCommit && fp != FailOpen {
				return fmt.Errorf("binding %q: post_commit is observational and needs failure_policy fail_open, resolved %s", id, fp)
			}
			full := "/" + rpc
			r.methods[full] = md
			steps = append(steps, struct {
				k key
				b binding
			}{key{full, p}, binding{interceptor: c.Name, id: id, phase: p, failurePolicy: fp, timeout: c.Timeout, maxPatches: c.MaxPatches, client: client}})
		}
	}
	if c.BindingPolicy == Exact {
		var missing []string
		for rp := range configured {
			if !declared[rp] {
				missing = append(missing, rp.rpc+" "+phaseName(rp.phase))
			}
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			return fmt.Errorf("binding_policy exact: configured but not declared by the manifest: %s", strings.Join(missing, ", "))
		}
	}
	for _, s := range steps {
		r.plan[s.k] = append(r.plan[s.k], s.b)
	}
	return nil
}

func selectorRPC(s *gipb.InterceptorSelector) string {
	if s.GetRpc() != "" {
		return s.GetRpc()
	}
	return s.GetService() + "/" + s.GetMethod()
}

func firstPolicy(ps ...FailurePolicy) FailurePolicy {
	for _, p := range ps {
		if p != "" {
			return p
		}
	}
	return FailClosed
}

// registered asserts at build time that the OpenShell service is linked in,
// so its descriptors are in the global registry.
var _ = openshellv1.OpenShell_ServiceDesc
