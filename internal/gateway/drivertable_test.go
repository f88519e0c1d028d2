package gateway

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/openshell-go/openshell/internal/compute/kubernetes"
)

// TestDriverTableForServedKubernetesDriver: `driver serve --config` hands
// a separately served kubernetes driver the same table the gateway would,
// ServiceAccount lists included.
func TestDriverTableForServedKubernetesDriver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.toml")
	toml := `[openshell]
version = 1

[openshell.gateway]
sandbox_namespace = "agents"
default_image = "busybox:1"
host_gateway_ip = "10.0.0.1"

[openshell.drivers.kubernetes]
socket_path = "/run/openshell/k8s.sock"
gateway_endpoint = "https://gw:17670"
service_account_name = "sa"
additional_bootstrap_service_account_names = ["sa-external"]
selectable_service_account_names = [" sa-2 "]
`
	if err := os.WriteFile(path, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	table, err := driverTable(path, "kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"sandbox_namespace": "agents", "default_image": "busybox:1",
		"gateway_endpoint": "https://gw:17670", "service_account_name": "sa",
		"additional_bootstrap_service_account_names": []any{"sa-external"},
		"selectable_service_account_names":           []any{" sa-2 "},
	}
	if diff := cmp.Diff(want, table); diff != "" {
		t.Fatalf("driverTable (-want +got):\n%s", diff)
	}
	cfg, err := kubernetes.ParseConfig(table)
	if err != nil {
		t.Fatalf("kubernetes driver rejects the served table: %v", err)
	}
	if names := cfg.ServiceAccountValidator().Names(); !contains(names, "sa-2") || !contains(names, "sa-external") || !contains(names, "sa") {
		t.Fatalf("accepted accounts = %v", names)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
