// Package compute defines the boundary between the gateway and the backends
// that run sandboxes. A Driver reports backend state only; the gateway owns
// the public sandbox phase (see the lifecycle engine).
//
// The interface mirrors openshell.compute.v1.ComputeDriver with plain Go
// types, so in-tree drivers (process, kubernetes) and a remote driver
// reached over a Unix socket (compute/remote) are interchangeable.
// Implementations live in subpackages named after their technology and never
// import each other. Errors use internal/errdefs kinds.
//
// # Typed seam
//
// What the gateway asks a driver for is typed: [Template] has fields for
// the runtime class, ServiceAccount, user namespaces, annotations,
// resources and GPUs. Only [Template.DriverConfig] (the active driver's
// block of template.driver_config) stays an opaque map, which the driver
// alone decodes. The contract is that a driver refuses, in ValidateCreate,
// a typed field it cannot honour instead of ignoring it.
//
// # Optional abilities
//
// [Driver] holds what every backend does. Abilities only some backends
// have are separate interfaces, discovered by type assertion as Nomad's
// driver plugins do: [WorkspaceScoper] (backend scope per workspace),
// [Adopter] (take over an existing workload), [ServiceAccountSelector]
// (per-sandbox ServiceAccount), [BootstrapAuthenticatorProvider] (sandboxes
// bootstrap from a platform identity) and [ListenerRequirer] (extra
// callback listeners). [EnsureWorkspace], [DeleteWorkspace], [ListenerRequirements]
// and [CheckTemplate] apply them, so callers never compare driver names.
// The remote driver (compute/remote) implements each ability by forwarding
// it; the serving side answers for the driver it serves.
package compute
