package open_test

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/open"
	"github.com/openshell-go/openshell/internal/store/storetest"
)

func TestOpenSQLite(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		url, path string
	}{
		{"sqlite:" + filepath.Join(dir, "a.db"), filepath.Join(dir, "a.db")},
		{"sqlite://" + filepath.Join(dir, "b.db"), filepath.Join(dir, "b.db")},
		{"sqlite::memory:", ""},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			s, err := open.Open(t.Context(), tt.url, nil)
			if err != nil {
				t.Fatalf("Open(%q): %v", tt.url, err)
			}
			defer s.Close()
			if _, err := s.Create(t.Context(), store.TypeSandbox, storetest.Sandbox("a", "default", "a", nil)); err != nil {
				t.Fatal(err)
			}
			if tt.path != "" {
				if _, err := os.Stat(tt.path); err != nil {
					t.Fatalf("database file: %v", err)
				}
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	tests := []struct {
		url  string
		code codes.Code
	}{
		{"mysql://u:secretpw@h/db", codes.InvalidArgument},
		{"sqlite:", codes.InvalidArgument},
		{"", codes.InvalidArgument},
		{"postgres://u:secretpw@127.0.0.1:1/db?connect_timeout=5", codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			_, err := open.Open(t.Context(), tt.url, nil)
			storetest.WantCode(t, err, tt.code)
			if strings.Contains(err.Error(), "secretpw") {
				t.Fatalf("error %q leaks the password", err)
			}
		})
	}
}

func TestOpenPostgres(t *testing.T) {
	admin := os.Getenv("OPENSHELL_TEST_POSTGRES_URL")
	if admin == "" {
		citest.SkipOrFail(t, "OPENSHELL_TEST_POSTGRES_URL is not set: run test/postgres/start.sh")
	}
	conn, err := pgx.Connect(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	name := fmt.Sprintf("openshell_open_test_%d", time.Now().UnixNano())
	if _, err := conn.Exec(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database: %v", err)
		}
	}()
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	s, err := open.Open(t.Context(), u.String(), nil)
	if err != nil {
		t.Fatalf("Open(postgres): %v", err)
	}
	defer s.Close()
	if _, err := s.Create(t.Context(), store.TypeSandbox, storetest.Sandbox("a", "default", "a", nil)); err != nil {
		t.Fatal(err)
	}
}
