package gateway

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openshell-go/openshell/internal/config"
	"github.com/openshell-go/openshell/internal/credentials"
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
	k, err := loadKEK(&config.Config{CredentialsKEK: base64.StdEncoding.EncodeToString(key)})
	if err != nil || k.ID() != want.ID() {
		t.Fatalf("loadKEK(env) = %v, %v; want id %s", k, err, want.ID())
	}
	const bad = "not-a-key-but-a-secret-looking-string"
	_, err = loadKEK(&config.Config{CredentialsKEK: bad})
	if err == nil || strings.Contains(err.Error(), bad) {
		t.Fatalf("loadKEK(malformed) = %v, want an error that does not echo the value", err)
	}
	path := filepath.Join(t.TempDir(), "state", "credentials.kek")
	if _, err := loadKEK(&config.Config{CredentialsKEKFile: path}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("KEK file: %v, %v; want mode 0600", fi, err)
	}
}
