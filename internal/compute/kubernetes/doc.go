// Package kubernetes is the Kubernetes compute driver: every sandbox is an
// agents.x-k8s.io Sandbox custom resource (v1beta1 when the cluster serves
// it, else v1alpha1) that the agent-sandbox controller turns into a Pod.
//
// The driver enriches the Sandbox's podTemplate the way OpenShell does (see
// enrich): an init container copies the openshell-sandbox supervisor from
// the supervisor image into a shared emptyDir, the agent container runs the
// supervisor (which launches the canonical command), and a projected,
// pod-bound ServiceAccount token (audience "openshell-gateway") lets the
// supervisor exchange its platform identity for its first sandbox JWT
// through IssueSandboxToken. The gateway-side half of that exchange is
// [Authenticator], returned by [Driver.BootstrapAuthenticator].
//
// The accepted bootstrap ServiceAccounts and the ones a sandbox may select
// come from one place ([Config.ServiceAccountValidator],
// [Config.SelectableServiceAccounts]). [Driver.Adopt] brings an existing
// Sandbox under management by merging the same enrichment into its
// podTemplate (opt-in: allow_adoption).
//
// Objects are handled as unstructured JSON through the dynamic client; the
// agent-sandbox Go types are deliberately not a dependency.
//
// Workspace modes decide which namespaces hold sandboxes and which ones
// bootstrap authentication accepts ([NamespaceValidator]): "shared" (one
// namespace), "managed" (openshell-<gateway_id>-<workspace>, created by
// EnsureWorkspace) and "operator" (an allowlist).
//
// All Driver methods are safe for concurrent use. Each Watch owns its
// informers and stops them when its context ends.
package kubernetes
