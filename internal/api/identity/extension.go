package identity

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// ExtensionServices returns the supervisor middleware services the
// effective policy of sandboxID selects.
type ExtensionServices func(ctx context.Context, sandboxID string) ([]*sandboxv1.SupervisorMiddlewareService, error)

// ExtensionMinter is the optional ability of a TokenMinter to mint
// supervisor extension tokens (sandboxjwt.Issuer).
type ExtensionMinter interface {
	MintSupervisorExtension(audience, sandboxID string, ttl time.Duration) (token string, expiresAt time.Time, err error)
	// TTL is the sandbox token lifetime; 0 = tokens that never expire.
	TTL() time.Duration
}

// OpenShell's bounds on extension credentials.
const (
	maxExtensionCredentials  = 64
	defaultExtensionTokenTTL = 15 * time.Minute
	maxExtensionTokenTTL     = time.Hour
	mintWindow               = time.Minute
	mintsPerWindow           = 10
)

// extensionCredentials mints one caller_kind supervisor token per name for
// sandboxID, refusing the whole request on the first name that is not
// selected by the sandbox's policy or opted out of authentication.
// Resolving the policy has a cost, so each sandbox may ask mintsPerWindow
// times per mintWindow.
func (s *Service) extensionCredentials(ctx context.Context, sandboxID string, names []string) ([]*openshellv1.ExtensionServiceCredential, error) {
	if !s.limiter.allow(sandboxID) {
		return nil, errdefs.ResourceExhausted("extension credential minting rate limit exceeded for this sandbox")
	}
	if len(names) > maxExtensionCredentials {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("at most %d extension credentials may be requested", maxExtensionCredentials))
	}
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if n == "" {
			return nil, errdefs.InvalidArgument("extension service names must not be empty")
		}
		if seen[n] {
			return nil, errdefs.InvalidArgument(fmt.Sprintf("duplicate extension service name '%s'", n))
		}
		seen[n] = true
	}
	var services []*sandboxv1.SupervisorMiddlewareService
	if s.o.ExtensionServices != nil {
		var err error
		if services, err = s.o.ExtensionServices(ctx, sandboxID); err != nil {
			return nil, err
		}
	}
	byName := make(map[string]*sandboxv1.SupervisorMiddlewareService, len(services))
	for _, svc := range services {
		byName[svc.GetName()] = svc
	}
	em, _ := s.o.Minter.(ExtensionMinter)
	creds := make([]*openshellv1.ExtensionServiceCredential, 0, len(names))
	for _, n := range names {
		svc, ok := byName[n]
		if !ok {
			return nil, errdefs.PermissionDenied(fmt.Sprintf("extension service '%s' is not selected by the sandbox policy", n))
		}
		if svc.GetAllowInsecureTransport() {
			return nil, errdefs.FailedPrecondition(fmt.Sprintf("extension service '%s' opted out of extension authentication; no credential is minted for it", n))
		}
		if err := checkAudience(svc.GetAudience()); err != nil {
			return nil, err
		}
		if em == nil {
			return nil, errdefs.Unavailable("extension credential minting is not configured on this gateway")
		}
		tok, exp, err := em.MintSupervisorExtension(svc.GetAudience(), sandboxID, extensionTTL(em.TTL()))
		if err != nil {
			return nil, fmt.Errorf("mint extension credential for %q: %w", n, err)
		}
		creds = append(creds, &openshellv1.ExtensionServiceCredential{ServiceName: n, Token: tok, ExpiresAtMs: exp.Unix() * 1000}) // the exp claim, in ms
	}
	return creds, nil
}

// extensionTTL is the lifetime of an extension credential: the sandbox
// token's, capped at an hour; 15 minutes when sandbox tokens never expire.
func extensionTTL(sandboxTTL time.Duration) time.Duration {
	if sandboxTTL <= 0 {
		return defaultExtensionTokenTTL
	}
	return min(sandboxTTL, maxExtensionTokenTTL)
}

// checkAudience applies OpenShell's rules for an extension audience.
func checkAudience(a string) error {
	switch {
	case a == "":
		return errdefs.FailedPrecondition("extension audience must not be empty")
	case strings.TrimSpace(a) != a:
		return errdefs.FailedPrecondition("extension audience must not have leading or trailing whitespace")
	case strings.IndexFunc(a, unicode.IsControl) >= 0:
		return errdefs.FailedPrecondition("extension audience must not contain control characters")
	}
	return nil
}

// mintLimiter allows each sandbox max requests per fixed window. It is
// safe for concurrent use.
type mintLimiter struct {
	window time.Duration
	max    int
	now    func() time.Time

	mu      sync.Mutex
	windows map[string]*mintWindowState
}

type mintWindowState struct {
	started time.Time
	count   int
}

// pruneAbove is the number of tracked sandboxes above which expired
// windows are dropped.
const pruneAbove = 1024

func newMintLimiter(window time.Duration, limit int, now func() time.Time) *mintLimiter {
	return &mintLimiter{window: window, max: limit, now: now, windows: map[string]*mintWindowState{}}
}

func (l *mintLimiter) allow(sandboxID string) bool {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.windows) >= pruneAbove {
		for id, w := range l.windows {
			if now.Sub(w.started) >= l.window {
				delete(l.windows, id)
			}
		}
	}
	w := l.windows[sandboxID]
	if w == nil || now.Sub(w.started) >= l.window {
		w = &mintWindowState{started: now}
		l.windows[sandboxID] = w
	}
	if w.count >= l.max {
		return false
	}
	w.count++
	return true
}
