package credentials

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// KeySize is the size in bytes of a KEK and of a data key (AES-256).
const KeySize = 32

// Driver is the CredentialHandle driver name of values sealed here.
const Driver = "gateway-aes256gcm"

// Metadata keys of a sealed value's handle.
const (
	MetaKEKID      = "kek_id"
	MetaWrappedKey = "wrapped_data_key"
)

// ErrKEKMismatch means a sealed value was wrapped under a KEK this
// keyring does not hold.
var ErrKEKMismatch = errors.New("credential was sealed under another key-encryption key")

// Keyring holds the current key-encryption key, which seals, and any
// previous ones, which still open (see WithPrevious and Rewrap).
type Keyring struct {
	id       string
	kek      cipher.AEAD
	previous map[string]cipher.AEAD
	// root is the current KEK, kept for DeriveKey.
	root []byte
}

// NewKeyring returns a keyring for a 32-byte KEK.
func NewKeyring(kek []byte) (*Keyring, error) {
	if len(kek) != KeySize {
		return nil, fmt.Errorf("key-encryption key is %d bytes, want %d", len(kek), KeySize)
	}
	aead, err := newAEAD(kek)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(kek)
	return &Keyring{id: "kek-" + hex.EncodeToString(sum[:8]), kek: aead, root: append([]byte(nil), kek...)}, nil
}

// DeriveKey returns a 32-byte key for purpose, derived from the current
// KEK with HKDF-SHA256: the same in every gateway process holding that
// KEK (replicas, restarts), different for every purpose, and of no use
// for recovering the KEK or the data keys it wraps.
func (k *Keyring) DeriveKey(purpose string) ([]byte, error) {
	if purpose == "" {
		return nil, errors.New("derived key: purpose is required")
	}
	return hkdf.Key(sha256.New, k.root, nil, "openshell-go derived key: "+purpose, KeySize)
}

// ID names the current KEK without revealing it (a truncated SHA-256).
func (k *Keyring) ID() string { return k.id }

// WithPrevious returns a keyring that seals with k's KEK and also opens
// values wrapped under the current KEK of any of prev.
func (k *Keyring) WithPrevious(prev ...*Keyring) *Keyring {
	out := &Keyring{id: k.id, kek: k.kek, previous: map[string]cipher.AEAD{}, root: k.root}
	for id, a := range k.previous {
		out.previous[id] = a
	}
	for _, p := range prev {
		if p.id != k.id {
			out.previous[p.id] = p.kek
		}
	}
	return out
}

// unwrapper returns the AEAD of KEK id.
func (k *Keyring) unwrapper(id string) (cipher.AEAD, error) {
	if id == k.id {
		return k.kek, nil
	}
	if a, ok := k.previous[id]; ok {
		return a, nil
	}
	return nil, fmt.Errorf("%w (%s)", ErrKEKMismatch, id)
}

// Rewrap returns s with its data key wrapped under the current KEK; the
// ciphertext is unchanged. It reports false when s already was.
func (k *Keyring) Rewrap(s Sealed, aad string) (Sealed, bool, error) {
	if s.KEKID == k.id {
		return s, false, nil
	}
	old, err := k.unwrapper(s.KEKID)
	if err != nil {
		return s, false, err
	}
	dek, err := open(old, s.WrappedKey, aad)
	if err != nil {
		return s, false, fmt.Errorf("unwrap data key: %w", err)
	}
	wrapped, err := seal(k.kek, dek, aad)
	clear(dek)
	if err != nil {
		return s, false, err
	}
	return Sealed{KEKID: k.id, WrappedKey: wrapped, Ciphertext: s.Ciphertext}, true, nil
}

// Sealed is one encrypted value: Ciphertext and WrappedKey are
// nonce||ciphertext, base64 (standard encoding).
type Sealed struct {
	KEKID      string
	WrappedKey string
	Ciphertext string
}

// Seal encrypts plaintext under a fresh data key bound to aad.
func (k *Keyring) Seal(plaintext []byte, aad string) (Sealed, error) {
	dek := make([]byte, KeySize)
	if _, err := rand.Read(dek); err != nil {
		return Sealed{}, err
	}
	data, err := newAEAD(dek)
	if err != nil {
		return Sealed{}, err
	}
	ct, err := seal(data, plaintext, aad)
	if err != nil {
		return Sealed{}, err
	}
	wrapped, err := seal(k.kek, dek, aad)
	if err != nil {
		return Sealed{}, err
	}
	clear(dek)
	return Sealed{KEKID: k.id, WrappedKey: wrapped, Ciphertext: ct}, nil
}

// Open decrypts s with the associated data it was sealed with.
func (k *Keyring) Open(s Sealed, aad string) ([]byte, error) {
	kek, err := k.unwrapper(s.KEKID)
	if err != nil {
		return nil, err
	}
	dek, err := open(kek, s.WrappedKey, aad)
	if err != nil {
		return nil, fmt.Errorf("unwrap data key: %w", err)
	}
	data, err := newAEAD(dek)
	clear(dek)
	if err != nil {
		return nil, err
	}
	pt, err := open(data, s.Ciphertext, aad)
	if err != nil {
		return nil, fmt.Errorf("decrypt credential: %w", err)
	}
	return pt, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func seal(a cipher.AEAD, plaintext []byte, aad string) (string, error) {
	nonce := make([]byte, a.NonceSize(), a.NonceSize()+len(plaintext)+a.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(a.Seal(nonce, nonce, plaintext, []byte(aad))), nil
}

func open(a cipher.AEAD, enc, aad string) ([]byte, error) {
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return nil, errors.New("malformed sealed value")
	}
	if len(raw) < a.NonceSize()+a.Overhead() {
		return nil, errors.New("malformed sealed value")
	}
	return a.Open(nil, raw[:a.NonceSize()], raw[a.NonceSize():], []byte(aad))
}

// ParseKEK decodes a KEK given as base64 (standard or URL, padded or not)
// or hex text.
func ParseKEK(text string) ([]byte, error) {
	text = strings.TrimSpace(text)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(text); err == nil && len(b) == KeySize {
			return b, nil
		}
	}
	if b, err := hex.DecodeString(text); err == nil && len(b) == KeySize {
		return b, nil
	}
	return nil, fmt.Errorf("key-encryption key must be %d bytes, base64 or hex encoded", KeySize)
}

// LoadOrCreateKEK reads the KEK file at path (see LoadKEKFile), creating
// it (mode 0600, parent directory 0700) with a random key when it does not
// exist.
func LoadOrCreateKEK(path string) (*Keyring, error) {
	k, err := LoadKEKFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return createKEK(path)
	}
	return k, err
}

// LoadKEKFile reads an existing KEK file. A file readable by group or
// others is refused.
func LoadKEKFile(path string) (*Keyring, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read key-encryption key: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("key-encryption key file %s has mode %04o, want 0600", path, fi.Mode().Perm())
	}
	kek, err := ParseKEK(string(b))
	if err != nil {
		return nil, fmt.Errorf("key-encryption key file %s: %w", path, err)
	}
	return NewKeyring(kek)
}

func createKEK(path string) (*Keyring, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	kek := make([]byte, KeySize)
	if _, err := rand.Read(kek); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return LoadOrCreateKEK(path) // another process won the race
	}
	if err != nil {
		return nil, fmt.Errorf("create key-encryption key: %w", err)
	}
	_, werr := f.WriteString(base64.StdEncoding.EncodeToString(kek) + "\n")
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("write key-encryption key: %w", err)
	}
	return NewKeyring(kek)
}
