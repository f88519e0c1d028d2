package kubernetes

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func baseOptions() enrichOptions {
	return enrichOptions{
		SandboxID: "11111111-2222-4333-8444-555555555555", SandboxName: "sb",
		SupervisorImage: "sup:1", Endpoint: "https://gw:17670", SATokenTTLSecs: 3600,
	}
}

func mustJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func containerByName(t *testing.T, pt map[string]any, key, n string) map[string]any {
	t.Helper()
	for _, c := range list(child(pt, "spec"), key) {
		if name(c) == n {
			return c.(map[string]any)
		}
	}
	t.Fatalf("%s %q not found", key, n)
	return nil
}

func envMap(c map[string]any) map[string]string {
	m := map[string]string{}
	for _, e := range list(c, "env") {
		em := e.(map[string]any)
		v, _ := em["value"].(string)
		m[name(e)] = v
	}
	return m
}

func names(l []any) []string {
	var out []string
	for _, e := range l {
		out = append(out, name(e))
	}
	return out
}

// TestEnrichMergePreservesUserFields: merging into an existing podTemplate
// keeps the user's image, env, ports, volumes, mounts, labels and
// annotations, and wraps the original command in the supervisor.
func TestEnrichMergePreservesUserFields(t *testing.T) {
	in := mustJSON(t, `{
	  "metadata": {"labels": {"app": "agent"}, "annotations": {"team": "a"}},
	  "spec": {
	    "containers": [
	      {"name": "sidecar", "image": "proxy:1"},
	      {"name": "agent", "image": "custom:2", "command": ["python"], "args": ["-m", "agent"],
	       "env": [{"name": "KEEP", "value": "1"}, {"name": "OPENSHELL_ENDPOINT", "value": "stale"}],
	       "ports": [{"containerPort": 8080}],
	       "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
	    ],
	    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
	    "serviceAccountName": "user-sa"
	  }
	}`)
	orig := deepCopy(in)
	o := baseOptions()
	got, conflicts := enrich(in, o)
	if len(conflicts) > 0 {
		t.Fatalf("enrich() conflicts = %v", conflicts)
	}
	if diff := cmp.Diff(orig, any(in)); diff != "" {
		t.Errorf("enrich modified its input (-before +after):\n%s", diff)
	}
	meta := child(got, "metadata")
	if l := child(meta, "labels"); l["app"] != "agent" || l[LabelSandboxID] != o.SandboxID {
		t.Errorf("labels = %v", l)
	}
	if a := child(meta, "annotations"); a["team"] != "a" || a[AnnotationSandboxID] != o.SandboxID {
		t.Errorf("annotations = %v", a)
	}
	spec := child(got, "spec")
	if spec["serviceAccountName"] != "user-sa" {
		t.Errorf("serviceAccountName = %v, want the user's", spec["serviceAccountName"])
	}
	if got := names(list(spec, "volumes")); !slices.Equal(got, []string{"data", supervisorVolume, saTokenVolume}) {
		t.Errorf("volumes = %v", got)
	}
	if got := names(list(spec, "initContainers")); !slices.Equal(got, []string{supervisorInitContainer}) {
		t.Errorf("initContainers = %v", got)
	}
	side := containerByName(t, got, "containers", "sidecar")
	if diff := cmp.Diff(map[string]any{"name": "sidecar", "image": "proxy:1"}, side); diff != "" {
		t.Errorf("sidecar changed (-want +got):\n%s", diff)
	}
	agent := containerByName(t, got, "containers", "agent")
	if agent["image"] != "custom:2" || agent["args"] != nil {
		t.Errorf("agent image %v args %v, want custom:2 and no args", agent["image"], agent["args"])
	}
	if diff := cmp.Diff([]any{supervisorPath}, agent["command"]); diff != "" {
		t.Errorf("agent command (-want +got):\n%s", diff)
	}
	env := envMap(agent)
	if env["KEEP"] != "1" || env[envEndpoint] != o.Endpoint || env[envCommand] != `["python","-m","agent"]` || env[envSATokenFile] != saTokenPath || env[envEgressFence] != "nftables" {
		t.Errorf("agent env = %v", env)
	}
	if len(list(agent, "ports")) != 1 {
		t.Errorf("ports = %v", agent["ports"])
	}
	if got := names(list(agent, "volumeMounts")); !slices.Equal(got, []string{"data", supervisorVolume, saTokenVolume}) {
		t.Errorf("agent mounts = %v", got)
	}
	wantSC := map[string]any{
		"runAsUser": int64(0), "allowPrivilegeEscalation": false,
		"capabilities": map[string]any{"drop": []any{"ALL"}, "add": []any{"CHOWN", "KILL", "NET_ADMIN", "SETGID", "SETPCAP", "SETUID"}},
	}
	if diff := cmp.Diff(wantSC, agent["securityContext"]); diff != "" {
		t.Errorf("agent securityContext (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]any{"seccompProfile": map[string]any{"type": "RuntimeDefault"}}, spec["securityContext"]); diff != "" {
		t.Errorf("pod securityContext (-want +got):\n%s", diff)
	}
	init := containerByName(t, got, "initContainers", supervisorInitContainer)
	wantInit := map[string]any{
		"runAsUser": int64(0), "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
		"capabilities": map[string]any{"drop": []any{"ALL"}},
	}
	if diff := cmp.Diff(wantInit, init["securityContext"]); diff != "" {
		t.Errorf("init container securityContext (-want +got):\n%s", diff)
	}
	// Idempotence of the contract: enriching the result again conflicts
	// (its names are taken), it never doubles them silently.
	if _, c := enrich(got, o); len(c) == 0 {
		t.Errorf("enrich(enriched) reported no conflicts")
	}
}

func TestEnrichFromScratch(t *testing.T) {
	o := baseOptions()
	o.Image, o.ServiceAccountName, o.Command, o.TTY = "agent:1", "openshell-sandbox", []string{"sleep", "1"}, true
	o.ClientTLSSecretName, o.WorkspaceClaim, o.UserNamespaces = "tls", workspaceVolume, true
	got, conflicts := enrich(nil, o)
	if len(conflicts) > 0 {
		t.Fatalf("conflicts = %v", conflicts)
	}
	spec := child(got, "spec")
	if spec["serviceAccountName"] != "openshell-sandbox" || spec["hostUsers"] != false || spec["restartPolicy"] != "Never" || spec["automountServiceAccountToken"] != false {
		t.Errorf("pod spec = %v", spec)
	}
	agent := containerByName(t, got, "containers", defaultAgentName)
	env := envMap(agent)
	for k, v := range map[string]string{envCommand: `["sleep","1"]`, envTTY: "true", envTLSCA: clientTLSDir + "/ca.crt", envWorkspace: workspaceDir} {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	if got := names(list(spec, "volumes")); !slices.Equal(got, []string{supervisorVolume, saTokenVolume, clientTLSVolume}) {
		t.Errorf("volumes = %v", got)
	}
}

func TestEnrichConflicts(t *testing.T) {
	tests := []struct {
		name, template string
		opts           func(*enrichOptions)
		want           string
	}{
		{"init container name", `{"spec":{"initContainers":[{"name":"openshell-supervisor-install","image":"x"}],"containers":[{"name":"a","image":"x"}]}}`, nil, "container name"},
		{"volume name", `{"spec":{"volumes":[{"name":"openshell-sa-token","emptyDir":{}}],"containers":[{"name":"a","image":"x"}]}}`, nil, `volume name "openshell-sa-token"`},
		{"mount path", `{"spec":{"containers":[{"name":"a","image":"x","volumeMounts":[{"name":"v","mountPath":"/var/run/secrets/openshell"}]}]}}`, nil, "already mounts /var/run/secrets/openshell"},
		{"runAsNonRoot pod", `{"spec":{"securityContext":{"runAsNonRoot":true},"containers":[{"name":"a","image":"x"}]}}`, nil, "pod securityContext.runAsNonRoot"},
		{"runAsUser container", `{"spec":{"containers":[{"name":"a","image":"x","securityContext":{"runAsUser":1000}}]}}`, nil, "securityContext.runAsUser"},
		{"privileged", `{"spec":{"containers":[{"name":"a","image":"x","securityContext":{"privileged":true}}]}}`, nil, "securityContext.privileged"},
		{"privilege escalation", `{"spec":{"containers":[{"name":"a","image":"x","securityContext":{"allowPrivilegeEscalation":true}}]}}`, nil, "allowPrivilegeEscalation: true"},
		{"extra capability", `{"spec":{"containers":[{"name":"a","image":"x","securityContext":{"capabilities":{"add":["SETUID","CAP_SYS_ADMIN","NET_RAW"]}}}]}}`, nil, "capabilities.add [CAP_SYS_ADMIN NET_RAW]"},
		{"unconfined pod", `{"spec":{"securityContext":{"seccompProfile":{"type":"Unconfined"}},"containers":[{"name":"a","image":"x"}]}}`, nil, "pod securityContext.seccompProfile Unconfined"},
		{"unconfined container", `{"spec":{"containers":[{"name":"a","image":"x","securityContext":{"seccompProfile":{"type":"Unconfined"}}}]}}`, nil, `"a" securityContext.seccompProfile Unconfined`},
		{"ambiguous container", `{"spec":{"containers":[{"name":"a","image":"x"},{"name":"b","image":"y"}]}}`, nil, "cannot tell which container"},
		{"named container missing", `{"spec":{"containers":[{"name":"a","image":"x"}]}}`, func(o *enrichOptions) { o.AgentContainer = "agent" }, `agent container "agent" not found`},
		{"other sandbox annotation", `{"metadata":{"annotations":{"openshell.io/sandbox-id":"other"}},"spec":{"containers":[{"name":"a","image":"x"}]}}`, nil, "already set"},
		{"no image", `{"spec":{"containers":[{"name":"a"}]}}`, nil, "has no image"},
		{"tls volume when tls", `{"spec":{"volumes":[{"name":"openshell-client-tls"}],"containers":[{"name":"a","image":"x"}]}}`, func(o *enrichOptions) { o.ClientTLSSecretName = "s" }, "openshell-client-tls"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := baseOptions()
			if tt.opts != nil {
				tt.opts(&o)
			}
			got, conflicts := enrich(mustJSON(t, tt.template), o)
			if got != nil || !slices.ContainsFunc(conflicts, func(c string) bool { return strings.Contains(c, tt.want) }) {
				t.Errorf("enrich() = %v, conflicts %q, want nil and a conflict containing %q", got != nil, conflicts, tt.want)
			}
		})
	}
	// A TLS volume name is only reserved when TLS is configured.
	if _, c := enrich(mustJSON(t, `{"spec":{"volumes":[{"name":"openshell-client-tls"}],"containers":[{"name":"a","image":"x"}]}}`), baseOptions()); len(c) > 0 {
		t.Errorf("conflicts without TLS = %v, want none", c)
	}
}

// TestEnrichSecurityContextMerge: a template's own stricter settings stay
// (a Localhost seccomp profile, capabilities the supervisor keeps anyway,
// other pod securityContext fields); the capability drop is always ALL.
func TestEnrichSecurityContextMerge(t *testing.T) {
	in := mustJSON(t, `{"spec":{
	  "securityContext":{"fsGroup":2000,"seccompProfile":{"type":"Localhost","localhostProfile":"profiles/agent.json"}},
	  "containers":[{"name":"a","image":"x","securityContext":{"readOnlyRootFilesystem":true,
	    "capabilities":{"add":["cap_kill"],"drop":["NET_RAW"]}}}]}}`)
	got, conflicts := enrich(in, baseOptions())
	if len(conflicts) > 0 {
		t.Fatalf("conflicts = %v", conflicts)
	}
	spec := child(got, "spec")
	wantPod := map[string]any{"fsGroup": float64(2000), "seccompProfile": map[string]any{"type": "Localhost", "localhostProfile": "profiles/agent.json"}}
	if diff := cmp.Diff(wantPod, spec["securityContext"]); diff != "" {
		t.Errorf("pod securityContext (-want +got):\n%s", diff)
	}
	wantSC := map[string]any{
		"runAsUser": int64(0), "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
		"capabilities": map[string]any{"drop": []any{"ALL"}, "add": []any{"CHOWN", "KILL", "NET_ADMIN", "SETGID", "SETPCAP", "SETUID"}},
	}
	if diff := cmp.Diff(wantSC, containerByName(t, got, "containers", "a")["securityContext"]); diff != "" {
		t.Errorf("agent securityContext (-want +got):\n%s", diff)
	}
}

// TestEnrichSupervisorOTLPEnv: the gateway's OTLP settings reach the
// supervisor's environment; the user environment cannot set them.
func TestEnrichSupervisorOTLPEnv(t *testing.T) {
	o := baseOptions()
	o.Image = "agent:1"
	o.Env = map[string]string{"OPENSHELL_OTLP_SERVICE_NAME": "from-spec", "OPENSHELL_OTLP_ENDPOINT": "http://evil:4317", "KEEP": "1"}
	o.SupervisorEnv = map[string]string{"OPENSHELL_OTLP_SERVICE_NAME": "gw-sandbox", "OPENSHELL_OTEL_BSP_SCHEDULE_DELAY": "100"}
	got, conflicts := enrich(nil, o)
	if len(conflicts) > 0 {
		t.Fatalf("conflicts = %v", conflicts)
	}
	env := envMap(containerByName(t, got, "containers", defaultAgentName))
	if env["OPENSHELL_OTLP_SERVICE_NAME"] != "gw-sandbox" || env["OPENSHELL_OTEL_BSP_SCHEDULE_DELAY"] != "100" || env["KEEP"] != "1" {
		t.Errorf("env = %v, want the gateway's OTLP settings and KEEP", env)
	}
	if _, ok := env["OPENSHELL_OTLP_ENDPOINT"]; ok {
		t.Errorf("user environment set OPENSHELL_OTLP_ENDPOINT: %v", env)
	}
}
