package credentials_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/openshell-go/openshell/internal/credentials"
)

func TestSealOpen(t *testing.T) {
	k, err := credentials.LoadOrCreateKEK(filepath.Join(t.TempDir(), "state", "kek"))
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("sk-very-secret-value")
	s1, err := k.Seal(secret, "provider-1/API_KEY")
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := k.Seal(secret, "provider-1/API_KEY")
	if s1.WrappedKey == s2.WrappedKey || s1.Ciphertext == s2.Ciphertext {
		t.Error("two seals of one value share a data key or ciphertext")
	}
	if bytes.Contains([]byte(s1.Ciphertext+s1.WrappedKey+s1.KEKID), secret) {
		t.Error("sealed form contains the plaintext")
	}
	got, err := k.Open(s1, "provider-1/API_KEY")
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("Open = %q, %v, want %q", got, err, secret)
	}
	if _, err := k.Open(s1, "provider-2/API_KEY"); err == nil {
		t.Error("Open with another record's associated data succeeded")
	}
	other, _ := credentials.NewKeyring(bytes.Repeat([]byte{7}, 32))
	if _, err := other.Open(s1, "provider-1/API_KEY"); !errors.Is(err, credentials.ErrKEKMismatch) {
		t.Errorf("Open under another KEK = %v, want ErrKEKMismatch", err)
	}
}

func TestLoadOrCreateKEK(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kek")
	k1, err := credentials.LoadOrCreateKEK(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("KEK file mode = %04o, want 0600", fi.Mode().Perm())
	}
	k2, err := credentials.LoadOrCreateKEK(path)
	if err != nil {
		t.Fatal(err)
	}
	if k1.ID() != k2.ID() {
		t.Errorf("reloaded KEK id = %s, want %s", k2.ID(), k1.ID())
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := credentials.LoadOrCreateKEK(path); err == nil {
		t.Error("a world-readable KEK file was accepted")
	}
}

func TestParseKEK(t *testing.T) {
	if _, err := credentials.ParseKEK("c2hvcnQ="); err == nil {
		t.Error("a 5-byte key was accepted")
	}
	if _, err := credentials.ParseKEK("0000000000000000000000000000000000000000000000000000000000000000"); err != nil {
		t.Errorf("hex key refused: %v", err)
	}
}

func TestValidKey(t *testing.T) {
	for key, want := range map[string]bool{"GITHUB_TOKEN": true, "_x1": true, "": false, "1X": false, "A-B": false, "a b": false} {
		if got := credentials.ValidKey(key); got != want {
			t.Errorf("ValidKey(%q) = %v, want %v", key, got, want)
		}
	}
}

// TestRewrap: after rotation a value sealed under the old KEK opens
// through the new keyring, Rewrap moves it to the new KEK with the same
// ciphertext, and the new KEK alone then opens it.
func TestRewrap(t *testing.T) {
	old, _ := credentials.NewKeyring(bytes.Repeat([]byte{1}, 32))
	cur, _ := credentials.NewKeyring(bytes.Repeat([]byte{2}, 32))
	s, err := old.Seal([]byte("v"), "p/K")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cur.Open(s, "p/K"); !errors.Is(err, credentials.ErrKEKMismatch) {
		t.Fatalf("new KEK alone opened an old value: %v", err)
	}
	rot := cur.WithPrevious(old)
	if v, err := rot.Open(s, "p/K"); err != nil || string(v) != "v" {
		t.Fatalf("rotating keyring Open = %q, %v", v, err)
	}
	r, changed, err := rot.Rewrap(s, "p/K")
	if err != nil || !changed || r.KEKID != cur.ID() || r.Ciphertext != s.Ciphertext {
		t.Fatalf("Rewrap = %+v, %v, %v", r, changed, err)
	}
	if v, err := cur.Open(r, "p/K"); err != nil || string(v) != "v" {
		t.Fatalf("new KEK Open after rewrap = %q, %v", v, err)
	}
	if _, changed, _ := rot.Rewrap(r, "p/K"); changed {
		t.Error("Rewrap of a current value changed it")
	}
	if _, _, err := rot.Rewrap(s, "q/K"); err == nil {
		t.Error("Rewrap with another record's associated data succeeded")
	}
}

func TestDeriveKey(t *testing.T) {
	kek := bytes.Repeat([]byte{7}, credentials.KeySize)
	a, err := credentials.NewKeyring(kek)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := credentials.NewKeyring(bytes.Clone(kek)) // another replica
	other, _ := credentials.NewKeyring(bytes.Repeat([]byte{8}, credentials.KeySize))
	old, _ := credentials.NewKeyring(bytes.Repeat([]byte{9}, credentials.KeySize))
	key := func(k *credentials.Keyring, purpose string) []byte {
		t.Helper()
		d, err := k.DeriveKey(purpose)
		if err != nil || len(d) != credentials.KeySize {
			t.Fatalf("DeriveKey(%q) = %d bytes, %v", purpose, len(d), err)
		}
		return d
	}
	p := key(a, "service login")
	if !bytes.Equal(p, key(b, "service login")) || !bytes.Equal(p, key(a.WithPrevious(old), "service login")) {
		t.Error("the same KEK and purpose derive different keys")
	}
	if bytes.Equal(p, key(a, "something else")) || bytes.Equal(p, key(other, "service login")) || bytes.Equal(p, kek) {
		t.Error("a derived key repeats another purpose's, another KEK's, or the KEK")
	}
	if _, err := a.DeriveKey(""); err == nil {
		t.Error("DeriveKey(\"\") = nil error, want refused")
	}
}
