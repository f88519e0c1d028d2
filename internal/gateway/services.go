package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/openshell-go/openshell/internal/api/services"
	"github.com/openshell-go/openshell/internal/config"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// serviceURLs returns where sandbox services are served: the wildcard DNS
// names of the server certificate ("*.example.com" accepts
// "<sandbox>--<service>.example.com"), plus openshell.localhost when the
// gateway is bound to loopback. URLs use http when the gateway has no TLS
// or serves the loopback plaintext service path, https otherwise.
func serviceURLs(cfg *config.Config) (services.URLs, error) {
	u := services.URLs{Scheme: "https", Port: cfg.Port}
	if !cfg.TLS.Enabled || cfg.LoopbackServiceHTTP {
		u.Scheme = "http"
	}
	if cfg.TLS.Enabled {
		pair, err := tls.LoadX509KeyPair(cfg.TLS.CertPath, cfg.TLS.KeyPath)
		if err != nil {
			return u, fmt.Errorf("tls server certificate %s: %w", cfg.TLS.CertPath, err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			return u, fmt.Errorf("tls server certificate %s: %w", cfg.TLS.CertPath, err)
		}
		u.Domains = wildcardDomains(leaf.DNSNames)
	}
	if ip := net.ParseIP(cfg.BindAddress); ip != nil && ip.IsLoopback() && !slices.Contains(u.Domains, services.LocalDomain) {
		// Browsers resolve *.localhost to loopback; keep it first so
		// that printed URLs work without DNS.
		u.Domains = append([]string{services.LocalDomain}, u.Domains...)
	}
	return u, nil
}

// checkServiceLogin refuses the browser login of service URLs on a
// gateway that serves no service host: the setting would do nothing.
func checkServiceLogin(cfg *config.Config, u services.URLs) error {
	if cfg.OIDC.LoginClientID != "" && len(u.Domains) == 0 {
		return errdefs.InvalidArgument("--oidc-login-client-id: this gateway serves no service URLs (its server certificate has no wildcard DNS name and it is not bound to loopback), so the browser login would never be used")
	}
	return nil
}

// wildcardDomains returns the domains of "*.<domain>" names, in order.
func wildcardDomains(names []string) []string {
	var out []string
	for _, n := range names {
		if d, ok := strings.CutPrefix(strings.ToLower(n), "*."); ok && d != "" && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}
