// Package remote connects the gateway to a compute driver running in
// another process, over openshell.compute.v1.ComputeDriver on a Unix
// socket, and serves any in-process compute.Driver over the same contract.
//
// Dial returns a *Driver that implements compute.Driver and every optional
// ability (compute.WorkspaceScoper, compute.Adopter,
// compute.ServiceAccountSelector, compute.BootstrapAuthenticatorProvider,
// compute.ListenerRequirer) by proxying each call; the serving side answers
// for the driver it serves: workspace scoping and listener requirements are
// no-ops without the ability, adoption answers Unimplemented, the
// bootstrap authenticator is nil when the served driver does not serve the
// sandbox bootstrap (bearer tokens of IssueSandboxToken are forwarded to it
// otherwise; the token is a secret field), and a template naming a
// ServiceAccount is
// refused unless the served driver selects ServiceAccounts
// (compute.CheckTemplate). The typed compute.Template fields travel
// in platform_config under OpenShell's keys (runtime_class_name,
// annotations, service_account_name, user_namespaces; host_users and
// namespace are accepted on input); in a sandbox the driver is asked to run
// an unknown key or a mistyped value is InvalidArgument, never dropped,
// while a driver's report of a sandbox (SandboxViewFromProto) skips them. Serve exposes a compute.Driver on a socket
// (mode 0600, removed on exit), which is what `openshell-gateway driver
// serve` runs. Errors cross the wire as gRPC
// status codes (errdefs.ToGRPC on the server, errdefs.FromGRPC on the
// client), so errdefs kinds and messages survive; errors of no known kind
// become Internal with a generic message, and the server logs them.
//
// The socket's file mode is the access control: only the gateway's user
// can connect, as for the upstream driver sockets.
package remote
