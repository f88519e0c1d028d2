// Package mtls authenticates users by their verified TLS client
// certificate: the subject CN becomes the principal's subject and the OU
// values its roles. A client certificate never grants sandbox identity.
package mtls

import (
	"context"

	"github.com/openshell-go/openshell/internal/auth"
)

// Authenticator maps a verified client certificate to a user principal.
// The zero value is ready to use and safe for concurrent use.
type Authenticator struct{}

var _ auth.Authenticator = Authenticator{}

// Authenticate implements auth.Authenticator. Requests without a verified
// client certificate (or with an empty CN) fall through.
func (Authenticator) Authenticate(_ context.Context, req *auth.Request) (*auth.Principal, error) {
	if len(req.PeerCertificates) == 0 {
		return nil, nil
	}
	leaf := req.PeerCertificates[0]
	if leaf.Subject.CommonName == "" {
		return nil, nil
	}
	return &auth.Principal{
		Kind:        auth.KindUser,
		Source:      auth.SourceMTLS,
		Subject:     leaf.Subject.CommonName,
		DisplayName: leaf.Subject.CommonName,
		Roles:       append([]string(nil), leaf.Subject.OrganizationalUnit...),
	}, nil
}
