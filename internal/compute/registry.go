package compute

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/openshell-go/openshell/internal/errdefs"
)

// FactoryDeps are the gateway facilities a driver factory may use.
type FactoryDeps struct {
	// Logger is the gateway logger; factories scope it
	// (logger.With("component", "compute/<name>")). Never nil when the
	// gateway calls a factory; factories treat nil as slog.DiscardHandler.
	Logger *slog.Logger
	// StateDir is the gateway state directory; drivers keep their own
	// state under it.
	StateDir string
	// GatewayEndpoint is the callback endpoint sandboxes dial, e.g.
	// "unix:///run/openshell/sandbox.sock" or "http://127.0.0.1:17670".
	GatewayEndpoint string
	// SupervisorPath is the openshell-sandbox supervisor binary; empty
	// lets the driver find it.
	SupervisorPath string
	// SupervisorEnv is added to each supervisor's environment (the
	// gateway's OTLP settings, internal/telemetry.SupervisorEnv); a
	// sandbox spec cannot override it. Nil adds nothing.
	SupervisorEnv map[string]string
}

// Factory builds a driver from its configuration block
// ([openshell.drivers.<name>]) as decoded TOML/JSON. Factories reject
// unknown keys with errdefs.ErrInvalidArgument.
type Factory func(cfg map[string]any, deps FactoryDeps) (Driver, error)

// Registry maps driver names to factories. The gateway builds one registry
// in one file of its main package; adding a driver is a one-line diff
// there. A Registry is safe for concurrent use.
type Registry struct {
	mu        sync.RWMutex
	factories map[string]Factory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{factories: make(map[string]Factory)}
}

// Register adds a factory. It panics when name is empty, factory is nil or
// name is already registered: those are programming errors in the wiring.
func (r *Registry) Register(name string, factory Factory) {
	if name == "" || factory == nil {
		panic("compute: Register with empty name or nil factory")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.factories[name]; dup {
		panic(fmt.Sprintf("compute: driver %q registered twice", name))
	}
	r.factories[name] = factory
}

// Cleanuper is the part of testing.TB that RegisterForTest needs.
type Cleanuper interface {
	Helper()
	Cleanup(func())
}

// RegisterForTest registers factory under name for the duration of a test,
// replacing any existing registration, and restores the previous state at
// cleanup.
func (r *Registry) RegisterForTest(t Cleanuper, name string, factory Factory) {
	t.Helper()
	r.mu.Lock()
	prev, had := r.factories[name]
	r.factories[name] = factory
	r.mu.Unlock()
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if had {
			r.factories[name] = prev
		} else {
			delete(r.factories, name)
		}
	})
}

// New builds the driver registered as name. An unknown name is
// errdefs.ErrInvalidArgument; factory errors pass through.
func (r *Registry) New(name string, cfg map[string]any, deps FactoryDeps) (Driver, error) {
	r.mu.RLock()
	f, ok := r.factories[name]
	r.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("compute driver %q is not registered (known: %v): %w", name, r.Names(), errdefs.ErrInvalidArgument)
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	return f(cfg, deps)
}

// Names lists the registered driver names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.factories))
	for n := range r.factories {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
