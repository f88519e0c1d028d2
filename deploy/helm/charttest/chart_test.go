// Package charttest renders and lints the deploy/helm/openshell chart with
// the Helm Go library. It is a separate module so that Helm's dependency graph
// never enters the product module.
package charttest

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pelletier/go-toml/v2"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "../openshell"
	release   = "openshell"
	namespace = "openshell"
)

// object is one rendered manifest.
type object struct {
	Kind     string
	Name     string
	NS       string
	Template string
	YAML     string
}

func (o object) key() string { return o.Kind + " " + o.NS + "/" + o.Name }

// render renders the chart as `helm install openshell --namespace openshell`
// with the given values YAML on top of values.yaml.
func render(t *testing.T, values string) ([]object, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	var names []string
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []object
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for doc := range strings.SplitSeq(files[name], "\n---") {
			var meta struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name      string `json:"name"`
					Namespace string `json:"namespace"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			if meta.Kind == "" {
				if strings.TrimSpace(stripComments(doc)) != "" {
					t.Fatalf("%s: document without kind:\n%s", name, doc)
				}
				continue
			}
			out = append(out, object{meta.Kind, meta.Metadata.Name, meta.Metadata.Namespace, name, doc})
		}
	}
	return out, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for l := range strings.SplitSeq(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func mustRender(t *testing.T, values string) []object {
	t.Helper()
	objs, err := render(t, values)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return objs
}

// get decodes the object of kind/name (in any namespace) into v.
func get(t *testing.T, objs []object, kind, name string, v any) {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Name == name {
			if err := yaml.UnmarshalStrict([]byte(o.YAML), v); err != nil {
				t.Fatalf("%s: %v", o.key(), err)
			}
			return
		}
	}
	t.Fatalf("no %s %q rendered; have %v", kind, name, keys(objs))
}

func keys(objs []object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.key())
	}
	return out
}

func has(objs []object, kind, name string) bool {
	return slices.ContainsFunc(objs, func(o object) bool { return o.Kind == kind && o.Name == name })
}

// gatewayTOML returns the rendered gateway.toml lines (after checking that
// it parses as TOML).
func gatewayTOML(t *testing.T, objs []object) []string {
	t.Helper()
	var cm corev1.ConfigMap
	get(t, objs, "ConfigMap", "openshell-config", &cm)
	text := cm.Data["gateway.toml"]
	var parsed map[string]any
	if err := toml.Unmarshal([]byte(text), &parsed); err != nil {
		t.Fatalf("gateway.toml does not parse: %v\n%s", err, text)
	}
	return strings.Split(text, "\n")
}

// section returns the lines of TOML table name (without the header).
func section(t *testing.T, lines []string, name string) []string {
	t.Helper()
	i := slices.Index(lines, "["+name+"]")
	if i < 0 {
		t.Fatalf("no [%s] in gateway.toml:\n%s", name, strings.Join(lines, "\n"))
	}
	var out []string
	for _, l := range lines[i+1:] {
		if strings.HasPrefix(l, "[") {
			break
		}
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

func TestDefaultRender(t *testing.T) {
	objs := mustRender(t, "")
	want := []string{
		"ClusterRole /openshell-openshell",
		"ClusterRoleBinding /openshell-openshell",
		"ConfigMap openshell/openshell-config",
		"Job openshell/openshell-pki-hook",
		"Role openshell/openshell-credentials-kek",
		"Role openshell/openshell-pki-hook",
		"Role openshell/openshell-sandboxes",
		"RoleBinding openshell/openshell-credentials-kek",
		"RoleBinding openshell/openshell-pki-hook",
		"RoleBinding openshell/openshell-sandboxes",
		"Service openshell/openshell",
		"Service openshell/openshell-headless",
		"ServiceAccount openshell/openshell",
		"ServiceAccount openshell/openshell-pki-hook",
		"ServiceAccount openshell/openshell-sandbox",
		"StatefulSet openshell/openshell",
	}
	got := keys(objs)
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rendered objects (-want +got):\n%s", diff)
	}

	lines := gatewayTOML(t, objs)
	if diff := cmp.Diff([]string{"version = 1"}, section(t, lines, "openshell")); diff != "" {
		t.Errorf("[openshell] (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{
		`bind_address = "0.0.0.0:17670"`,
		`health_bind_address = "0.0.0.0:17671"`,
		`log_level = "info"`,
		`compute_drivers = ["kubernetes"]`,
	}, section(t, lines, "openshell.gateway")); diff != "" {
		t.Errorf("[openshell.gateway] (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{
		`cert_path = "/etc/openshell/tls/tls.crt"`,
		`key_path = "/etc/openshell/tls/tls.key"`,
		`client_ca_path = "/etc/openshell/tls/ca.crt"`,
	}, section(t, lines, "openshell.gateway.tls")); diff != "" {
		t.Errorf("[openshell.gateway.tls] (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{
		`signing_key_path = "/etc/openshell/jwt/signing.pem"`,
		`public_key_path = "/etc/openshell/jwt/public.pem"`,
		`kid_path = "/etc/openshell/jwt/kid"`,
		`gateway_id = "openshell"`,
		`ttl_secs = 3600`,
	}, section(t, lines, "openshell.gateway.gateway_jwt")); diff != "" {
		t.Errorf("[openshell.gateway.gateway_jwt] (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{
		`sandbox_namespace = "openshell"`,
		`workspace_mode = "shared"`,
		`gateway_id = "openshell"`,
		`service_account_name = "openshell-sandbox"`,
		`supervisor_image = "openshell-sandbox:0.1.0"`,
		`image_pull_policy = "IfNotPresent"`,
		`gateway_endpoint = "https://openshell.openshell.svc:17670"`,
		`client_tls_secret_name = "openshell-client-tls"`,
		`sa_token_ttl_secs = 3600`,
		`allow_adoption = false`,
	}, section(t, lines, "openshell.drivers.kubernetes")); diff != "" {
		t.Errorf("[openshell.drivers.kubernetes] (-want +got):\n%s", diff)
	}
	for _, table := range []string{"[openshell.gateway.oidc]", "[openshell.gateway.mtls_auth]"} {
		if slices.Contains(lines, table) {
			t.Errorf("%s rendered by default", table)
		}
	}

	var sts appsv1.StatefulSet
	get(t, objs, "StatefulSet", "openshell", &sts)
	if *sts.Spec.Replicas != 1 || sts.Spec.ServiceName != "openshell-headless" {
		t.Errorf("replicas %d, serviceName %q", *sts.Spec.Replicas, sts.Spec.ServiceName)
	}
	pod := sts.Spec.Template.Spec
	if pod.ServiceAccountName != "openshell" {
		t.Errorf("gateway serviceAccountName = %q", pod.ServiceAccountName)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("containers = %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != "openshell-gateway:0.1.0" {
		t.Errorf("image = %q", c.Image)
	}
	if diff := cmp.Diff([]string{"openshell-gateway"}, c.Command); diff != "" {
		t.Errorf("command (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"--config", "/etc/openshell/gateway.toml"}, c.Args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if diff := cmp.Diff(map[string]int32{"grpc": 17670, "health": 17671}, ports); diff != "" {
		t.Errorf("ports (-want +got):\n%s", diff)
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		want := "/healthz"
		if name == "readiness" {
			want = "/readyz"
		}
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port.String() != "health" {
			t.Errorf("%s probe = %+v; want GET %s on port health", name, p, want)
		}
	}
	if got := env(c, "OPENSHELL_DB_URL"); got == nil || got.Value != "sqlite:/var/lib/openshell/openshell.db" {
		t.Errorf("OPENSHELL_DB_URL = %+v; want the SQLite file on the state volume", got)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if diff := cmp.Diff(map[string]string{
		"config": "/etc/openshell/gateway.toml", "tls": "/etc/openshell/tls", "jwt": "/etc/openshell/jwt",
		"state": "/var/lib/openshell", "tmp": "/tmp",
	}, mounts); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	secrets := map[string]string{}
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = v.Secret.SecretName
		}
	}
	if diff := cmp.Diff(map[string]string{"tls": "openshell-server-tls", "jwt": "openshell-jwt"}, secrets); diff != "" {
		t.Errorf("secret volumes (-want +got):\n%s", diff)
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Name != "state" {
		t.Errorf("volumeClaimTemplates = %+v; want one named state", sts.Spec.VolumeClaimTemplates)
	}
	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("container is not read-only: %+v", c.SecurityContext)
	}

	var svc corev1.Service
	get(t, objs, "Service", "openshell", &svc)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 17670 || svc.Spec.Ports[0].TargetPort.String() != "grpc" {
		t.Errorf("service ports = %+v", svc.Spec.Ports)
	}

	var sandboxSA corev1.ServiceAccount
	get(t, objs, "ServiceAccount", "openshell-sandbox", &sandboxSA)
	if sandboxSA.AutomountServiceAccountToken == nil || *sandboxSA.AutomountServiceAccountToken {
		t.Errorf("sandbox ServiceAccount automounts its token")
	}
}

func env(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func TestPKIHook(t *testing.T) {
	tests := []struct {
		name     string
		values   string
		args     []string
		resNames []string
	}{
		{"default", "", []string{
			"generate-certs", "--namespace", "openshell",
			"--server-secret-name", "openshell-server-tls", "--client-secret-name", "openshell-client-tls",
			"--server-san", "openshell,openshell.openshell,openshell.openshell.svc,openshell.openshell.svc.cluster.local",
			"--jwt-secret-name", "openshell-jwt",
		}, []string{"openshell-server-tls", "openshell-client-tls", "openshell-jwt"}},
		{"names and SANs", "pki: {serverSecretName: srv, clientSecretName: cli, jwtSecretName: jwt}\nserver: {serverSANs: [gw.example.com, 10.0.0.7]}", []string{
			"generate-certs", "--namespace", "openshell",
			"--server-secret-name", "srv", "--client-secret-name", "cli",
			"--server-san", "openshell,openshell.openshell,openshell.openshell.svc,openshell.openshell.svc.cluster.local,gw.example.com,10.0.0.7",
			"--jwt-secret-name", "jwt",
		}, []string{"srv", "cli", "jwt"}},
		{"jwt only", "pki: {jwtOnly: true}", []string{
			"generate-certs", "--namespace", "openshell", "--jwt-only", "--jwt-secret-name", "openshell-jwt",
		}, []string{"openshell-jwt"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := mustRender(t, tt.values)
			var job batchv1.Job
			get(t, objs, "Job", "openshell-pki-hook", &job)
			if got := job.Annotations["helm.sh/hook"]; got != "pre-install,pre-upgrade" {
				t.Errorf("hook annotation = %q", got)
			}
			pod := job.Spec.Template.Spec
			if pod.ServiceAccountName != "openshell-pki-hook" || pod.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("hook pod SA %q restart %q", pod.ServiceAccountName, pod.RestartPolicy)
			}
			c := pod.Containers[0]
			if diff := cmp.Diff([]string{"openshell-gateway"}, c.Command); diff != "" {
				t.Errorf("command (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.args, c.Args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
			if e := env(c, "POD_NAMESPACE"); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
				t.Errorf("POD_NAMESPACE = %+v", e)
			}
			var role rbacv1.Role
			get(t, objs, "Role", "openshell-pki-hook", &role)
			want := []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
				{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: tt.resNames, Verbs: []string{"get", "delete"}},
			}
			if diff := cmp.Diff(want, role.Rules); diff != "" {
				t.Errorf("hook role rules (-want +got):\n%s", diff)
			}
			for _, kind := range []string{"ServiceAccount", "Role", "RoleBinding"} {
				for _, o := range objs {
					if o.Kind == kind && o.Name == "openshell-pki-hook" && !strings.Contains(o.YAML, "helm.sh/hook: pre-install,pre-upgrade") {
						t.Errorf("%s is not a pre-install/pre-upgrade hook", o.key())
					}
				}
			}
		})
	}
	objs := mustRender(t, "pki: {enabled: false}")
	if has(objs, "Job", "openshell-pki-hook") || has(objs, "Role", "openshell-pki-hook") {
		t.Errorf("pki.enabled=false still renders the hook")
	}
}

// TestServiceAccountLists pins the issue 9 Helm keys: rendered directly
// beneath service_account_name as TOML string arrays, only when non-empty.
func TestServiceAccountLists(t *testing.T) {
	const (
		addKey = "additional_bootstrap_service_account_names"
		selKey = "selectable_service_account_names"
	)
	tests := []struct {
		name   string
		values string
		after  []string // lines directly after service_account_name
	}{
		{"default omits both", "", nil},
		{"explicit empty lists omit both", "server: {drivers: {kubernetes: {additionalBootstrapServiceAccountNames: [], selectableServiceAccountNames: []}}}", nil},
		{"additional only",
			"server: {drivers: {kubernetes: {additionalBootstrapServiceAccountNames: [sa-external]}}}",
			[]string{addKey + ` = ["sa-external"]`}},
		{"selectable only",
			"server: {drivers: {kubernetes: {selectableServiceAccountNames: [sa-2, sa-3]}}}",
			[]string{selKey + ` = ["sa-2", "sa-3"]`}},
		{"both",
			"server: {drivers: {kubernetes: {additionalBootstrapServiceAccountNames: [sa-external, \" sa-4 \"], selectableServiceAccountNames: [sa-2]}}}",
			[]string{addKey + ` = ["sa-external", " sa-4 "]`, selKey + ` = ["sa-2"]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lines := section(t, gatewayTOML(t, mustRender(t, tt.values)), "openshell.drivers.kubernetes")
			i := slices.Index(lines, `service_account_name = "openshell-sandbox"`)
			if i < 0 {
				t.Fatalf("no service_account_name line in %q", lines)
			}
			next := lines[i+1 : i+1+len(tt.after)]
			if diff := cmp.Diff(tt.after, next, cmp.Comparer(func(a, b []string) bool { return slices.Equal(a, b) })); diff != "" {
				t.Errorf("lines beneath service_account_name (-want +got):\n%s", diff)
			}
			if after := lines[i+1+len(tt.after)]; !strings.HasPrefix(after, "supervisor_image = ") {
				t.Errorf("line after the lists = %q; want supervisor_image", after)
			}
			for _, k := range []string{addKey, selKey} {
				n := 0
				for _, l := range lines {
					if strings.HasPrefix(l, k+" ") {
						n++
					}
				}
				want := 0
				for _, l := range tt.after {
					if strings.HasPrefix(l, k+" ") {
						want = 1
					}
				}
				if n != want {
					t.Errorf("%s rendered %d times, want %d", k, n, want)
				}
			}
		})
	}
}

func TestServiceAccountListsInvalid(t *testing.T) {
	for _, key := range []string{"additionalBootstrapServiceAccountNames", "selectableServiceAccountNames"} {
		for _, tc := range []struct{ name, list string }{
			{"empty string", `[sa-1, ""]`},
			{"blank string", `["  "]`},
			{"number", `[sa-1, 42]`},
			{"boolean", `[true]`},
			{"null entry", `[null]`},
			{"map entry", `[{name: sa-1}]`},
			{"not a list", `sa-1`},
		} {
			t.Run(key+"/"+tc.name, func(t *testing.T) {
				_, err := render(t, fmt.Sprintf("server: {drivers: {kubernetes: {%s: %s}}}", key, tc.list))
				want := fmt.Sprintf("server.drivers.kubernetes.%s entries must be non-empty strings", key)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("render = %v; want %q", err, want)
				}
			})
		}
	}
}

func rules(t *testing.T, objs []object, kind, name string) []rbacv1.PolicyRule {
	t.Helper()
	switch kind {
	case "ClusterRole":
		var r rbacv1.ClusterRole
		get(t, objs, kind, name, &r)
		return r.Rules
	default:
		var r rbacv1.Role
		get(t, objs, kind, name, &r)
		return r.Rules
	}
}

var (
	tokenReviewRule = rbacv1.PolicyRule{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}}
	sandboxRule     = rbacv1.PolicyRule{APIGroups: []string{"agents.x-k8s.io"}, Resources: []string{"sandboxes"}, Verbs: []string{"get", "list", "watch", "create", "delete", "patch"}}
	podRule         = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}
	namespaceRule   = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "create", "delete"}}
)

func TestGatewayRBAC(t *testing.T) {
	tests := []struct {
		name        string
		values      string
		clusterRole []rbacv1.PolicyRule
		roleNS      []string // namespaces with the sandboxes Role
	}{
		{"shared", "", []rbacv1.PolicyRule{tokenReviewRule}, []string{"openshell"}},
		{"shared elsewhere", "server: {drivers: {kubernetes: {sandboxNamespace: agents}}}", []rbacv1.PolicyRule{tokenReviewRule}, []string{"agents"}},
		{"managed", "server: {drivers: {kubernetes: {workspaceMode: managed}}}", []rbacv1.PolicyRule{tokenReviewRule, namespaceRule, sandboxRule, podRule}, nil},
		{"operator", "server: {drivers: {kubernetes: {workspaceMode: operator, allowedNamespaces: [team-a, team-b]}}}", []rbacv1.PolicyRule{tokenReviewRule}, []string{"team-a", "team-b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := mustRender(t, tt.values)
			if diff := cmp.Diff(tt.clusterRole, rules(t, objs, "ClusterRole", "openshell-openshell")); diff != "" {
				t.Errorf("ClusterRole rules (-want +got):\n%s", diff)
			}
			var crb rbacv1.ClusterRoleBinding
			get(t, objs, "ClusterRoleBinding", "openshell-openshell", &crb)
			wantSubj := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "openshell", Namespace: "openshell"}}
			if diff := cmp.Diff(wantSubj, crb.Subjects); diff != "" || crb.RoleRef.Name != "openshell-openshell" {
				t.Errorf("ClusterRoleBinding subjects (-want +got):\n%s roleRef %+v", diff, crb.RoleRef)
			}
			var roleNS, bindingNS, saNS []string
			for _, o := range objs {
				switch {
				case o.Kind == "Role" && o.Name == "openshell-sandboxes":
					roleNS = append(roleNS, o.NS)
					var r rbacv1.Role
					if err := yaml.UnmarshalStrict([]byte(o.YAML), &r); err != nil {
						t.Fatal(err)
					}
					if diff := cmp.Diff([]rbacv1.PolicyRule{sandboxRule, podRule}, r.Rules); diff != "" {
						t.Errorf("Role %s rules (-want +got):\n%s", o.NS, diff)
					}
				case o.Kind == "RoleBinding" && o.Name == "openshell-sandboxes":
					bindingNS = append(bindingNS, o.NS)
					var rb rbacv1.RoleBinding
					if err := yaml.UnmarshalStrict([]byte(o.YAML), &rb); err != nil {
						t.Fatal(err)
					}
					if diff := cmp.Diff(wantSubj, rb.Subjects); diff != "" {
						t.Errorf("RoleBinding %s subjects (-want +got):\n%s", o.NS, diff)
					}
				case o.Kind == "ServiceAccount" && o.Name == "openshell-sandbox":
					saNS = append(saNS, o.NS)
				}
			}
			for what, got := range map[string][]string{"Role": roleNS, "RoleBinding": bindingNS, "sandbox ServiceAccount": saNS} {
				if diff := cmp.Diff(tt.roleNS, got); diff != "" {
					t.Errorf("%s namespaces (-want +got):\n%s", what, diff)
				}
			}
			// No rule anywhere grants more than the listed verbs.
			for _, o := range objs {
				if (o.Kind == "Role" || o.Kind == "ClusterRole") && strings.Contains(o.YAML, `"*"`) {
					t.Errorf("%s uses a wildcard", o.key())
				}
			}
		})
	}
	objs := mustRender(t, "rbac: {create: false}")
	for _, o := range objs {
		if strings.HasPrefix(o.Kind, "ClusterRole") || (o.Kind == "Role" && o.Name != "openshell-pki-hook") {
			t.Errorf("rbac.create=false renders %s", o.key())
		}
	}
}

func TestModesAndDatabase(t *testing.T) {
	t.Run("managed", func(t *testing.T) {
		lines := section(t, gatewayTOML(t, mustRender(t, "server: {gatewayId: gw1, drivers: {kubernetes: {workspaceMode: managed}}}")), "openshell.drivers.kubernetes")
		for _, want := range []string{`workspace_mode = "managed"`, `gateway_id = "gw1"`} {
			if !slices.Contains(lines, want) {
				t.Errorf("no line %q in %q", want, lines)
			}
		}
	})
	t.Run("operator", func(t *testing.T) {
		lines := section(t, gatewayTOML(t, mustRender(t, "server: {drivers: {kubernetes: {workspaceMode: operator, allowedNamespaces: [team-a, team-b]}}}")), "openshell.drivers.kubernetes")
		if !slices.Contains(lines, `allowed_namespaces = ["team-a", "team-b"]`) {
			t.Errorf("no allowed_namespaces line in %q", lines)
		}
	})
	t.Run("existing database secret", func(t *testing.T) {
		objs := mustRender(t, "server: {database: {existingSecret: pg, existingSecretKey: dsn}}")
		var sts appsv1.StatefulSet
		get(t, objs, "StatefulSet", "openshell", &sts)
		e := env(sts.Spec.Template.Spec.Containers[0], "OPENSHELL_DB_URL")
		if e == nil || e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
			e.ValueFrom.SecretKeyRef.Name != "pg" || e.ValueFrom.SecretKeyRef.Key != "dsn" {
			t.Errorf("OPENSHELL_DB_URL = %+v; want secretKeyRef pg/dsn", e)
		}
		if len(sts.Spec.VolumeClaimTemplates) != 0 {
			t.Errorf("external database still claims a state volume")
		}
		if has(objs, "Secret", "openshell-db") {
			t.Errorf("chart created a database Secret next to an existing one")
		}
	})
	t.Run("database url", func(t *testing.T) {
		objs := mustRender(t, "replicaCount: 2\nserver: {database: {url: \"postgres://u:p@pg:5432/openshell\"}}")
		var sec corev1.Secret
		get(t, objs, "Secret", "openshell-db", &sec)
		if sec.StringData["url"] != "postgres://u:p@pg:5432/openshell" {
			t.Errorf("db secret = %+v", sec.StringData)
		}
		var sts appsv1.StatefulSet
		get(t, objs, "StatefulSet", "openshell", &sts)
		e := env(sts.Spec.Template.Spec.Containers[0], "OPENSHELL_DB_URL")
		if e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "openshell-db" {
			t.Errorf("OPENSHELL_DB_URL = %+v; want from Secret openshell-db", e)
		}
		if *sts.Spec.Replicas != 2 {
			t.Errorf("replicas = %d", *sts.Spec.Replicas)
		}
	})
	t.Run("plaintext", func(t *testing.T) {
		objs := mustRender(t, "server: {disableTLS: true}")
		lines := gatewayTOML(t, objs)
		if !slices.Contains(section(t, lines, "openshell.gateway"), "disable_tls = true") {
			t.Errorf("no disable_tls line")
		}
		for _, l := range lines {
			if l == "[openshell.gateway.tls]" || strings.HasPrefix(l, "client_tls_secret_name") {
				t.Errorf("plaintext render has %q", l)
			}
		}
		if !slices.Contains(lines, `gateway_endpoint = "http://openshell.openshell.svc:17670"`) {
			t.Errorf("plaintext endpoint not http")
		}
	})
	t.Run("oidc", func(t *testing.T) {
		lines := gatewayTOML(t, mustRender(t, "server: {auth: {oidc: {issuer: \"https://id.example.com/realms/x\", rolesClaim: realm_access.roles}}}"))
		if diff := cmp.Diff([]string{`issuer = "https://id.example.com/realms/x"`, `audience = "openshell"`, `roles_claim = "realm_access.roles"`},
			section(t, lines, "openshell.gateway.oidc")); diff != "" {
			t.Errorf("[openshell.gateway.oidc] (-want +got):\n%s", diff)
		}
	})
}

// TestAllowAdoption checks server.drivers.kubernetes.allowAdoption reaches
// the driver's allow_adoption switch, and that a value other than a
// boolean fails the render instead of being read as off.
func TestAllowAdoption(t *testing.T) {
	for _, tt := range []struct{ values, want string }{
		{"", "allow_adoption = false"},
		{"server: {drivers: {kubernetes: {allowAdoption: false}}}", "allow_adoption = false"},
		{"server: {drivers: {kubernetes: {allowAdoption: true}}}", "allow_adoption = true"},
	} {
		lines := section(t, gatewayTOML(t, mustRender(t, tt.values)), "openshell.drivers.kubernetes")
		n := 0
		for _, l := range lines {
			if strings.HasPrefix(l, "allow_adoption ") {
				n++
				if l != tt.want {
					t.Errorf("values %q: rendered %q, want %q", tt.values, l, tt.want)
				}
			}
		}
		if n != 1 {
			t.Errorf("values %q: allow_adoption rendered %d times, want once", tt.values, n)
		}
	}
	for _, v := range []string{`"true"`, "yes-please", "1"} {
		_, err := render(t, "server: {drivers: {kubernetes: {allowAdoption: "+v+"}}}")
		if err == nil || !strings.Contains(err.Error(), "server.drivers.kubernetes.allowAdoption must be true or false") {
			t.Errorf("render(allowAdoption: %s) = %v, want the boolean error", v, err)
		}
	}
}

// TestAllowUnauthenticatedUsers: server.auth.allowUnauthenticatedUsers is
// rendered into [openshell.gateway.auth] (off by default); without it a
// chart installed with no OIDC refuses every user RPC.
func TestAllowUnauthenticatedUsers(t *testing.T) {
	for _, tt := range []struct{ values, want string }{
		{"", "allow_unauthenticated_users = false"},
		{"server: {auth: {allowUnauthenticatedUsers: true}}", "allow_unauthenticated_users = true"},
	} {
		lines := section(t, gatewayTOML(t, mustRender(t, tt.values)), "openshell.gateway.auth")
		if len(lines) != 1 || lines[0] != tt.want {
			t.Errorf("values %q: [openshell.gateway.auth] = %q, want [%q]", tt.values, lines, tt.want)
		}
	}
	_, err := render(t, `server: {auth: {allowUnauthenticatedUsers: "yes"}}`)
	if err == nil || !strings.Contains(err.Error(), "server.auth.allowUnauthenticatedUsers must be true or false") {
		t.Errorf("render(allowUnauthenticatedUsers: \"yes\") = %v, want the boolean error", err)
	}
}

func TestInvalidValues(t *testing.T) {
	tests := []struct{ name, values, want string }{
		{"unknown workspace mode", "server: {drivers: {kubernetes: {workspaceMode: cluster}}}", `workspaceMode "cluster" is not one of shared, managed, operator`},
		{"operator without namespaces", "server: {drivers: {kubernetes: {workspaceMode: operator}}}", "allowedNamespaces must list at least one namespace"},
		{"replicas on sqlite", "replicaCount: 3", "replicaCount > 1 needs an external database"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := render(t, tt.values); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("render = %v; want %q", err, tt.want)
			}
		})
	}
}

func TestLint(t *testing.T) {
	for _, values := range []string{"", "server: {drivers: {kubernetes: {workspaceMode: managed, selectableServiceAccountNames: [sa-2]}}}"} {
		vals, err := chartutil.ReadValues([]byte(values))
		if err != nil {
			t.Fatal(err)
		}
		res := lint.All(chartDir, vals, namespace, false)
		for _, m := range res.Messages {
			t.Logf("lint: %s", m)
			if m.Severity >= support.WarningSev {
				t.Errorf("lint (values %q): %s", values, m)
			}
		}
	}
}

// TestValuesDocumented checks that every leaf key of values.yaml has a
// "# --" comment directly above it or above one of its ancestors (a
// documented value that is itself a map, such as podSecurityContext).
func TestValuesDocumented(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	for _, f := range ch.Raw {
		if f.Name == "values.yaml" {
			raw = f.Data
		}
	}
	lines := strings.Split(string(raw), "\n")
	isKey := func(l string) bool {
		trim := strings.TrimSpace(l)
		return trim != "" && !strings.HasPrefix(trim, "#") && !strings.HasPrefix(trim, "- ") && strings.Contains(trim, ":")
	}
	documented := func(i int) bool { return i > 0 && strings.HasPrefix(strings.TrimSpace(lines[i-1]), "# -- ") }
	leaves := 0
	for i, l := range lines {
		next := i + 1
		for next < len(lines) && (strings.TrimSpace(lines[next]) == "" || strings.HasPrefix(strings.TrimSpace(lines[next]), "#")) {
			next++
		}
		if !isKey(l) || (strings.HasSuffix(strings.TrimSpace(l), ":") && next < len(lines) && indent(lines[next]) > indent(l) && isKey(lines[next])) {
			continue // not a key, or a grouping map
		}
		leaves++
		ok := documented(i)
		for j, ind := i-1, indent(l); !ok && j >= 0 && ind > 0; j-- {
			if isKey(lines[j]) && indent(lines[j]) < ind {
				ind = indent(lines[j])
				ok = documented(j)
			}
		}
		if !ok {
			t.Errorf("values.yaml:%d: %q is not documented by a '# -- ' comment", i+1, strings.TrimSpace(l))
		}
	}
	if leaves < 50 {
		t.Errorf("found only %d documented leaves; the check is not reading values.yaml", leaves)
	}
}

func indent(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }

// TestReadmeValuesTable checks that README.md's values table and values.yaml
// list the same keys.
func TestReadmeValuesTable(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(chartDir + "/README.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for l := range strings.SplitSeq(string(readme), "\n") {
		if strings.HasPrefix(l, "| `") {
			key, _, _ := strings.Cut(strings.TrimPrefix(l, "| `"), "`")
			documented[key] = true
		}
	}
	covered := map[string]bool{}
	var walk func(prefix string, v map[string]any)
	walk = func(prefix string, v map[string]any) {
		for k, val := range v {
			path := prefix + k
			if sub, ok := val.(map[string]any); ok && len(sub) > 0 && !documented[path] {
				walk(path+".", sub)
				continue
			}
			covered[path] = true
			if !documented[path] {
				t.Errorf("values key %s is missing from README.md's values table", path)
			}
		}
	}
	walk("", ch.Values)
	vals := chartutil.Values(ch.Values)
	for k := range documented {
		_, perr := vals.PathValue(k)
		_, terr := vals.Table(k)
		if perr != nil && terr != nil {
			t.Errorf("README.md documents %s, which values.yaml does not have", k)
		}
	}
	if len(covered) < 50 {
		t.Errorf("only %d keys walked", len(covered))
	}
}
