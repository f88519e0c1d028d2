package postgres_test

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/postgres"
	"github.com/openshell-go/openshell/internal/store/postgres/postgrestest"
	"github.com/openshell-go/openshell/internal/store/storetest"
)

var (
	adminURL    = postgrestest.AdminURL
	newDatabase = postgrestest.NewDatabase
)

func openStore(t testing.TB, dbURL string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(t.Context(), dbURL, postgres.Options{})
	if err != nil {
		t.Fatalf("postgres.Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	adminURL(t)
	storetest.Run(t, func(t testing.TB) store.Store { return openStore(t, newDatabase(t)) })
}

// Two replicas on one database racing the same compare-and-swap: exactly
// one wins each round.
func TestTwoReplicasRaceCAS(t *testing.T) {
	dbURL := newDatabase(t)
	replicas := []*postgres.Store{openStore(t, dbURL), openStore(t, dbURL)}
	ctx := t.Context()
	if _, err := replicas[0].Create(ctx, store.TypeSandbox, storetest.Sandbox("sb", "default", "sb", nil)); err != nil {
		t.Fatal(err)
	}
	for round := uint64(1); round <= 25; round++ {
		var start, done sync.WaitGroup
		start.Add(1)
		errs := make([]error, len(replicas))
		for i, r := range replicas {
			done.Go(func() {
				sb := &openshellv1.Sandbox{}
				if err := r.Get(ctx, store.TypeSandbox, "sb", sb); err != nil {
					errs[i] = err
					return
				}
				sb.Spec.LogLevel = fmt.Sprintf("replica-%d-round-%d", i, round)
				start.Wait()
				_, errs[i] = r.Update(ctx, store.TypeSandbox, sb, round)
			})
		}
		start.Done()
		done.Wait()
		wins := 0
		for _, err := range errs {
			switch {
			case err == nil:
				wins++
			case errors.Is(err, errdefs.ErrConflict):
				storetest.WantCode(t, err, codes.Aborted)
			default:
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if wins != 1 {
			t.Fatalf("round %d: %d winners (%v), want exactly 1", round, wins, errs)
		}
	}
}

// A connection killed in the middle of a policy revision leaves nothing
// of it behind.
func TestKilledConnectionRollsBackRevision(t *testing.T) {
	dbURL := newDatabase(t)
	s := openStore(t, dbURL)
	ctx := t.Context()
	if _, err := s.Create(ctx, store.TypeSandbox, storetest.Sandbox("sb", "default", "sb", nil)); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	dbName := strings.TrimPrefix(must(url.Parse(dbURL)).Path, "/")
	killed := 0
	_, err = s.CommitPolicyRevision(ctx, store.PolicyRevision{
		Revision:        store.Record{Type: store.TypeSandboxPolicy, Scope: "sb", Status: "pending", Payload: []byte("p")},
		Backfill:        &store.Record{Status: "loaded"},
		Project:         &store.Projection{Type: store.TypeSandbox, ID: "sb", Msg: &openshellv1.Sandbox{}, Mutate: store.SetAnnotations(map[string]string{"k": "v"})},
		SupersedeStatus: "superseded",
		Fault: func(step string) error {
			if step != "project" {
				return nil
			}
			// The store's transaction connection is idle in transaction now.
			rows, err := admin.Query(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = $1 AND pid <> pg_backend_pid() AND state = 'idle in transaction'`, dbName)
			if err != nil {
				return err
			}
			for rows.Next() {
				killed++
			}
			return rows.Err()
		},
	})
	if killed != 1 {
		t.Fatalf("terminated %d backends, want 1", killed)
	}
	if err == nil {
		t.Fatal("CommitPolicyRevision succeeded on a killed connection")
	}
	t.Logf("commit on killed connection: %v", err)
	recs, err := s.ListScoped(ctx, store.TypeSandboxPolicy, "sb", 0, 0)
	if err != nil || len(recs) != 0 {
		t.Fatalf("after killed transaction: %d records (%v), want none", len(recs), err)
	}
	sb := &openshellv1.Sandbox{}
	if err := s.Get(ctx, store.TypeSandbox, "sb", sb); err != nil || sb.GetMetadata().GetResourceVersion() != 1 || len(sb.GetMetadata().GetAnnotations()) != 0 {
		t.Fatalf("sandbox after killed transaction: %v, %v; want untouched", sb.GetMetadata(), err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestOpenUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	const password = "sup3r-s3cret-pw"
	_, err = postgres.Open(t.Context(), "postgres://gw:"+password+"@"+addr+"/openshell?sslmode=disable&connect_timeout=5", postgres.Options{})
	storetest.WantCode(t, err, codes.Unavailable)
	if !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("error %q does not name %s and the reason", err, addr)
	}
	if strings.Contains(err.Error(), password) {
		t.Fatalf("error %q leaks the password", err)
	}
}

func TestOpenWrongPassword(t *testing.T) {
	u, err := url.Parse(adminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	const password = "definitely-wrong-pw"
	u.User = url.UserPassword(u.User.Username(), password)
	_, err = postgres.Open(t.Context(), u.String(), postgres.Options{})
	storetest.WantCode(t, err, codes.Unavailable)
	if !strings.Contains(err.Error(), u.Host) || !strings.Contains(err.Error(), "password authentication failed") || strings.Contains(err.Error(), password) {
		t.Fatalf("error = %q, want host, reason and no password", err)
	}
}

func TestOpenBadURL(t *testing.T) {
	_, err := postgres.Open(t.Context(), "postgres://gw:pw@127.0.0.1:notaport/db", postgres.Options{})
	storetest.WantCode(t, err, codes.InvalidArgument)
	if strings.Contains(err.Error(), ":pw@") {
		t.Fatalf("error %q leaks the password", err)
	}
}
