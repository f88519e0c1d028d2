package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/telemetry"
)

// DefaultWorkspace is where requests without a workspace go.
const DefaultWorkspace = "default"

// Store is the persistence the engine needs for sandbox rows. Writes are
// conditional: Create fails with AlreadyExists when the id or
// (workspace, name) is taken; Update is a compare-and-swap on
// metadata.resource_version (Conflict otherwise) and stores the new version
// back into the message; Delete removes the row only at expectedRV
// (Conflict otherwise, NotFound when it is gone) together with every
// record scoped to the sandbox.
type Store interface {
	CreateSandbox(ctx context.Context, sb *openshellv1.Sandbox) error
	GetSandbox(ctx context.Context, id string) (*openshellv1.Sandbox, error)
	GetSandboxByName(ctx context.Context, workspace, name string) (*openshellv1.Sandbox, error)
	UpdateSandbox(ctx context.Context, sb *openshellv1.Sandbox) error
	DeleteSandbox(ctx context.Context, id string, expectedRV uint64) error
	ListSandboxes(ctx context.Context, opts ListOptions) ([]*openshellv1.Sandbox, error)
}

// ListOptions selects sandboxes.
type ListOptions struct {
	Workspace     string
	AllWorkspaces bool
	Limit, Offset int
	LabelSelector string
}

// TokenIssuer mints sandbox JWTs. Optional: without one, sandboxes get no
// token (only useful for unauthenticated local development).
type TokenIssuer interface {
	Mint(sandboxID string) (token string, expiresAt time.Time, err error)
}

// Options configure an Engine.
type Options struct {
	Store      Store
	Driver     compute.Driver
	DriverName string
	Issuer     TokenIssuer
	// ProviderExists reports NotFound for unknown providers; nil means no
	// provider exists yet.
	ProviderExists func(ctx context.Context, workspace, name string) error
	// WorkspaceAccepts, when set, is asked whether a workspace still takes
	// new sandboxes. Create and Adopt ask it after the new row is inserted
	// (under the sandbox's gate): a workspace being deleted marks itself
	// TERMINATING before it counts its sandboxes, so either the count sees
	// the row or this check sees TERMINATING. A refusal removes the row
	// before the driver is involved and fails the call FailedPrecondition.
	WorkspaceAccepts func(ctx context.Context, workspace string) error
	Logger           *slog.Logger
	Now              func() time.Time
}

// Engine owns sandbox lifecycle: it persists intent before touching
// compute, makes every change to a sandbox's row under that sandbox's gate
// (see the package documentation), reconciles driver events into the store
// and composes the public phase from the backend state and the supervisor
// session. An Engine is safe for concurrent use.
type Engine struct {
	store      Store
	driver     compute.Driver
	driverName string
	issuer     TokenIssuer
	providers  func(ctx context.Context, workspace, name string) error
	workspaces func(ctx context.Context, workspace string) error
	log        *slog.Logger
	now        func() time.Time
	hub        *hub

	gateMu sync.Mutex
	gates  map[string]*gate // sandboxes someone holds or awaits the gate of

	stateMu sync.Mutex
	states  map[string]*sandboxState // sandboxes whose row exists; written under their gate

	defaultImage string
	manages      bool
}

// New returns an engine. Call Run to start reconciling.
func New(ctx context.Context, o Options) (*Engine, error) {
	if o.Store == nil || o.Driver == nil {
		return nil, errors.New("lifecycle: store and driver are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	caps, err := o.Driver.Capabilities(ctx)
	if err != nil {
		return nil, fmt.Errorf("compute driver capabilities: %w", err)
	}
	name := o.DriverName
	if name == "" {
		name = caps.DriverName
	}
	return &Engine{
		store: o.Store, driver: o.Driver, driverName: name, issuer: o.Issuer, providers: o.ProviderExists,
		workspaces: o.WorkspaceAccepts, log: o.Logger.With("component", "lifecycle"), now: o.Now, hub: newHub(),
		gates: map[string]*gate{}, states: map[string]*sandboxState{},
		defaultImage: caps.DefaultImage, manages: caps.GatewayManagesLifecycle,
	}, nil
}

// DriverName is the active driver's name.
func (e *Engine) DriverName() string { return e.driverName }

// NormalizeWorkspace maps "" to the default workspace.
func NormalizeWorkspace(ws string) string {
	if ws == "" {
		return DefaultWorkspace
	}
	return ws
}

// Create validates, persists and starts a sandbox, in OpenShell's order:
// validation, providers, driver validation (before anything is persisted or
// minted), token, MustCreate as PROVISIONING, driver create. The sandbox's
// gate is taken before the row is inserted, so no other operation sees the
// row before the driver has been asked. The workspace is checked again
// after the insert (see Options.WorkspaceAccepts). A refusal or a driver
// failure removes the row again.
func (e *Engine) Create(ctx context.Context, req *openshellv1.CreateSandboxRequest) (*openshellv1.Sandbox, error) {
	if err := ValidateCreateRequest(req); err != nil {
		return nil, err
	}
	ws := NormalizeWorkspace(req.GetWorkspace())
	spec := proto.Clone(req.GetSpec()).(*openshellv1.SandboxSpec)
	if spec == nil {
		spec = &openshellv1.SandboxSpec{}
	}
	for _, p := range spec.GetProviders() {
		if err := e.providerExists(ctx, ws, p); err != nil {
			return nil, err
		}
	}
	if spec.Template == nil {
		spec.Template = &openshellv1.SandboxTemplate{}
	}
	if spec.Template.Image == "" {
		spec.Template.Image = e.defaultImage
	}
	name := req.GetName()
	if name == "" {
		name = petname()
	}
	now := e.now()
	sb := &openshellv1.Sandbox{
		Metadata: &datamodelv1.ObjectMeta{
			Id: uuid.NewString(), Name: name, Workspace: ws,
			Labels: req.GetLabels(), Annotations: req.GetAnnotations(), CreatedAtMs: now.UnixMilli(),
		},
		Spec: spec,
		Status: &openshellv1.SandboxStatus{
			SandboxName: name,
			Phase:       openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING,
		},
	}
	dsb, err := e.toDriver(sb)
	if err != nil {
		return nil, err
	}
	if err := compute.CheckTemplate(e.driver, e.driverName, dsb.Spec.Template); err != nil {
		return nil, err
	}
	if err := e.driver.ValidateCreate(ctx, dsb); err != nil {
		return nil, driverError("validate sandbox", err)
	}
	if e.issuer != nil {
		tok, _, err := e.issuer.Mint(sb.Metadata.Id)
		if err != nil {
			return nil, fmt.Errorf("mint sandbox token: %w", err)
		}
		dsb.Spec.SandboxToken = tok
	}
	setReadyCondition(sb.Status, &openshellv1.SandboxCondition{Type: compute.ConditionReady, Status: "False", Reason: "Provisioning", Message: "Creating the sandbox"}, now)
	id := sb.Metadata.Id
	g := e.lock(id)
	defer e.unlock(ctx, id, g)
	if err := e.insert(ctx, sb); err != nil {
		return nil, err
	}
	// Backend scope for the workspace (a namespace in the kubernetes
	// driver's managed mode); idempotent, a no-op for other drivers.
	err = compute.EnsureWorkspace(ctx, e.driver, ws)
	if err == nil {
		err = e.driver.Create(ctx, dsb)
	}
	if err != nil {
		// Compensate: the request failed, so nothing may remain.
		if _, derr := e.driver.Delete(context.WithoutCancel(ctx), compute.Ref{ID: sb.Metadata.Id, Name: name}); derr != nil {
			e.log.Warn("cleanup after failed create: driver delete", "sandbox_id", sb.Metadata.Id, "err", derr)
		}
		if derr := e.dropRow(context.WithoutCancel(ctx), id); derr != nil {
			e.log.Error("cleanup after failed create: store delete", "sandbox_id", id, "err", derr)
		}
		return nil, driverError("create sandbox", err)
	}
	e.log.Info("sandbox created", "sandbox_id", sb.Metadata.Id, "name", name, "workspace", ws)
	e.hub.publish(sb.Metadata.Id, Update{Sandbox: sb})
	// Fold in whatever the backend already reports.
	if got, err := e.driver.Get(ctx, compute.Ref{ID: sb.Metadata.Id, Name: name}); err == nil {
		e.setBackend(sb.Metadata.Id, backendView{present: true, sb: got})
		if updated, err := e.recompose(ctx, sb.Metadata.Id); err == nil && updated != nil {
			sb = updated
		}
	}
	return sb, nil
}

// insert persists a new sandbox row (the caller holds its gate) and admits
// it to its workspace: when the workspace no longer accepts sandboxes the
// row is removed again and the error is FailedPrecondition.
func (e *Engine) insert(ctx context.Context, sb *openshellv1.Sandbox) error {
	id, name, ws := sb.GetMetadata().GetId(), sb.GetMetadata().GetName(), sb.GetMetadata().GetWorkspace()
	if err := e.store.CreateSandbox(ctx, sb); err != nil {
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			return errdefs.AlreadyExists(fmt.Sprintf("sandbox %q already exists in workspace %q", name, ws))
		}
		return err
	}
	e.track(id)
	if e.workspaces == nil {
		return nil
	}
	err := e.workspaces(ctx, ws)
	if err == nil {
		return nil
	}
	if derr := e.dropRow(context.WithoutCancel(ctx), id); derr != nil {
		e.log.Error("cleanup after refused workspace: store delete", "sandbox_id", id, "err", derr)
	}
	switch {
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return err
	case errors.Is(err, errdefs.ErrNotFound):
		return errdefs.FailedPrecondition(fmt.Sprintf("workspace %q was deleted", ws))
	}
	return fmt.Errorf("check workspace %q: %w", ws, err)
}

func (e *Engine) providerExists(ctx context.Context, ws, name string) error {
	if e.providers == nil {
		return errdefs.FailedPrecondition(fmt.Sprintf("provider '%s' not found", name))
	}
	if err := e.providers(ctx, ws, name); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.FailedPrecondition(fmt.Sprintf("provider '%s' not found", name))
		}
		return err
	}
	return nil
}

// driverError keeps the caller-meaningful codes of a driver failure and
// hides everything else behind Internal.
func driverError(op string, err error) error {
	switch {
	case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrFailedPrecondition), errors.Is(err, errdefs.ErrInvalidArgument):
		return err
	}
	return fmt.Errorf("%s: %w", op, err) // unknown kinds become Internal at the edge
}

// toDriver maps a public sandbox to the driver's view.
func (e *Engine) toDriver(sb *openshellv1.Sandbox) (compute.Sandbox, error) {
	spec := sb.GetSpec()
	t := spec.GetTemplate()
	var driverCfg map[string]any
	if dc := t.GetDriverConfig(); dc != nil {
		if v, ok := dc.GetFields()[e.driverName]; ok {
			s := v.GetStructValue()
			if s == nil {
				return compute.Sandbox{}, errdefs.InvalidArgument(fmt.Sprintf("template.driver_config.%s must be an object", e.driverName))
			}
			driverCfg = s.AsMap()
		}
	}
	res := compute.Resources{}
	if r := t.GetResources(); r != nil {
		res = resourcesFromStruct(r)
	}
	out := compute.Sandbox{
		ID: sb.GetMetadata().GetId(), Name: sb.GetMetadata().GetName(), Workspace: sb.GetMetadata().GetWorkspace(),
		Spec: compute.Spec{
			LogLevel:    spec.GetLogLevel(),
			Environment: spec.GetEnvironment(),
			Command:     spec.GetCommand(),
			TTY:         spec.GetTty(),
			Template: compute.Template{
				Image: t.GetImage(), AgentSocketPath: t.GetAgentSocket(), Labels: t.GetLabels(),
				Annotations: t.GetAnnotations(), Environment: t.GetEnvironment(), Resources: res,
				RuntimeClassName: t.GetRuntimeClassName(), ServiceAccountName: t.GetServiceAccountName(),
				UserNamespaces: t.UserNamespaces, DriverConfig: driverCfg,
			},
		},
	}
	out.Spec.Template.Resources.GPUs = spec.GetResourceRequirements().GetGpu().GetCount()
	return out, nil
}

// resourcesFromStruct reads Kubernetes-style {requests:{cpu,memory},
// limits:{cpu,memory}} from template.resources.
func resourcesFromStruct(s *structpb.Struct) compute.Resources {
	get := func(section, key string) string {
		sec := s.GetFields()[section].GetStructValue()
		if sec == nil {
			return ""
		}
		v := sec.GetFields()[key]
		if v == nil {
			return ""
		}
		if str := v.GetStringValue(); str != "" {
			return str
		}
		if _, ok := v.GetKind().(*structpb.Value_NumberValue); ok {
			return fmt.Sprint(v.GetNumberValue())
		}
		return ""
	}
	return compute.Resources{
		CPURequest: get("requests", "cpu"), CPULimit: get("limits", "cpu"),
		MemoryRequest: get("requests", "memory"), MemoryLimit: get("limits", "memory"),
	}
}

// Get returns a sandbox by name. Missing and not-yours both read NotFound.
func (e *Engine) Get(ctx context.Context, workspace, name string) (*openshellv1.Sandbox, error) {
	if name == "" {
		return nil, errdefs.InvalidArgument("name is required")
	}
	ws := NormalizeWorkspace(workspace)
	sb, err := e.store.GetSandboxByName(ctx, ws, name)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.NotFound(fmt.Sprintf("sandbox %q not found in workspace %q", name, ws))
		}
		return nil, err
	}
	return sb, nil
}

// GetByID returns a sandbox by id.
func (e *Engine) GetByID(ctx context.Context, id string) (*openshellv1.Sandbox, error) {
	if id == "" {
		return nil, errdefs.InvalidArgument("sandbox_id is required")
	}
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.NotFound("sandbox not found")
		}
		return nil, err
	}
	return sb, nil
}

// List lists sandboxes.
func (e *Engine) List(ctx context.Context, o ListOptions) ([]*openshellv1.Sandbox, error) {
	if o.AllWorkspaces && o.Workspace != "" {
		return nil, errdefs.InvalidArgument("all_workspaces cannot be combined with workspace")
	}
	if !o.AllWorkspaces {
		o.Workspace = NormalizeWorkspace(o.Workspace)
	}
	if o.Limit == 0 {
		o.Limit = 100
	}
	if o.Limit > 1000 {
		o.Limit = 1000
	}
	return e.store.ListSandboxes(ctx, o)
}

// Delete marks the sandbox DELETING, deletes the backend and removes the
// row once the backend is gone (now, or later through the watcher).
func (e *Engine) Delete(ctx context.Context, workspace, name string) (bool, error) {
	sb, err := e.Get(ctx, workspace, name)
	if err != nil {
		return false, err
	}
	id := sb.GetMetadata().GetId()
	g := e.lock(id)
	defer e.unlock(ctx, id, g)
	sb, err = e.mutate(ctx, id, func(sb *openshellv1.Sandbox) bool {
		if sb.Status.Phase == openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING {
			return false
		}
		sb.Status.Phase = openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING
		sb.Metadata.DeletionTimestampMs = e.now().UnixMilli()
		setReadyCondition(sb.Status, &openshellv1.SandboxCondition{Type: compute.ConditionReady, Status: "False", Reason: "Deleting", Message: "Sandbox is being deleted"}, e.now())
		return true
	})
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, errdefs.NotFound(fmt.Sprintf("sandbox %q not found in workspace %q", name, NormalizeWorkspace(workspace)))
	}
	if err != nil {
		return false, err
	}
	return true, e.finishDelete(ctx, sb)
}

// finishDelete deletes the backend of a DELETING sandbox and removes the
// row once the backend is gone. Call under the sandbox's gate.
func (e *Engine) finishDelete(ctx context.Context, sb *openshellv1.Sandbox) error {
	id, name := sb.GetMetadata().GetId(), sb.GetMetadata().GetName()
	if _, err := e.driver.Delete(ctx, compute.Ref{ID: id, Name: name}); err != nil {
		return fmt.Errorf("delete sandbox %q: %w", name, err)
	}
	if _, err := e.driver.Get(ctx, compute.Ref{ID: id, Name: name}); errors.Is(err, errdefs.ErrNotFound) {
		e.removeRow(ctx, id, isDeleting)
	}
	return nil
}

func isDeleting(sb *openshellv1.Sandbox) bool {
	return sb.GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING
}

// removeRow removes the row of a sandbox that is gone when cond holds for
// it, and tells watchers. Call under the sandbox's gate.
func (e *Engine) removeRow(ctx context.Context, id string, cond func(*openshellv1.Sandbox) bool) {
	sb, err := e.removeIf(ctx, id, cond)
	if err != nil {
		e.log.Error("remove sandbox row", "sandbox_id", id, "err", err)
		return
	}
	if sb == nil {
		return
	}
	e.log.Info("sandbox deleted", "sandbox_id", id, "name", sb.GetMetadata().GetName())
	sb.Status.Phase = openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING
	e.hub.publish(id, Update{Sandbox: sb, Deleted: true})
}

// dropRow removes the row of a sandbox whose create or adoption failed.
// Call under the sandbox's gate.
func (e *Engine) dropRow(ctx context.Context, id string) error {
	_, err := e.removeIf(ctx, id, nil)
	return err
}

// removeIf deletes id's row when cond (nil: always) holds for it, on the
// condition that the row is still the version read: a concurrent change
// (another replica) makes it read again and decide again, a few times,
// then the conflict is returned (Aborted). It returns the removed row, or
// nil when there was none or cond refused it. Call under id's gate.
func (e *Engine) removeIf(ctx context.Context, id string, cond func(*openshellv1.Sandbox) bool) (*openshellv1.Sandbox, error) {
	for attempt := 0; ; attempt++ {
		sb, err := e.store.GetSandbox(ctx, id)
		if errors.Is(err, errdefs.ErrNotFound) {
			e.forget(id)
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if cond != nil && !cond(sb) {
			return nil, nil
		}
		err = e.store.DeleteSandbox(ctx, id, sb.GetMetadata().GetResourceVersion())
		switch {
		case err == nil:
			e.forget(id)
			return sb, nil
		case errors.Is(err, errdefs.ErrNotFound):
			e.forget(id)
			return nil, nil
		case errors.Is(err, errdefs.ErrConflict) && attempt < maxCASAttempts:
			continue
		}
		return nil, err
	}
}

// Stop persists STOPPING, then stops the backend. Idempotent.
func (e *Engine) Stop(ctx context.Context, workspace, name string) (*openshellv1.Sandbox, error) {
	sb, err := e.Get(ctx, workspace, name)
	if err != nil {
		return nil, err
	}
	id := sb.GetMetadata().GetId()
	g := e.lock(id)
	defer e.unlock(ctx, id, g)
	var refuse error
	sb, err = e.mutate(ctx, id, func(sb *openshellv1.Sandbox) bool {
		switch sb.Status.Phase {
		case openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPING:
			return false
		case openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING:
			refuse = errdefs.FailedPrecondition(fmt.Sprintf("sandbox %q is being deleted", name))
			return false
		}
		sb.Status.Phase = openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPING
		setReadyCondition(sb.Status, &openshellv1.SandboxCondition{Type: compute.ConditionReady, Status: "False", Reason: "Stopping", Message: "Sandbox is stopping"}, e.now())
		return true
	})
	if err != nil {
		return nil, err
	}
	if refuse != nil {
		return nil, refuse
	}
	if sb.Status.Phase == openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED {
		return sb, nil
	}
	if err := e.driver.Stop(ctx, compute.Ref{ID: id, Name: sb.GetMetadata().GetName()}); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, driverError("stop sandbox", err)
	}
	e.refreshBackend(ctx, sb)
	return e.recompose(ctx, id)
}

// Start persists STARTING, then starts the backend. Idempotent.
func (e *Engine) Start(ctx context.Context, workspace, name string) (*openshellv1.Sandbox, error) {
	sb, err := e.Get(ctx, workspace, name)
	if err != nil {
		return nil, err
	}
	id := sb.GetMetadata().GetId()
	g := e.lock(id)
	defer e.unlock(ctx, id, g)
	var refuse error
	changed := false
	sb, err = e.mutate(ctx, id, func(sb *openshellv1.Sandbox) bool {
		switch sb.Status.Phase {
		case openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING:
			refuse = errdefs.FailedPrecondition(fmt.Sprintf("sandbox %q is being deleted", name))
			return false
		case openshellv1.SandboxPhase_SANDBOX_PHASE_READY, openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING, openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING:
			return false
		}
		sb.Status.Phase = openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING
		sb.Status.ExitCode = nil
		setReadyCondition(sb.Status, &openshellv1.SandboxCondition{Type: compute.ConditionReady, Status: "False", Reason: "Starting", Message: "Sandbox is starting"}, e.now())
		changed = true
		return true
	})
	if err != nil {
		return nil, err
	}
	if refuse != nil {
		return nil, refuse
	}
	if !changed {
		return sb, nil
	}
	if err := e.driver.Start(ctx, compute.Ref{ID: id, Name: sb.GetMetadata().GetName()}); err != nil {
		return nil, driverError("start sandbox", err)
	}
	e.refreshBackend(ctx, sb)
	return e.recompose(ctx, id)
}

func (e *Engine) refreshBackend(ctx context.Context, sb *openshellv1.Sandbox) {
	ctx, end := telemetry.StartOperation(ctx, "lifecycle.RefreshBackend")
	defer end(nil)
	got, err := e.driver.Get(ctx, compute.Ref{ID: sb.GetMetadata().GetId(), Name: sb.GetMetadata().GetName()})
	switch {
	case err == nil:
		e.setBackend(sb.GetMetadata().GetId(), backendView{present: true, sb: got})
	case errors.Is(err, errdefs.ErrNotFound):
		e.setBackend(sb.GetMetadata().GetId(), backendView{})
	}
}

// maxCASAttempts bounds the retries of a conditional write that keeps
// meeting concurrent changes.
const maxCASAttempts = 8

// mutate applies fn to the current row and writes it with CAS, retrying a
// few times on conflicts with a fresh read. fn returns false to skip the
// write (the current row is returned). Call under id's gate: fn may read
// the engine's state of id, which only changes under the gate.
func (e *Engine) mutate(ctx context.Context, id string, fn func(*openshellv1.Sandbox) bool) (*openshellv1.Sandbox, error) {
	for attempt := 0; ; attempt++ {
		sb, err := e.store.GetSandbox(ctx, id)
		if errors.Is(err, errdefs.ErrNotFound) {
			e.forget(id)
		}
		if err != nil {
			return nil, err
		}
		e.track(id)
		if sb.Status == nil {
			sb.Status = &openshellv1.SandboxStatus{}
		}
		if !fn(sb) {
			return sb, nil
		}
		err = e.store.UpdateSandbox(ctx, sb)
		if err == nil {
			e.hub.publish(id, Update{Sandbox: sb})
			return sb, nil
		}
		if !errors.Is(err, errdefs.ErrConflict) || attempt >= maxCASAttempts {
			return nil, err
		}
	}
}

// recompose recomputes the phase of one sandbox from what the engine knows
// and persists it when it changed. The backend and session state are read
// inside the compare-and-swap retry, so a retried write never carries an
// older view than the one it replaces. Call under id's gate.
func (e *Engine) recompose(ctx context.Context, id string) (*openshellv1.Sandbox, error) {
	return e.mutate(ctx, id, func(sb *openshellv1.Sandbox) bool {
		st, _ := e.state(id)
		b, session, instance := st.backend, st.connected, st.instance
		phase, cond := composePhase(sb.Status.Phase, b, session)
		changed := phase != sb.Status.Phase
		sb.Status.Phase = phase
		if setReadyCondition(sb.Status, cond, e.now()) {
			changed = true
		}
		if b.present && b.sb.Status.InstanceID != "" && sb.Status.AgentPod != b.sb.Status.SandboxName && b.sb.Status.SandboxName != "" {
			sb.Status.AgentPod = b.sb.Status.SandboxName
			changed = true
		}
		if session && instance != "" && sb.Status.MainProcessInstanceId != instance {
			sb.Status.MainProcessInstanceId = instance
			changed = true
		}
		return changed
	})
}

// SetCurrentPolicyVersion records in the sandbox's status that its
// supervisor loaded policy version v, and tells watchers. The write goes
// through the sandbox's gate without waiting for it (see post): while an
// operation holds the gate it is applied when that operation ends, and the
// call returns nil.
func (e *Engine) SetCurrentPolicyVersion(ctx context.Context, sandboxID string, v uint32) error {
	return e.post(ctx, sandboxID, func(ctx context.Context) error {
		_, err := e.mutate(ctx, sandboxID, func(sb *openshellv1.Sandbox) bool {
			if sb.Status.CurrentPolicyVersion == v {
				return false
			}
			sb.Status.CurrentPolicyVersion = v
			return true
		})
		return err
	})
}

// SessionChanged is the supervisor-presence hook: the relay calls it when a
// supervisor session for sandboxID connects or ends. The change goes
// through the sandbox's gate without waiting for it (see post), so the
// relay is never held up by a long operation; a session of a sandbox
// without a row is ignored.
func (e *Engine) SessionChanged(ctx context.Context, sandboxID string, connected bool, instanceID string) {
	err := e.post(ctx, sandboxID, func(ctx context.Context) error {
		return e.observe(ctx, sandboxID, func(st *sandboxState) {
			st.connected, st.instance = connected, instanceID
			if !connected {
				st.instance = ""
			}
		})
	})
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		e.log.Warn("compose phase after session change", "sandbox_id", sandboxID, "err", err)
	}
}

// observe records a change in what the engine knows about id (backend or
// session) and composes the phase again. A sandbox without a row is left
// alone and not tracked. Call under id's gate.
func (e *Engine) observe(ctx context.Context, id string, change func(*sandboxState)) error {
	ok, err := e.known(ctx, id)
	if err != nil || !ok {
		return err
	}
	e.update(id, change)
	_, err = e.recompose(ctx, id)
	return err
}

// SandboxExists reports NotFound when no row exists for id.
func (e *Engine) SandboxExists(ctx context.Context, id string) error {
	_, err := e.store.GetSandbox(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.NotFound("sandbox not found")
	}
	return err
}

// ReportMainProcessExit moves the sandbox to ERROR with the exit code. Any
// exit counts, code 0 too: the main process is the sandbox's reason to be.
func (e *Engine) ReportMainProcessExit(ctx context.Context, sandboxID, instanceID string, exitCode int32) error {
	if sandboxID == "" {
		return errdefs.InvalidArgument("sandbox_id is required")
	}
	if instanceID == "" {
		return errdefs.InvalidArgument("instance_id is required")
	}
	sb, err := e.store.GetSandbox(ctx, sandboxID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.NotFound("sandbox not found")
	}
	if err != nil {
		return err
	}
	if err := staleInstance(sb, instanceID); err != nil {
		return err
	}
	// Through the gate without waiting: the supervisor reports its exit
	// while a stop holding the gate waits for that very supervisor.
	return e.post(ctx, sandboxID, func(ctx context.Context) error {
		return e.recordExit(ctx, sandboxID, instanceID, exitCode)
	})
}

func staleInstance(sb *openshellv1.Sandbox, instanceID string) error {
	if cur := sb.GetStatus().GetMainProcessInstanceId(); cur != "" && cur != instanceID {
		return errdefs.FailedPrecondition(fmt.Sprintf("stale main process instance %q (current %q)", instanceID, cur))
	}
	return nil
}

// recordExit moves the sandbox to ERROR for ReportMainProcessExit. Call
// under the sandbox's gate.
func (e *Engine) recordExit(ctx context.Context, sandboxID, instanceID string, exitCode int32) error {
	var stale error
	_, err := e.mutate(ctx, sandboxID, func(sb *openshellv1.Sandbox) bool {
		if stale = staleInstance(sb, instanceID); stale != nil {
			return false
		}
		switch sb.Status.Phase {
		case openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING:
			return false
		case openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPING, openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED:
			// The supervisor ends the main process when it is told to
			// stop: an exit during a stop is the stop, not a failure.
			return false
		}
		sb.Status.Phase = openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR
		sb.Status.MainProcessInstanceId = instanceID
		code := exitCode
		sb.Status.ExitCode = &code
		setReadyCondition(sb.Status, &openshellv1.SandboxCondition{Type: compute.ConditionReady, Status: "False", Reason: ReasonMainProcessExited, Message: fmt.Sprintf("Main process exited with code %d", exitCode)}, e.now())
		return true
	})
	if errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.NotFound("sandbox not found")
	}
	if err != nil {
		return err
	}
	return stale
}

// Subscribe returns updates for one sandbox until cancel is called.
func (e *Engine) Subscribe(id string) (<-chan Update, func()) {
	ch, cancel := e.hub.subscribe(id)
	return ch, cancel
}

// EventTail returns the last n platform events of a sandbox (0 = all kept).
func (e *Engine) EventTail(id string, n int) []*openshellv1.PlatformEvent {
	return e.hub.eventTail(id, n)
}

// PublishPlatformEvent records a gateway-side platform event.
func (e *Engine) PublishPlatformEvent(id string, ev *openshellv1.PlatformEvent) {
	e.hub.publish(id, Update{Platform: ev})
}

// PublishDraftUpdate tells the watchers of sandbox id, on this gateway
// process, that its draft policy chunks changed.
func (e *Engine) PublishDraftUpdate(id string, u *openshellv1.DraftPolicyUpdate) {
	e.hub.publish(id, Update{Draft: u})
}

// DeleteWorkspace releases the backend scope of a workspace that no longer
// holds sandboxes.
func (e *Engine) DeleteWorkspace(ctx context.Context, workspace string) error {
	if err := compute.DeleteWorkspace(ctx, e.driver, workspace); err != nil {
		return driverError("delete workspace", err)
	}
	return nil
}
