package providers_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/credentials"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/providers"
	"github.com/openshell-go/openshell/internal/store/open"
)

func keyring(t testing.TB) *credentials.Keyring {
	t.Helper()
	k, err := credentials.LoadOrCreateKEK(filepath.Join(t.TempDir(), "kek"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func secretValue(t testing.TB) string {
	t.Helper()
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "ghp_" + hex.EncodeToString(b[:])
}

func githubProvider(name, token string) *datamodelv1.Provider {
	return &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: name}, Type: "github",
		Credentials: map[string]string{"GITHUB_TOKEN": token},
	}
}

// checkRoundTrip creates, updates and resolves a provider through s and
// returns its id.
func checkRoundTrip(t *testing.T, s *providers.Store, token, token2 string) string {
	t.Helper()
	ctx := t.Context()
	created, err := s.Create(ctx, "default", githubProvider("gh", token))
	if err != nil {
		t.Fatal(err)
	}
	if got := created.GetCredentials()["GITHUB_TOKEN"]; got != providers.Redacted {
		t.Fatalf("Create returned credential %q, want %q", got, providers.Redacted)
	}
	if _, err := s.Update(ctx, "default", &datamodelv1.Provider{
		Metadata:    &datamodelv1.ObjectMeta{Name: "gh"},
		Credentials: map[string]string{"GH_TOKEN": token2},
	}, nil); err != nil {
		t.Fatal(err)
	}
	p, err := s.Get(ctx, "default", "gh")
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"GITHUB_TOKEN": token, "GH_TOKEN": token2} {
		got, err := s.Resolve(p, key)
		if err != nil || got != want {
			t.Fatalf("Resolve(%s) = %q, %v; want the stored value", key, got, err)
		}
	}
	return p.GetMetadata().GetId()
}

// TestNoPlaintextAtRestSQLite: after a create and an update, neither the
// SQLite database file nor its WAL holds the credential values.
func TestNoPlaintextAtRestSQLite(t *testing.T) {
	dir := t.TempDir()
	st, err := open.Open(t.Context(), "sqlite:"+filepath.Join(dir, "gateway.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := providers.NewStore(providers.Options{Objects: st, Keyring: keyring(t)})
	token, token2 := secretValue(t), secretValue(t)
	checkRoundTrip(t, s, token, token2)
	files, _ := filepath.Glob(filepath.Join(dir, "gateway.db*"))
	if len(files) == 0 {
		t.Fatal("no database files found")
	}
	var all []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "gateway.db")); err == nil {
		all = append(all, b...)
	}
	if !bytes.Contains(all, []byte("GITHUB_TOKEN")) {
		t.Fatal("the database does not even hold the credential key: the check reads the wrong file")
	}
	for _, v := range []string{token, token2} {
		if bytes.Contains(all, []byte(v)) {
			t.Errorf("the SQLite files hold a credential value in plaintext")
		}
	}
}

// TestNoPlaintextAtRestPostgres: the provider's row in PostgreSQL, read
// as text column by column, holds no credential value.
func TestNoPlaintextAtRestPostgres(t *testing.T) {
	admin := os.Getenv("OPENSHELL_TEST_POSTGRES_URL")
	if admin == "" {
		citest.SkipOrFail(t, "OPENSHELL_TEST_POSTGRES_URL is not set: run test/postgres/start.sh")
	}
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "openshell_providers_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := conn.Exec(c, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database: %v", err)
		}
		_ = conn.Close(c)
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	st, err := open.Open(ctx, u.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := providers.NewStore(providers.Options{Objects: st, Keyring: keyring(t)})
	token, token2 := secretValue(t), secretValue(t)
	id := checkRoundTrip(t, s, token, token2)

	db, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	var row string
	var payload []byte
	if err := db.QueryRow(ctx, "SELECT o::text, payload FROM objects o WHERE id = $1", id).Scan(&row, &payload); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(row, id) || !bytes.Contains(payload, []byte("GITHUB_TOKEN")) {
		t.Fatal("the row read is not the provider's")
	}
	for _, v := range []string{token, token2} {
		if strings.Contains(row, v) || bytes.Contains(payload, []byte(v)) {
			t.Errorf("the PostgreSQL row holds a credential value in plaintext")
		}
	}
}

func newStore(t *testing.T, now func() time.Time) *providers.Store {
	t.Helper()
	st, err := open.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "gateway.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return providers.NewStore(providers.Options{Objects: st, Keyring: keyring(t), Now: now})
}

// TestResolveExpiry: a credential whose credential_expires_at_ms has
// passed no longer resolves; clearing the expiry (0) makes it resolve.
func TestResolveExpiry(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	s := newStore(t, func() time.Time { return now })
	ctx := t.Context()
	p := githubProvider("gh", "value-1")
	p.CredentialExpiresAtMs = map[string]int64{"GITHUB_TOKEN": now.UnixMilli() + 1000}
	if _, err := s.Create(ctx, "default", p); err != nil {
		t.Fatal(err)
	}
	stored, _ := s.Get(ctx, "default", "gh")
	if v, err := s.Resolve(stored, "GITHUB_TOKEN"); err != nil || v != "value-1" {
		t.Fatalf("Resolve before expiry = %q, %v", v, err)
	}
	now = now.Add(time.Second)
	_, err := s.Resolve(stored, "GITHUB_TOKEN")
	if errdefs.Code(err) != codes.FailedPrecondition || strings.Contains(err.Error(), "value-1") {
		t.Fatalf("Resolve at expiry = %v, want FailedPrecondition without the value", err)
	}
	if _, err := s.Update(ctx, "default", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "gh"}}, map[string]int64{"GITHUB_TOKEN": 0}); err != nil {
		t.Fatal(err)
	}
	stored, _ = s.Get(ctx, "default", "gh")
	if v, err := s.Resolve(stored, "GITHUB_TOKEN"); err != nil || v != "value-1" {
		t.Fatalf("Resolve after clearing the expiry = %q, %v", v, err)
	}
}

// TestSealedValueBoundToRecord: a sealed value copied onto another
// provider does not open there.
func TestSealedValueBoundToRecord(t *testing.T) {
	s := newStore(t, nil)
	ctx := t.Context()
	if _, err := s.Create(ctx, "default", githubProvider("a", "value-a")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "default", githubProvider("b", "value-b")); err != nil {
		t.Fatal(err)
	}
	a, _ := s.Get(ctx, "default", "a")
	b, _ := s.Get(ctx, "default", "b")
	b.CredentialHandles["GITHUB_TOKEN"] = a.CredentialHandles["GITHUB_TOKEN"]
	if _, err := s.Resolve(b, "GITHUB_TOKEN"); err == nil {
		t.Fatal("a value sealed for provider a opened as provider b's")
	}
}

// TestUpdateCAS: an update at a stale resource version is Aborted and
// changes nothing.
func TestUpdateCAS(t *testing.T) {
	s := newStore(t, nil)
	ctx := t.Context()
	created, err := s.Create(ctx, "default", githubProvider("gh", "v1"))
	if err != nil {
		t.Fatal(err)
	}
	rv := created.GetMetadata().GetResourceVersion()
	upd := func(rv uint64, v string) error {
		_, err := s.Update(ctx, "default", &datamodelv1.Provider{
			Metadata: &datamodelv1.ObjectMeta{Name: "gh", ResourceVersion: rv}, Config: map[string]string{"K": v},
		}, nil)
		return err
	}
	if err := upd(rv, "a"); err != nil {
		t.Fatal(err)
	}
	err = upd(rv, "b")
	if errdefs.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "provider 'gh' was modified concurrently") {
		t.Fatalf("stale update = %v (%v), want Aborted", err, errdefs.Code(err))
	}
	p, _ := s.Get(ctx, "default", "gh")
	if p.GetConfig()["K"] != "a" {
		t.Errorf("config after the refused update = %v", p.GetConfig())
	}
}

// TestRewrapAll: after a KEK rotation every stored credential moves to
// the new KEK, keeps its value, and the old KEK is no longer needed.
func TestRewrapAll(t *testing.T) {
	st, err := open.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "gateway.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx := t.Context()
	old := keyring(t)
	before := providers.NewStore(providers.Options{Objects: st, Keyring: old})
	for _, ws := range []string{"default", "team"} {
		if _, err := before.Create(ctx, ws, githubProvider("gh", "value-"+ws)); err != nil {
			t.Fatal(err)
		}
	}
	cur := keyring(t)
	rotating := providers.NewStore(providers.Options{Objects: st, Keyring: cur.WithPrevious(old)})
	n, err := rotating.RewrapAll(ctx)
	if err != nil || n != 2 {
		t.Fatalf("RewrapAll = %d, %v; want 2 providers", n, err)
	}
	if n, err := rotating.RewrapAll(ctx); err != nil || n != 0 {
		t.Fatalf("second RewrapAll = %d, %v; want 0", n, err)
	}
	after := providers.NewStore(providers.Options{Objects: st, Keyring: cur})
	for _, ws := range []string{"default", "team"} {
		p, err := after.Get(ctx, ws, "gh")
		if err != nil {
			t.Fatal(err)
		}
		if v, err := after.Resolve(p, "GITHUB_TOKEN"); err != nil || v != "value-"+ws {
			t.Errorf("Resolve in %s with the new KEK only = %q, %v", ws, v, err)
		}
	}
	if _, err := providers.NewStore(providers.Options{Objects: st, Keyring: keyring(t)}).RewrapAll(ctx); err == nil {
		t.Error("RewrapAll with a keyring that cannot open the values succeeded")
	}
}
