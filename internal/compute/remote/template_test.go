package remote_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/structpb"

	computev1 "github.com/openshell-go/openshell/api/openshell/compute/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/remote"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// TestPlatformConfigFromWire checks how platform_config, as an OpenShell
// gateway sends it, becomes typed template fields, and that a key or
// value the driver cannot honour is refused instead of dropped.
func TestPlatformConfigFromWire(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name    string
		pc      map[string]any
		ns      string
		want    compute.Sandbox
		wantErr string
	}{
		{"empty", nil, "", compute.Sandbox{ID: "i", Name: "n"}, ""},
		{"typed fields", map[string]any{
			"runtime_class_name": "gvisor", "service_account_name": "sa", "user_namespaces": true,
			"annotations": map[string]any{"a": "b"},
		}, "", compute.Sandbox{ID: "i", Name: "n", Spec: compute.Spec{Template: compute.Template{
			RuntimeClassName: "gvisor", ServiceAccountName: "sa", UserNamespaces: &yes, Annotations: map[string]string{"a": "b"},
		}}}, ""},
		{"host_users wins", map[string]any{"user_namespaces": false, "host_users": false}, "",
			compute.Sandbox{ID: "i", Name: "n", Spec: compute.Spec{Template: compute.Template{UserNamespaces: &yes}}}, ""},
		{"host_users true", map[string]any{"host_users": true}, "",
			compute.Sandbox{ID: "i", Name: "n", Spec: compute.Spec{Template: compute.Template{UserNamespaces: &no}}}, ""},
		{"namespace fills an empty one", map[string]any{"namespace": "team-a"}, "", compute.Sandbox{ID: "i", Name: "n", Namespace: "team-a"}, ""},
		{"namespace field wins", map[string]any{"namespace": "team-a"}, "team-b", compute.Sandbox{ID: "i", Name: "n", Namespace: "team-b"}, ""},
		{"unknown key", map[string]any{"gpu_device": "0"}, "", compute.Sandbox{}, "platform_config.gpu_device is not supported"},
		{"wrong type", map[string]any{"runtime_class_name": 3.0}, "", compute.Sandbox{}, "platform_config.runtime_class_name must be a string"},
		{"annotation not a string", map[string]any{"annotations": map[string]any{"a": 1.0}}, "", compute.Sandbox{}, "platform_config.annotations must be a map of strings"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &computev1.DriverSandbox{Id: "i", Name: "n", Namespace: tt.ns, Spec: &computev1.DriverSandboxSpec{Template: &computev1.DriverSandboxTemplate{}}}
			if tt.pc != nil {
				s, err := structpb.NewStruct(tt.pc)
				if err != nil {
					t.Fatal(err)
				}
				p.Spec.Template.PlatformConfig = s
			}
			got, err := remote.SandboxFromProto(p)
			if tt.wantErr != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != tt.wantErr {
					t.Fatalf("SandboxFromProto() error = %v, want InvalidArgument %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("SandboxFromProto() error = %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("SandboxFromProto() (-want +got):\n%s", diff)
			}
		})
	}
}

// TestServedDriverRefusesUnsupportedServiceAccount checks a driver served
// over the socket refuses template.service_account_name when it lacks the
// ServiceAccountSelector ability, as the gateway does in process.
func TestServedDriverRefusesUnsupportedServiceAccount(t *testing.T) {
	f := &fakeDriver{}
	d := serve(t, f)
	sb := compute.Sandbox{ID: "i", Name: "n", Spec: compute.Spec{Template: compute.Template{ServiceAccountName: "sa"}}}
	const want = "template.service_account_name is not supported by the fake compute driver (it does not select ServiceAccounts)"
	for op, call := range map[string]func() error{
		"ValidateCreate": func() error { return d.ValidateCreate(t.Context(), sb) },
		"Create":         func() error { return d.Create(t.Context(), sb) },
	} {
		if err := call(); !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != want {
			t.Errorf("%s() error = %v, want InvalidArgument %q", op, err, want)
		}
	}
	if len(f.created) != 0 {
		t.Errorf("driver created %d sandboxes, want none", len(f.created))
	}
}

// TestBootstrapNotServed checks a served driver without the bootstrap
// ability gives the gateway no bootstrap authenticator.
func TestBootstrapNotServed(t *testing.T) {
	d := serve(t, &fakeDriver{})
	a, err := d.BootstrapAuthenticator(t.Context())
	if a != nil || err != nil {
		t.Errorf("BootstrapAuthenticator() = %v, %v, want nil, nil", a, err)
	}
}

// TestAdoptionEnabledNotServed checks a served driver that cannot adopt
// answers the AdoptionEnabled probe with Unimplemented, which the gateway
// reads as "no adoption here".
func TestAdoptionEnabledNotServed(t *testing.T) {
	if err := serve(t, &fakeDriver{}).AdoptionEnabled(t.Context()); !errors.Is(err, errdefs.ErrUnimplemented) {
		t.Errorf("AdoptionEnabled(no Adopter) = %v, want Unimplemented", err)
	}
	if err := serve(t, &adoptingDriver{}).AdoptionEnabled(t.Context()); err != nil {
		t.Errorf("AdoptionEnabled(Adopter) = %v, want nil", err)
	}
}

// TestSandboxViewSkipsUnknownPlatformConfig checks a driver's report of a
// sandbox (get, list, watch) is not refused for platform_config keys this
// side does not know: there they describe, they do not ask.
func TestSandboxViewSkipsUnknownPlatformConfig(t *testing.T) {
	pc, err := structpb.NewStruct(map[string]any{"gpu_device": "0", "runtime_class_name": "gvisor", "user_namespaces": "yes"})
	if err != nil {
		t.Fatal(err)
	}
	p := &computev1.DriverSandbox{Id: "i", Name: "n", Spec: &computev1.DriverSandboxSpec{Template: &computev1.DriverSandboxTemplate{PlatformConfig: pc}}}
	got, err := remote.SandboxViewFromProto(p)
	want := compute.Sandbox{ID: "i", Name: "n", Spec: compute.Spec{Template: compute.Template{RuntimeClassName: "gvisor"}}}
	if err != nil {
		t.Fatalf("SandboxViewFromProto() error = %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SandboxViewFromProto() (-want +got):\n%s", diff)
	}
	if _, err := remote.SandboxFromProto(p); !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != "platform_config.gpu_device is not supported" {
		t.Errorf("SandboxFromProto() error = %v, want InvalidArgument for the first unknown key", err)
	}
}
