package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// LocalGatewayAddr is where openshell looks for a gateway when none is
// registered.
const LocalGatewayAddr = "127.0.0.1:17670"

// gatewayTarget is a resolved gateway: where to dial and with which TLS
// material.
type gatewayTarget struct {
	Name     string // registry name, "local", or "" for --gateway-endpoint
	Endpoint string
	CAFile   string
	CertFile string
	KeyFile  string
	Insecure bool   // skip TLS verification
	Source   string // how it was chosen, for "gateway info" and -v
	// AuthMode is the registry entry's auth_mode ("" when not registered).
	AuthMode string
	// BearerToken is sent as "authorization: Bearer ..." (auth_mode oidc).
	// Never printed or logged.
	BearerToken string
}

func (t gatewayTarget) describe() string {
	if t.Name == "" {
		return fmt.Sprintf("gateway at %s", t.Endpoint)
	}
	return fmt.Sprintf("gateway %q at %s", t.Name, t.Endpoint)
}

// resolveGateway picks the gateway: --gateway-endpoint, then --gateway NAME,
// then active_gateway, then (nothing registered) the local gateway on
// 127.0.0.1:17670, over TLS when the local TLS directory holds client
// material.
func (a *app) resolveGateway() (gatewayTarget, error) {
	reg := a.newRegistry()
	if a.gatewayEndpoint != "" {
		if _, err := validateEndpoint(a.gatewayEndpoint); err != nil {
			return gatewayTarget{}, err
		}
		t := gatewayTarget{Endpoint: a.gatewayEndpoint, Insecure: a.gatewayInsecure, Source: "--gateway-endpoint"}
		if a.gatewayName != "" {
			// Reuse a registered gateway's TLS material for an explicit endpoint.
			if e, err := reg.Get(a.gatewayName); err == nil {
				t.Name = e.Name
				t.CAFile, t.CertFile, t.KeyFile = e.CAFile(), e.CertFile(), e.KeyFile()
				if err := a.applyAuthMode(reg, e, &t); err != nil {
					return gatewayTarget{}, err
				}
			}
		}
		return t, nil
	}
	fromEntry := func(e gatewayEntry, source string) (gatewayTarget, error) {
		t := gatewayTarget{
			Name: e.Name, Endpoint: e.Endpoint,
			CAFile: e.CAFile(), CertFile: e.CertFile(), KeyFile: e.KeyFile(),
			Insecure: e.Insecure || a.gatewayInsecure, Source: source,
		}
		return t, a.applyAuthMode(reg, e, &t)
	}
	if a.gatewayName != "" {
		e, err := reg.Get(a.gatewayName)
		if err != nil {
			return gatewayTarget{}, err
		}
		return fromEntry(e, "--gateway")
	}
	if name := reg.Active(); name != "" {
		e, err := reg.Get(name)
		if err != nil {
			return gatewayTarget{}, fmt.Errorf("active gateway %q: %w (select another with 'openshell gateway select NAME')", name, err)
		}
		return fromEntry(e, "active gateway")
	}
	all, err := reg.List()
	if err != nil {
		return gatewayTarget{}, err
	}
	switch len(all) {
	case 0:
		return a.localGateway(), nil
	case 1:
		return fromEntry(all[0], "only registered gateway")
	default:
		return gatewayTarget{}, fmt.Errorf("%d gateways are registered but none is selected: choose one with 'openshell gateway select NAME' or --gateway NAME", len(all))
	}
}

// selectedGatewayName is the registry name resolveGateway would use, read
// without side effects: --gateway, else nothing for an explicit
// --gateway-endpoint, else active_gateway, else the only registered
// gateway; "" when none applies.
func (a *app) selectedGatewayName() (string, error) {
	if a.gatewayName != "" {
		return a.gatewayName, nil
	}
	if a.gatewayEndpoint != "" {
		return "", nil
	}
	reg := a.newRegistry()
	if name := reg.Active(); name != "" {
		return name, nil
	}
	all, err := reg.List()
	if err != nil || len(all) != 1 {
		return "", err
	}
	return all[0].Name, nil
}

// applyAuthMode sets t's credentials from the entry's auth_mode: mtls and
// plaintext need nothing more; oidc sends the access token stored by
// 'gateway login' (over https only), refreshed when it expires within 30 s;
// other modes are refused instead of dialing the gateway without
// credentials.
func (a *app) applyAuthMode(reg *registry, e gatewayEntry, t *gatewayTarget) error {
	t.AuthMode = e.effectiveAuthMode()
	switch t.AuthMode {
	case authModeMTLS, authModePlaintext:
		return nil
	case authModeOIDC:
		if !strings.HasPrefix(t.Endpoint, "https://") {
			return fmt.Errorf("gateway %q uses OIDC, which needs an https:// endpoint, not %s", e.Name, t.Endpoint)
		}
		ctx := a.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		tok, err := a.oidcAccessToken(ctx, reg, e, t.Insecure)
		if err != nil {
			if a.probeWithoutCredentials {
				a.credentialsProblem = err.Error()
				return nil
			}
			return err
		}
		t.BearerToken = tok
		return nil
	case authModeCloudflareJWT:
		return fmt.Errorf("gateway %q uses auth_mode %q, which this openshell does not support yet; use OpenShell's CLI for it", e.Name, t.AuthMode)
	default:
		return fmt.Errorf("gateway %q: unknown auth_mode %q in %s", e.Name, t.AuthMode, filepath.Join(e.Dir, "metadata.json"))
	}
}

// bearerCredentials sends a bearer token with every RPC, over TLS only.
type bearerCredentials struct{ token string }

func (b bearerCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (bearerCredentials) RequireTransportSecurity() bool { return true }

// localTLSDir is where openshell-gateway generate-certs leaves client
// material for the local gateway.
func (a *app) localTLSDir() string {
	if v := a.getenv("OPENSHELL_LOCAL_TLS_DIR"); v != "" {
		return v
	}
	return filepath.Join(stateHome(a.lookupEnv), "openshell", "tls")
}

func (a *app) localGateway() gatewayTarget {
	dir := a.localTLSDir()
	ca := filepath.Join(dir, "ca.crt")
	crt := filepath.Join(dir, "client", "tls.crt")
	key := filepath.Join(dir, "client", "tls.key")
	if fileExists(ca) && fileExists(crt) && fileExists(key) {
		return gatewayTarget{Name: "local", Endpoint: "https://" + LocalGatewayAddr, CAFile: ca, CertFile: crt, KeyFile: key,
			Insecure: a.gatewayInsecure, Source: "local gateway (TLS material in " + dir + ")"}
	}
	return gatewayTarget{Name: "local", Endpoint: "http://" + LocalGatewayAddr, Source: "local gateway"}
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// dialTarget returns the gRPC target and transport credentials for t.
func dialTarget(t gatewayTarget) (string, credentials.TransportCredentials, error) {
	u, err := url.Parse(t.Endpoint)
	if err != nil {
		return "", nil, err
	}
	switch u.Scheme {
	case "http":
		return "passthrough:///" + u.Host, insecure.NewCredentials(), nil
	case "unix":
		return "unix://" + u.Path, insecure.NewCredentials(), nil
	case "https":
		cfg, hostport, err := tlsConfigFor(t, u)
		if err != nil {
			return "", nil, err
		}
		return "passthrough:///" + hostport, credentials.NewTLS(cfg), nil
	}
	return "", nil, fmt.Errorf("unsupported endpoint scheme %q", u.Scheme)
}

// tlsConfigFor is the client TLS configuration for an https:// target and
// the host:port to dial.
func tlsConfigFor(t gatewayTarget, u *url.URL) (*tls.Config, string, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: t.Insecure} //nolint:gosec // explicit user choice
	host := u.Host
	if u.Port() == "" {
		host += ":443"
	}
	cfg.ServerName = u.Hostname()
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, "", fmt.Errorf("read CA %s: %w", t.CAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, "", fmt.Errorf("CA %s holds no PEM certificate", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" && t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, "", fmt.Errorf("load client certificate %s: %w", t.CertFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, host, nil
}

// gateway resolves and dials the gateway once per Run.
func (a *app) gateway() (openshellv1.OpenShellClient, error) {
	if a.client != nil {
		return a.client, nil
	}
	t, err := a.resolveGateway()
	if err != nil {
		return nil, err
	}
	target, creds, err := dialTarget(t)
	if err != nil {
		return nil, err
	}
	if a.verbose {
		_, _ = fmt.Fprintf(a.stderr, "using %s (%s)\n", t.describe(), t.Source)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if t.BearerToken != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerCredentials{token: t.BearerToken}))
	}
	if md := envTraceContext(a.getenv); md != nil {
		opts = append(opts, traceContextInterceptors(md)...)
	}
	conn, err := grpc.NewClient(target, append(opts,
		grpc.WithChainUnaryInterceptor(a.debugUnary),
		grpc.WithChainStreamInterceptor(a.debugStream),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
	)...)
	if err != nil {
		return nil, err
	}
	a.target = &t
	a.conn = conn
	a.client = openshellv1.NewOpenShellClient(conn)
	return a.client, nil
}

// debugUnary logs method names, codes and durations; never payloads, so no
// token or credential can leak.
func (a *app) debugUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	start := time.Now()
	err := invoker(ctx, method, req, reply, cc, opts...)
	a.logger.Debug("rpc", "method", method, "code", status.Code(err).String(), "duration", time.Since(start).Round(time.Millisecond))
	return err
}

func (a *app) debugStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	a.logger.Debug("rpc stream open", "method", method, "code", status.Code(err).String())
	if err != nil {
		return nil, err
	}
	return &loggedStream{ClientStream: cs, a: a, method: method}, nil
}

type loggedStream struct {
	grpc.ClientStream
	a      *app
	method string
	done   bool
}

func (s *loggedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil && !s.done {
		s.done = true
		code := status.Code(err).String()
		if errors.Is(err, errEOF) {
			code = "OK"
		}
		s.a.logger.Debug("rpc stream end", "method", s.method, "code", code)
	}
	return err
}
