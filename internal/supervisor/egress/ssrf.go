package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Resolver resolves a host name to addresses. The proxy resolves each
// connection's host exactly once and dials only the addresses it checked.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// metadataNames are cloud instance metadata host names: denied by name
// before any lookup, whatever they resolve to.
var metadataNames = map[string]bool{
	"metadata.google.internal":   true,
	"metadata.goog":              true,
	"metadata":                   true,
	"instance-data":              true,
	"instance-data.ec2.internal": true,
	"metadata.azure.com":         true,
	"metadata.packet.net":        true,
}

// internalRanges are the destinations an endpoint must name in allowed_ips
// to reach: loopback, link-local (which holds the cloud metadata
// addresses), private, shared, unspecified, multicast and the like.
var internalRanges = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
		"::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8", "64:ff9b::/96", "64:ff9b:1::/48",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// ssrfGuard decides which resolved addresses a connection may reach.
type ssrfGuard struct {
	// own are the gateway's (and supervisor's) own addresses: denied like
	// internal ranges unless allowed_ips names them.
	own []netip.Prefix
}

// check returns nil when every address may be dialed under allowed, or an
// error naming the first one that may not. Hostless endpoints (onlyAllowed)
// reach only addresses inside allowed.
func (g *ssrfGuard) check(addrs []netip.Addr, allowed []netip.Prefix, onlyAllowed bool) error {
	for _, a := range addrs {
		a = a.Unmap()
		if inAny(allowed, a) {
			continue
		}
		if onlyAllowed {
			return fmt.Errorf("address %s is outside the endpoint's allowed_ips", a)
		}
		if inAny(g.own, a) {
			return fmt.Errorf("address %s is the gateway's own and not in the endpoint's allowed_ips", a)
		}
		if inAny(internalRanges, a) {
			return fmt.Errorf("address %s is internal (loopback, link-local, private or reserved) and not in the endpoint's allowed_ips", a)
		}
	}
	return nil
}

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// resolve turns host into the addresses to check and dial: an IP literal
// as is, a metadata name refused, anything else looked up once.
func resolve(ctx context.Context, r Resolver, host string) ([]netip.Addr, error) {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	if metadataNames[h] {
		return nil, metadataHostError(h)
	}
	addrs, err := r.LookupNetIP(ctx, "ip", h)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", h, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve %s: no addresses", h)
	}
	return addrs, nil
}

// metadataHostError refuses a cloud metadata host name.
type metadataHostError string

func (e metadataHostError) Error() string {
	return "host " + string(e) + " is a cloud metadata service"
}

// StaticResolver maps names to fixed addresses (tests; the supervisor
// accepts it only through its test-only override). Unknown names fail.
type StaticResolver map[string][]netip.Addr

// LookupNetIP implements Resolver.
func (s StaticResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := s[strings.ToLower(host)]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}
