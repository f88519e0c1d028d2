package securityevent

import (
	"context"
	"path"
	"strconv"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// Call is one finished RPC as the gateway's interceptor saw it.
type Call struct {
	Method    string
	RequestID string
	// Actor* describe the authenticated principal (empty when none).
	ActorSubject   string
	ActorKind      string
	ActorSandboxID string
	SourceIP       string
	// Req is the request (for streams, the first message received, or
	// nil); Resp the unary response or nil.
	Req, Resp any
	Code      codes.Code
	// Refused is true when admission (rate limit, authentication,
	// authorization) refused the call before any handler ran.
	Refused bool
}

// spec describes the event an RPC produces.
type spec struct {
	class    Class
	activity Activity
	what     string
	// fill adds the subject's identifiers from the request and response.
	fill func(ev *Event, req, resp any)
}

const svc = "/openshell.v1.OpenShell/"

var rpcs = map[string]spec{
	svc + "CreateSandbox":            {ProcessActivity, ActivityLaunch, "sandbox create", fillSandbox},
	svc + "AdoptSandbox":             {ProcessActivity, ActivityOther("Adopt"), "sandbox adopt", fillAdopt},
	svc + "DeleteSandbox":            {ProcessActivity, ActivityTerminate, "sandbox delete", fillSandbox},
	svc + "StopSandbox":              {ProcessActivity, ActivityTerminate, "sandbox stop", fillSandbox},
	svc + "StartSandbox":             {ProcessActivity, ActivityLaunch, "sandbox start", fillSandbox},
	svc + "ExecSandbox":              {ProcessActivity, ActivityLaunch, "exec", fillExec},
	svc + "ExecSandboxInteractive":   {ProcessActivity, ActivityLaunch, "interactive exec", fillExec},
	svc + "ForwardTcp":               {NetworkActivity, ActivityOpen, "tcp forward", fillForward},
	svc + "CreateSshSession":         {HTTPActivity, ActivityPost, "ssh session token issue", fillSandbox},
	svc + "RevokeSshSession":         {HTTPActivity, ActivityPost, "ssh session token revoke", fillRevoke},
	svc + "IssueSandboxToken":        {HTTPActivity, ActivityPost, "sandbox token issue", nil},
	svc + "RefreshSandboxToken":      {HTTPActivity, ActivityPost, "sandbox token refresh", nil},
	svc + "UpdateConfig":             {ConfigStateChange, ActivityLog, "config update", fillUpdateConfig},
	svc + "ApproveDraftChunk":        {ConfigStateChange, ActivityLog, "policy draft chunk approve", fillDraft},
	svc + "ApproveAllDraftChunks":    {ConfigStateChange, ActivityLog, "policy draft approve all", fillDraft},
	svc + "RejectDraftChunk":         {ConfigStateChange, ActivityLog, "policy draft chunk reject", fillDraft},
	svc + "EditDraftChunk":           {ConfigStateChange, ActivityLog, "policy draft chunk edit", fillDraft},
	svc + "UndoDraftChunk":           {ConfigStateChange, ActivityLog, "policy draft chunk undo", fillDraft},
	svc + "ClearDraftChunks":         {ConfigStateChange, ActivityLog, "policy draft clear", fillDraft},
	svc + "CreateProvider":           {ConfigStateChange, ActivityLog, "provider create", fillProvider},
	svc + "UpdateProvider":           {ConfigStateChange, ActivityLog, "provider update", fillProvider},
	svc + "DeleteProvider":           {ConfigStateChange, ActivityLog, "provider delete", fillProvider},
	svc + "RotateProviderCredential": {ConfigStateChange, ActivityLog, "provider credential rotate", fillProvider},
	svc + "ConfigureProviderRefresh": {ConfigStateChange, ActivityLog, "provider refresh configure", fillProvider},
	svc + "DeleteProviderRefresh":    {ConfigStateChange, ActivityLog, "provider refresh delete", fillProvider},
	svc + "AttachSandboxProvider":    {ConfigStateChange, ActivityLog, "sandbox provider attach", fillProvider},
	svc + "DetachSandboxProvider":    {ConfigStateChange, ActivityLog, "sandbox provider detach", fillProvider},
	svc + "ImportProviderProfiles":   {ConfigStateChange, ActivityLog, "provider profiles import", fillWorkspace},
	svc + "UpdateProviderProfiles":   {ConfigStateChange, ActivityLog, "provider profile update", fillProfile},
	svc + "DeleteProviderProfile":    {ConfigStateChange, ActivityLog, "provider profile delete", fillProfile},
	svc + "CreateWorkspace":          {ConfigStateChange, ActivityLog, "workspace create", fillWorkspaceByName},
	svc + "DeleteWorkspace":          {ConfigStateChange, ActivityLog, "workspace delete", fillWorkspaceByName},
	svc + "AddWorkspaceMember":       {ConfigStateChange, ActivityLog, "workspace member add", fillMember},
	svc + "RemoveWorkspaceMember":    {ConfigStateChange, ActivityLog, "workspace member remove", fillMember},
	svc + "ExposeService":            {ConfigStateChange, ActivityLog, "service expose", fillService},
	svc + "DeleteService":            {ConfigStateChange, ActivityLog, "service delete", fillService},
}

// Watches reports whether method produces an event of its own when it
// runs (streams need their first message captured only then).
func Watches(method string) bool {
	_, ok := rpcs[method]
	return ok
}

// ObserveRPC emits at most one event for c: a refusal at admission, the
// RPC's own event when it is in the table, or an authorization denial a
// handler returned.
func ObserveRPC(ctx context.Context, em Emitter, c Call) {
	if em == nil {
		return
	}
	ev := Event{
		Method: c.Method, RequestID: c.RequestID, Code: c.Code.String(), SourceIP: c.SourceIP,
		ActorSubject: c.ActorSubject, ActorKind: c.ActorKind, Outcome: outcome(c.Code),
	}
	sp, ok := rpcs[c.Method]
	switch {
	case c.Refused || !ok:
		switch c.Code {
		case codes.Unauthenticated:
			ev.Class, ev.Activity, ev.Message = HTTPActivity, ActivityPost, "authentication failed for "+path.Base(c.Method)
		case codes.PermissionDenied:
			ev.Class, ev.Activity, ev.Message = HTTPActivity, ActivityPost, "authorization denied for "+path.Base(c.Method)
		case codes.ResourceExhausted:
			if !c.Refused {
				return
			}
			ev.Class, ev.Activity, ev.Message = DetectionFinding, ActivityCreate, "rate limit exceeded"
		default:
			return
		}
	default:
		ev.Class, ev.Activity = sp.class, sp.activity
		ev.Message = sp.what + ": " + string(ev.Outcome)
		if sp.fill != nil {
			sp.fill(&ev, c.Req, c.Resp)
		}
		if ev.SandboxID == "" && c.ActorSandboxID != "" && (sp.class == HTTPActivity) {
			ev.SandboxID = c.ActorSandboxID
		}
	}
	em.Emit(ctx, ev)
}

func outcome(c codes.Code) Outcome {
	switch c {
	case codes.OK:
		return Success
	case codes.Unauthenticated, codes.PermissionDenied:
		return Denied
	default:
		return Failure
	}
}

func setField(ev *Event, k, v string) {
	if v == "" {
		return
	}
	if ev.Fields == nil {
		ev.Fields = map[string]string{}
	}
	ev.Fields[k] = v
}

type (
	getName        interface{ GetName() string }
	getWorkspace   interface{ GetWorkspace() string }
	getSandboxID   interface{ GetSandboxId() string }
	getSandboxName interface{ GetSandboxName() string }
	getSandbox     interface {
		GetSandbox() *openshellv1.Sandbox
	}
)

// fillSandbox: requests naming a sandbox (name or sandbox_id), responses
// carrying one.
func fillSandbox(ev *Event, req, resp any) {
	if r, ok := req.(getName); ok {
		ev.SandboxName = r.GetName()
	}
	if r, ok := req.(getSandboxID); ok {
		ev.SandboxID = r.GetSandboxId()
	}
	if r, ok := req.(getWorkspace); ok {
		ev.Workspace = r.GetWorkspace()
	}
	if r, ok := resp.(getSandbox); ok && r.GetSandbox() != nil {
		m := r.GetSandbox().GetMetadata()
		ev.SandboxID, ev.SandboxName = m.GetId(), m.GetName()
		if m.GetWorkspace() != "" {
			ev.Workspace = m.GetWorkspace()
		}
	}
	if r, ok := resp.(getSandboxID); ok && ev.SandboxID == "" {
		ev.SandboxID = r.GetSandboxId()
	}
}

func fillAdopt(ev *Event, req, resp any) {
	fillSandbox(ev, req, resp)
	if r, ok := req.(*openshellv1.AdoptSandboxRequest); ok {
		setField(ev, "namespace", r.GetNamespace())
	}
}

// fillExec records the sandbox and the executable's base name: never the
// arguments, environment or stdin.
func fillExec(ev *Event, req, _ any) {
	var r *openshellv1.ExecSandboxRequest
	switch m := req.(type) {
	case *openshellv1.ExecSandboxRequest:
		r = m
	case *openshellv1.ExecSandboxInput:
		r = m.GetStart()
	}
	if r == nil {
		return
	}
	ev.SandboxID = r.GetSandboxId()
	if cmd := r.GetCommand(); len(cmd) > 0 {
		setField(ev, "process_name", path.Base(cmd[0]))
	}
	setField(ev, "tty", strconv.FormatBool(r.GetTty()))
}

// fillForward makes SSH targets SSH Activity; TCP targets keep Network
// Activity with the port (and host when not the sandbox itself).
func fillForward(ev *Event, req, _ any) {
	f, ok := req.(*openshellv1.TcpForwardFrame)
	if !ok || f.GetInit() == nil {
		return
	}
	in := f.GetInit()
	ev.SandboxID = in.GetSandboxId()
	setField(ev, "service_id", in.GetServiceId())
	switch {
	case in.GetSsh() != nil:
		ev.Class, ev.Message = SSHActivity, "ssh session: "+string(ev.Outcome)
	case in.GetTcp() != nil:
		setField(ev, "dst_host", in.GetTcp().GetHost())
		setField(ev, "dst_port", strconv.FormatUint(uint64(in.GetTcp().GetPort()), 10))
	}
}

func fillRevoke(ev *Event, _, resp any) {
	if r, ok := resp.(*openshellv1.RevokeSshSessionResponse); ok {
		setField(ev, "revoked", strconv.FormatBool(r.GetRevoked()))
	}
}

// fillUpdateConfig names what changed (policy, merge, setting, setting
// delete) and where (global or the sandbox), and the setting key: never
// the value or the policy.
func fillUpdateConfig(ev *Event, req, _ any) {
	r, ok := req.(*openshellv1.UpdateConfigRequest)
	if !ok {
		return
	}
	scope := "sandbox"
	if r.GetGlobal() {
		scope = "global"
	} else {
		ev.SandboxName = r.GetName()
	}
	ev.Workspace = r.GetWorkspace()
	change := ""
	switch {
	case r.GetPolicy() != nil:
		change = "policy"
	case len(r.GetMergeOperations()) > 0:
		change = "policy_merge"
	case r.GetDeleteSetting():
		change = "setting_delete"
	case r.GetSettingKey() != "":
		change = "setting"
	}
	setField(ev, "scope", scope)
	setField(ev, "change", change)
	setField(ev, "setting_key", r.GetSettingKey())
	ev.Message = change + " update (" + scope + "): " + string(ev.Outcome)
}

type getChunkID interface{ GetChunkId() string }

func fillDraft(ev *Event, req, _ any) {
	if r, ok := req.(getName); ok {
		ev.SandboxName = r.GetName()
	}
	if r, ok := req.(getWorkspace); ok {
		ev.Workspace = r.GetWorkspace()
	}
	if r, ok := req.(getChunkID); ok {
		setField(ev, "chunk_id", r.GetChunkId())
	}
}

// fillProvider records the provider's name (and credential key name for
// rotation and refresh): never credentials or refresh material.
func fillProvider(ev *Event, req, _ any) {
	switch r := req.(type) {
	case *openshellv1.CreateProviderRequest:
		setField(ev, "provider", r.GetProvider().GetMetadata().GetName())
	case *openshellv1.UpdateProviderRequest:
		setField(ev, "provider", r.GetProvider().GetMetadata().GetName())
	case *openshellv1.DeleteProviderRequest:
		setField(ev, "provider", r.GetName())
	case *openshellv1.RotateProviderCredentialRequest:
		setField(ev, "provider", r.GetProvider())
		setField(ev, "credential_key", r.GetCredentialKey())
	case *openshellv1.ConfigureProviderRefreshRequest:
		setField(ev, "provider", r.GetProvider())
		setField(ev, "credential_key", r.GetCredentialKey())
	case *openshellv1.DeleteProviderRefreshRequest:
		setField(ev, "provider", r.GetProvider())
		setField(ev, "credential_key", r.GetCredentialKey())
	case *openshellv1.AttachSandboxProviderRequest:
		setField(ev, "provider", r.GetProviderName())
	case *openshellv1.DetachSandboxProviderRequest:
		setField(ev, "provider", r.GetProviderName())
	}
	if r, ok := req.(getSandboxName); ok {
		ev.SandboxName = r.GetSandboxName()
	}
	if r, ok := req.(getWorkspace); ok {
		ev.Workspace = r.GetWorkspace()
	}
}

func fillWorkspace(ev *Event, req, _ any) {
	if r, ok := req.(getWorkspace); ok {
		ev.Workspace = r.GetWorkspace()
	}
}

type getID interface{ GetId() string }

func fillProfile(ev *Event, req, _ any) {
	fillWorkspace(ev, req, nil)
	if r, ok := req.(getID); ok {
		setField(ev, "profile_id", r.GetId())
	}
}

func fillWorkspaceByName(ev *Event, req, _ any) {
	if r, ok := req.(getName); ok {
		ev.Workspace = r.GetName()
	}
}

func fillMember(ev *Event, req, _ any) {
	fillWorkspace(ev, req, nil)
	switch r := req.(type) {
	case *openshellv1.AddWorkspaceMemberRequest:
		setField(ev, "member", r.GetPrincipalSubject())
		setField(ev, "role", r.GetRole().String())
	case *openshellv1.RemoveWorkspaceMemberRequest:
		setField(ev, "member", r.GetPrincipalSubject())
	}
}

// fillService names the sandbox, the service and (on expose) the port.
func fillService(ev *Event, req, _ any) {
	fillWorkspace(ev, req, nil)
	switch r := req.(type) {
	case *openshellv1.ExposeServiceRequest:
		ev.SandboxName = r.GetSandbox()
		setField(ev, "service", r.GetService())
		setField(ev, "target_port", strconv.FormatUint(uint64(r.GetTargetPort()), 10))
	case *openshellv1.DeleteServiceRequest:
		ev.SandboxName = r.GetSandbox()
		setField(ev, "service", r.GetService())
	}
}
