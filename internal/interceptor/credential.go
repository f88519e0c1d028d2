package interceptor

import (
	"context"
	"sync"
	"time"
)

// TokenMinter mints the gateway's extension tokens
// (sandboxjwt.Issuer.MintExtension).
type TokenMinter interface {
	MintExtension(audience string, ttl time.Duration) (token string, expiresAt time.Time, err error)
}

// Lifetime of the extension tokens the gateway sends to interceptors, and
// how long before expiry a cached token is replaced.
const (
	extensionTokenTTL     = 5 * time.Minute
	extensionTokenRefresh = time.Minute
)

// extensionCredential attaches "authorization: Bearer <extension token>"
// for one interceptor's audience to every call, reusing the token until it
// is within extensionTokenRefresh of expiry. The token is never logged.
type extensionCredential struct {
	minter   TokenMinter
	audience string
	now      func() time.Time

	mu      sync.Mutex
	token   string
	expires time.Time
}

func (c *extensionCredential) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token == "" || c.now().Add(extensionTokenRefresh).After(c.expires) {
		tok, exp, err := c.minter.MintExtension(c.audience, extensionTokenTTL)
		if err != nil {
			return nil, err
		}
		c.token, c.expires = tok, exp
	}
	return map[string]string{"authorization": "Bearer " + c.token}, nil
}

// RequireTransportSecurity is false: unix:// endpoints carry the token
// without TLS, as in OpenShell. http:// endpoints get no credential at all.
func (c *extensionCredential) RequireTransportSecurity() bool { return false }
