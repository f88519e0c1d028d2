package lifecycle

import (
	"context"

	"github.com/openshell-go/openshell/internal/compute"
)

// ApplyEventForTest hands ev to e as its driver watch would.
func ApplyEventForTest(ctx context.Context, e *Engine, ev compute.Event) { e.apply(ctx, ev) }

// EngineMapsForTest reports how many gates and tracked sandboxes e holds.
func EngineMapsForTest(e *Engine) (gates, states int) { return engineMaps(e) }
