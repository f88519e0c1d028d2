package lifecycle

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

func TestValidateCreateRequestLogLevel(t *testing.T) {
	tests := []struct {
		level   string
		wantErr string // substring; "" = valid
	}{
		{"", ""},
		{"trace", ""},
		{"debug", ""},
		{"info", ""},
		{"warn", ""},
		{"error", ""},
		{"INFO", ""},
		{"bogus", `spec.log_level "bogus" is not valid: want one of trace, debug, info, warn, error, or empty for the default`},
		{"warning", `spec.log_level "warning" is not valid`},
		{"info+2", `spec.log_level "info+2" is not valid`},
		{strings.Repeat("x", MaxLogLevelLen+1), "log_level exceeds maximum length"},
	}
	for _, tt := range tests {
		t.Run(tt.level, func(t *testing.T) {
			err := ValidateCreateRequest(&openshellv1.CreateSandboxRequest{Spec: &openshellv1.SandboxSpec{LogLevel: tt.level}})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ValidateCreateRequest(log_level %q) = %v, want nil", tt.level, err)
				}
				return
			}
			if errdefs.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ValidateCreateRequest(log_level %q) = %v, want InvalidArgument containing %q", tt.level, err, tt.wantErr)
			}
		})
	}
}
