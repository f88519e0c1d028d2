// Command fakeinterceptor is a GatewayInterceptor service for the tests of
// internal/interceptor. It listens on a loopback port, prints
// "listening <addr>", answers Describe with the manifest given as ProtoJSON
// and records every Evaluate request it receives (ProtoJSON plus the raw
// wire bytes, base64, and the authorization metadata the call carried) as
// one JSON line in the record file. With -profiles
// it answers SnapshotProviderProfiles with those profiles and -revision,
// recording each call as the line {"snapshot":true}. With -require-audience
// it acts as a strict verifier: Describe answers Unauthenticated unless the
// bearer token's aud is that value (the claim is decoded, not verified: the
// tests verify signatures themselves). With -describes it appends a line to
// that file for every Describe it answers.
package main

import (
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"context"
	"crypto/tls"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	gipb "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

type server struct {
	gipb.UnimplementedGatewayInterceptorServer
	manifest  *gipb.InterceptorManifest
	behavior  string
	patches   []*gipb.JsonPatch
	mu        sync.Mutex
	record    *os.File
	snapshot  *gipb.ProviderProfileSnapshot
	audience  string // -require-audience
	describes string // -describes
}

func (s *server) SnapshotProviderProfiles(context.Context, *gipb.ProviderProfileSnapshotRequest) (*gipb.ProviderProfileSnapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.record.Write([]byte(`{"snapshot":true}` + "\n"))
	if s.behavior == "snapshot-fail" {
		return nil, status.Error(codes.Unavailable, "catalog backend down")
	}
	return s.snapshot, nil
}

func (s *server) Describe(ctx context.Context, _ *gipb.DescribeRequest) (*gipb.InterceptorManifest, error) {
	if s.describes != "" {
		f, err := os.OpenFile(s.describes, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		_, _ = f.WriteString("describe\n")
		_ = f.Close()
	}
	if s.audience != "" && bearerAudience(ctx) != s.audience {
		return nil, status.Error(codes.Unauthenticated, "extension token audience is not "+s.audience)
	}
	return s.manifest, nil
}

// bearerAudience is the aud claim of the call's bearer token, or "".
func bearerAudience(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	auth := md.Get("authorization")
	if len(auth) != 1 {
		return ""
	}
	parts := strings.Split(strings.TrimPrefix(auth[0], "Bearer "), ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var claims struct {
		Aud string `json:"aud"`
	}
	_ = json.Unmarshal(b, &claims)
	return claims.Aud
}

func (s *server) Evaluate(ctx context.Context, ev *gipb.InterceptorEvaluation) (*gipb.InterceptorResult, error) {
	s.write(ctx, ev)
	switch s.behavior {
	case "crash":
		os.Exit(3)
	case "slow":
		time.Sleep(5 * time.Second)
	case "deny":
		if ev.GetValidate() != nil {
			return &gipb.InterceptorResult{Allowed: false, Reason: "providers of this type are vetoed by policy", StatusCode: "FAILED_PRECONDITION"}, nil
		}
	case "deny-plain":
		if ev.GetModifyOperation() != nil || ev.GetValidate() != nil {
			return &gipb.InterceptorResult{Allowed: false, Reason: "not today"}, nil
		}
	case "deny-proposals": // a policy owner: refuse proposed chunks, let telemetry through
		if len(ev.GetValidate().GetProposedOperation().GetFields()["proposedChunks"].GetListValue().GetValues()) > 0 {
			return &gipb.InterceptorResult{Allowed: false, Reason: "policy proposals are reviewed elsewhere", StatusCode: "FAILED_PRECONDITION"}, nil
		}
	case "deny-post":
		return &gipb.InterceptorResult{Allowed: false}, nil
	}
	res := &gipb.InterceptorResult{Allowed: true, LogAnnotations: map[string]string{"seen": ev.GetBindingId()}}
	if ev.GetModifyOperation() != nil {
		res.Patches = s.patches
	}
	return res, nil
}

func (s *server) write(ctx context.Context, ev *gipb.InterceptorEvaluation) {
	if s.behavior == "noop" { // the benchmark's interceptor: allow, record nothing
		return
	}
	js, err := protojson.Marshal(ev)
	if err != nil {
		panic(err)
	}
	raw, err := proto.Marshal(ev)
	if err != nil {
		panic(err)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	line, _ := json.Marshal(map[string]any{"json": json.RawMessage(js), "raw": base64.StdEncoding.EncodeToString(raw), "authorization": md.Get("authorization")})
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.record.Write(append(line, '\n'))
}

func main() {
	manifest := flag.String("manifest", "{}", "InterceptorManifest as ProtoJSON")
	behavior := flag.String("behavior", "allow", "allow, noop (allow, record nothing), deny, deny-plain, deny-proposals (validate refuses requests with proposedChunks), deny-post, crash, slow or snapshot-fail (SnapshotProviderProfiles fails)")
	patches := flag.String("patches", "[]", "JSON array of JsonPatch (ProtoJSON) returned in modify_operation")
	record := flag.String("record", "", "file the evaluations are appended to")
	unixPath := flag.String("unix", "", "listen on this Unix socket instead of a loopback TCP port")
	certFile := flag.String("tls-cert", "", "serve TLS with this certificate (PEM)")
	keyFile := flag.String("tls-key", "", "and this key (PEM)")
	profiles := flag.String("profiles", "[]", "JSON array of ProviderProfile (ProtoJSON) served by SnapshotProviderProfiles")
	revision := flag.String("revision", "rev-1", "revision served by SnapshotProviderProfiles")
	audience := flag.String("require-audience", "", "refuse Describe unless the bearer token has this aud")
	describes := flag.String("describes", "", "file a line is appended to for every Describe")
	flag.Parse()
	s := &server{behavior: *behavior, manifest: &gipb.InterceptorManifest{}, audience: *audience, describes: *describes}
	if err := protojson.Unmarshal([]byte(*manifest), s.manifest); err != nil {
		fmt.Fprintln(os.Stderr, "manifest:", err)
		os.Exit(2)
	}
	s.snapshot = &gipb.ProviderProfileSnapshot{Revision: *revision}
	var rawProfiles []json.RawMessage
	if err := json.Unmarshal([]byte(*profiles), &rawProfiles); err != nil {
		fmt.Fprintln(os.Stderr, "profiles:", err)
		os.Exit(2)
	}
	for _, r := range rawProfiles {
		p := &openshellv1.ProviderProfile{}
		if err := protojson.Unmarshal(r, p); err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
			os.Exit(2)
		}
		s.snapshot.Profiles = append(s.snapshot.Profiles, p)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(*patches), &raw); err != nil {
		fmt.Fprintln(os.Stderr, "patches:", err)
		os.Exit(2)
	}
	for _, r := range raw {
		p := &gipb.JsonPatch{}
		if err := protojson.Unmarshal(r, p); err != nil {
			fmt.Fprintln(os.Stderr, "patch:", err)
			os.Exit(2)
		}
		s.patches = append(s.patches, p)
	}
	f, err := os.OpenFile(*record, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	s.record = f
	network, address := "tcp", "127.0.0.1:0"
	if *unixPath != "" {
		network, address = "unix", *unixPath
	}
	ln, err := net.Listen(network, address)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var opts []grpc.ServerOption
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	}
	g := grpc.NewServer(opts...)
	gipb.RegisterGatewayInterceptorServer(g, s)
	fmt.Printf("listening %s\n", ln.Addr())
	if err := g.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
