package docker

import (
	"fmt"
	"math"
	"time"

	"github.com/docker/docker/api/types/container"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// sandboxOf reads a container into the driver-facing sandbox (see the
// package doc for the conditions).
func (d *Driver) sandboxOf(info container.InspectResponse) compute.Sandbox {
	var labels map[string]string
	var image string
	if info.Config != nil {
		labels = info.Config.Labels
		image = info.Config.Image
	}
	sb := compute.Sandbox{
		ID:        labels[LabelSandboxID],
		Name:      labels[LabelSandboxName],
		Namespace: labels[LabelNamespace],
		Workspace: labels[LabelWorkspace],
	}
	sb.Spec.Template.Image = image
	sb.Status.SandboxName = info.Name
	if len(sb.Status.SandboxName) > 0 && sb.Status.SandboxName[0] == '/' {
		sb.Status.SandboxName = sb.Status.SandboxName[1:]
	}
	st := info.State
	if st == nil {
		st = &container.State{}
	}
	since := st.FinishedAt
	switch {
	case st.Running || st.Restarting:
		since = st.StartedAt
		sb.Status.InstanceID = shortID(info.ID) + "@" + st.StartedAt
		sb.Status.Conditions = []compute.Condition{cond(compute.ConditionReady, "True", "Running", "container is running", since)}
	case st.Status == container.StateCreated:
		sb.Status.Conditions = []compute.Condition{cond(compute.ConditionReady, "False", "Starting", "container is created and not started yet", info.Created)}
	case d.isStopped(sb.ID):
		sb.Status.Conditions = []compute.Condition{
			cond(compute.ConditionReady, "False", "Stopped", "sandbox is stopped", since),
			cond(compute.ConditionSuspended, "True", "Stopped", "sandbox is stopped", since),
		}
	case st.Status == container.StateRemoving || st.Status == container.StateDead:
		sb.Status.Deleting = st.Status == container.StateRemoving
		sb.Status.Conditions = []compute.Condition{cond(compute.ConditionReady, "False", "ContainerGone", "container is "+st.Status, since)}
	default:
		msg := fmt.Sprintf("supervisor exited with code %d", st.ExitCode)
		if st.OOMKilled {
			msg += " (out of memory)"
		}
		if st.Error != "" {
			msg += ": " + st.Error
		}
		sb.Status.Conditions = []compute.Condition{cond(compute.ConditionReady, "False", "ProcessExited", msg, since)}
	}
	return sb
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func cond(typ, status, reason, msg, since string) compute.Condition {
	if t, err := time.Parse(time.RFC3339Nano, since); err == nil && !t.IsZero() && t.Year() > 1 {
		since = t.UTC().Format(time.RFC3339)
	} else {
		since = ""
	}
	return compute.Condition{Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: since}
}

// resources maps the template's Kubernetes-style quantities to Docker's:
// cpu limit -> NanoCPUs, cpu request -> CPUShares (1024 per cpu), memory
// limit -> Memory, memory request -> MemoryReservation, GPUs -> a device
// request for that many GPUs, and the configured pids limit.
func resources(r compute.Resources, pids int64) (container.Resources, error) {
	var out container.Resources
	cpuReq, err := quantity("cpu request", r.CPURequest)
	if err != nil {
		return out, err
	}
	cpuLim, err := quantity("cpu limit", r.CPULimit)
	if err != nil {
		return out, err
	}
	memReq, err := quantity("memory request", r.MemoryRequest)
	if err != nil {
		return out, err
	}
	memLim, err := quantity("memory limit", r.MemoryLimit)
	if err != nil {
		return out, err
	}
	if cpuLim != nil {
		out.NanoCPUs = cpuLim.MilliValue() * 1_000_000
		if out.NanoCPUs < 10_000_000 {
			return out, errdefs.InvalidArgument(fmt.Sprintf("cpu limit %q is below Docker's minimum of 10m", r.CPULimit))
		}
	}
	if cpuReq != nil {
		out.CPUShares = max(cpuReq.MilliValue()*1024/1000, 2)
	}
	if memLim != nil {
		out.Memory = memLim.Value()
		if out.Memory < 6*1024*1024 {
			return out, errdefs.InvalidArgument(fmt.Sprintf("memory limit %q is below Docker's minimum of 6Mi", r.MemoryLimit))
		}
	}
	if memReq != nil {
		out.MemoryReservation = memReq.Value()
	}
	if cpuReq != nil && cpuLim != nil && cpuReq.Cmp(*cpuLim) > 0 {
		return out, errdefs.InvalidArgument(fmt.Sprintf("cpu request %q exceeds cpu limit %q", r.CPURequest, r.CPULimit))
	}
	if memReq != nil && memLim != nil && memReq.Cmp(*memLim) > 0 {
		return out, errdefs.InvalidArgument(fmt.Sprintf("memory request %q exceeds memory limit %q", r.MemoryRequest, r.MemoryLimit))
	}
	if pids > 0 {
		out.PidsLimit = &pids
	}
	if r.GPUs > 0 {
		if r.GPUs > math.MaxInt32 {
			return out, errdefs.InvalidArgument(fmt.Sprintf("gpu count %d is too large", r.GPUs))
		}
		out.DeviceRequests = []container.DeviceRequest{{Count: int(r.GPUs), Capabilities: [][]string{{"gpu"}}}}
	}
	return out, nil
}

func quantity(what, s string) (*resource.Quantity, error) {
	if s == "" {
		return nil, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() <= 0 {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("%s %q is not a positive quantity", what, s))
	}
	return &q, nil
}
