package lifecycle

import (
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
)

// Condition reasons the gateway writes itself.
const (
	ReasonSupervisorNotConnected = "SupervisorNotConnected"
	ReasonDependenciesReady      = "DependenciesReady"
	ReasonDependenciesNotReady   = "DependenciesNotReady"
	ReasonMainProcessExited      = "MainProcessExited"
	ReasonBackendMissing         = "BackendMissing"
)

// terminalReasons are backend Ready=False reasons after which the workload
// will not become ready on its own: the sandbox goes to ERROR.
var terminalReasons = map[string]bool{
	"ProcessExited":        true,
	"Failed":               true,
	"CrashLoopBackOff":     true,
	"ErrImagePull":         true,
	"ImagePullBackOff":     true,
	"InvalidImageName":     true,
	"CreateContainerError": true,
	"Error":                true,
}

// backendView is what the lifecycle engine knows about a sandbox's backend.
type backendView struct {
	present bool
	sb      compute.Sandbox
}

func condition(conds []compute.Condition, typ string) (compute.Condition, bool) {
	for _, c := range conds {
		if c.Type == typ {
			return c, true
		}
	}
	return compute.Condition{}, false
}

func (b backendView) ready() bool {
	c, ok := condition(b.sb.Status.Conditions, compute.ConditionReady)
	return b.present && ok && c.Status == "True"
}

func (b backendView) suspended() bool {
	c, ok := condition(b.sb.Status.Conditions, compute.ConditionSuspended)
	return b.present && ok && c.Status == "True"
}

// terminal reports a Ready=False condition with a terminal reason.
func (b backendView) terminal() (compute.Condition, bool) {
	c, ok := condition(b.sb.Status.Conditions, compute.ConditionReady)
	if b.present && ok && c.Status == "False" && terminalReasons[c.Reason] {
		return c, true
	}
	return compute.Condition{}, false
}

// composePhase derives the public phase and Ready condition from the
// persisted phase (which carries user intent: STOPPING, STOPPED, STARTING,
// DELETING, and the sticky ERROR), the backend and the supervisor session.
func composePhase(current openshellv1.SandboxPhase, b backendView, session bool) (openshellv1.SandboxPhase, *openshellv1.SandboxCondition) {
	ready := func(status, reason, msg string) *openshellv1.SandboxCondition {
		return &openshellv1.SandboxCondition{Type: compute.ConditionReady, Status: status, Reason: reason, Message: msg}
	}
	switch current {
	case openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING:
		return current, ready("False", "Deleting", "Sandbox is being deleted")
	case openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR:
		return current, nil // sticky: keep the condition that put it there
	case openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPING:
		if !b.present || b.suspended() || !b.ready() {
			return openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, ready("False", "Stopped", "Sandbox is stopped")
		}
		return current, ready("False", "Stopping", "Sandbox is stopping")
	case openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED:
		return current, ready("False", "Stopped", "Sandbox is stopped")
	}
	if b.present && b.sb.Status.Deleting {
		return openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING, ready("False", "Deleting", "Backend is deleting the sandbox")
	}
	if c, ok := b.terminal(); ok {
		return openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR, ready("False", c.Reason, c.Message)
	}
	if session {
		// A live session beats a lagging backend snapshot, including a
		// stale "suspended" one from a restart the gateway itself did.
		return openshellv1.SandboxPhase_SANDBOX_PHASE_READY, ready("True", ReasonDependenciesReady, "Supervisor session connected")
	}
	if b.suspended() && current != openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING {
		return openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, ready("False", "Stopped", "Sandbox is stopped")
	}
	switch {
	case b.ready():
		phase := openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING
		if current == openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING {
			phase = current
		}
		return phase, ready("False", ReasonSupervisorNotConnected, "Backend ready; waiting for supervisor session")
	}
	phase := openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING
	if current == openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING {
		phase = current
	}
	if current == openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		return phase, ready("False", ReasonDependenciesNotReady, "Supervisor session disconnected")
	}
	msg := "Waiting for the backend"
	reason := "Provisioning"
	if c, ok := condition(b.sb.Status.Conditions, compute.ConditionReady); ok && c.Message != "" {
		msg, reason = c.Message, c.Reason
	}
	return phase, ready("False", reason, msg)
}

// setReadyCondition replaces the Ready condition in st, stamping the
// transition time only when status or reason changed.
func setReadyCondition(st *openshellv1.SandboxStatus, c *openshellv1.SandboxCondition, now time.Time) bool {
	if c == nil {
		return false
	}
	for i, old := range st.Conditions {
		if old.GetType() != c.Type {
			continue
		}
		if old.GetStatus() == c.Status && old.GetReason() == c.Reason && old.GetMessage() == c.Message {
			return false
		}
		c.LastTransitionTime = old.GetLastTransitionTime()
		if old.GetStatus() != c.Status || old.GetReason() != c.Reason {
			c.LastTransitionTime = now.UTC().Format(time.RFC3339)
		}
		st.Conditions[i] = c
		return true
	}
	c.LastTransitionTime = now.UTC().Format(time.RFC3339)
	st.Conditions = append(st.Conditions, c)
	return true
}
