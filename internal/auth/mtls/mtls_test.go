package mtls

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"slices"
	"testing"

	"github.com/openshell-go/openshell/internal/auth"
)

func TestAuthenticate(t *testing.T) {
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: "openshell-client", OrganizationalUnit: []string{"openshell-user", "ops"}}}
	p, err := Authenticator{}.Authenticate(t.Context(), &auth.Request{PeerCertificates: []*x509.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != auth.KindUser || p.IsSandbox() || p.Subject != "openshell-client" || p.Source != auth.SourceMTLS ||
		!slices.Equal(p.Roles, []string{"openshell-user", "ops"}) {
		t.Errorf("Authenticate() = %+v", p)
	}
	for name, r := range map[string]*auth.Request{
		"no certificate": {},
		"empty CN":       {PeerCertificates: []*x509.Certificate{{}}},
	} {
		if p, err := (Authenticator{}).Authenticate(t.Context(), r); p != nil || err != nil {
			t.Errorf("%s: Authenticate() = %v, %v, want (nil, nil)", name, p, err)
		}
	}
}
