package lifecycle

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// restartingInstance stands in for the main process instance while a
// re-enrichment restarts the pod (see adoptExisting).
const restartingInstance = "restarting"

// ReasonAdopted is the reason of the platform event published when an
// existing backend workload is adopted (or re-enriched).
const (
	ReasonAdopted    = "Adopted"
	ReasonReenriched = "Reenriched"
)

// Adopt brings an existing backend workload (a Kubernetes Sandbox custom
// resource) under the gateway's management without recreating it.
//
// Order: the request is validated; the driver must implement
// compute.Adopter (FailedPrecondition "adoption is only supported by the
// kubernetes driver" otherwise) and have adoption enabled (its
// AdoptionEnabled refusal, e.g. "sandbox adoption is disabled on this
// gateway", whatever the name). When a sandbox with that name already
// exists in the workspace and the workload is labelled as that very
// sandbox, it is returned as is (idempotent), or re-enriched first when
// req.Reenrich is set; any other existing sandbox makes the name
// AlreadyExists. A new adoption asks the driver for a dry run first, so
// every driver-side rejection (adoption disabled, namespace not accepted,
// workload not found, ambiguous agent container, conflicts, service
// account) happens before a row is persisted or a token minted. Then the
// token is minted, the sandbox's gate taken, the row persisted as
// PROVISIONING (MustCreate), the workspace checked again (see
// Options.WorkspaceAccepts) and the driver writes the workload. A driver failure that left the workload
// untouched removes the row again. The driver restarts the pod under the
// supervisor, so a successful adoption returns the sandbox STARTING (READY
// once the supervisor connects); a workload the user had suspended is
// returned STOPPED.
//
// The agent's image and command stay those of the workload: a request
// naming spec.command or spec.template.image is InvalidArgument (the
// original command runs under the supervisor, which the driver injects).
func (e *Engine) Adopt(ctx context.Context, req *openshellv1.AdoptSandboxRequest) (*openshellv1.Sandbox, error) {
	name := req.GetName()
	if name == "" {
		return nil, errdefs.InvalidArgument("name is required")
	}
	if len(req.GetSpec().GetCommand()) > 0 {
		return nil, errdefs.InvalidArgument("spec.command cannot be set when adopting: the command comes from the Sandbox resource")
	}
	if req.GetSpec().GetTemplate().GetImage() != "" {
		return nil, errdefs.InvalidArgument("spec.template.image cannot be set when adopting: the image comes from the Sandbox resource")
	}
	// The create rules cover the name, the spec's shape and the labels.
	if err := ValidateCreateRequest(&openshellv1.CreateSandboxRequest{Name: name, Spec: req.GetSpec(), Labels: req.GetLabels()}); err != nil {
		return nil, err
	}
	adopter, ok := e.driver.(compute.Adopter)
	if ok {
		if err := adopter.AdoptionEnabled(ctx); errors.Is(err, errdefs.ErrUnimplemented) {
			ok = false // a separately served driver that cannot adopt
		} else if err != nil {
			return nil, err
		}
	}
	if !ok {
		return nil, errdefs.FailedPrecondition("adoption is only supported by the kubernetes driver")
	}
	ws := NormalizeWorkspace(req.GetWorkspace())

	existing, err := e.store.GetSandboxByName(ctx, ws, name)
	switch {
	case err == nil:
		return e.adoptExisting(ctx, adopter, req, existing)
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, err
	}

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
	now := e.now()
	sb := &openshellv1.Sandbox{
		Metadata: &datamodelv1.ObjectMeta{
			Id: uuid.NewString(), Name: name, Workspace: ws, Labels: req.GetLabels(), CreatedAtMs: now.UnixMilli(),
		},
		Spec: spec,
		Status: &openshellv1.SandboxStatus{
			SandboxName: name,
			Phase:       openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING,
		},
	}
	id := sb.Metadata.Id
	dsb, err := e.toDriver(sb)
	if err != nil {
		return nil, err
	}
	areq := compute.AdoptRequest{Sandbox: dsb, Namespace: req.GetNamespace(), AgentContainer: req.GetAgentContainer(), DryRun: true}
	if _, err := adopter.Adopt(ctx, areq); err != nil {
		return nil, adoptError(err)
	}
	if e.issuer != nil {
		tok, _, err := e.issuer.Mint(id)
		if err != nil {
			return nil, fmt.Errorf("mint sandbox token: %w", err)
		}
		areq.Sandbox.Spec.SandboxToken = tok
	}
	setReadyCondition(sb.Status, &openshellv1.SandboxCondition{Type: compute.ConditionReady, Status: "False", Reason: "Provisioning", Message: "Adopting the existing sandbox"}, now)
	g := e.lock(id)
	defer e.unlock(ctx, id, g)
	if err := e.insert(ctx, sb); err != nil {
		return nil, err
	}
	areq.DryRun = false
	res, err := adopter.Adopt(ctx, areq)
	if err != nil {
		e.compensateAdopt(ctx, sb, err)
		return nil, adoptError(err)
	}
	e.log.Info("sandbox adopted", "sandbox_id", id, "name", name, "workspace", ws, "namespace", res.Sandbox.Namespace, "backend_uid", res.BackendUID)
	e.hub.publish(id, Update{Platform: adoptEvent(ReasonAdopted, res, e.now().UnixMilli())})
	e.setBackend(id, backendView{present: true, sb: res.Sandbox})
	// The driver restarted the pod through a suspension. The watcher still
	// has those suspended snapshots queued (it waits for this gate), and
	// composePhase would turn a PROVISIONING sandbox with a suspended
	// backend into a sticky STOPPED. The restart is a start, so the
	// sandbox is STARTING (like StartSandbox) until its supervisor
	// connects. A Sandbox the user had suspended stays suspended: it is
	// composed as STOPPED.
	if !(backendView{present: true, sb: res.Sandbox}).suspended() {
		if updated, err := e.mutate(ctx, id, e.markStarting); err == nil {
			sb = updated
		}
	}
	if updated, err := e.recompose(ctx, id); err == nil && updated != nil {
		sb = updated
	}
	return sb, nil
}

// markStarting moves a sandbox whose pod the driver restarts to STARTING.
func (e *Engine) markStarting(sb *openshellv1.Sandbox) bool {
	switch sb.Status.Phase {
	case openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPING,
		openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING, openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING:
		return false
	}
	sb.Status.Phase = openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING
	sb.Status.ExitCode = nil
	setReadyCondition(sb.Status, &openshellv1.SandboxCondition{Type: compute.ConditionReady, Status: "False", Reason: "Starting", Message: "Pod restarting under the supervisor"}, e.now())
	return true
}

// adoptExisting answers an adoption whose name is taken in the workspace:
// the same sandbox is returned (re-enriched on request), anything else is
// AlreadyExists.
func (e *Engine) adoptExisting(ctx context.Context, adopter compute.Adopter, req *openshellv1.AdoptSandboxRequest, sb *openshellv1.Sandbox) (*openshellv1.Sandbox, error) {
	id, name, ws := sb.GetMetadata().GetId(), sb.GetMetadata().GetName(), sb.GetMetadata().GetWorkspace()
	taken := errdefs.AlreadyExists(fmt.Sprintf("sandbox %q already exists in workspace %q", name, ws))
	dsb, err := e.toDriver(sb)
	if err != nil {
		return nil, taken
	}
	areq := compute.AdoptRequest{Sandbox: dsb, Namespace: req.GetNamespace(), AgentContainer: req.GetAgentContainer(), DryRun: true}
	// A dry run for the record's id reports the workload's sandbox id: the
	// same id means this sandbox was adopted (or created) here before.
	res, err := adopter.Adopt(ctx, areq)
	if err != nil {
		if errors.Is(err, errdefs.ErrUnavailable) {
			return nil, err
		}
		return nil, taken
	}
	if res.Sandbox.ID != id {
		return nil, taken
	}
	if !req.GetReenrich() {
		return sb, nil
	}
	g := e.lock(id)
	defer e.unlock(ctx, id, g)
	if sb.GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING {
		return nil, errdefs.FailedPrecondition(fmt.Sprintf("sandbox %q is being deleted", name))
	}
	if e.issuer != nil {
		tok, _, err := e.issuer.Mint(id)
		if err != nil {
			return nil, fmt.Errorf("mint sandbox token: %w", err)
		}
		areq.Sandbox.Spec.SandboxToken = tok
	}
	// The pod restarts through a suspension while the old supervisor's
	// session ends: STARTING first, so that neither reads as a stop. The
	// old supervisor reports its main process's exit when its pod is
	// deleted; replacing the recorded instance makes that report stale
	// (ignored) instead of an ERROR. The next session records its own.
	if _, err := e.mutate(ctx, id, func(sb *openshellv1.Sandbox) bool {
		if !e.markStarting(sb) {
			return false
		}
		if sb.Status.MainProcessInstanceId != "" {
			sb.Status.MainProcessInstanceId = restartingInstance
		}
		return true
	}); err != nil {
		return nil, err
	}
	before, _ := e.state(id)
	oldSession, hadSession := before.instance, before.connected
	areq.DryRun, areq.Reenrich = false, true
	res, err = adopter.Adopt(ctx, areq)
	if err != nil {
		// Compose again so that a still connected supervisor's instance
		// is recorded again.
		e.refreshBackend(ctx, sb)
		_, _ = e.recompose(ctx, id)
		return nil, adoptError(err)
	}
	// The driver waited until the old pod was gone: a session of the
	// supervisor that ran in it is stale even if its end has not been
	// reported yet. Left in place it would compose READY, and the
	// restart's queued suspended snapshots would then read as a stop.
	if hadSession {
		e.update(id, func(st *sandboxState) {
			if st.connected && st.instance == oldSession {
				st.connected, st.instance = false, ""
			}
		})
	}
	e.log.Info("sandbox re-enriched", "sandbox_id", id, "name", name, "workspace", ws, "backend_uid", res.BackendUID)
	e.hub.publish(id, Update{Platform: adoptEvent(ReasonReenriched, res, e.now().UnixMilli())})
	e.setBackend(id, backendView{present: true, sb: res.Sandbox})
	return e.recompose(ctx, id)
}

// compensateAdopt undoes the row of a failed adoption. A failure the driver
// reports before writing the workload (a rejection or a concurrent edit)
// removes the row. After another failure the workload may already carry
// this sandbox's id; then the row is kept so that the reconciler does not
// treat the adopted workload as an orphan (and delete it), and adopting
// again returns the sandbox.
func (e *Engine) compensateAdopt(ctx context.Context, sb *openshellv1.Sandbox, cause error) {
	ctx = context.WithoutCancel(ctx)
	id, name := sb.GetMetadata().GetId(), sb.GetMetadata().GetName()
	if !rejectedBeforeWrite(cause) {
		if got, err := e.driver.Get(ctx, compute.Ref{ID: id, Name: name}); err == nil && got.ID == id {
			e.log.Warn("adoption failed after the workload was written; keeping the sandbox", "sandbox_id", id, "err", cause)
			e.setBackend(id, backendView{present: true, sb: got})
			_, _ = e.recompose(ctx, id)
			return
		}
	}
	if err := e.dropRow(ctx, id); err != nil {
		e.log.Error("cleanup after failed adoption: store delete", "sandbox_id", id, "err", err)
	}
}

func rejectedBeforeWrite(err error) bool {
	for _, k := range []error{errdefs.ErrInvalidArgument, errdefs.ErrFailedPrecondition, errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrConflict} {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

// adoptError keeps the caller-meaningful codes of a driver's adoption
// failure (a concurrent edit stays Conflict, i.e. Aborted) and hides
// everything else behind Internal.
func adoptError(err error) error {
	if rejectedBeforeWrite(err) || errors.Is(err, errdefs.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("adopt sandbox: %w", err)
}

func adoptEvent(reason string, res compute.AdoptResult, ts int64) *openshellv1.PlatformEvent {
	what := res.Sandbox.Name
	if res.Sandbox.Namespace != "" {
		what = res.Sandbox.Namespace + "/" + res.Sandbox.Name
	}
	msg := fmt.Sprintf("Adopted Sandbox %s (uid %s); its pod restarts under the supervisor", what, res.BackendUID)
	if reason == ReasonReenriched {
		msg = fmt.Sprintf("Re-enriched Sandbox %s (uid %s); its pod restarts under the supervisor", what, res.BackendUID)
	}
	return &openshellv1.PlatformEvent{
		TimestampMs: ts, Source: "gateway", Type: "Normal", Reason: reason, Message: msg,
		Metadata: map[string]string{"backend_uid": res.BackendUID, "namespace": res.Sandbox.Namespace},
	}
}
