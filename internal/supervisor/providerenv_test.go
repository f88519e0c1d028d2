package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress/placeholder"
)

// envClient answers GetSandboxProviderEnvironment with whatever resp
// holds; every other method of the embedded interface panics.
type envClient struct {
	openshellv1.OpenShellClient
	mu   sync.Mutex
	resp *openshellv1.GetSandboxProviderEnvironmentResponse
	ids  []string
}

func (c *envClient) GetSandboxProviderEnvironment(_ context.Context, req *openshellv1.GetSandboxProviderEnvironmentRequest, _ ...grpc.CallOption) (*openshellv1.GetSandboxProviderEnvironmentResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !req.GetSupportsStaticCredentialBindings() {
		return nil, errors.New("the supervisor did not ask for endpoint-bound credentials")
	}
	c.ids = append(c.ids, req.GetSandboxId())
	return c.resp, nil
}

// set answers with the credentials of env (key: value), each bound to
// api.github.com:443 unless its key is in unbound.
func (c *envClient) set(rev uint64, env map[string]string, unbound ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resp = &openshellv1.GetSandboxProviderEnvironmentResponse{ProviderEnvRevision: rev, Environment: env,
		StaticCredentialBindings: map[string]*openshellv1.StaticCredentialBinding{}}
	for k := range env {
		if !slices.Contains(unbound, k) {
			c.resp.StaticCredentialBindings[k] = &openshellv1.StaticCredentialBinding{
				Endpoints: []*openshellv1.StaticCredentialEndpointBinding{{Host: "api.github.com", Port: 443}}, CredentialIdentity: "p:" + k}
		}
	}
}

// resolves reports what the Authorization header "Bearer <placeholder of
// key>" to api.github.com becomes through p's resolver ("" when refused).
func resolves(t *testing.T, p *providerEnv, key string) string {
	t.Helper()
	req, err := http.NewRequest("GET", "http://api.github.com:443/user", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+placeholder.For(key))
	if st, _, _ := p.creds.Resolve(req, "api.github.com", 443); st != 0 {
		return ""
	}
	return req.Header.Get("Authorization")
}

// TestProviderEnvironment: the supervisor asks for endpoint-bound
// credentials; agent processes get placeholders, never values, which join
// the base environment, replace a same-named entry and give way to the
// egress proxy's variables; the proxy's resolver holds the values; a
// response with a credential bound to no endpoint is refused and the
// previous environment stays; a refresh picks up a new revision.
func TestProviderEnvironment(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &envClient{}
		c.set(7, map[string]string{"GITHUB_TOKEN": "ghp_value"})
		p := newProviderEnv()
		if _, err := p.fetch(t.Context(), c, "sb-1"); err != nil {
			t.Fatal(err)
		}
		got := overlay([]string{"PATH=/bin", "GITHUB_TOKEN=from-image"}, p.list())
		want := []string{"PATH=/bin", "GITHUB_TOKEN=openshell:resolve:env:GITHUB_TOKEN"}
		if !slices.Equal(got, want) {
			t.Errorf("environ = %q, want %q", got, want)
		}
		if got := resolves(t, p, "GITHUB_TOKEN"); got != "Bearer ghp_value" {
			t.Errorf("resolved Authorization = %q, want the value", got)
		}

		c.set(7, map[string]string{"GITHUB_TOKEN": "other", "LOOSE": "no-endpoint"}, "LOOSE")
		if _, err := p.fetch(t.Context(), c, "sb-1"); err == nil || strings.Contains(err.Error(), "no-endpoint") {
			t.Errorf("fetch of a credential without endpoints = %v, want an error naming no value", err)
		}
		if got := resolves(t, p, "GITHUB_TOKEN"); got != "Bearer ghp_value" {
			t.Errorf("after a refused response, Authorization = %q, want the previous value", got)
		}

		c.set(7, map[string]string{"GITHUB_TOKEN": "p", "HTTP_PROXY": "provider-value"})
		if _, err := p.fetch(t.Context(), c, "sb-1"); err != nil {
			t.Fatal(err)
		}
		got = overlay(p.list(), []string{"HTTP_PROXY=http://10.0.0.1:3128"})
		if want := []string{"GITHUB_TOKEN=openshell:resolve:env:GITHUB_TOKEN", "HTTP_PROXY=http://10.0.0.1:3128"}; !slices.Equal(got, want) {
			t.Errorf("provider list under the egress variables = %q, want %q", got, want)
		}

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.refreshLoop(ctx, slog.New(slog.DiscardHandler), c, "sb-1", time.Minute)
		}()
		c.set(8, map[string]string{"GH_TOKEN": "gh_value"})
		time.Sleep(time.Minute) // fake clock: exactly one tick
		synctest.Wait()
		got = overlay([]string{"PATH=/bin"}, p.list())
		if want := []string{"PATH=/bin", "GH_TOKEN=openshell:resolve:env:GH_TOKEN"}; !slices.Equal(got, want) {
			t.Errorf("environ after refresh = %q, want %q", got, want)
		}
		if resolves(t, p, "GITHUB_TOKEN") != "" || resolves(t, p, "GH_TOKEN") != "Bearer gh_value" {
			t.Error("after the refresh the resolver does not hold exactly the new credentials")
		}
		cancel()
		<-done
		c.mu.Lock()
		defer c.mu.Unlock()
		if !slices.Equal(c.ids, []string{"sb-1", "sb-1", "sb-1", "sb-1"}) {
			t.Errorf("calls for sandbox ids %q, want four for sb-1", c.ids)
		}
	})
}
