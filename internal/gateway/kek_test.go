package gateway

import (
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	"github.com/openshell-go/openshell/internal/config"
	"github.com/openshell-go/openshell/internal/credentials"
	"github.com/openshell-go/openshell/internal/providers"
	storeopen "github.com/openshell-go/openshell/internal/store/open"
)

// TestLoadKEK: the key from the environment variable wins and is used as
// given; a malformed one is refused without echoing it; otherwise the file
// is created 0600.
func TestLoadKEK(t *testing.T) {
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i)
	}
	want, _ := credentials.NewKeyring(key)
	k, _, err := loadKEK(t.Context(), &config.Config{CredentialsKEK: base64.StdEncoding.EncodeToString(key)}, slog.New(slog.DiscardHandler))
	if err != nil || k.ID() != want.ID() {
		t.Fatalf("loadKEK(env) = %v, %v; want id %s", k, err, want.ID())
	}
	const bad = "not-a-key-but-a-secret-looking-string"
	_, _, err = loadKEK(t.Context(), &config.Config{CredentialsKEK: bad}, slog.New(slog.DiscardHandler))
	if err == nil || strings.Contains(err.Error(), bad) {
		t.Fatalf("loadKEK(malformed) = %v, want an error that does not echo the value", err)
	}
	path := filepath.Join(t.TempDir(), "state", "credentials.kek")
	if _, _, err := loadKEK(t.Context(), &config.Config{CredentialsKEKFile: path}, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("KEK file: %v, %v; want mode 0600", fi, err)
	}
}

// TestKEKRotation: a gateway started with a new KEK and the old one as
// previous re-wraps every stored credential; afterwards the new KEK alone
// opens them. A previous KEK file that does not exist is an error, not
// created.
func TestKEKRotation(t *testing.T) {
	dir := t.TempDir()
	st, err := storeopen.Open(t.Context(), "sqlite:"+filepath.Join(dir, "gw.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	oldFile := filepath.Join(dir, "old.kek")
	oldCfg := &config.Config{CredentialsKEKFile: oldFile}
	oldKR, _, err := loadKEK(t.Context(), oldCfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := providers.NewStore(providers.Options{Objects: st, Keyring: oldKR}).Create(ctx, "default", &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Type: "github", Credentials: map[string]string{"GITHUB_TOKEN": "v"},
	}); err != nil {
		t.Fatal(err)
	}
	newCfg := &config.Config{CredentialsKEKFile: filepath.Join(dir, "new.kek"), CredentialsPreviousKEKFiles: []string{oldFile}}
	kr, nPrev, err := loadKEK(t.Context(), newCfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := rewrapCredentials(ctx, nPrev, slog.New(slog.DiscardHandler), providers.NewStore(providers.Options{Objects: st, Keyring: kr})); err != nil {
		t.Fatal(err)
	}
	onlyNew, _, err := loadKEK(t.Context(), &config.Config{CredentialsKEKFile: newCfg.CredentialsKEKFile}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ps := providers.NewStore(providers.Options{Objects: st, Keyring: onlyNew})
	p, err := ps.Get(ctx, "default", "gh")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := ps.Resolve(p, "GITHUB_TOKEN"); err != nil || v != "v" {
		t.Fatalf("Resolve with the new KEK only = %q, %v", v, err)
	}
	missing := filepath.Join(dir, "missing.kek")
	if _, _, err := loadKEK(t.Context(), &config.Config{CredentialsKEKFile: newCfg.CredentialsKEKFile, CredentialsPreviousKEKFiles: []string{missing}}, slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a missing previous KEK file was accepted")
	}
	if _, err := os.Stat(missing); err == nil {
		t.Error("a missing previous KEK file was created")
	}
}
