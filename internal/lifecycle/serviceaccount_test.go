package lifecycle

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// TestServiceAccountNameRules checks template.service_account_name takes
// exactly what Kubernetes accepts for a ServiceAccount (a DNS-1123
// subdomain of at most 253 characters, no per-label limit), on create and
// on adopt.
func TestServiceAccountNameRules(t *testing.T) {
	label100 := strings.Repeat("a", 100)
	max := strings.Repeat("a", 126) + "." + strings.Repeat("b", 126) // 253
	tests := []struct {
		name, sa string
		valid    bool
	}{
		{"short", "agent", true},
		{"one 100-character label", label100, true},
		{"253 characters", max, true},
		{"dotted", "team.agent-1", true},
		{"254 characters", max + "c", false},
		{"uppercase", "Agent", false},
		{"underscore", "agent_1", false},
		{"leading dot", ".agent", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl := &openshellv1.SandboxTemplate{ServiceAccountName: tt.sa}
			err := ValidateCreateRequest(&openshellv1.CreateSandboxRequest{Name: "a", Spec: &openshellv1.SandboxSpec{Template: tmpl}})
			if tt.valid != (err == nil) {
				t.Fatalf("ValidateCreateRequest(service_account_name %d chars) = %v, want valid %v", len(tt.sa), err, tt.valid)
			}
			if !tt.valid && (errdefs.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "template.service_account_name must be a valid Kubernetes ServiceAccount name")) {
				t.Fatalf("ValidateCreateRequest() = %v, want InvalidArgument naming template.service_account_name", err)
			}
			// Adopt applies the same rules before it looks for the
			// adoption ability, which the fake driver lacks.
			e, _, _ := newEngine(t)
			_, err = e.Adopt(t.Context(), &openshellv1.AdoptSandboxRequest{Name: "a", Spec: &openshellv1.SandboxSpec{Template: tmpl}})
			want := codes.FailedPrecondition
			if !tt.valid {
				want = codes.InvalidArgument
			}
			if got := errdefs.Code(err); got != want {
				t.Fatalf("Adopt(service_account_name %d chars) = %v (%v), want %v", len(tt.sa), err, got, want)
			}
		})
	}
}
