package policy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	policyrules "github.com/openshell-go/openshell/internal/policy"
	"github.com/openshell-go/openshell/internal/policy/advisor"
	"github.com/openshell-go/openshell/internal/settings"
	"github.com/openshell-go/openshell/internal/store"
)

// failureMode is the policy_validation_failure_mode this gateway serves.
const failureMode = "fail_closed"

// GetSandboxConfig returns the sandbox's effective policy and settings:
// the global policy when one is set (policy_source GLOBAL, its version in
// global_policy_version; version stays the sandbox's own, as OpenShell, and
// a sandbox with no policy of its own takes the global one as its version
// 1), else the sandbox's newest revision; every registered setting with the
// scope its value comes from; and config_revision, a fingerprint of all
// of it that changes whenever any of it does.
func (s *Service) GetSandboxConfig(ctx context.Context, req *sandboxv1.GetSandboxConfigRequest) (*sandboxv1.GetSandboxConfigResponse, error) {
	sb, err := s.o.Authz.SandboxForCaller(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	resp := &sandboxv1.GetSandboxConfigResponse{
		Workspace: sb.GetMetadata().GetWorkspace(), PolicyValidationFailureMode: failureMode,
		PolicySource: sandboxv1.PolicySource_POLICY_SOURCE_SANDBOX,
	}
	g, err := s.global.Active(ctx)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	rev, err := s.history.Latest(ctx, sb)
	if errors.Is(err, errdefs.ErrNotFound) && g != nil {
		// A sandbox without a policy of its own starting under a global
		// one takes it as its baseline (version 1), as it would take its
		// supervisor's first sync: the supervisor applies and reports
		// that version, and it is the sandbox's policy once the global
		// one is removed. Concurrent seeds: one wins, the other is
		// Conflict and the caller retries.
		rev, err = s.history.Update(ctx, sb, g.GetPolicy())
	}
	switch {
	case err == nil:
		resp.Policy, resp.Version, resp.PolicyHash = rev.GetPolicy(), rev.GetVersion(), rev.GetPolicyHash()
	case errors.Is(err, errdefs.ErrNotFound):
		// No policy: the supervisor seeds one with UpdateConfig.
	default:
		return nil, err
	}
	if g != nil {
		resp.Policy, resp.PolicyHash = g.GetPolicy(), g.GetPolicyHash()
		resp.PolicySource, resp.GlobalPolicyVersion = sandboxv1.PolicySource_POLICY_SOURCE_GLOBAL, g.GetVersion()
	}
	global, err := s.settings.Get(ctx, settings.GlobalScope)
	if err != nil {
		return nil, err
	}
	own, err := s.settings.Get(ctx, sb.GetMetadata().GetId())
	if err != nil {
		return nil, err
	}
	resp.Settings = settings.Effective(global.Values, own.Values)
	if err := s.composeProviderRules(ctx, sb, resp); err != nil {
		return nil, err
	}
	resp.ConfigRevision = configRevision(resp)
	return resp, nil
}

// configRevision fingerprints what a supervisor acts on: the policy
// source and hash, the failure mode and every effective setting.
func configRevision(r *sandboxv1.GetSandboxConfigResponse) uint64 {
	h := sha256.New()
	_ = binary.Write(h, binary.LittleEndian, int32(r.GetPolicySource()))
	h.Write([]byte(r.GetPolicyValidationFailureMode()))
	h.Write([]byte{0})
	h.Write([]byte(r.GetPolicyHash()))
	keys := make([]string, 0, len(r.GetSettings()))
	for k := range r.GetSettings() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		e := r.GetSettings()[k]
		h.Write([]byte(k))
		_ = binary.Write(h, binary.LittleEndian, int32(e.GetScope()))
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(e.GetValue())
		_ = binary.Write(h, binary.LittleEndian, uint32(len(b)))
		h.Write(b)
	}
	return binary.LittleEndian.Uint64(h.Sum(nil)[:8])
}

// GetGatewayConfig returns the global settings: every registered key
// (unset ones with an empty value) and the global settings revision.
func (s *Service) GetGatewayConfig(ctx context.Context, _ *sandboxv1.GetGatewayConfigRequest) (*sandboxv1.GetGatewayConfigResponse, error) {
	if p, ok := auth.FromContext(ctx); ok && p.IsSandbox() {
		return nil, errdefs.PermissionDenied("sandbox principals may not call this method")
	}
	global, err := s.settings.Get(ctx, settings.GlobalScope)
	if err != nil {
		return nil, err
	}
	return &sandboxv1.GetGatewayConfigResponse{Settings: settings.Gateway(global.Values), SettingsRevision: global.Revision}, nil
}

// maxPolicySize bounds a policy in UpdateConfig, as OpenShell.
const maxPolicySize = 256 << 10

// UpdateConfig changes one thing per call, as OpenShell: a policy, a
// setting (set or delete_setting) or merge operations, at sandbox scope
// (name) or gateway-wide (global, platform admins only). Merge operations
// change a sandbox's policy incrementally (not the global one, as
// OpenShell).
func (s *Service) UpdateConfig(ctx context.Context, req *openshellv1.UpdateConfigRequest) (*openshellv1.UpdateConfigResponse, error) {
	key := strings.TrimSpace(req.GetSettingKey())
	n := 0
	for _, set := range []bool{req.GetPolicy() != nil, key != "", len(req.GetMergeOperations()) > 0} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return nil, errdefs.InvalidArgument("policy, setting_key, and merge_operations are mutually exclusive")
	case n == 0:
		return nil, errdefs.InvalidArgument("one of policy, setting_key, or merge_operations must be provided")
	}
	if err := lifecycle.ValidateAnnotations(req.GetAnnotations(), "annotations"); err != nil {
		return nil, err
	}
	if req.GetPolicy() != nil {
		if size := proto.Size(req.GetPolicy()); size > maxPolicySize {
			return nil, errdefs.InvalidArgument(fmt.Sprintf("policy serialized size exceeds maximum (%d > %d)", size, maxPolicySize))
		}
	}
	if p, ok := auth.FromContext(ctx); ok && p.IsSandbox() {
		return s.syncSandboxPolicy(ctx, p.SandboxID, req)
	}
	if req.GetGlobal() {
		if err := s.o.Authz.RequirePlatformAdmin(ctx); err != nil {
			return nil, err
		}
		return s.updateGlobal(ctx, req, key)
	}
	if req.GetName() == "" {
		return nil, errdefs.InvalidArgument("name is required for sandbox-scoped updates")
	}
	if err := s.o.Authz.Sandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Get(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	w := write(req)
	switch {
	case key != "":
		return s.updateSandboxSetting(ctx, sb, req, key, w)
	case len(req.GetMergeOperations()) > 0:
		return s.mergeSandboxPolicy(ctx, sb, req.GetMergeOperations(), w)
	}
	return s.updateSandboxPolicy(ctx, sb, req.GetPolicy(), w)
}

// write is the sandbox metadata change that comes with a sandbox-scoped
// UpdateConfig: its annotations (merged into the sandbox's, and kept as
// the provenance of a new policy revision) under a compare-and-swap on
// expected_resource_version (0: none).
func write(req *openshellv1.UpdateConfigRequest) policyrules.Write {
	return policyrules.Write{Annotations: req.GetAnnotations(), ExpectedRV: req.GetExpectedResourceVersion()}
}

// checkMergeTargets refuses, as OpenShell, rules under the reserved
// _provider_ prefix and endpoints the proxy never dials.
func checkMergeTargets(ops []*openshellv1.PolicyMergeOperation) error {
	for _, op := range ops {
		switch o := op.GetOperation().(type) {
		case *openshellv1.PolicyMergeOperation_AddRule:
			if name := strings.TrimSpace(o.AddRule.GetRuleName()); strings.HasPrefix(name, "_provider_") {
				return errdefs.InvalidArgument(fmt.Sprintf("merge operation add_rule rule_name '%s' uses reserved '_provider_' prefix for provider composition", name))
			}
			if err := advisor.AlwaysBlockedRule(o.AddRule.GetRule()); err != nil {
				return err
			}
		case *openshellv1.PolicyMergeOperation_AddAllowRules:
			if err := advisor.AlwaysBlockedHost(o.AddAllowRules.GetHost()); err != nil {
				return err
			}
		}
	}
	return nil
}

// staleVersion refuses a write on sb read at another resource version.
func staleVersion(sb *openshellv1.Sandbox, w policyrules.Write) error {
	if rv := sb.GetMetadata().GetResourceVersion(); w.ExpectedRV != 0 && rv != w.ExpectedRV {
		return &store.ConflictError{Type: store.TypeSandbox, ID: sb.GetMetadata().GetId(), Expected: w.ExpectedRV, Current: rv}
	}
	return nil
}

// mergeSandboxPolicy applies merge operations to sb's newest policy as
// one new revision (policy.Merge); a concurrent revision makes it re-apply
// them to that one, so none is lost. Refused while a global policy is in
// force, like a whole-policy update.
func (s *Service) mergeSandboxPolicy(ctx context.Context, sb *openshellv1.Sandbox, ops []*openshellv1.PolicyMergeOperation, w policyrules.Write) (*openshellv1.UpdateConfigResponse, error) {
	if err := policyrules.CheckMergeOperations(ops); err != nil {
		return nil, err
	}
	if err := checkMergeTargets(ops); err != nil {
		return nil, err
	}
	if err := staleVersion(sb, w); err != nil {
		return nil, err
	}
	if _, err := s.global.Active(ctx); err == nil {
		return nil, errdefs.FailedPrecondition("policy is managed globally; delete global policy before sandbox policy update")
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	rev, ann, err := s.history.ApplyWrite(ctx, sb, w, func(cur *sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error) {
		return policyrules.Merge(cur, ops)
	})
	if err != nil {
		return nil, err
	}
	return &openshellv1.UpdateConfigResponse{Version: rev.GetVersion(), PolicyHash: rev.GetPolicyHash(), Annotations: ann}, nil
}

// syncSandboxPolicy is UpdateConfig by a supervisor: only its own
// sandbox's policy (the first sync), with OpenShell's refusals.
func (s *Service) syncSandboxPolicy(ctx context.Context, sandboxID string, req *openshellv1.UpdateConfigRequest) (*openshellv1.UpdateConfigResponse, error) {
	switch {
	case req.GetGlobal():
		return nil, errdefs.PermissionDenied("sandbox callers cannot mutate global config")
	case req.GetDeleteSetting():
		return nil, errdefs.PermissionDenied("sandbox callers cannot delete settings")
	case strings.TrimSpace(req.GetName()) == "", req.GetPolicy() == nil:
		return nil, errdefs.PermissionDenied("sandbox callers may only perform sandbox policy sync")
	}
	sb, err := s.o.Engine.GetByID(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	if req.GetName() != sb.GetMetadata().GetName() && req.GetName() != sb.GetMetadata().GetId() {
		return nil, authz.ErrCrossSandbox
	}
	return s.updateSandboxPolicy(ctx, sb, req.GetPolicy(), write(req))
}

// updateSandboxPolicy stores a new revision of sb's own policy; refused
// while a global policy is in force.
func (s *Service) updateSandboxPolicy(ctx context.Context, sb *openshellv1.Sandbox, p *sandboxv1.SandboxPolicy, w policyrules.Write) (*openshellv1.UpdateConfigResponse, error) {
	if err := staleVersion(sb, w); err != nil {
		return nil, err
	}
	if _, err := s.global.Active(ctx); err == nil {
		return nil, errdefs.FailedPrecondition("policy is managed globally; delete global policy before sandbox policy update")
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	rev, ann, err := s.history.ApplyWrite(ctx, sb, w, func(*sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error) { return p, nil })
	if err != nil {
		return nil, err
	}
	return &openshellv1.UpdateConfigResponse{Version: rev.GetVersion(), PolicyHash: rev.GetPolicyHash(), Annotations: ann}, nil
}

// updateGlobal sets or removes the global policy or a global setting.
// Global writes are serialized in this process (settings.Store.Lock) and
// compare-and-swap protected in the store.
func (s *Service) updateGlobal(ctx context.Context, req *openshellv1.UpdateConfigRequest, key string) (*openshellv1.UpdateConfigResponse, error) {
	switch {
	case len(req.GetAnnotations()) > 0:
		return nil, errdefs.InvalidArgument("annotations are only supported for sandbox-scoped updates")
	case len(req.GetMergeOperations()) > 0:
		return nil, errdefs.InvalidArgument("merge_operations are not supported for global policy updates")
	case req.GetExpectedResourceVersion() != 0:
		// OpenShell ignores it here; the global writes have their own
		// compare-and-swap, so it would be a field that does nothing.
		return nil, errdefs.InvalidArgument("expected_resource_version is only supported for sandbox-scoped updates")
	case req.GetPolicy() != nil && req.GetDeleteSetting():
		return nil, errdefs.InvalidArgument("delete_setting cannot be combined with policy payload")
	}
	defer s.settings.Lock()()
	if req.GetPolicy() != nil {
		rev, err := s.global.Set(ctx, req.GetPolicy())
		if err != nil {
			return nil, err
		}
		cur, err := s.settings.Get(ctx, settings.GlobalScope)
		if err != nil {
			return nil, err
		}
		return &openshellv1.UpdateConfigResponse{Version: rev.GetVersion(), PolicyHash: rev.GetPolicyHash(), SettingsRevision: cur.Revision}, nil
	}
	if key == settings.PolicyKey {
		if !req.GetDeleteSetting() {
			return nil, errdefs.InvalidArgument("reserved key 'policy' must be set via the policy field")
		}
		removed, err := s.global.Remove(ctx)
		if err != nil {
			return nil, err
		}
		cur, err := s.settings.Get(ctx, settings.GlobalScope)
		if err != nil {
			return nil, err
		}
		return &openshellv1.UpdateConfigResponse{SettingsRevision: cur.Revision, Deleted: removed}, nil
	}
	k, err := settings.Resolve(key)
	if err != nil {
		return nil, err
	}
	if !req.GetDeleteSetting() {
		if err := k.Check(settings.ScopeGlobal, req.GetSettingValue()); err != nil {
			return nil, err
		}
	}
	snap, changed, err := s.settings.Update(ctx, settings.GlobalScope, mutation(key, req))
	if err != nil {
		return nil, err
	}
	return &openshellv1.UpdateConfigResponse{SettingsRevision: snap.Revision, Deleted: req.GetDeleteSetting() && changed}, nil
}

// mutation returns the settings change req asks for on key.
func mutation(key string, req *openshellv1.UpdateConfigRequest) func(map[string]*sandboxv1.SettingValue) (bool, error) {
	return func(values map[string]*sandboxv1.SettingValue) (bool, error) {
		old, ok := values[key]
		if req.GetDeleteSetting() {
			delete(values, key)
			return ok, nil
		}
		if ok && proto.Equal(old, req.GetSettingValue()) {
			return false, nil
		}
		values[key] = req.GetSettingValue()
		return true, nil
	}
}

// updateSandboxSetting sets or deletes a setting of sb; a key set
// globally cannot be changed per sandbox (OpenShell's texts).
// The annotations are merged after the setting is stored (as OpenShell);
// a stale expected_resource_version is refused before anything is
// written, though a sandbox changed between that check and the
// annotations' compare-and-swap leaves the setting stored and answers
// Aborted.
func (s *Service) updateSandboxSetting(ctx context.Context, sb *openshellv1.Sandbox, req *openshellv1.UpdateConfigRequest, key string, w policyrules.Write) (*openshellv1.UpdateConfigResponse, error) {
	if key == settings.PolicyKey {
		return nil, errdefs.InvalidArgument("reserved key 'policy' must be set via policy commands")
	}
	k, err := settings.Resolve(key)
	if err != nil {
		return nil, err
	}
	if !req.GetDeleteSetting() {
		if err := k.Check(settings.ScopeSandbox, req.GetSettingValue()); err != nil {
			return nil, err
		}
	}
	defer s.settings.Lock()()
	global, err := s.settings.Get(ctx, settings.GlobalScope)
	if err != nil {
		return nil, err
	}
	if _, managed := global.Values[key]; managed {
		if req.GetDeleteSetting() {
			return nil, errdefs.FailedPrecondition(fmt.Sprintf("setting '%s' is managed globally; delete the global setting first", key))
		}
		return nil, errdefs.FailedPrecondition(fmt.Sprintf("setting '%s' is managed globally; delete the global setting before sandbox update", key))
	}
	if err := staleVersion(sb, w); err != nil {
		return nil, err
	}
	snap, changed, err := s.settings.Update(ctx, sb.GetMetadata().GetId(), mutation(key, req))
	if err != nil {
		return nil, err
	}
	ann, err := s.history.Annotate(ctx, sb, w)
	if err != nil {
		return nil, err
	}
	return &openshellv1.UpdateConfigResponse{SettingsRevision: snap.Revision, Deleted: req.GetDeleteSetting() && changed, Annotations: ann}, nil
}
