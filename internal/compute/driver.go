package compute

import (
	"context"
	"fmt"
	"time"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Driver runs sandboxes on one backend. All methods are safe for concurrent
// use. Methods taking a Ref find the sandbox by ID first, then by Name.
//
// Driver is the part every backend has. What only some backends can do is
// an optional interface (WorkspaceScoper, Adopter, ServiceAccountSelector,
// BootstrapAuthenticatorProvider, ListenerRequirer) that callers discover by type assertion; callers never
// compare a driver's name.
type Driver interface {
	// Capabilities describes the driver; it does not touch the backend.
	Capabilities(ctx context.Context) (Capabilities, error)
	// ValidateCreate checks a create request without side effects. The
	// gateway calls it before it persists anything or mints a token, so a
	// rejection leaves nothing behind. InvalidArgument / FailedPrecondition.
	// The contract: a driver refuses the typed Template fields it cannot
	// honour rather than ignoring them (each driver's package doc says
	// which it honours).
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
}

// WorkspaceScoper is implemented by drivers that keep backend scope per
// gateway workspace (the kubernetes driver's managed mode: a namespace per
// workspace). Drivers without it need no preparation for a workspace.
type WorkspaceScoper interface {
	// EnsureWorkspace prepares backend scope for a gateway workspace.
	// Idempotent.
	EnsureWorkspace(ctx context.Context, workspace string) error
	// DeleteWorkspace removes what EnsureWorkspace created. Idempotent.
	DeleteWorkspace(ctx context.Context, workspace string) error
}

// EnsureWorkspace calls d's EnsureWorkspace when d is a WorkspaceScoper;
// it is a no-op otherwise.
func EnsureWorkspace(ctx context.Context, d Driver, workspace string) error {
	if s, ok := d.(WorkspaceScoper); ok {
		return s.EnsureWorkspace(ctx, workspace)
	}
	return nil
}

// DeleteWorkspace calls d's DeleteWorkspace when d is a WorkspaceScoper;
// it is a no-op otherwise.
func DeleteWorkspace(ctx context.Context, d Driver, workspace string) error {
	if s, ok := d.(WorkspaceScoper); ok {
		return s.DeleteWorkspace(ctx, workspace)
	}
	return nil
}

// Adopter is implemented by drivers that can take over an existing backend
// workload (openshell-go extension; the kubernetes driver).
type Adopter interface {
	// AdoptionEnabled reports whether this driver adopts at all: nil, or
	// FailedPrecondition saying why not (the kubernetes driver's
	// allow_adoption switch). It does not touch the backend; the gateway
	// asks before anything else, so a refusal never depends on the
	// sandbox named.
	AdoptionEnabled(ctx context.Context) error
	Adopt(ctx context.Context, req AdoptRequest) (AdoptResult, error)
}

// ServiceAccountSelector is implemented by drivers that run each sandbox
// under a platform ServiceAccount its template may choose
// (Template.ServiceAccountName); the driver's ValidateCreate decides which
// names are selectable. CheckTemplate refuses the field for every other
// driver.
type ServiceAccountSelector interface {
	// SelectsServiceAccounts marks the ability; it has no effect.
	SelectsServiceAccounts()
}

// BootstrapAuthenticatorProvider is implemented by drivers whose sandboxes
// bootstrap from a platform identity (the kubernetes driver: a projected,
// pod-bound ServiceAccount token) instead of a gateway-minted token. The
// gateway consults the returned authenticator for IssueSandboxToken only;
// it yields sandbox principals with auth.SourceK8sSABootstrap. A nil
// authenticator means the driver has the bootstrap turned off.
type BootstrapAuthenticatorProvider interface {
	BootstrapAuthenticator(ctx context.Context) (auth.Authenticator, error)
}

// ListenerRequirer is implemented by drivers whose sandboxes need extra
// gateway listeners (callback-only listeners) to reach the gateway.
// Drivers without it need none.
type ListenerRequirer interface {
	ListenerRequirements(ctx context.Context) ([]ListenerRequirement, error)
}

// ListenerRequirements returns d's listener requirements, or none when d
// is not a ListenerRequirer.
func ListenerRequirements(ctx context.Context, d Driver) ([]ListenerRequirement, error) {
	if l, ok := d.(ListenerRequirer); ok {
		return l.ListenerRequirements(ctx)
	}
	return nil, nil
}

// CheckTemplate refuses (InvalidArgument) the typed Template fields that
// need an optional ability d lacks. driverName names d in the message.
// The gateway calls it before ValidateCreate; the remote driver server
// calls it too, so a separately served driver refuses the same requests.
func CheckTemplate(d Driver, driverName string, t Template) error {
	if t.ServiceAccountName != "" {
		if _, ok := d.(ServiceAccountSelector); !ok {
			return errdefs.InvalidArgument(fmt.Sprintf("template.service_account_name is not supported by the %s compute driver (it does not select ServiceAccounts)", driverName))
		}
	}
	return nil
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
	// SandboxToken is the gateway-minted JWT the supervisor authenticates
	// with. Secret: never log it.
	SandboxToken string
	// Command is the main process (argv); empty means the supervisor's
	// default. TTY asks for a terminal.
	Command []string
	TTY     bool
}

// Template is the platform-level description of the workload. Every field
// but DriverConfig is typed; a driver that cannot honour a set field is
// expected to refuse the sandbox in ValidateCreate (or lacks the optional
// ability CheckTemplate looks for). Settings derived from the sandbox
// policy (isolation) get their own typed fields here, not keys in a map.
type Template struct {
	Image           string
	AgentSocketPath string
	Labels          map[string]string
	// Annotations are platform annotations (Kubernetes pod annotations).
	Annotations map[string]string
	Environment map[string]string
	Resources   Resources
	// RuntimeClassName selects a container runtime class; empty means the
	// driver's default.
	RuntimeClassName string
	// ServiceAccountName selects the platform ServiceAccount the workload
	// runs under; empty means the driver's default. Only drivers that are
	// ServiceAccountSelectors accept it.
	ServiceAccountName string
	// UserNamespaces asks for (true) or against (false) a user namespace
	// for the workload; nil means the driver's default.
	UserNamespaces *bool
	// DriverConfig is the active driver's block of
	// template.driver_config: opaque, decoded and validated by the driver
	// alone.
	DriverConfig map[string]any
}

// Resources are Kubernetes-style quantities ("500m", "1Gi"); empty = unset.
type Resources struct {
	CPURequest    string
	CPULimit      string
	MemoryRequest string
	MemoryLimit   string
	// GPUs is the number of GPUs asked for (spec.resource_requirements.gpu
	// on the wire); 0 asks for none.
	GPUs uint32
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
