// Package open selects a store backend from a URL. It is the only package
// that imports both backends.
package open

import (
	"context"
	"log/slog"
	"strings"

	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/postgres"
	"github.com/openshell-go/openshell/internal/store/sqlite"
)

// Open opens the store named by url:
//
//	sqlite:/path/to/gateway.db   (also sqlite:///path, sqlite:relative.db)
//	sqlite::memory:              in-memory, for tests
//	postgres://user:pass@host:port/db?sslmode=...   (or postgresql://)
//
// An unknown scheme is errdefs.ErrInvalidArgument; an unreachable
// PostgreSQL is errdefs.ErrUnavailable.
func Open(ctx context.Context, url string, logger *slog.Logger) (store.Store, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case strings.HasPrefix(url, "sqlite:"):
		path := strings.TrimPrefix(url, "sqlite:")
		path = strings.TrimPrefix(path, "//")
		if path == "" {
			return nil, errdefs.InvalidArgument("sqlite store url needs a path, e.g. sqlite:/var/lib/openshell/gateway.db")
		}
		return sqlite.Open(ctx, path, sqlite.Options{Logger: logger})
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		return postgres.Open(ctx, url, postgres.Options{Logger: logger})
	}
	scheme, _, ok := strings.Cut(url, ":")
	if !ok {
		scheme = ""
	}
	return nil, errdefs.InvalidArgument("unsupported store url scheme " + `"` + scheme + `"` + ": want sqlite: or postgres://")
}
