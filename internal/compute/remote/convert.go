package remote

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	computev1 "github.com/openshell-go/openshell/api/openshell/compute/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Platform config keys: the typed Template fields travel in
// DriverSandboxTemplate.platform_config under these keys, as OpenShell's
// gateway sends them.
const (
	keyRuntimeClassName   = "runtime_class_name"
	keyAnnotations        = "annotations"
	keyServiceAccountName = "service_account_name"
	keyUserNamespaces     = "user_namespaces"
	// keyHostUsers is the inverse of user_namespaces (Kubernetes'
	// hostUsers); accepted on input, it wins over user_namespaces.
	keyHostUsers = "host_users"
	// keyNamespace is accepted on input for a sandbox whose namespace
	// field is empty.
	keyNamespace = "namespace"
)

// SandboxToProto converts a driver sandbox to its wire form. It fails
// (InvalidArgument) only when driver config holds values JSON cannot
// carry.
func SandboxToProto(sb compute.Sandbox) (*computev1.DriverSandbox, error) {
	tmpl := sb.Spec.Template
	dc, err := toStruct("driver_config", tmpl.DriverConfig)
	if err != nil {
		return nil, err
	}
	out := &computev1.DriverSandbox{
		Id: sb.ID, Name: sb.Name, Namespace: sb.Namespace, Workspace: sb.Workspace,
		Spec: &computev1.DriverSandboxSpec{
			LogLevel:    sb.Spec.LogLevel,
			Environment: sb.Spec.Environment,
			Template: &computev1.DriverSandboxTemplate{
				Image:           tmpl.Image,
				AgentSocketPath: tmpl.AgentSocketPath,
				Labels:          tmpl.Labels,
				Environment:     tmpl.Environment,
				Resources: &computev1.DriverResourceRequirements{
					CpuRequest:    tmpl.Resources.CPURequest,
					CpuLimit:      tmpl.Resources.CPULimit,
					MemoryRequest: tmpl.Resources.MemoryRequest,
					MemoryLimit:   tmpl.Resources.MemoryLimit,
				},
				PlatformConfig: platformConfigToProto(tmpl),
				DriverConfig:   dc,
			},
			SandboxToken: sb.Spec.SandboxToken,
			Command:      sb.Spec.Command,
			Tty:          sb.Spec.TTY,
		},
		Status: StatusToProto(sb.Status),
	}
	if n := tmpl.Resources.GPUs; n > 0 {
		out.Spec.ResourceRequirements = &computev1.ResourceRequirements{Gpu: &computev1.GpuResourceRequirements{Count: &n}}
	}
	return out, nil
}

// platformConfigToProto puts the typed template fields into
// platform_config; nil when none is set.
func platformConfigToProto(t compute.Template) *structpb.Struct {
	f := map[string]*structpb.Value{}
	if t.RuntimeClassName != "" {
		f[keyRuntimeClassName] = structpb.NewStringValue(t.RuntimeClassName)
	}
	if t.ServiceAccountName != "" {
		f[keyServiceAccountName] = structpb.NewStringValue(t.ServiceAccountName)
	}
	if t.UserNamespaces != nil {
		f[keyUserNamespaces] = structpb.NewBoolValue(*t.UserNamespaces)
	}
	if len(t.Annotations) > 0 {
		ann := &structpb.Struct{Fields: map[string]*structpb.Value{}}
		for k, v := range t.Annotations {
			ann.Fields[k] = structpb.NewStringValue(v)
		}
		f[keyAnnotations] = structpb.NewStructValue(ann)
	}
	if len(f) == 0 {
		return nil
	}
	return &structpb.Struct{Fields: f}
}

// platformConfigFromProto sets the typed template fields from
// platform_config. With strict, a known key with a value of the wrong type,
// and an unknown key, are InvalidArgument (the first in key order): a
// setting is never dropped silently. Without strict such keys are skipped.
func platformConfigFromProto(pc *structpb.Struct, sb *compute.Sandbox, strict bool) error {
	t := &sb.Spec.Template
	var hostUsers *bool
	for _, k := range slices.Sorted(maps.Keys(pc.GetFields())) {
		v := pc.GetFields()[k]
		var err error
		switch k {
		case keyRuntimeClassName:
			err = pcString(k, v, &t.RuntimeClassName)
		case keyServiceAccountName:
			err = pcString(k, v, &t.ServiceAccountName)
		case keyNamespace:
			var ns string
			if err = pcString(k, v, &ns); err == nil && sb.Namespace == "" {
				sb.Namespace = ns
			}
		case keyUserNamespaces:
			var b bool
			if err = pcBool(k, v, &b); err == nil {
				t.UserNamespaces = &b
			}
		case keyHostUsers:
			var b bool
			if err = pcBool(k, v, &b); err == nil {
				hostUsers = &b
			}
		case keyAnnotations:
			err = pcAnnotations(v, &t.Annotations)
		default:
			err = errdefs.InvalidArgument(fmt.Sprintf("platform_config.%s is not supported", k))
		}
		if err != nil && strict {
			return err
		}
	}
	if hostUsers != nil {
		userns := !*hostUsers
		t.UserNamespaces = &userns
	}
	return nil
}

func pcString(k string, v *structpb.Value, dst *string) error {
	s, ok := v.GetKind().(*structpb.Value_StringValue)
	if !ok {
		return errdefs.InvalidArgument(fmt.Sprintf("platform_config.%s must be a string", k))
	}
	*dst = s.StringValue
	return nil
}

func pcBool(k string, v *structpb.Value, dst *bool) error {
	b, ok := v.GetKind().(*structpb.Value_BoolValue)
	if !ok {
		return errdefs.InvalidArgument(fmt.Sprintf("platform_config.%s must be a boolean", k))
	}
	*dst = b.BoolValue
	return nil
}

func pcAnnotations(v *structpb.Value, dst *map[string]string) error {
	bad := errdefs.InvalidArgument("platform_config.annotations must be a map of strings")
	s := v.GetStructValue()
	if s == nil {
		return bad
	}
	out := make(map[string]string, len(s.GetFields()))
	for k, av := range s.GetFields() {
		sv, ok := av.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return bad
		}
		out[k] = sv.StringValue
	}
	*dst = out
	return nil
}

func toStruct(what string, m map[string]any) (*structpb.Struct, error) {
	if m == nil {
		return nil, nil
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("%s: %v", what, err))
	}
	return s, nil
}

// StatusToProto converts a driver status to its wire form.
func StatusToProto(st compute.Status) *computev1.DriverSandboxStatus {
	out := &computev1.DriverSandboxStatus{
		SandboxName: st.SandboxName, InstanceId: st.InstanceID,
		AgentFd: st.AgentFD, SandboxFd: st.SandboxFD, Deleting: st.Deleting,
	}
	for _, c := range st.Conditions {
		out.Conditions = append(out.Conditions, &computev1.DriverCondition{
			Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message, LastTransitionTime: c.LastTransitionTime,
		})
	}
	return out
}

// SandboxFromProto converts a wire sandbox the driver is asked to run
// (create, validate, adopt) to the driver type. A nil message, and a
// platform_config the driver cannot honour, are InvalidArgument.
func SandboxFromProto(p *computev1.DriverSandbox) (compute.Sandbox, error) {
	return sandboxFromProto(p, true)
}

// SandboxViewFromProto converts a driver's report of a sandbox (get, list,
// watch, adoption result). Its platform_config only describes, so keys this
// side does not know, or values of another type, are skipped rather than
// failing the report.
func SandboxViewFromProto(p *computev1.DriverSandbox) (compute.Sandbox, error) {
	return sandboxFromProto(p, false)
}

func sandboxFromProto(p *computev1.DriverSandbox, strict bool) (compute.Sandbox, error) {
	if p == nil {
		return compute.Sandbox{}, errdefs.InvalidArgument("sandbox is required")
	}
	sb := compute.Sandbox{ID: p.GetId(), Name: p.GetName(), Namespace: p.GetNamespace(), Workspace: p.GetWorkspace()}
	spec := p.GetSpec()
	tmpl := spec.GetTemplate()
	res := tmpl.GetResources()
	sb.Spec = compute.Spec{
		LogLevel:     spec.GetLogLevel(),
		Environment:  spec.GetEnvironment(),
		SandboxToken: spec.GetSandboxToken(),
		Command:      spec.GetCommand(),
		TTY:          spec.GetTty(),
		Template: compute.Template{
			Image:           tmpl.GetImage(),
			AgentSocketPath: tmpl.GetAgentSocketPath(),
			Labels:          tmpl.GetLabels(),
			Environment:     tmpl.GetEnvironment(),
			Resources: compute.Resources{
				CPURequest: res.GetCpuRequest(), CPULimit: res.GetCpuLimit(),
				MemoryRequest: res.GetMemoryRequest(), MemoryLimit: res.GetMemoryLimit(),
			},
		},
	}
	if err := platformConfigFromProto(tmpl.GetPlatformConfig(), &sb, strict); err != nil {
		return compute.Sandbox{}, err
	}
	if tmpl.GetDriverConfig() != nil {
		sb.Spec.Template.DriverConfig = tmpl.GetDriverConfig().AsMap()
	}
	sb.Spec.Template.Resources.GPUs = spec.GetResourceRequirements().GetGpu().GetCount()
	sb.Status = StatusFromProto(p.GetStatus())
	return sb, nil
}

// StatusFromProto converts a wire status (nil allowed) to the driver type.
func StatusFromProto(p *computev1.DriverSandboxStatus) compute.Status {
	st := compute.Status{
		SandboxName: p.GetSandboxName(), InstanceID: p.GetInstanceId(),
		AgentFD: p.GetAgentFd(), SandboxFD: p.GetSandboxFd(), Deleting: p.GetDeleting(),
	}
	for _, c := range p.GetConditions() {
		st.Conditions = append(st.Conditions, compute.Condition{
			Type: c.GetType(), Status: c.GetStatus(), Reason: c.GetReason(), Message: c.GetMessage(),
			LastTransitionTime: c.GetLastTransitionTime(),
		})
	}
	return st
}

// EventToProto converts a driver event to its wire form.
func EventToProto(ev compute.Event) (*computev1.WatchSandboxesEvent, error) {
	switch ev.Kind {
	case compute.EventSandbox:
		sb, err := SandboxToProto(ev.Sandbox)
		if err != nil {
			return nil, err
		}
		sb.Spec.SandboxToken = "" // status events never carry the token
		return &computev1.WatchSandboxesEvent{Payload: &computev1.WatchSandboxesEvent_Sandbox{
			Sandbox: &computev1.WatchSandboxesSandboxEvent{Sandbox: sb}}}, nil
	case compute.EventDeleted:
		return &computev1.WatchSandboxesEvent{Payload: &computev1.WatchSandboxesEvent_Deleted{
			Deleted: &computev1.WatchSandboxesDeletedEvent{SandboxId: ev.SandboxID}}}, nil
	case compute.EventPlatform:
		pe := ev.Platform
		var ms int64
		if !pe.Time.IsZero() {
			ms = pe.Time.UnixMilli()
		}
		return &computev1.WatchSandboxesEvent{Payload: &computev1.WatchSandboxesEvent_PlatformEvent{
			PlatformEvent: &computev1.WatchSandboxesPlatformEvent{SandboxId: ev.SandboxID, Event: &computev1.DriverPlatformEvent{
				TimestampMs: ms, Source: pe.Source, Type: pe.Type, Reason: pe.Reason, Message: pe.Message, Metadata: pe.Metadata,
			}}}}, nil
	}
	return nil, fmt.Errorf("unknown event kind %d", ev.Kind)
}

// EventFromProto converts a wire event to the driver type.
func EventFromProto(p *computev1.WatchSandboxesEvent) (compute.Event, error) {
	switch pl := p.GetPayload().(type) {
	case *computev1.WatchSandboxesEvent_Sandbox:
		sb, err := SandboxViewFromProto(pl.Sandbox.GetSandbox())
		if err != nil {
			return compute.Event{}, err
		}
		return compute.Event{Kind: compute.EventSandbox, SandboxID: sb.ID, Sandbox: sb}, nil
	case *computev1.WatchSandboxesEvent_Deleted:
		return compute.Event{Kind: compute.EventDeleted, SandboxID: pl.Deleted.GetSandboxId()}, nil
	case *computev1.WatchSandboxesEvent_PlatformEvent:
		e := pl.PlatformEvent.GetEvent()
		var t time.Time
		if e.GetTimestampMs() != 0 {
			t = time.UnixMilli(e.GetTimestampMs()).UTC()
		}
		return compute.Event{Kind: compute.EventPlatform, SandboxID: pl.PlatformEvent.GetSandboxId(), Platform: compute.PlatformEvent{
			Time: t, Source: e.GetSource(), Type: e.GetType(), Reason: e.GetReason(), Message: e.GetMessage(), Metadata: e.GetMetadata(),
		}}, nil
	}
	return compute.Event{}, fmt.Errorf("watch event without payload")
}

// CapabilitiesFromProto converts GetCapabilities' response.
func CapabilitiesFromProto(p *computev1.GetCapabilitiesResponse) compute.Capabilities {
	return compute.Capabilities{
		DriverName: p.GetDriverName(), DriverVersion: p.GetDriverVersion(),
		DefaultImage: p.GetDefaultImage(), GatewayManagesLifecycle: p.GetGatewayManagesLifecycle(),
	}
}

// ListenerRequirementToProto converts one listener requirement.
func ListenerRequirementToProto(r compute.ListenerRequirement) *computev1.GatewayListenerRequirement {
	out := &computev1.GatewayListenerRequirement{Reason: r.Reason}
	switch {
	case r.ExactBindAddress != "":
		out.Selector = &computev1.GatewayListenerRequirement_ExactBindAddress{ExactBindAddress: r.ExactBindAddress}
	case r.DefaultRouteInterface:
		out.Selector = &computev1.GatewayListenerRequirement_DefaultRouteInterface{DefaultRouteInterface: &computev1.GatewayDefaultRouteInterfaceRequirement{}}
	case r.LoopbackInterface:
		out.Selector = &computev1.GatewayListenerRequirement_LoopbackInterface{LoopbackInterface: &computev1.GatewayLoopbackInterfaceRequirement{}}
	}
	return out
}

// ListenerRequirementFromProto converts one listener requirement.
func ListenerRequirementFromProto(p *computev1.GatewayListenerRequirement) compute.ListenerRequirement {
	r := compute.ListenerRequirement{Reason: p.GetReason()}
	switch s := p.GetSelector().(type) {
	case *computev1.GatewayListenerRequirement_ExactBindAddress:
		r.ExactBindAddress = s.ExactBindAddress
	case *computev1.GatewayListenerRequirement_DefaultRouteInterface:
		r.DefaultRouteInterface = true
	case *computev1.GatewayListenerRequirement_LoopbackInterface:
		r.LoopbackInterface = true
	}
	return r
}
