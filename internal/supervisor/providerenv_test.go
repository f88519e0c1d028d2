package supervisor

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
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
	c.ids = append(c.ids, req.GetSandboxId())
	return c.resp, nil
}

func (c *envClient) set(rev uint64, env map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resp = &openshellv1.GetSandboxProviderEnvironmentResponse{ProviderEnvRevision: rev, Environment: env}
}

// TestProviderEnvironment: placeholders join the base environment, replace
// a same-named entry, give way to the egress proxy's variables, and a refresh picks up a new revision for processes
// started afterwards.
func TestProviderEnvironment(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &envClient{}
		c.set(7, map[string]string{"GITHUB_TOKEN": "openshell:resolve:env:GITHUB_TOKEN"})
		p := &providerEnv{}
		if _, err := p.fetch(t.Context(), c, "sb-1"); err != nil {
			t.Fatal(err)
		}
		got := overlay([]string{"PATH=/bin", "GITHUB_TOKEN=from-image"}, p.list())
		want := []string{"PATH=/bin", "GITHUB_TOKEN=openshell:resolve:env:GITHUB_TOKEN"}
		if !slices.Equal(got, want) {
			t.Errorf("environ = %q, want %q", got, want)
		}

		c.set(7, map[string]string{"GITHUB_TOKEN": "p", "HTTP_PROXY": "provider-value"})
		if _, err := p.fetch(t.Context(), c, "sb-1"); err != nil {
			t.Fatal(err)
		}
		got = overlay(p.list(), []string{"HTTP_PROXY=http://10.0.0.1:3128"})
		if want := []string{"GITHUB_TOKEN=p", "HTTP_PROXY=http://10.0.0.1:3128"}; !slices.Equal(got, want) {
			t.Errorf("provider list under the egress variables = %q, want %q", got, want)
		}

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.refreshLoop(ctx, slog.New(slog.DiscardHandler), c, "sb-1", time.Minute)
		}()
		c.set(8, map[string]string{"GH_TOKEN": "openshell:resolve:env:GH_TOKEN"})
		time.Sleep(time.Minute) // fake clock: exactly one tick
		synctest.Wait()
		got = overlay([]string{"PATH=/bin"}, p.list())
		if want := []string{"PATH=/bin", "GH_TOKEN=openshell:resolve:env:GH_TOKEN"}; !slices.Equal(got, want) {
			t.Errorf("environ after refresh = %q, want %q", got, want)
		}
		cancel()
		<-done
		c.mu.Lock()
		defer c.mu.Unlock()
		if !slices.Equal(c.ids, []string{"sb-1", "sb-1", "sb-1"}) {
			t.Errorf("calls for sandbox ids %q, want three for sb-1", c.ids)
		}
	})
}
