// Package apitest sets up what the tests of the API domain packages share:
// a real SQLite store holding the default workspace, a lifecycle engine
// over an in-memory fake driver, the principals of the authorization
// matrix, and a fixture workspace with members and a sandbox. It is
// imported only by tests.
package apitest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/credentials"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/open"
)

// FakeDriver keeps backend sandboxes in a map (unit logic only; the
// gateway end-to-end tests run the real process driver).
type FakeDriver struct {
	mu  sync.Mutex
	sbs map[string]compute.Sandbox
	// ValidateFn, when set (before the driver is used), runs in
	// ValidateCreate: after the API's checks, before the row is inserted.
	ValidateFn func(ctx context.Context, sb compute.Sandbox) error
}

var _ compute.Driver = (*FakeDriver)(nil)

// NewFakeDriver returns an empty FakeDriver.
func NewFakeDriver() *FakeDriver { return &FakeDriver{sbs: map[string]compute.Sandbox{}} }

// Capabilities implements compute.Driver.
func (d *FakeDriver) Capabilities(context.Context) (compute.Capabilities, error) {
	return compute.Capabilities{DriverName: "fake", DefaultImage: "img"}, nil
}

// ListenerRequirements implements compute.Driver.
func (d *FakeDriver) ListenerRequirements(context.Context) ([]compute.ListenerRequirement, error) {
	return nil, nil
}

// ValidateCreate implements compute.Driver.
func (d *FakeDriver) ValidateCreate(ctx context.Context, sb compute.Sandbox) error {
	if d.ValidateFn != nil {
		return d.ValidateFn(ctx, sb)
	}
	return nil
}

// Create implements compute.Driver.
func (d *FakeDriver) Create(_ context.Context, sb compute.Sandbox) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sbs[sb.ID] = sb
	return nil
}

// Get implements compute.Driver.
func (d *FakeDriver) Get(_ context.Context, ref compute.Ref) (compute.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sb, ok := d.sbs[ref.ID]
	if !ok {
		return compute.Sandbox{}, errdefs.ErrNotFound
	}
	return sb, nil
}

// List implements compute.Driver.
func (d *FakeDriver) List(context.Context) ([]compute.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]compute.Sandbox, 0, len(d.sbs))
	for _, sb := range d.sbs {
		out = append(out, sb)
	}
	return out, nil
}

// Stop implements compute.Driver.
func (d *FakeDriver) Stop(context.Context, compute.Ref) error { return nil }

// Start implements compute.Driver.
func (d *FakeDriver) Start(context.Context, compute.Ref) error { return nil }

// Delete implements compute.Driver.
func (d *FakeDriver) Delete(_ context.Context, ref compute.Ref) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.sbs[ref.ID]
	delete(d.sbs, ref.ID)
	return ok, nil
}

// Watch implements compute.Driver: unsupported.
func (d *FakeDriver) Watch(context.Context) (<-chan compute.Event, func() error, error) {
	return nil, nil, errdefs.Unimplemented("watch")
}

// EnsureWorkspace implements compute.Driver.
func (d *FakeDriver) EnsureWorkspace(context.Context, string) error { return nil }

// DeleteWorkspace implements compute.Driver.
func (d *FakeDriver) DeleteWorkspace(context.Context, string) error { return nil }

// AdminRole is the platform admin role of OIDC test gateways.
const AdminRole = "openshell-admin"

// Env is a store and an engine, as the gateway wires them.
type Env struct {
	Store  store.Store
	Engine *lifecycle.Engine
	Driver *FakeDriver
	// Providers seals credentials under a key made for the test; the
	// engine's ProviderExists asks it.
	Providers *providers.Store
}

// NewEnv returns an Env over a real SQLite store in t.TempDir holding the
// default workspace, as the gateway creates it at start.
func NewEnv(t testing.TB) *Env {
	t.Helper()
	st, err := open.Open(t.Context(), "sqlite:"+t.TempDir()+"/gateway.db", nil)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	CreateWorkspace(t, st, "default")
	d := NewFakeDriver()
	kr, err := credentials.LoadOrCreateKEK(t.TempDir() + "/credentials.kek")
	if err != nil {
		t.Fatal(err)
	}
	provs := providers.NewStore(providers.Options{Objects: st, Keyring: kr})
	eng, err := lifecycle.New(t.Context(), lifecycle.Options{
		Store: lifecycle.ObjectStore{S: st}, Driver: d, ProviderExists: provs.Exists,
		WorkspaceAccepts: authz.New(authz.Options{Store: st}).WorkspaceAcceptsSandboxes,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &Env{Store: st, Engine: eng, Driver: d, Providers: provs}
}

// Authz returns the authorizer of a gateway with OIDC on or off.
func (e *Env) Authz(oidc bool) *authz.Authorizer {
	return authz.New(authz.Options{Store: e.Store, Sandboxes: e.Engine, OIDC: oidc, AdminRole: AdminRole})
}

// CreateWorkspace stores an ACTIVE workspace directly.
func CreateWorkspace(t testing.TB, st store.Store, name string) {
	t.Helper()
	w := &datamodelv1.Workspace{
		Metadata: &datamodelv1.ObjectMeta{Id: authz.WorkspaceID(name), Name: name},
		Status:   &datamodelv1.WorkspaceStatus{Phase: authz.WorkspaceActive},
	}
	if _, err := st.Create(t.Context(), store.TypeWorkspace, w); err != nil {
		t.Fatalf("create workspace %s: %v", name, err)
	}
}

// AddMember stores a workspace membership directly.
func AddMember(t testing.TB, st store.Store, ws, subject string, role openshellv1.WorkspaceRole) {
	t.Helper()
	m := &openshellv1.WorkspaceMember{
		Metadata:         &datamodelv1.ObjectMeta{Name: subject, Workspace: ws},
		PrincipalSubject: subject, Role: role,
	}
	if _, err := st.Create(t.Context(), store.TypeWorkspaceMember, m); err != nil {
		t.Fatalf("add member %s to %s: %v", subject, ws, err)
	}
}

// Fixture is the world of the authorization matrices: workspaces "team-a"
// (user member "ua", admin member "aa") and "team-b" (no members), and a
// sandbox "sb" in each.
type Fixture struct {
	*Env
	// SandboxA and SandboxB are the ids of sandbox "sb" in team-a and
	// team-b.
	SandboxA, SandboxB string
}

// NewFixture returns a Fixture.
func NewFixture(t testing.TB) *Fixture {
	t.Helper()
	e := NewEnv(t)
	CreateWorkspace(t, e.Store, "team-a")
	CreateWorkspace(t, e.Store, "team-b")
	AddMember(t, e.Store, "team-a", "ua", openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER)
	AddMember(t, e.Store, "team-a", "aa", openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN)
	f := &Fixture{Env: e}
	for _, ws := range []string{"team-a", "team-b"} {
		sb, err := e.Engine.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "sb", Workspace: ws})
		if err != nil {
			t.Fatalf("create sandbox in %s: %v", ws, err)
		}
		if ws == "team-a" {
			f.SandboxA = sb.GetMetadata().GetId()
		} else {
			f.SandboxB = sb.GetMetadata().GetId()
		}
	}
	return f
}

// Principals of the authorization matrices.
var (
	LocalDev = &auth.Principal{Kind: auth.KindUser, Source: auth.SourceLocalDev, Subject: "unauthenticated-local-dev", Roles: []string{auth.DefaultUserRole, AdminRole}}
	MTLSUser = &auth.Principal{Kind: auth.KindUser, Source: auth.SourceMTLS, Subject: "openshell-client", Roles: []string{auth.DefaultUserRole}}
	OIDCRoot = &auth.Principal{Kind: auth.KindUser, Source: auth.SourceOIDC, Subject: "root", Roles: []string{AdminRole}}
	// NoSubject is an OIDC user whose token carries no subject.
	NoSubject = &auth.Principal{Kind: auth.KindUser, Source: auth.SourceOIDC, Roles: []string{auth.DefaultUserRole}}
)

// OIDCUser is an OIDC user with the default role.
func OIDCUser(subject string) *auth.Principal {
	return &auth.Principal{Kind: auth.KindUser, Source: auth.SourceOIDC, Subject: subject, Roles: []string{auth.DefaultUserRole}}
}

// Sandbox is the JWT principal of sandbox id.
func Sandbox(id string) *auth.Principal {
	return &auth.Principal{Kind: auth.KindSandbox, Source: auth.SourceSandboxJWT, SandboxID: id}
}

// As returns ctx carrying principal p.
func As(ctx context.Context, p *auth.Principal) context.Context { return auth.NewContext(ctx, p) }

// WantErr fails t unless err has code and its text contains msg.
func WantErr(t testing.TB, what string, err error, code codes.Code, msg string) {
	t.Helper()
	if got := errdefs.Code(err); got != code || !strings.Contains(fmt.Sprint(err), msg) {
		t.Fatalf("%s: error = %v (%v), want %v containing %q", what, err, got, code, msg)
	}
}

// Call is one RPC of an authorization matrix.
type Call struct {
	Name string
	Do   func(ctx context.Context) error
}

// Case is one principal of an authorization matrix and the codes it gets,
// in the order of the calls.
type Case struct {
	Name string
	P    *auth.Principal
	Want []codes.Code
}

// Matrix runs every call as every principal and checks the codes.
func Matrix(t *testing.T, calls []Call, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		if len(tc.Want) != len(calls) {
			t.Fatalf("case %s has %d codes for %d calls", tc.Name, len(tc.Want), len(calls))
		}
		t.Run(tc.Name, func(t *testing.T) {
			for i, c := range calls {
				err := c.Do(As(t.Context(), tc.P))
				if got := errdefs.Code(err); got != tc.Want[i] {
					t.Errorf("%s as %s = %v (%v), want %v", c.Name, tc.Name, got, err, tc.Want[i])
				}
			}
		})
	}
}
