package lifecycle

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/structpb"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
)

// saDriver is a fakeDriver with the ServiceAccountSelector ability.
type saDriver struct{ *fakeDriver }

func (saDriver) SelectsServiceAccounts() {}

// TestCreateHandsTypedTemplate checks the public template reaches the
// driver as typed compute.Template fields, and that a ServiceAccount is
// accepted by a driver with the ServiceAccountSelector ability whatever its
// name.
func TestCreateHandsTypedTemplate(t *testing.T) {
	st, d := newMemStore(), newFakeDriver()
	e, err := New(t.Context(), Options{Store: st, Driver: saDriver{d}, DriverName: "custom", Issuer: fakeIssuer{}})
	if err != nil {
		t.Fatal(err)
	}
	userns := true
	gpus := uint32(2)
	res, err := structpb.NewStruct(map[string]any{"limits": map[string]any{"cpu": "2", "memory": "1Gi"}, "requests": map[string]any{"cpu": "500m"}})
	if err != nil {
		t.Fatal(err)
	}
	dc, err := structpb.NewStruct(map[string]any{"custom": map[string]any{"node": "a"}, "other": map[string]any{"x": 1.0}})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := e.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "typed", Spec: &openshellv1.SandboxSpec{
		ResourceRequirements: &openshellv1.ResourceRequirements{Gpu: &openshellv1.GpuResourceRequirements{Count: &gpus}},
		Template: &openshellv1.SandboxTemplate{
			Image: "img", RuntimeClassName: "gvisor", ServiceAccountName: "agent-sa", UserNamespaces: &userns,
			Annotations: map[string]string{"example.com/a": "b"}, Resources: res, DriverConfig: dc,
		},
	}})
	if err != nil {
		t.Fatalf("Create() error = %v", err)
	}
	want := compute.Template{
		Image: "img", RuntimeClassName: "gvisor", ServiceAccountName: "agent-sa", UserNamespaces: &userns,
		Annotations:  map[string]string{"example.com/a": "b"},
		Resources:    compute.Resources{CPURequest: "500m", CPULimit: "2", MemoryLimit: "1Gi", GPUs: 2},
		DriverConfig: map[string]any{"node": "a"},
	}
	if diff := cmp.Diff(want, d.sandboxes[sb.GetMetadata().GetId()].Spec.Template); diff != "" {
		t.Errorf("template handed to the driver (-want +got):\n%s", diff)
	}
}
