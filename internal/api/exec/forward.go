package exec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/store"
)

// CreateSshSession issues a token that authorizes ForwardTcp for one
// READY sandbox.
func (s *Service) CreateSshSession(ctx context.Context, req *openshellv1.CreateSshSessionRequest) (*openshellv1.CreateSshSessionResponse, error) {
	sb, err := s.readySandbox(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	token := uuid.NewString()
	sess := &openshellv1.SshSession{
		Metadata:  &datamodelv1.ObjectMeta{Id: token, Name: "ssh-" + token, Workspace: sb.GetMetadata().GetWorkspace()},
		SandboxId: sb.GetMetadata().GetId(), Token: token,
	}
	if s.o.SSHSessionTTL > 0 {
		sess.ExpiresAtMs = s.o.Now().Add(s.o.SSHSessionTTL).UnixMilli()
	}
	if _, err := s.o.Store.Create(ctx, store.TypeSSHSession, sess); err != nil {
		return nil, err
	}
	return &openshellv1.CreateSshSessionResponse{
		SandboxId: sess.SandboxId, Token: token, GatewayHost: s.o.GatewayHost, GatewayPort: s.o.GatewayPort,
		GatewayScheme: s.o.GatewayScheme, ExpiresAtMs: sess.ExpiresAtMs,
	}, nil
}

// RevokeSshSession revokes a session token of a sandbox the caller may
// see; any other token reads as unknown (revoked=false).
func (s *Service) RevokeSshSession(ctx context.Context, req *openshellv1.RevokeSshSessionRequest) (*openshellv1.RevokeSshSessionResponse, error) {
	if req.GetToken() == "" {
		return nil, errdefs.InvalidArgument("token is required")
	}
	sess := &openshellv1.SshSession{}
	if err := s.o.Store.Get(ctx, store.TypeSSHSession, req.GetToken(), sess); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return &openshellv1.RevokeSshSessionResponse{Revoked: false}, nil
		}
		return nil, err
	}
	if err := authz.EnsureSandboxScope(ctx, sess.GetSandboxId()); err != nil {
		return nil, err
	}
	// A user outside the session's workspace is answered as if the
	// token did not exist.
	if p, ok := auth.FromContext(ctx); ok && !p.IsSandbox() {
		if err := s.o.Authz.Workspace(ctx, sess.GetMetadata().GetWorkspace(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); errors.Is(err, errdefs.ErrPermissionDenied) {
			return &openshellv1.RevokeSshSessionResponse{Revoked: false}, nil
		} else if err != nil {
			return nil, err
		}
	}
	if sess.GetRevoked() {
		return &openshellv1.RevokeSshSessionResponse{Revoked: false}, nil
	}
	_, err := s.o.Store.UpdateCAS(ctx, store.TypeSSHSession, req.GetToken(), 0, sess, func(m proto.Message) error {
		m.(*openshellv1.SshSession).Revoked = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &openshellv1.RevokeSshSessionResponse{Revoked: true}, nil
}

// forwardCounter caps concurrent forwards per token and per sandbox.
type forwardCounter struct {
	perToken, perSandbox int
	mu                   sync.Mutex
	tokens, sandboxes    map[string]int
}

func newForwardCounter(perToken, perSandbox int) *forwardCounter {
	return &forwardCounter{perToken: perToken, perSandbox: perSandbox, tokens: map[string]int{}, sandboxes: map[string]int{}}
}

func (c *forwardCounter) acquire(token, sandbox string) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tokens[token] >= c.perToken {
		return nil, errdefs.ResourceExhausted(fmt.Sprintf("too many concurrent forwards for this session (max %d)", c.perToken))
	}
	if c.sandboxes[sandbox] >= c.perSandbox {
		return nil, errdefs.ResourceExhausted(fmt.Sprintf("too many concurrent forwards for this sandbox (max %d)", c.perSandbox))
	}
	c.tokens[token]++
	c.sandboxes[sandbox]++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.tokens[token]--; c.tokens[token] <= 0 {
			delete(c.tokens, token)
		}
		if c.sandboxes[sandbox]--; c.sandboxes[sandbox] <= 0 {
			delete(c.sandboxes, sandbox)
		}
	}, nil
}

// isLoopbackHost accepts only loopback targets inside the sandbox.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// authorizeForward checks the session token of a ForwardTcp init frame.
func (s *Service) authorizeForward(ctx context.Context, init *openshellv1.TcpForwardInit) error {
	if init.GetSandboxId() == "" {
		return errdefs.InvalidArgument("sandbox_id is required")
	}
	if init.GetAuthorizationToken() == "" {
		return errdefs.Unauthenticated("authorization_token is required for ForwardTcp")
	}
	sess := &openshellv1.SshSession{}
	if err := s.o.Store.Get(ctx, store.TypeSSHSession, init.GetAuthorizationToken(), sess); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.Unauthenticated("invalid or expired ssh session token")
		}
		return err
	}
	switch {
	case sess.GetRevoked():
		return errdefs.Unauthenticated("ssh session token has been revoked")
	case sess.GetExpiresAtMs() > 0 && s.o.Now().UnixMilli() >= sess.GetExpiresAtMs():
		return errdefs.Unauthenticated("ssh session token has expired")
	case sess.GetSandboxId() != init.GetSandboxId():
		return errdefs.PermissionDenied("ssh session token does not belong to this sandbox")
	}
	return nil
}

// ForwardTcp bridges a client byte stream to the sandbox's SSH server or to
// a loopback TCP port inside the sandbox. The first frame must be init
// with a valid ssh session token.
func (s *Service) ForwardTcp(stream openshellv1.OpenShell_ForwardTcpServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	init := first.GetInit()
	if init == nil {
		return errdefs.InvalidArgument("first TcpForwardFrame must be init")
	}
	if err := s.authorizeForward(ctx, init); err != nil {
		return err
	}
	var target relay.RelayTarget
	switch t := init.GetTarget().(type) {
	case *openshellv1.TcpForwardInit_Ssh:
		target = relay.SSHTarget()
	case *openshellv1.TcpForwardInit_Tcp:
		host := t.Tcp.GetHost()
		if host == "" {
			host = "127.0.0.1"
		}
		if !isLoopbackHost(host) {
			return errdefs.InvalidArgument(fmt.Sprintf("tcp target host %q is not a loopback address", host))
		}
		if t.Tcp.GetPort() == 0 || t.Tcp.GetPort() > 65535 {
			return errdefs.InvalidArgument("tcp target port must be 1-65535")
		}
		target = relay.TCPTarget(host, t.Tcp.GetPort())
	default:
		return errdefs.InvalidArgument("target is required")
	}
	target.ServiceID = init.GetServiceId()
	if _, err := s.readySandbox(ctx, init.GetSandboxId()); err != nil {
		return err
	}
	release, err := s.forwards.acquire(init.GetAuthorizationToken(), init.GetSandboxId())
	if err != nil {
		return err
	}
	defer release()
	conn, err := s.o.Relay.OpenRelay(ctx, init.GetSandboxId(), target)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	return bridgeForward(stream, conn)
}

// bridgeForward pumps bytes both ways until either side ends.
func bridgeForward(stream openshellv1.OpenShell_ForwardTcpServer, conn net.Conn) error {
	upDone := make(chan error, 1)
	go func() { // client → sandbox; joined below
		for {
			f, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				if cw, ok := conn.(interface{ CloseWrite() error }); ok && err == nil {
					_ = cw.CloseWrite()
				}
				upDone <- err
				return
			}
			if d := f.GetData(); len(d) > 0 {
				if _, err := conn.Write(d); err != nil {
					upDone <- err
					return
				}
			}
		}
	}()
	buf := make([]byte, relay.ChunkSize)
	var downErr error
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if serr := stream.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: append([]byte(nil), buf[:n]...)}}); serr != nil {
				downErr = serr
				break
			}
		}
		if err != nil {
			// EOF and a closed relay (the sandbox side or the client hung
			// up) are how a forward ends, not failures.
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && stream.Context().Err() == nil {
				downErr = err
			}
			break
		}
	}
	conn.Close()
	// The sandbox side ended: the call ends too, which also ends the
	// receive loop above (Recv fails once the handler returns).
	select {
	case err := <-upDone:
		if downErr == nil {
			downErr = err
		}
	default:
	}
	return downErr
}
