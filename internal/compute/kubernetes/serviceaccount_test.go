package kubernetes

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

func baseConfig(extra map[string]any) map[string]any {
	cfg := map[string]any{"kubeconfig": "/unused", "gateway_endpoint": "https://gw:17670", "default_image": "agent:1"}
	for k, v := range extra {
		cfg[k] = v
	}
	return cfg
}

func offlineDriver(t *testing.T, extra map[string]any) *Driver {
	t.Helper()
	c, err := ParseConfig(baseConfig(extra))
	if err != nil {
		t.Fatalf("ParseConfig() error = %v", err)
	}
	d, err := NewForConfig(&rest.Config{Host: "https://127.0.0.1:1"}, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestServiceAccountValidator(t *testing.T) {
	legacy := NewServiceAccountValidator("openshell-sandbox")
	if !legacy.AcceptsIn("any", "openshell-sandbox") || legacy.AcceptsIn("any", "default") {
		t.Errorf("single-account validator: accept/reject wrong")
	}
	v := NewServiceAccountValidator(" sa-2 ", "", "sa", "sa", "team-a:sa-3")
	if got, want := v.Names(), []string{"sa", "sa-2", "team-a:sa-3"}; !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v (trimmed, blanks dropped, deduplicated)", got, want)
	}
	tests := []struct {
		ns, name string
		want     bool
	}{
		{"x", "sa", true}, {"x", "sa-2", true}, {"x", " sa-2 ", false}, {"x", "other", false},
		{"team-a", "sa-3", true}, {"team-b", "sa-3", false}, {"", "sa-3", false},
		{"team-a", "team-a:sa-3", false}, {"x", "", false},
	}
	for _, tt := range tests {
		if got := v.AcceptsIn(tt.ns, tt.name); got != tt.want {
			t.Errorf("AcceptsIn(%q, %q) = %v, want %v", tt.ns, tt.name, got, tt.want)
		}
	}
	if v.Accepts("team-a:sa-3") {
		t.Errorf("Accepts(qualified entry) = true, want false: Accepts matches bare names only")
	}
}

// TestServiceAccountSets pins the two config keys and the sets built from
// them: accepted = default ∪ additional ∪ selectable; selectable = default
// ∪ selectable. A bootstrap-only account is not selectable.
func TestServiceAccountSets(t *testing.T) {
	c, err := ParseConfig(baseConfig(map[string]any{
		"service_account_name":                       "sa",
		"additional_bootstrap_service_account_names": []any{"sa-external", " "},
		"selectable_service_account_names":           []any{" sa-2 "},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.ServiceAccountValidator().Names(), []string{"sa", "sa-2", "sa-external"}; !slices.Equal(got, want) {
		t.Errorf("accepted = %v, want %v", got, want)
	}
	if got, want := c.SelectableServiceAccounts().Names(), []string{"sa", "sa-2"}; !slices.Equal(got, want) {
		t.Errorf("selectable = %v, want %v", got, want)
	}
	plain, err := ParseConfig(baseConfig(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := plain.ServiceAccountValidator().Names(); !slices.Equal(got, []string{DefaultServiceAccountName}) {
		t.Errorf("accepted without lists = %v, want only the default", got)
	}
}

func TestServiceAccountConfigValidation(t *testing.T) {
	tests := []struct {
		key  string
		val  any
		want string
	}{
		{"selectable_service_account_names", []any{"Bad_Name"}, "selectable_service_account_names entry 'Bad_Name' is not a valid Kubernetes ServiceAccount name"},
		{"additional_bootstrap_service_account_names", []any{"ok", "has space"}, "additional_bootstrap_service_account_names entry 'has space' is not a valid Kubernetes ServiceAccount name"},
		{"selectable_service_account_names", []any{"-leading"}, "entry '-leading' is not a valid"},
		{"selectable_service_account_names", []any{"Capital"}, "entry 'Capital' is not a valid"},
		{"selectable_service_account_names", []any{"under_score"}, "entry 'under_score' is not a valid"},
		{"selectable_service_account_names", []any{strings.Repeat("a", 254)}, "is not a valid Kubernetes ServiceAccount name"},
		{"selectable_service_account_names", []any{"Bad_NS:sa"}, "entry 'Bad_NS:sa' is not a valid"},
		{"service_account_name", "Bad_Name", "service_account_name 'Bad_Name' is not a valid Kubernetes ServiceAccount name"},
		{"selectable_service_account_names", "sa", "must be a list of strings"},
		{"selectable_service_account_names", []any{1}, "entries must be strings"},
	}
	for _, tt := range tests {
		_, err := ParseConfig(baseConfig(map[string]any{tt.key: tt.val}))
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseConfig(%s=%v) error = %v, want InvalidArgument containing %q", tt.key, tt.val, err, tt.want)
		}
	}
}

func TestResolveServiceAccount(t *testing.T) {
	d := offlineDriver(t, map[string]any{
		"service_account_name":                       "sa",
		"additional_bootstrap_service_account_names": []any{"sa-external"},
		"selectable_service_account_names":           []any{"sa-2", "openshell:sa-ns"},
	})
	tests := []struct {
		name    string
		sa      string
		want    string
		wantErr string
	}{
		{"absent", "", "sa", ""},
		{"default", "sa", "sa", ""},
		{"selectable", "sa-2", "sa-2", ""},
		{"padded", " sa-2 ", "sa-2", ""},
		{"qualified in its namespace", "sa-ns", "sa-ns", ""},
		{"bootstrap-only", "sa-external", "", "service_account_name 'sa-external' is not selectable on this gateway"},
		{"unknown", "root", "", "service_account_name 'root' is not selectable on this gateway"},
		{"blank", " ", "", "service_account_name ' ' is not selectable on this gateway"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := compute.Sandbox{ID: "11111111-2222-4333-8444-555555555555", Name: "sb", Spec: compute.Spec{Template: compute.Template{ServiceAccountName: tt.sa}}}
			p, err := d.plan(sb)
			if tt.wantErr != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != tt.wantErr {
					t.Errorf("plan() error = %v, want InvalidArgument %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || p.opts.ServiceAccountName != tt.want {
				t.Errorf("plan() = %q, %v, want %q", p.opts.ServiceAccountName, err, tt.want)
			}
		})
	}
}

func TestNamespaceFor(t *testing.T) {
	sb := func(ws, ns string) compute.Sandbox {
		return compute.Sandbox{ID: "11111111-2222-4333-8444-555555555555", Name: "sb", Workspace: ws, Namespace: ns}
	}
	shared := offlineDriver(t, map[string]any{"sandbox_namespace": "sbx"})
	managed := offlineDriver(t, map[string]any{"workspace_mode": "managed", "gateway_id": "gw1"})
	operator := offlineDriver(t, map[string]any{"workspace_mode": "operator", "allowed_namespaces": []any{"team-a", "openshell"}})
	tests := []struct {
		name string
		d    *Driver
		sb   compute.Sandbox
		want string // "" = InvalidArgument
	}{
		{"shared", shared, sb("team-a", ""), "sbx"},
		{"shared other namespace", shared, sb("", "kube-system"), ""},
		{"managed default", managed, sb("", ""), "openshell-gw1-default"},
		{"managed workspace", managed, sb("team-a", ""), "openshell-gw1-team-a"},
		{"managed bad workspace", managed, sb("Team_A", ""), ""},
		{"operator workspace", operator, sb("team-a", ""), "team-a"},
		{"operator other workspace", operator, sb("team-b", ""), "openshell"},
		{"operator explicit", operator, sb("", "team-a"), "team-a"},
		{"operator not allowed", operator, sb("", "kube-system"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := tt.d.plan(tt.sb)
			if tt.want == "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Errorf("plan() = %q, %v, want InvalidArgument", p.namespace, err)
				}
				return
			}
			if err != nil || p.namespace != tt.want {
				t.Errorf("plan() namespace = %q, %v, want %q", p.namespace, err, tt.want)
			}
		})
	}
}

// TestLongServiceAccountNames checks names Kubernetes accepts but a
// 63-character-per-label rule would refuse are accepted in the
// configuration and selectable by a sandbox.
func TestLongServiceAccountNames(t *testing.T) {
	label100 := strings.Repeat("a", 100)
	max := strings.Repeat("a", 126) + "." + strings.Repeat("b", 126)
	d := offlineDriver(t, map[string]any{"service_account_name": label100, "selectable_service_account_names": []any{max}})
	for _, sa := range []string{"", max} {
		sb := compute.Sandbox{ID: "11111111-2222-4333-8444-555555555555", Name: "sb", Spec: compute.Spec{Template: compute.Template{ServiceAccountName: sa}}}
		p, err := d.plan(sb)
		want := sa
		if sa == "" {
			want = label100
		}
		if err != nil || p.opts.ServiceAccountName != want {
			t.Errorf("plan(service_account_name %d chars) = %d chars, %v, want %d chars", len(sa), len(p.opts.ServiceAccountName), err, len(want))
		}
	}
}
