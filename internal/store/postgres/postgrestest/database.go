package postgrestest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/openshell-go/openshell/internal/citest"
)

// AdminURL returns the superuser URL of the shared test server
// (OPENSHELL_TEST_POSTGRES_URL), skipping t when none is configured, or
// failing it under CI=true.
func AdminURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("OPENSHELL_TEST_POSTGRES_URL")
	if u == "" {
		citest.SkipOrFail(t, "OPENSHELL_TEST_POSTGRES_URL is not set; run eval \"$(test/postgres/start.sh)\"")
	}
	return u
}

// NewDatabase creates a throw-away database on the shared test server,
// dropped when t ends, and returns its URL.
func NewDatabase(t testing.TB) string {
	t.Helper()
	admin := AdminURL(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "openshell_test_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(t.Context(), admin)
	if err != nil {
		t.Fatalf("connect to test postgres: %v", err)
	}
	defer func() { _ = conn.Close(t.Context()) }()
	if _, err := conn.Exec(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		// t.Context is already canceled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer func() { _ = c.Close(ctx) }()
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}
