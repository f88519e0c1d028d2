package gatewaytest

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/store/postgres/postgrestest"
)

// waitPolicyStatus polls GetSandboxPolicyStatus until version of sandbox
// name leaves PENDING and returns that revision with the active version.
func waitPolicyStatus(ctx context.Context, t testing.TB, c openshellv1.OpenShellClient, name string, version uint32) *openshellv1.GetSandboxPolicyStatusResponse {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last *openshellv1.GetSandboxPolicyStatusResponse
	var lastErr error
	for time.Now().Before(deadline) {
		last, lastErr = c.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Name: name, Version: version})
		if lastErr == nil && last.GetRevision().GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_PENDING {
			return last
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("policy version %d of %s still pending after 30s: %v, %v", version, name, last, lastErr)
	return nil
}

// TestPolicyEndToEnd: a real gateway and real supervisors. An unsafe
// spec.policy is refused with every violation and leaves no sandbox; a
// sandbox created with a policy reaches READY, its policy is version 1 and
// the supervisor's report is stored on it: FAILED with the reason for an
// network rule asking for tls: terminate without protocol rest (not
// implemented), LOADED for a policy of filesystem,
// Landlock and process sections. On the live sandbox only the network
// rules may change.
func TestPolicyEndToEnd(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	_, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "unsafe", Spec: &openshellv1.SandboxSpec{
		Command: []string{"sleep", "infinity"},
		Policy: &sandboxv1.SandboxPolicy{
			Process:    &sandboxv1.ProcessPolicy{RunAsUser: "root"},
			Filesystem: &sandboxv1.FilesystemPolicy{ReadOnly: []string{"/usr/../etc/shadow"}, ReadWrite: []string{"/"}},
		},
	}})
	wantCode(t, "CreateSandbox(unsafe policy)", err, codes.InvalidArgument, "policy contains unsafe content: "+
		"run_as_user must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got 'root'; "+
		"path contains '..' traversal component: /usr/../etc/shadow; "+
		"read-write path is overly broad: /")
	noSandboxRecords(ctx, t, c, "a create with an unsafe policy")

	pol := &sandboxv1.SandboxPolicy{
		Version:    1,
		Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true, ReadOnly: []string{"/usr"}, ReadWrite: []string{"/tmp"}},
		NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
			"github": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443, Tls: "terminate"}}},
		},
	}
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "pol", Spec: &openshellv1.SandboxSpec{
		Command: []string{"sleep", "infinity"}, Policy: pol,
	}}); err != nil {
		t.Fatalf("CreateSandbox(pol): %v", err)
	}
	WaitPhase(ctx, t, c, "pol", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	st := waitPolicyStatus(ctx, t, c, "pol", 1)
	rev := st.GetRevision()
	if rev.GetVersion() != 1 || rev.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_FAILED || !proto.Equal(rev.GetPolicy(), pol) {
		t.Errorf("policy status of pol = version %d %v (policy %v), want version 1 FAILED with spec.policy", rev.GetVersion(), rev.GetStatus(), rev.GetPolicy())
	}
	// The filesystem section is enforced (Landlock); the TLS-terminating network rule is not.
	if want := `network policies are not enforced as written: rule "github" endpoint "api.github.com" asks for tls "terminate" without protocol rest (only REST requests are inspected): ` +
		`not implemented by the egress proxy, those endpoints are denied (rules: github)`; rev.GetLoadError() != want {
		t.Errorf("load_error = %q, want %q", rev.GetLoadError(), want)
	}
	if st.GetActiveVersion() != 0 {
		t.Errorf("active_version = %d, want 0: no version was loaded", st.GetActiveVersion())
	}

	// Live sandbox: static sections are refused, all at once, and nothing is stored.
	changed := proto.Clone(pol).(*sandboxv1.SandboxPolicy)
	changed.Filesystem.IncludeWorkdir = false
	changed.Filesystem.ReadWrite = append(changed.Filesystem.ReadWrite, "/var")
	changed.Process = &sandboxv1.ProcessPolicy{RunAsUser: "1000"}
	_, err = c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: "pol", Policy: changed})
	wantCode(t, "UpdateConfig(static change)", err, codes.InvalidArgument,
		"filesystem include_workdir cannot be changed on a live sandbox; "+
			"filesystem read_write path '/var' cannot be added on a live sandbox; "+
			"process policy cannot be changed on a live sandbox (applied at startup)")
	// Network rules may change: a new version.
	more := proto.Clone(pol).(*sandboxv1.SandboxPolicy)
	more.NetworkPolicies["pypi"] = &sandboxv1.NetworkPolicyRule{Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443}}}
	up, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: "pol", Policy: more})
	if err != nil || up.GetVersion() != 2 {
		t.Fatalf("UpdateConfig(network rule added) = %v, %v; want version 2", up, err)
	}
	list, err := c.ListSandboxPolicies(ctx, &openshellv1.ListSandboxPoliciesRequest{Name: "pol"})
	if err != nil {
		t.Fatal(err)
	}
	var versions []uint32
	for _, r := range list.GetRevisions() {
		versions = append(versions, r.GetVersion())
	}
	if len(versions) != 2 || versions[0] != 2 || versions[1] != 1 {
		t.Errorf("ListSandboxPolicies versions = %v, want [2 1]", versions)
	}

	// A policy of sections the supervisor enforces (filesystem, Landlock,
	// process) is LOADED and becomes the sandbox's current version.
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "plain", Spec: &openshellv1.SandboxSpec{
		Command: []string{"sleep", "infinity"}, Policy: &sandboxv1.SandboxPolicy{
			Version: 1,
			Filesystem: &sandboxv1.FilesystemPolicy{
				IncludeWorkdir: true,
				ReadOnly:       []string{"/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc"},
				ReadWrite:      []string{"/tmp"},
			},
			Landlock: &sandboxv1.LandlockPolicy{Compatibility: "best_effort"},
			Process:  &sandboxv1.ProcessPolicy{RunAsUser: "sandbox", RunAsGroup: "sandbox"},
		},
	}}); err != nil {
		t.Fatalf("CreateSandbox(plain): %v", err)
	}
	WaitPhase(ctx, t, c, "plain", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	st = waitPolicyStatus(ctx, t, c, "plain", 0)
	if r := st.GetRevision(); r.GetVersion() != 1 || r.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_LOADED || r.GetLoadError() != "" || r.GetLoadedAtMs() == 0 {
		t.Errorf("policy status of plain = %v, want version 1 LOADED", r)
	}
	if st.GetActiveVersion() != 1 {
		t.Errorf("active_version of plain = %d, want 1", st.GetActiveVersion())
	}
	sb, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	if v := sb.GetSandbox().GetStatus().GetCurrentPolicyVersion(); v != 1 {
		t.Errorf("plain status.current_policy_version = %d, want 1", v)
	}
}

// TestGlobalPolicyEndToEnd: a real gateway and a running supervisor. A
// global policy set over the wire shows up in GetSandboxConfig of the
// running sandbox (source GLOBAL, its version) and is removed again; a
// global setting is reported with scope GLOBAL and by GetGatewayConfig.
func TestGlobalPolicyEndToEnd(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	own := &sandboxv1.SandboxPolicy{
		Version:    1,
		Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true, ReadOnly: []string{"/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc"}, ReadWrite: []string{"/tmp"}},
		Landlock:   &sandboxv1.LandlockPolicy{Compatibility: "best_effort"},
		Process:    &sandboxv1.ProcessPolicy{RunAsUser: "sandbox", RunAsGroup: "sandbox"},
	}
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "glob", Spec: &openshellv1.SandboxSpec{
		Command: []string{"sleep", "infinity"}, Policy: own,
	}}); err != nil {
		t.Fatalf("CreateSandbox(glob): %v", err)
	}
	WaitPhase(ctx, t, c, "glob", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	sb, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: "glob"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetSandbox().GetMetadata().GetId()
	cfg := func() *sandboxv1.GetSandboxConfigResponse {
		t.Helper()
		r, err := c.GetSandboxConfig(ctx, &sandboxv1.GetSandboxConfigRequest{SandboxId: id})
		if err != nil {
			t.Fatalf("GetSandboxConfig: %v", err)
		}
		return r
	}
	before := cfg()
	if before.GetPolicySource() != sandboxv1.PolicySource_POLICY_SOURCE_SANDBOX || !proto.Equal(before.GetPolicy(), own) {
		t.Fatalf("before: %v, want the sandbox's own policy", before)
	}

	global := proto.Clone(own).(*sandboxv1.SandboxPolicy)
	global.NetworkPolicies = map[string]*sandboxv1.NetworkPolicyRule{
		"pypi": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "pypi.org", Port: 443}}},
	}
	up, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Global: true, Policy: global})
	if err != nil || up.GetVersion() != 1 {
		t.Fatalf("UpdateConfig(global policy) = %v, %v; want version 1", up, err)
	}
	with := cfg()
	if with.GetPolicySource() != sandboxv1.PolicySource_POLICY_SOURCE_GLOBAL || with.GetGlobalPolicyVersion() != 1 ||
		!proto.Equal(with.GetPolicy(), global) || with.GetConfigRevision() == before.GetConfigRevision() {
		t.Fatalf("with a global policy: source %v, global version %d, config revision %d (before %d); want GLOBAL, 1, changed",
			with.GetPolicySource(), with.GetGlobalPolicyVersion(), with.GetConfigRevision(), before.GetConfigRevision())
	}

	// A sandbox created without a policy while the global one is in force
	// starts (its supervisor's report needs a revision to land on): it takes
	// the global policy as its baseline, version 1.
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "late", Spec: &openshellv1.SandboxSpec{
		Command: []string{"sleep", "infinity"},
	}}); err != nil {
		t.Fatalf("CreateSandbox(late): %v", err)
	}
	WaitPhase(ctx, t, c, "late", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	if st := waitPolicyStatus(ctx, t, c, "late", 1); !proto.Equal(st.GetRevision().GetPolicy(), global) {
		t.Errorf("late's version 1 = %v, want the global policy as its baseline", st.GetRevision().GetPolicy())
	}

	if _, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "proposal_approval_mode",
		SettingValue: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: "manual"}}}); err != nil {
		t.Fatalf("UpdateConfig(global setting): %v", err)
	}
	if e := cfg().GetSettings()["proposal_approval_mode"]; e.GetScope() != sandboxv1.SettingScope_SETTING_SCOPE_GLOBAL || e.GetValue().GetStringValue() != "manual" {
		t.Errorf("effective proposal_approval_mode = %v, want manual from GLOBAL", e)
	}
	gw, err := c.GetGatewayConfig(ctx, &sandboxv1.GetGatewayConfigRequest{})
	if err != nil || gw.GetSettingsRevision() != 1 || gw.GetSettings()["proposal_approval_mode"].GetStringValue() != "manual" {
		t.Errorf("GetGatewayConfig = %v, %v; want revision 1 with proposal_approval_mode manual", gw, err)
	}
	_, err = c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "no_such_key", DeleteSetting: true})
	wantCode(t, "UpdateConfig(unknown key)", err, codes.InvalidArgument, "unknown setting key 'no_such_key'")

	del, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "policy", DeleteSetting: true})
	if err != nil || !del.GetDeleted() {
		t.Fatalf("UpdateConfig(remove global policy) = %v, %v; want deleted", del, err)
	}
	after := cfg()
	if after.GetPolicySource() != sandboxv1.PolicySource_POLICY_SOURCE_SANDBOX || after.GetGlobalPolicyVersion() != 0 || !proto.Equal(after.GetPolicy(), own) {
		t.Fatalf("after removal: source %v, global version %d; want the sandbox's own policy again", after.GetPolicySource(), after.GetGlobalPolicyVersion())
	}
}

// TestGlobalSettingsTwoGateways: two gateway processes on one PostgreSQL
// database write global settings at once, each through its own gateway;
// a write that loses the compare-and-swap answers Aborted and is retried
// by the client. No update is lost: the final revision counts every
// successful write and both writers' last values are in force.
func TestGlobalSettingsTwoGateways(t *testing.T) {
	db := postgrestest.NewDatabase(t)
	gws := [2]*Gateway{
		Start(t, Options{ExtraArgs: []string{"--db-url", db}}),
		Start(t, Options{ExtraArgs: []string{"--db-url", db}}),
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	keys := [2]string{"ocsf_json_enabled", "agent_policy_proposals_enabled"}
	const n = 15
	var wg sync.WaitGroup
	var aborted [2]int
	for i, g := range gws {
		c := g.Client()
		wg.Go(func() {
			for j := range n {
				req := &openshellv1.UpdateConfigRequest{Global: true, SettingKey: keys[i],
					SettingValue: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: j%2 == 0}}}
				for {
					_, err := c.UpdateConfig(ctx, req)
					if status.Code(err) == codes.Aborted {
						aborted[i]++
						continue
					}
					if err != nil {
						t.Errorf("UpdateConfig(%s) via gateway %d: %v", keys[i], i, err)
						return
					}
					break
				}
			}
		})
	}
	wg.Wait()
	for i, g := range gws {
		gw, err := g.Client().GetGatewayConfig(ctx, &sandboxv1.GetGatewayConfigRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if gw.GetSettingsRevision() != 2*n {
			t.Errorf("gateway %d: settings revision %d, want %d (every write a revision)", i, gw.GetSettingsRevision(), 2*n)
		}
		for _, k := range keys {
			if v := gw.GetSettings()[k]; v.GetValue() == nil || !v.GetBoolValue() { // the last write (j = n-1, even) sets true
				t.Errorf("gateway %d: %s = %v, want true", i, k, v)
			}
		}
	}
	t.Logf("aborted and retried: %v", aborted)
}
