package gateway

import (
	"errors"
	"testing"

	"github.com/openshell-go/openshell/internal/api/services"
	"github.com/openshell-go/openshell/internal/config"
	"github.com/openshell-go/openshell/internal/errdefs"
)

func TestCheckServiceLogin(t *testing.T) {
	login := &config.Config{OIDC: config.OIDC{Issuer: "https://idp.example", LoginClientID: "web"}}
	none := &config.Config{OIDC: config.OIDC{Issuer: "https://idp.example"}}
	domains := services.URLs{Domains: []string{"apps.example.com"}}
	for _, tt := range []struct {
		name  string
		cfg   *config.Config
		urls  services.URLs
		fails bool
	}{
		{"login with a service domain", login, domains, false},
		{"login without any service domain", login, services.URLs{}, true},
		{"no login, no service domain", none, services.URLs{}, false},
	} {
		err := checkServiceLogin(tt.cfg, tt.urls)
		if (err != nil) != tt.fails || (err != nil && !errors.Is(err, errdefs.ErrInvalidArgument)) {
			t.Errorf("%s: checkServiceLogin() = %v, want failure %v", tt.name, err, tt.fails)
		}
	}
}
