package docker

import (
	"errors"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/google/go-cmp/cmp"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

func TestResources(t *testing.T) {
	pids := int64(64)
	for _, tc := range []struct {
		name string
		in   compute.Resources
		pids int64
		want container.Resources
	}{
		{"none", compute.Resources{}, 0, container.Resources{}},
		{"cpu and memory", compute.Resources{CPURequest: "500m", CPULimit: "2", MemoryRequest: "256Mi", MemoryLimit: "1Gi"}, 0,
			container.Resources{CPUShares: 512, NanoCPUs: 2_000_000_000, MemoryReservation: 256 << 20, Memory: 1 << 30}},
		{"gpus and pids", compute.Resources{GPUs: 2}, 64,
			container.Resources{PidsLimit: &pids, DeviceRequests: []container.DeviceRequest{{Count: 2, Capabilities: [][]string{{"gpu"}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resources(tc.in, tc.pids)
			if err != nil {
				t.Fatalf("resources(%+v) error = %v", tc.in, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("resources(%+v) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
	for _, bad := range []compute.Resources{
		{CPULimit: "lots"}, {MemoryLimit: "-1Gi"}, {CPULimit: "5m"}, {MemoryLimit: "1Mi"},
		{CPURequest: "2", CPULimit: "1"}, {MemoryRequest: "2Gi", MemoryLimit: "1Gi"},
	} {
		if _, err := resources(bad, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("resources(%+v) error = %v, want InvalidArgument", bad, err)
		}
	}
}
