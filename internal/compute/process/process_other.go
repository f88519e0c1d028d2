//go:build !linux

package process

import (
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Name is the driver's registry name.
const Name = "process"

// New is the compute.Factory for the process driver; it needs Linux.
func New(map[string]any, compute.FactoryDeps) (compute.Driver, error) {
	return nil, errdefs.FailedPrecondition("the process driver needs Linux")
}
