// Package compute defines the boundary between the gateway and the backends
// that run sandboxes. A Driver reports backend state only; the gateway owns
// the public sandbox phase (see the lifecycle engine).
//
// The interface mirrors openshell.compute.v1.ComputeDriver with plain Go
// types, so in-tree drivers (process, docker, kubernetes) and a remote driver
// reached over a Unix socket (compute/remote) are interchangeable.
// Implementations live in subpackages named after their technology and never
// import each other. Errors use internal/errdefs kinds.
package compute

import (
	"context"
	"time"
)

// Driver runs sandboxes on one backend. All methods are safe for concurrent
// use. Methods taking a Ref find the sandbox by ID first, then by Name.
type Driver interface {
	// Capabilities describes the driver; it does not touch the backend.
	Capabilities(ctx context.Context) (Capabilities, error)
	// ListenerRequirements lists extra gateway listeners the driver's
	// sandboxes need to reach the gateway (callback-only listeners).
	ListenerRequirements(ctx context.Context) ([]ListenerRequirement, error)
	// ValidateCreate checks a create request without side effects. The
	// gateway calls it before it persists anything or mints a token, so a
	// rejection leaves nothing behind. InvalidArgument / FailedPrecondition.
	ValidateCreate(ctx context.Context, sb Sandbox) error
	// Create starts the backend workload for sb. AlreadyExists when a
	// workload with that id or name exists.
	Create(ctx context.Context, sb Sandbox) error
	// Get returns the backend's view of one sandbox; NotFound when absent.
	Get(ctx context.Context, ref Ref) (Sandbox, error)
	// List returns every sandbox the backend knows.
	List(ctx context.Context) ([]Sandbox, error)
	// Stop stops the workload, keeping its persistent state. Idempotent.
	Stop(ctx context.Context, ref Ref) error
	// Start starts a stopped workload. Idempotent.
	Start(ctx context.Context, ref Ref) error
	// Delete removes the workload and its state. It reports whether
	// anything was deleted; deleting an absent sandbox is not an error.
	Delete(ctx context.Context, ref Ref) (bool, error)
	// Watch streams backend events until ctx ends or the driver fails. The
	// channel is closed when the watch ends; the returned error func tells
	// why (nil after ctx cancellation).
	Watch(ctx context.Context) (<-chan Event, func() error, error)
	// EnsureWorkspace prepares backend scope for a gateway workspace
	// (e.g. a namespace). Idempotent; a no-op for drivers without scoping.
	EnsureWorkspace(ctx context.Context, workspace string) error
	// DeleteWorkspace removes what EnsureWorkspace created.
	DeleteWorkspace(ctx context.Context, workspace string) error
}

// Adopter is implemented by drivers that can take over an existing backend
// workload (openshell-go extension; kubernetes only).
type Adopter interface {
	Adopt(ctx context.Context, req AdoptRequest) (AdoptResult, error)
}

// Capabilities describes a driver.
type Capabilities struct {
	DriverName    string
	DriverVersion string
	DefaultImage  string
	// GatewayManagesLifecycle: the gateway stops running sandboxes on
	// graceful shutdown and starts them again at boot.
	GatewayManagesLifecycle bool
}

// ListenerRequirement asks the gateway for an extra callback listener.
type ListenerRequirement struct {
	Reason string
	// Exactly one of the selectors is set.
	ExactBindAddress      string
	DefaultRouteInterface bool
	LoopbackInterface     bool
}

// Ref names a sandbox by id and/or name.
type Ref struct {
	ID   string
	Name string
}

// Sandbox is the driver-facing sandbox: what the gateway asks for (Spec)
// and what the backend reports (Status).
type Sandbox struct {
	ID        string
	Name      string
	Namespace string
	Workspace string
	Spec      Spec
	Status    Status
}

// Spec is the canonical request handed to a driver.
type Spec struct {
	LogLevel    string
	Environment map[string]string
	Template    Template
	GPUCount    *uint32
	// SandboxToken is the gateway-minted JWT the supervisor authenticates
	// with. Secret: never log it.
	SandboxToken string
	// Command is the main process (argv); empty means the supervisor's
	// default. TTY asks for a terminal.
	Command []string
	TTY     bool
}

// Template is the platform-level description of the workload.
type Template struct {
	Image           string
	AgentSocketPath string
	Labels          map[string]string
	Environment     map[string]string
	Resources       Resources
	// PlatformConfig carries platform settings (runtime_class_name,
	// annotations, service_account_name, ...), as decoded JSON.
	PlatformConfig map[string]any
	// DriverConfig is the active driver's block of template.driver_config.
	DriverConfig map[string]any
}

// Resources are Kubernetes-style quantities ("500m", "1Gi"); empty = unset.
type Resources struct {
	CPURequest    string
	CPULimit      string
	MemoryRequest string
	MemoryLimit   string
}

// Status is the backend's report.
type Status struct {
	SandboxName string
	// InstanceID identifies one incarnation of the workload (changes on
	// every start).
	InstanceID string
	AgentFD    string
	SandboxFD  string
	Conditions []Condition
	Deleting   bool
}

// Condition is a Kubernetes-style condition ("Ready", "True", reason, ...).
type Condition struct {
	Type               string
	Status             string
	Reason             string
	Message            string
	LastTransitionTime string
}

// EventKind tells which field of Event is set.
type EventKind int

const (
	// EventSandbox: Sandbox holds the backend's current view.
	EventSandbox EventKind = iota + 1
	// EventDeleted: the backend no longer has SandboxID.
	EventDeleted
	// EventPlatform: Platform holds a progress or diagnostic event.
	EventPlatform
)

// Event is one backend change.
type Event struct {
	Kind      EventKind
	SandboxID string
	Sandbox   Sandbox
	Platform  PlatformEvent
}

// PlatformEvent is a backend progress or diagnostic event.
type PlatformEvent struct {
	Time     time.Time
	Source   string
	Type     string
	Reason   string
	Message  string
	Metadata map[string]string
}

// AdoptRequest asks a driver to take over an existing workload.
type AdoptRequest struct {
	Sandbox        Sandbox
	Namespace      string
	AgentContainer string
	Reenrich       bool
	DryRun         bool
}

// AdoptResult is the adopted workload.
type AdoptResult struct {
	Sandbox    Sandbox
	BackendUID string
}

// Condition helpers shared by drivers and the lifecycle engine.
const (
	ConditionReady     = "Ready"
	ConditionSuspended = "Suspended"
)
