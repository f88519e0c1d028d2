package gateway

import (
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/docker"
	"github.com/openshell-go/openshell/internal/compute/kubernetes"
	"github.com/openshell-go/openshell/internal/compute/process"
)

// drivers is the one place in-tree compute drivers are wired. Adding a
// driver is a one-line change here.
func drivers() *compute.Registry {
	r := compute.NewRegistry()
	r.Register("process", process.New)
	r.Register("docker", docker.New)
	r.Register("kubernetes", kubernetes.New)
	return r
}
