package compute_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

type fakeDriver struct{ compute.Driver }

func (fakeDriver) Capabilities(context.Context) (compute.Capabilities, error) {
	return compute.Capabilities{DriverName: "fake"}, nil
}

func TestRegistry(t *testing.T) {
	r := compute.NewRegistry()
	var gotDeps compute.FactoryDeps
	r.Register("fake", func(cfg map[string]any, deps compute.FactoryDeps) (compute.Driver, error) {
		gotDeps = deps
		if cfg["fail"] == true {
			return nil, errdefs.InvalidArgument("bad config")
		}
		return fakeDriver{}, nil
	})
	d, err := r.New("fake", nil, compute.FactoryDeps{StateDir: "/x"})
	if err != nil {
		t.Fatalf("New(fake) error = %v", err)
	}
	if caps, _ := d.Capabilities(t.Context()); caps.DriverName != "fake" {
		t.Errorf("Capabilities().DriverName = %q, want fake", caps.DriverName)
	}
	if gotDeps.StateDir != "/x" || gotDeps.Logger == nil {
		t.Errorf("factory deps = %+v, want StateDir /x and a non-nil logger", gotDeps)
	}
	if _, err := r.New("fake", map[string]any{"fail": true}, compute.FactoryDeps{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("New(fake, fail) error = %v, want InvalidArgument", err)
	}
	if _, err := r.New("nope", nil, compute.FactoryDeps{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("New(nope) error = %v, want InvalidArgument", err)
	}

	t.Run("duplicate panics", func(t *testing.T) {
		defer func() {
			if recover() == nil {
				t.Error("Register(fake) twice did not panic")
			}
		}()
		r.Register("fake", func(map[string]any, compute.FactoryDeps) (compute.Driver, error) { return nil, nil })
	})

	t.Run("register for test", func(t *testing.T) {
		r.RegisterForTest(t, "other", func(map[string]any, compute.FactoryDeps) (compute.Driver, error) { return fakeDriver{}, nil })
		if diff := cmp.Diff([]string{"fake", "other"}, r.Names()); diff != "" {
			t.Errorf("Names() (-want +got):\n%s", diff)
		}
	})
	if diff := cmp.Diff([]string{"fake"}, r.Names()); diff != "" {
		t.Errorf("Names() after cleanup (-want +got):\n%s", diff)
	}
}
