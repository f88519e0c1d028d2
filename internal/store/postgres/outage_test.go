package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/postgres"
	"github.com/openshell-go/openshell/internal/store/postgres/postgrestest"
)

// TestOutageIsUnavailableWithoutConnectionDetails stops a real cluster
// under an open store: every call fails with errdefs.ErrUnavailable whose
// client message (after the gRPC conversion) is "database unavailable" and
// names no user, database or address; Ping fails the same way; once the
// cluster is back the same store works again.
func TestOutageIsUnavailableWithoutConnectionDetails(t *testing.T) {
	pg := postgrestest.Start(t)
	st, err := postgres.Open(t.Context(), pg.URL, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	sb := &openshellv1.Sandbox{Metadata: &datamodelv1.ObjectMeta{Id: "sb-1", Name: "one", Workspace: "default"}}
	if _, err := st.Create(t.Context(), store.TypeSandbox, sb); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{u.User.Username(), strings.TrimPrefix(u.Path, "/"), u.Host, u.Port()}

	pg.Stop(t)
	calls := []struct {
		name string
		call func(context.Context) error
	}{
		{"Get", func(ctx context.Context) error { return st.Get(ctx, store.TypeSandbox, "sb-1", &openshellv1.Sandbox{}) }},
		{"List", func(ctx context.Context) error {
			_, err := st.List(ctx, store.TypeSandbox, store.ListOptions{})
			return err
		}},
		{"Create", func(ctx context.Context) error {
			_, err := st.Create(ctx, store.TypeSandbox, &openshellv1.Sandbox{Metadata: &datamodelv1.ObjectMeta{Id: "sb-2", Name: "two", Workspace: "default"}})
			return err
		}},
		{"Ping", st.Ping},
	}
	// Twice: the first round meets the pool's broken connections, the
	// second dials anew.
	for round := range 2 {
		for _, c := range calls {
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			err := c.call(ctx)
			cancel()
			if !errors.Is(err, errdefs.ErrUnavailable) {
				t.Errorf("round %d: %s during outage = %v, want ErrUnavailable", round, c.name, err)
				continue
			}
			msg := status.Convert(errdefs.ToGRPC(err)).Message()
			if msg != "database unavailable" {
				t.Errorf("round %d: %s during outage: client message %q, want %q", round, c.name, msg, "database unavailable")
			}
			for _, s := range secrets {
				if s != "" && strings.Contains(err.Error(), s) {
					t.Errorf("round %d: %s during outage: error %q names %q", round, c.name, err, s)
				}
			}
		}
	}

	pg.Resume(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := st.Get(t.Context(), store.TypeSandbox, "sb-1", &openshellv1.Sandbox{})
		if err == nil && st.Ping(t.Context()) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Get after the database came back = %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
