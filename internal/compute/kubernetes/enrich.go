package kubernetes

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/telemetry"
)

// ResourceGPU is the extended resource a sandbox's GPUs are requested as
// (a limit on the agent container, as OpenShell does): the NVIDIA device
// plugin's.
const ResourceGPU = "nvidia.com/gpu"

// Names and paths the enrichment owns. A podTemplate that already uses one
// of them conflicts (see enrich).
const (
	supervisorVolume        = "openshell-supervisor-bin"
	supervisorInitContainer = "openshell-supervisor-install"
	supervisorDir           = "/opt/openshell/bin"
	supervisorPath          = supervisorDir + "/openshell-sandbox"
	// supervisorImageBinary is where the supervisor image keeps the binary;
	// its "copy-self DST" subcommand installs it into the shared volume.
	supervisorImageBinary = "/openshell-sandbox"

	saTokenVolume    = "openshell-sa-token"
	saTokenDir       = "/var/run/secrets/openshell"
	saTokenPath      = saTokenDir + "/token"
	saTokenAudience  = "openshell-gateway"
	clientTLSVolume  = "openshell-client-tls"
	clientTLSDir     = "/etc/openshell-tls/client"
	workspaceVolume  = "workspace"
	workspaceDir     = "/sandbox"
	defaultAgentName = "agent"

	// LabelManagedBy marks Sandbox CRs (and their pods) created or adopted
	// by an OpenShell gateway; LabelGatewayID names the gateway;
	// LabelSandboxID carries the sandbox id. AnnotationSandboxID binds a pod
	// to its sandbox identity for bootstrap authentication.
	LabelManagedBy      = "openshell.ai/managed-by"
	LabelGatewayID      = "openshell.ai/gateway-id"
	LabelSandboxID      = "openshell.ai/sandbox-id"
	AnnotationSandboxID = "openshell.io/sandbox-id"
)

// supervisorCapabilities are the only capabilities the agent container
// keeps (every other one is dropped): what the supervisor, PID 1 and root
// there, needs to start agent processes confined (internal/supervisor/
// isolation) and to fence their network. SETUID and SETGID switch to the
// agent's user, SETPCAP empties the agent's bounding set, KILL signals
// agent processes of another uid (stop, exec and SSH signals), CHOWN
// gives the workspace directory to the agent's user, NET_ADMIN installs
// the nftables fence that leaves agent processes only the egress proxy
// (envEgressFence, internal/supervisor/nftfence). no_new_privs, seccomp
// and Landlock need none. Agent processes get none of them. See
// docs/kubernetes.md.
var supervisorCapabilities = []string{"CHOWN", "KILL", "NET_ADMIN", "SETGID", "SETPCAP", "SETUID"}

// Environment of the supervisor (see internal/supervisor).
const (
	envSandboxID   = "OPENSHELL_SANDBOX_ID"
	envSandboxName = "OPENSHELL_SANDBOX_NAME"
	envEndpoint    = "OPENSHELL_ENDPOINT"
	envLogLevel    = "OPENSHELL_LOG_LEVEL"
	envCommand     = "OPENSHELL_SANDBOX_COMMAND"
	envTTY         = "OPENSHELL_SANDBOX_TTY"
	envSATokenFile = "OPENSHELL_K8S_SA_TOKEN_FILE"
	envTLSCA       = "OPENSHELL_TLS_CA"
	envTLSCert     = "OPENSHELL_TLS_CERT"
	envTLSKey      = "OPENSHELL_TLS_KEY"
	envWorkspace   = "OPENSHELL_WORKSPACE_DIR"
	envEgressFence = "OPENSHELL_EGRESS_FENCE"
)

// enrichOptions is what enrich injects into a podTemplate.
type enrichOptions struct {
	SandboxID   string
	SandboxName string
	// AgentContainer names the container the supervisor wraps; empty
	// means the only container, else the one named "agent" (created when
	// the template has no containers).
	AgentContainer string
	// Image replaces the agent container's image when set; an agent
	// container without an image and no Image is a conflict.
	Image                string
	ImagePullPolicy      string
	SupervisorImage      string
	SupervisorPullPolicy string
	Endpoint             string
	// SupervisorEnv is the gateway's OTLP settings for the supervisor
	// (FactoryDeps.SupervisorEnv); the user environment cannot set them.
	SupervisorEnv map[string]string
	LogLevel      string
	// Command is the canonical main process; empty means the agent
	// container's own command and args (they run under the supervisor).
	Command []string
	TTY     bool
	// Env is the user environment (template, then spec), set before the
	// OpenShell variables, which always win.
	Env                 map[string]string
	ClientTLSSecretName string
	SATokenTTLSecs      int64
	// ServiceAccountName replaces spec.serviceAccountName when set.
	ServiceAccountName string
	RuntimeClassName   string
	Resources          compute.Resources
	Labels             map[string]string
	Annotations        map[string]string
	NodeSelector       map[string]string
	Tolerations        []any
	PriorityClassName  string
	UserNamespaces     bool
	// WorkspaceClaim, when set, is the name of a volumeClaimTemplate
	// mounted at /sandbox in the agent container.
	WorkspaceClaim string
}

// enrich merges the OpenShell sandbox contract into a copy of podTemplate
// (a Sandbox's spec.podTemplate as JSON) and returns the copy. It preserves
// the user's image, env, ports, volumes, mounts, labels and annotations;
// appends the OpenShell env vars, volumes and init container; and replaces
// the agent container's command with the side-loaded supervisor, which
// launches the canonical command. The agent container keeps only
// supervisorCapabilities, without privilege escalation, and the pod runs
// under the runtime's default seccomp profile. When something the contract
// needs is already taken (a container, init container or volume name, a
// mount path, a securityContext forbidding root or asking for more
// privilege, a different sandbox-id annotation), enrich returns nil and one
// message per conflict; the input is never modified.
func enrich(podTemplate map[string]any, o enrichOptions) (map[string]any, []string) {
	var conflicts []string
	conflict := func(format string, a ...any) { conflicts = append(conflicts, fmt.Sprintf(format, a...)) }

	t, _ := deepCopy(podTemplate).(map[string]any)
	if t == nil {
		t = map[string]any{}
	}
	meta := child(t, "metadata")
	spec := child(t, "spec")

	// Metadata.
	labels := childStrings(meta, "labels")
	for k, v := range o.Labels {
		if _, ok := labels[k]; !ok {
			labels[k] = v
		}
	}
	if o.SandboxID != "" {
		if cur, ok := labels[LabelSandboxID].(string); ok && cur != o.SandboxID {
			conflict("pod label %s is already set to %q", LabelSandboxID, cur)
		}
		labels[LabelSandboxID] = o.SandboxID
	}
	annotations := childStrings(meta, "annotations")
	for k, v := range o.Annotations {
		if _, ok := annotations[k]; !ok {
			annotations[k] = v
		}
	}
	if o.SandboxID != "" {
		if cur, ok := annotations[AnnotationSandboxID].(string); ok && cur != o.SandboxID {
			conflict("pod annotation %s is already set to %q", AnnotationSandboxID, cur)
		}
		annotations[AnnotationSandboxID] = o.SandboxID
	}
	setOrDelete(meta, "labels", labels)
	setOrDelete(meta, "annotations", annotations)

	// Names the contract needs.
	containers := list(spec, "containers")
	inits := list(spec, "initContainers")
	volumes := list(spec, "volumes")
	needVolumes := []string{supervisorVolume, saTokenVolume}
	if o.ClientTLSSecretName != "" {
		needVolumes = append(needVolumes, clientTLSVolume)
	}
	for _, c := range append(slices.Clone(containers), inits...) {
		if name(c) == supervisorInitContainer {
			conflict("container name %q is reserved for the supervisor installer", supervisorInitContainer)
		}
	}
	for _, v := range volumes {
		if slices.Contains(needVolumes, name(v)) {
			conflict("volume name %q is reserved by OpenShell", name(v))
		}
	}
	if sc, ok := spec["securityContext"].(map[string]any); ok {
		if sc["runAsNonRoot"] == true {
			conflict("pod securityContext.runAsNonRoot forbids the supervisor running as root")
		}
		if unconfinedSeccomp(sc) {
			conflict("pod securityContext.seccompProfile Unconfined: sandbox pods run under the runtime's default profile or a Localhost one")
		}
	}

	// The agent container.
	idx, err := agentContainerIndex(containers, o.AgentContainer)
	if err != nil {
		conflict("%v", err)
	}
	var agent map[string]any
	if idx < 0 && err == nil {
		agent = map[string]any{"name": defaultAgentName}
		containers = append(containers, agent)
	} else if idx >= 0 {
		agent, _ = containers[idx].(map[string]any)
		if agent == nil {
			conflict("container %d is not an object", idx)
		}
	}
	if agent != nil {
		mountPaths := []string{supervisorDir, saTokenDir}
		if o.ClientTLSSecretName != "" {
			mountPaths = append(mountPaths, clientTLSDir)
		}
		if o.WorkspaceClaim != "" {
			mountPaths = append(mountPaths, workspaceDir)
		}
		for _, m := range list(agent, "volumeMounts") {
			mm, _ := m.(map[string]any)
			if p, _ := mm["mountPath"].(string); slices.Contains(mountPaths, p) {
				conflict("agent container %q already mounts %s", name(agent), p)
			}
		}
		if sc, ok := agent["securityContext"].(map[string]any); ok {
			if sc["runAsNonRoot"] == true {
				conflict("agent container %q securityContext.runAsNonRoot forbids the supervisor running as root", name(agent))
			}
			if u, ok := sc["runAsUser"]; ok && !isZero(u) {
				conflict("agent container %q securityContext.runAsUser forbids the supervisor running as root", name(agent))
			}
			if sc["privileged"] == true {
				conflict("agent container %q securityContext.privileged: the supervisor runs with %v only and agent processes with no capabilities", name(agent), supervisorCapabilities)
			}
			if sc["allowPrivilegeEscalation"] == true {
				conflict("agent container %q securityContext.allowPrivilegeEscalation: true is refused: nothing in a sandbox may gain privileges by exec", name(agent))
			}
			if caps, ok := sc["capabilities"].(map[string]any); ok {
				var extra []string
				for _, c := range toStrings(caps["add"]) {
					if !slices.Contains(supervisorCapabilities, strings.TrimPrefix(strings.ToUpper(c), "CAP_")) {
						extra = append(extra, c)
					}
				}
				if len(extra) > 0 {
					conflict("agent container %q securityContext.capabilities.add %v would reach no agent process (they run with no capabilities) and the supervisor needs only %v", name(agent), extra, supervisorCapabilities)
				}
			}
			if unconfinedSeccomp(sc) {
				conflict("agent container %q securityContext.seccompProfile Unconfined: sandbox pods run under the runtime's default profile or a Localhost one", name(agent))
			}
		}
		if o.Image == "" && agent["image"] == nil {
			conflict("agent container %q has no image", name(agent))
		}
	}
	if len(conflicts) > 0 {
		sort.Strings(conflicts)
		return nil, slices.Compact(conflicts)
	}

	// Agent container.
	if o.Image != "" {
		agent["image"] = o.Image
	}
	if o.ImagePullPolicy != "" && agent["imagePullPolicy"] == nil {
		agent["imagePullPolicy"] = o.ImagePullPolicy
	}
	command := o.Command
	if len(command) == 0 {
		command = append(toStrings(agent["command"]), toStrings(agent["args"])...)
	}
	agent["command"] = []any{supervisorPath}
	delete(agent, "args")

	env := list(agent, "env")
	keys := slices.Sorted(maps.Keys(o.Env))
	for _, k := range keys {
		if !telemetry.IsSupervisorEnv(k) {
			env = upsertEnv(env, k, o.Env[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(o.SupervisorEnv)) {
		env = upsertEnv(env, k, o.SupervisorEnv[k])
	}
	env = upsertEnv(env, envSandboxID, o.SandboxID)
	env = upsertEnv(env, envSandboxName, o.SandboxName)
	env = upsertEnv(env, envEndpoint, o.Endpoint)
	if o.LogLevel != "" {
		env = upsertEnv(env, envLogLevel, o.LogLevel)
	}
	if len(command) > 0 {
		b, _ := json.Marshal(command)
		env = upsertEnv(env, envCommand, string(b))
	}
	if o.TTY {
		env = upsertEnv(env, envTTY, "true")
	}
	env = upsertEnv(env, envSATokenFile, saTokenPath)
	// The supervisor shares the pod's network namespace with the agent:
	// it runs the egress proxy and fences agent processes onto it.
	env = upsertEnv(env, envEgressFence, "nftables")
	if o.ClientTLSSecretName != "" {
		env = upsertEnv(env, envTLSCA, clientTLSDir+"/ca.crt")
		env = upsertEnv(env, envTLSCert, clientTLSDir+"/tls.crt")
		env = upsertEnv(env, envTLSKey, clientTLSDir+"/tls.key")
	}
	if o.WorkspaceClaim != "" {
		env = upsertEnv(env, envWorkspace, workspaceDir)
	}
	agent["env"] = env

	mounts := list(agent, "volumeMounts")
	mounts = append(mounts,
		map[string]any{"name": supervisorVolume, "mountPath": supervisorDir, "readOnly": true},
		map[string]any{"name": saTokenVolume, "mountPath": saTokenDir, "readOnly": true},
	)
	if o.ClientTLSSecretName != "" {
		mounts = append(mounts, map[string]any{"name": clientTLSVolume, "mountPath": clientTLSDir, "readOnly": true})
	}
	if o.WorkspaceClaim != "" {
		mounts = append(mounts, map[string]any{"name": o.WorkspaceClaim, "mountPath": workspaceDir})
	}
	agent["volumeMounts"] = mounts

	// The supervisor runs as root with only supervisorCapabilities; with
	// allowPrivilegeEscalation false it runs under no_new_privs, as
	// every agent process does anyway.
	sc := child(agent, "securityContext")
	sc["runAsUser"] = int64(0)
	sc["allowPrivilegeEscalation"] = false
	caps := child(sc, "capabilities")
	caps["drop"] = []any{"ALL"}
	caps["add"] = toAny(supervisorCapabilities)

	if r := o.Resources; r != (compute.Resources{}) {
		res := child(agent, "resources")
		set := func(kind, key, v string) {
			if v != "" {
				child(res, kind)[key] = v
			}
		}
		set("requests", "cpu", r.CPURequest)
		set("limits", "cpu", r.CPULimit)
		set("requests", "memory", r.MemoryRequest)
		set("limits", "memory", r.MemoryLimit)
		if r.GPUs > 0 {
			// An extended resource: the request defaults to the limit.
			set("limits", ResourceGPU, strconv.FormatUint(uint64(r.GPUs), 10))
		}
	}
	spec["containers"] = containers

	// Supervisor installer and volumes.
	init := map[string]any{
		"name":    supervisorInitContainer,
		"image":   o.SupervisorImage,
		"command": []any{supervisorImageBinary, "copy-self", supervisorPath},
		// Root (to read the binary whatever its mode in the supervisor
		// image) without capabilities: it only writes into the emptyDir.
		"securityContext": map[string]any{
			"runAsUser":                int64(0),
			"allowPrivilegeEscalation": false,
			"readOnlyRootFilesystem":   true,
			"capabilities":             map[string]any{"drop": []any{"ALL"}},
		},
		"volumeMounts": []any{map[string]any{"name": supervisorVolume, "mountPath": supervisorDir}},
	}
	if o.SupervisorPullPolicy != "" {
		init["imagePullPolicy"] = o.SupervisorPullPolicy
	}
	spec["initContainers"] = append(inits, init)
	volumes = append(volumes,
		map[string]any{"name": supervisorVolume, "emptyDir": map[string]any{}},
		map[string]any{"name": saTokenVolume, "projected": map[string]any{
			"defaultMode": int64(0o400),
			"sources": []any{map[string]any{"serviceAccountToken": map[string]any{
				"audience": saTokenAudience, "expirationSeconds": o.SATokenTTLSecs, "path": "token",
			}}},
		}},
	)
	if o.ClientTLSSecretName != "" {
		volumes = append(volumes, map[string]any{"name": clientTLSVolume, "secret": map[string]any{
			"secretName": o.ClientTLSSecretName, "defaultMode": int64(0o400),
		}})
	}
	spec["volumes"] = volumes

	// Pod-level settings.
	if o.ServiceAccountName != "" {
		spec["serviceAccountName"] = o.ServiceAccountName
	}
	if o.RuntimeClassName != "" {
		spec["runtimeClassName"] = o.RuntimeClassName
	}
	if len(o.NodeSelector) > 0 {
		ns := childStrings(spec, "nodeSelector")
		for k, v := range o.NodeSelector {
			ns[k] = v
		}
		spec["nodeSelector"] = ns
	}
	if len(o.Tolerations) > 0 {
		spec["tolerations"] = append(list(spec, "tolerations"), deepCopy(o.Tolerations).([]any)...)
	}
	if o.PriorityClassName != "" {
		spec["priorityClassName"] = o.PriorityClassName
	}
	if o.UserNamespaces {
		spec["hostUsers"] = false
	}
	// The runtime's default seccomp profile for the whole pod unless the
	// template names a Localhost one (Unconfined is a conflict above).
	psc := child(spec, "securityContext")
	if _, ok := psc["seccompProfile"]; !ok {
		psc["seccompProfile"] = map[string]any{"type": "RuntimeDefault"}
	}
	if _, ok := spec["automountServiceAccountToken"]; !ok {
		spec["automountServiceAccountToken"] = false
	}
	if _, ok := spec["restartPolicy"]; !ok {
		spec["restartPolicy"] = "Never"
	}
	return t, nil
}

// agentContainerIndex picks the agent container: the named one, else the
// only one, else the one named "agent". It returns -1 and no error when
// there are no containers (the caller creates one).
func agentContainerIndex(containers []any, want string) (int, error) {
	var names []string
	for _, c := range containers {
		names = append(names, name(c))
	}
	switch {
	case want != "":
		if i := slices.Index(names, want); i >= 0 {
			return i, nil
		}
		return -1, fmt.Errorf("agent container %q not found (containers: %v)", want, names)
	case len(containers) == 0:
		return -1, nil
	case len(containers) == 1:
		return 0, nil
	}
	if i := slices.Index(names, defaultAgentName); i >= 0 {
		return i, nil
	}
	return -1, fmt.Errorf("cannot tell which container is the agent (containers: %v); name one", names)
}

// unconfinedSeccomp reports whether a securityContext asks for no
// seccomp profile.
func unconfinedSeccomp(sc map[string]any) bool {
	p, _ := sc["seccompProfile"].(map[string]any)
	t, _ := p["type"].(string)
	return t == "Unconfined"
}

func toAny(l []string) []any {
	out := make([]any, len(l))
	for i, s := range l {
		out[i] = s
	}
	return out
}

func upsertEnv(env []any, k, v string) []any {
	for i, e := range env {
		if name(e) == k {
			env[i] = map[string]any{"name": k, "value": v}
			return env
		}
	}
	return append(env, map[string]any{"name": k, "value": v})
}

func name(v any) string {
	m, _ := v.(map[string]any)
	s, _ := m["name"].(string)
	return s
}

func isZero(v any) bool {
	switch n := v.(type) {
	case int64:
		return n == 0
	case int:
		return n == 0
	case float64:
		return n == 0
	}
	return false
}

// child returns m[k] as a map, creating it when absent.
func child(m map[string]any, k string) map[string]any {
	c, ok := m[k].(map[string]any)
	if !ok {
		c = map[string]any{}
		m[k] = c
	}
	return c
}

// childStrings returns m[k] as a map (not stored back).
func childStrings(m map[string]any, k string) map[string]any {
	c, ok := m[k].(map[string]any)
	if !ok {
		return map[string]any{}
	}
	return c
}

func setOrDelete(m map[string]any, k string, v map[string]any) {
	if len(v) == 0 {
		delete(m, k)
		return
	}
	m[k] = v
}

func list(m map[string]any, k string) []any {
	l, _ := m[k].([]any)
	return l
}

func toStrings(v any) []string {
	var out []string
	switch l := v.(type) {
	case []any:
		for _, e := range l {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
	case []string:
		out = slices.Clone(l)
	}
	return out
}

// deepCopy copies JSON-like values (maps, slices, scalars).
func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = deepCopy(e)
		}
		return l
	case map[string]string:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = e
		}
		return m
	case []string:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = e
		}
		return l
	case int:
		return int64(x)
	case int32:
		return int64(x)
	default:
		return x
	}
}
