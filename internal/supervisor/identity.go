package supervisor

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// tokenSource holds the supervisor's current sandbox JWT and attaches it to
// every call as "authorization: Bearer <jwt>".
type tokenSource struct {
	mu     sync.RWMutex
	token  string
	secure bool // require transport security (TLS endpoints)
}

var _ credentials.PerRPCCredentials = (*tokenSource)(nil)

func (t *tokenSource) get() string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.token
}

func (t *tokenSource) set(tok string) {
	t.mu.Lock()
	t.token = tok
	t.mu.Unlock()
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (t *tokenSource) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok := t.get()
	if tok == "" {
		return nil, nil
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
// Plaintext endpoints (loopback, Unix sockets) are allowed.
func (t *tokenSource) RequireTransportSecurity() bool { return t.secure }

// staticBearer is a one-call credential (the ServiceAccount token during
// the IssueSandboxToken exchange).
type staticBearer string

func (s staticBearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(s)}, nil
}
func (staticBearer) RequireTransportSecurity() bool { return false }

// jwtTimes returns the iat and exp claims of a JWT without verifying it
// (the supervisor only schedules its refresh). Zero means absent.
func jwtTimes(tok string) (iat, exp time.Time) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, time.Time{}
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, time.Time{}
	}
	var c struct {
		Iat int64 `json:"iat"`
		Exp int64 `json:"exp"`
	}
	if json.Unmarshal(raw, &c) != nil {
		return time.Time{}, time.Time{}
	}
	if c.Iat > 0 {
		iat = time.Unix(c.Iat, 0)
	}
	if c.Exp > 0 {
		exp = time.Unix(c.Exp, 0)
	}
	return iat, exp
}

// refreshAt is when a token issued at iat and expiring at exp should be
// refreshed: at 80% of its lifetime. Zero exp never refreshes.
func refreshAt(now, iat, exp time.Time) time.Time {
	if exp.IsZero() {
		return time.Time{}
	}
	if iat.IsZero() || !iat.Before(exp) {
		iat = now
	}
	return iat.Add(exp.Sub(iat) * 8 / 10)
}

// readCredentialFile reads p; a /proc/self/fd/N path handed over by the
// process driver is read from the inherited fd itself (re-opening it would
// check the file's permissions against the sandbox's ids) and then closed.
func readCredentialFile(p string) ([]byte, error) {
	fd := inheritedFD(p)
	if fd < 0 {
		return os.ReadFile(p)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	return io.ReadAll(f)
}

// preloadCredentials reads the token files into cfg (TokenFile wins over
// Token; the ServiceAccount token is only used when neither is set).
func preloadCredentials(cfg *Config) error {
	if cfg.TokenFile != "" {
		b, err := readCredentialFile(cfg.TokenFile)
		if err != nil {
			return fmt.Errorf("read sandbox token file: %w", err)
		}
		cfg.Token = strings.TrimSpace(string(b))
		cfg.TokenFile = ""
	}
	if cfg.Token == "" && cfg.K8sSATokenFile != "" {
		b, err := os.ReadFile(cfg.K8sSATokenFile)
		if err != nil {
			return fmt.Errorf("read service account token file: %w", err)
		}
		cfg.k8sSAToken = strings.TrimSpace(string(b))
		cfg.K8sSATokenFile = ""
	}
	return nil
}

// loadToken resolves the initial sandbox JWT from the preloaded
// configuration, exchanging a ServiceAccount token when that is all there is.
func loadToken(ctx context.Context, cfg *Config, client openshellv1.OpenShellClient) (string, error) {
	switch {
	case cfg.Token != "":
		return cfg.Token, nil
	case cfg.k8sSAToken != "":
		resp, err := client.IssueSandboxToken(ctx, &openshellv1.IssueSandboxTokenRequest{}, grpc.PerRPCCredentials(staticBearer(cfg.k8sSAToken)))
		if err != nil {
			return "", fmt.Errorf("exchange service account token for a sandbox token: %w", err)
		}
		return resp.GetToken(), nil
	}
	return "", nil
}

// refreshLoop refreshes the token at ~80% of its lifetime until ctx ends.
func refreshLoop(ctx context.Context, log *slog.Logger, ts *tokenSource, client openshellv1.OpenShellClient) {
	retry := newBackoff(time.Second, time.Minute)
	for {
		iat, exp := jwtTimes(ts.get())
		at := refreshAt(time.Now(), iat, exp)
		if at.IsZero() {
			return // never expires
		}
		if err := sleepCtx(ctx, time.Until(at)); err != nil {
			return
		}
		for {
			resp, err := client.RefreshSandboxToken(ctx, &openshellv1.RefreshSandboxTokenRequest{})
			if err == nil && resp.GetToken() != "" {
				ts.set(resp.GetToken())
				retry.reset()
				log.Info("sandbox token refreshed")
				break
			}
			if ctx.Err() != nil {
				return
			}
			log.Warn("sandbox token refresh failed", "err", err)
			if err := sleepCtx(ctx, retry.next()); err != nil {
				return
			}
		}
	}
}
