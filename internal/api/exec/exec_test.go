package exec_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/exec"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

const (
	ok       = codes.OK
	nf       = codes.NotFound
	denied   = codes.PermissionDenied
	notReady = codes.FailedPrecondition // past authorization: the fixture's sandboxes have no supervisor
)

// bidi is the server side of ForwardTcp for handler tests: Recv returns
// the init frame, then waits for the call to end.
type bidi struct {
	*apitest.SendStream[openshellv1.TcpForwardFrame]
	init *openshellv1.TcpForwardFrame
}

func (b *bidi) Recv() (*openshellv1.TcpForwardFrame, error) {
	if f := b.init; f != nil {
		b.init = nil
		return f, nil
	}
	<-b.Ctx.Done()
	return nil, b.Ctx.Err()
}

// session stores an SSH session token for sandbox id in workspace ws.
func session(t *testing.T, f *apitest.Fixture, ws, id, token string) {
	t.Helper()
	sess := &openshellv1.SshSession{
		Metadata:  &datamodelv1.ObjectMeta{Id: token, Name: "ssh-" + token, Workspace: ws},
		SandboxId: id, Token: token,
	}
	if _, err := f.Store.Create(t.Context(), store.TypeSSHSession, sess); err != nil {
		t.Fatal(err)
	}
}

// TestAuthorization runs the exec and forwarding RPCs as each kind of
// principal on an OIDC gateway against team-a's sandbox.
func TestAuthorization(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := exec.New(exec.Options{Store: f.Store, Authz: f.Authz(true)})
	t.Cleanup(svc.Close)
	session(t, f, "team-a", f.SandboxA, "tok-a")
	calls := []apitest.Call{
		{Name: "ExecSandbox", Do: func(ctx context.Context) error {
			return svc.ExecSandbox(&openshellv1.ExecSandboxRequest{SandboxId: f.SandboxA, Command: []string{"true"}},
				apitest.NewSendStream[openshellv1.ExecSandboxEvent](ctx, 16))
		}},
		{Name: "CreateSshSession", Do: func(ctx context.Context) error {
			_, err := svc.CreateSshSession(ctx, &openshellv1.CreateSshSessionRequest{SandboxId: f.SandboxA})
			return err
		}},
		{Name: "ForwardTcp", Do: func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			return svc.ForwardTcp(&bidi{
				SendStream: apitest.NewSendStream[openshellv1.TcpForwardFrame](ctx, 16),
				init: &openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Init{Init: &openshellv1.TcpForwardInit{
					SandboxId: f.SandboxA, AuthorizationToken: "tok-a", Target: &openshellv1.TcpForwardInit_Ssh{Ssh: &openshellv1.SshRelayTarget{}},
				}}},
			})
		}},
	}
	apitest.Matrix(t, calls, []apitest.Case{
		{Name: "local dev", P: apitest.LocalDev, Want: []codes.Code{notReady, notReady, notReady}},
		{Name: "platform admin", P: apitest.OIDCRoot, Want: []codes.Code{notReady, notReady, notReady}},
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{notReady, notReady, notReady}},
		{Name: "non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{nf, nf, nf}},
		{Name: "no subject", P: apitest.NoSubject, Want: []codes.Code{nf, nf, nf}},
		{Name: "own sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{notReady, notReady, notReady}},
		{Name: "other sandbox", P: apitest.Sandbox(f.SandboxB), Want: []codes.Code{denied, denied, denied}},
	})
}

// TestRevokeSshSession: a token of a sandbox the caller may not see reads
// as unknown and stays valid; its owner revokes it.
func TestRevokeSshSession(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := exec.New(exec.Options{Store: f.Store, Authz: f.Authz(true)})
	t.Cleanup(svc.Close)
	session(t, f, "team-a", f.SandboxA, "tok-a")
	revoke := func(ctx context.Context) (bool, error) {
		r, err := svc.RevokeSshSession(ctx, &openshellv1.RevokeSshSessionRequest{Token: "tok-a"})
		return r.GetRevoked(), err
	}
	for _, c := range []struct {
		name string
		ctx  context.Context
		code codes.Code
	}{
		{"non-member", apitest.As(t.Context(), apitest.OIDCUser("stranger")), ok},
		{"other sandbox", apitest.As(t.Context(), apitest.Sandbox(f.SandboxB)), denied},
	} {
		got, err := revoke(c.ctx)
		if got || errdefs.Code(err) != c.code {
			t.Errorf("RevokeSshSession as %s = %v, %v; want revoked=false, code %v", c.name, got, err, c.code)
		}
	}
	if got, err := revoke(apitest.As(t.Context(), apitest.OIDCUser("ua"))); !got || err != nil {
		t.Fatalf("RevokeSshSession as a member = %v, %v; want revoked", got, err)
	}
}
