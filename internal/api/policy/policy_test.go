package policy_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/policy"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

func livePolicy() *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{
		Version:    1,
		Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true, ReadOnly: []string{"/usr"}, ReadWrite: []string{"/tmp"}},
		NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
			"gh": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443}}},
		},
	}
}

// setup returns the policy service of an OIDC gateway over the fixture,
// with sandbox "pol" in team-a created with livePolicy.
func setup(t *testing.T) (*policy.Service, *apitest.Fixture, string) {
	t.Helper()
	f := apitest.NewFixture(t)
	svc := policy.New(policy.Options{Engine: f.Engine, Store: f.Store, Authz: f.Authz(true)})
	sb, err := f.Engine.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "pol", Workspace: "team-a", Spec: &openshellv1.SandboxSpec{Policy: livePolicy()}})
	if err != nil {
		t.Fatal(err)
	}
	return svc, f, sb.GetMetadata().GetId()
}

func status(ctx context.Context, t *testing.T, svc *policy.Service, version uint32) *openshellv1.GetSandboxPolicyStatusResponse {
	t.Helper()
	r, err := svc.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Name: "pol", Workspace: "team-a", Version: version})
	if err != nil {
		t.Fatalf("GetSandboxPolicyStatus(%d): %v", version, err)
	}
	return r
}

// The supervisor of a sandbox created with spec.policy gets version 1 from
// GetSandboxConfig and its report for version 1 is stored (it used to be
// NotFound "policy version 1 not found", and the sandbox never became
// READY).
func TestSupervisorReportsOnCreationPolicy(t *testing.T) {
	svc, _, id := setup(t)
	sup := apitest.As(t.Context(), apitest.Sandbox(id))
	cfg, err := svc.GetSandboxConfig(sup, &sandboxv1.GetSandboxConfigRequest{SandboxId: id})
	if err != nil || cfg.GetVersion() != 1 || !proto.Equal(cfg.GetPolicy(), livePolicy()) {
		t.Fatalf("GetSandboxConfig = %v, %v; want version 1 of spec.policy", cfg, err)
	}
	const reason = "network policies are not enforced by this supervisor: there is no egress proxy (rules: gh)"
	if _, err := svc.ReportPolicyStatus(sup, &openshellv1.ReportPolicyStatusRequest{
		SandboxId: id, Version: 1, Status: openshellv1.PolicyStatus_POLICY_STATUS_FAILED, LoadError: reason,
	}); err != nil {
		t.Fatalf("ReportPolicyStatus(1, FAILED) = %v", err)
	}
	ua := apitest.As(t.Context(), apitest.OIDCUser("ua"))
	st := status(ua, t, svc, 0)
	if r := st.GetRevision(); r.GetVersion() != 1 || r.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_FAILED || r.GetLoadError() != reason || st.GetActiveVersion() != 0 {
		t.Errorf("GetSandboxPolicyStatus = %v, want version 1 FAILED with the reason, active 0", st)
	}
	if _, err := svc.ReportPolicyStatus(sup, &openshellv1.ReportPolicyStatusRequest{SandboxId: id, Version: 1, Status: openshellv1.PolicyStatus_POLICY_STATUS_LOADED}); err != nil {
		t.Fatal(err)
	}
	st = status(ua, t, svc, 1)
	if r := st.GetRevision(); r.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_LOADED || r.GetLoadError() != "" || r.GetLoadedAtMs() == 0 || st.GetActiveVersion() != 1 {
		t.Errorf("after LOADED: GetSandboxPolicyStatus = %v, want LOADED, active 1", st)
	}
}

func TestReportPolicyStatusRefusals(t *testing.T) {
	svc, f, id := setup(t)
	for _, tc := range []struct {
		name string
		p    *auth.Principal
		req  *openshellv1.ReportPolicyStatusRequest
		code codes.Code
		msg  string
	}{
		{"another sandbox", apitest.Sandbox(f.SandboxA), &openshellv1.ReportPolicyStatusRequest{SandboxId: id, Version: 1, Status: openshellv1.PolicyStatus_POLICY_STATUS_LOADED},
			codes.PermissionDenied, "cross-sandbox access denied"},
		{"no version", apitest.Sandbox(id), &openshellv1.ReportPolicyStatusRequest{SandboxId: id, Status: openshellv1.PolicyStatus_POLICY_STATUS_LOADED},
			codes.InvalidArgument, "version is required"},
		{"pending", apitest.Sandbox(id), &openshellv1.ReportPolicyStatusRequest{SandboxId: id, Version: 1, Status: openshellv1.PolicyStatus_POLICY_STATUS_PENDING},
			codes.InvalidArgument, "status must be LOADED or FAILED"},
		{"unknown version", apitest.Sandbox(id), &openshellv1.ReportPolicyStatusRequest{SandboxId: id, Version: 7, Status: openshellv1.PolicyStatus_POLICY_STATUS_LOADED},
			codes.NotFound, "policy version 7 not found"},
	} {
		_, err := svc.ReportPolicyStatus(apitest.As(t.Context(), tc.p), tc.req)
		apitest.WantErr(t, "ReportPolicyStatus("+tc.name+")", err, tc.code, tc.msg)
	}
	if r := status(apitest.As(t.Context(), apitest.OIDCRoot), t, svc, 1).GetRevision(); r.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_PENDING {
		t.Errorf("after refused reports: version 1 is %v, want PENDING", r.GetStatus())
	}
}

// On a live sandbox only the network sections may change; refusals list
// every static change and store nothing.
func TestUpdateConfigLiveRules(t *testing.T) {
	svc, _, _ := setup(t)
	ctx := apitest.As(t.Context(), apitest.OIDCUser("aa"))
	changed := livePolicy()
	changed.Filesystem.IncludeWorkdir = false
	changed.Filesystem.ReadOnly = nil
	changed.Landlock = &sandboxv1.LandlockPolicy{Compatibility: "hard_requirement"}
	changed.Process = &sandboxv1.ProcessPolicy{RunAsUser: "root"}
	_, err := svc.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", Policy: changed})
	apitest.WantErr(t, "UpdateConfig(static changes)", err, codes.InvalidArgument,
		"filesystem include_workdir cannot be changed on a live sandbox; "+
			"filesystem read_only path '/usr' cannot be removed on a live sandbox; "+
			"landlock policy cannot be changed on a live sandbox (applied at startup); "+
			"process policy cannot be changed on a live sandbox (applied at startup); "+
			"policy contains unsafe content: run_as_user must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got 'root'")
	list, err := svc.ListSandboxPolicies(ctx, &openshellv1.ListSandboxPoliciesRequest{Name: "pol", Workspace: "team-a"})
	if err != nil || len(list.GetRevisions()) != 1 {
		t.Fatalf("ListSandboxPolicies after a refused update = %v, %v; want version 1 only", list, err)
	}

	more := livePolicy()
	more.NetworkPolicies["pypi"] = &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443}}}
	up, err := svc.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", Policy: more})
	if err != nil || up.GetVersion() != 2 {
		t.Fatalf("UpdateConfig(network rule) = %v, %v; want version 2", up, err)
	}
	list, err = svc.ListSandboxPolicies(ctx, &openshellv1.ListSandboxPoliciesRequest{Name: "pol", Workspace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	if revs := list.GetRevisions(); len(revs) != 2 || revs[0].GetVersion() != 2 || revs[1].GetVersion() != 1 ||
		revs[1].GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_SUPERSEDED || revs[0].GetPolicy() != nil {
		t.Errorf("ListSandboxPolicies = %v, want versions 2 (PENDING) and 1 (SUPERSEDED) without bodies", revs)
	}
}

// A sandbox without a policy takes the supervisor's first sync as its
// baseline; a user cannot then change its static sections.
func TestSupervisorSyncBecomesBaseline(t *testing.T) {
	svc, f, _ := setup(t)
	sup := apitest.As(t.Context(), apitest.Sandbox(f.SandboxA))
	if cfg, err := svc.GetSandboxConfig(sup, &sandboxv1.GetSandboxConfigRequest{SandboxId: f.SandboxA}); err != nil || cfg.GetPolicy() != nil || cfg.GetVersion() != 0 {
		t.Fatalf("GetSandboxConfig(no policy) = %v, %v; want no policy", cfg, err)
	}
	if up, err := svc.UpdateConfig(sup, &openshellv1.UpdateConfigRequest{Name: "sb", Policy: livePolicy()}); err != nil || up.GetVersion() != 1 {
		t.Fatalf("UpdateConfig(supervisor sync) = %v, %v; want version 1", up, err)
	}
	sb, err := f.Engine.GetByID(t.Context(), f.SandboxA)
	if err != nil || !proto.Equal(sb.GetSpec().GetPolicy(), livePolicy()) {
		t.Fatalf("spec.policy after the sync = %v, %v; want the synced policy", sb.GetSpec().GetPolicy(), err)
	}
	changed := livePolicy()
	changed.Filesystem.ReadWrite = []string{"/tmp", "/home"}
	_, err = svc.UpdateConfig(apitest.As(t.Context(), apitest.OIDCUser("aa")), &openshellv1.UpdateConfigRequest{Name: "sb", Workspace: "team-a", Policy: changed})
	apitest.WantErr(t, "UpdateConfig(after sync)", err, codes.InvalidArgument, "filesystem read_write path '/home' cannot be added on a live sandbox")
}

func TestPolicyStatusMembership(t *testing.T) {
	svc, _, _ := setup(t)
	ops := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"GetSandboxPolicyStatus", func(ctx context.Context) error {
			_, err := svc.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Name: "pol", Workspace: "team-a"})
			return err
		}},
		{"ListSandboxPolicies", func(ctx context.Context) error {
			_, err := svc.ListSandboxPolicies(ctx, &openshellv1.ListSandboxPoliciesRequest{Name: "pol", Workspace: "team-a"})
			return err
		}},
		{"UpdateConfig", func(ctx context.Context) error {
			_, err := svc.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: "pol", Workspace: "team-a", Policy: livePolicy()})
			return err
		}},
	}
	for _, tc := range []struct {
		name string
		p    *auth.Principal
		code codes.Code
		msg  string
	}{
		{"platform admin", apitest.OIDCRoot, codes.OK, ""},
		{"admin member", apitest.OIDCUser("aa"), codes.OK, ""},
		{"non-member", apitest.OIDCUser("stranger"), codes.NotFound, `sandbox "pol" not found in workspace "team-a"`},
		{"no subject", apitest.NoSubject, codes.NotFound, `sandbox "pol" not found in workspace "team-a"`},
	} {
		for _, o := range ops {
			err := o.call(apitest.As(t.Context(), tc.p))
			if errdefs.Code(err) != tc.code {
				t.Errorf("%s as %s = %v, want %v", o.name, tc.name, err, tc.code)
			} else if tc.msg != "" {
				apitest.WantErr(t, o.name+" as "+tc.name, err, tc.code, tc.msg)
			}
		}
	}
	ctx := apitest.As(t.Context(), apitest.OIDCRoot)
	_, err := svc.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Workspace: "team-a"})
	apitest.WantErr(t, "GetSandboxPolicyStatus(no name)", err, codes.InvalidArgument, "name is required")
	_, err = svc.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Global: true})
	apitest.WantErr(t, "GetSandboxPolicyStatus(global, none set)", err, codes.NotFound, "no global policy revision found")
	_, err = svc.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Name: "pol", Workspace: "team-a", Version: 9})
	apitest.WantErr(t, "GetSandboxPolicyStatus(version 9)", err, codes.NotFound, "no policy revision found for this sandbox")
}
