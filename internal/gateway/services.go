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
