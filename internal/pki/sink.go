package pki

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/openshell-go/openshell/internal/errdefs"
)

// Sink is a destination for a Bundle (a directory, a set of Kubernetes
// Secrets, ...).
type Sink interface {
	// String names the destination in messages.
	String() string
	// Items lists every item the sink stores for a bundle, in a stable order.
	Items() []string
	// Present reports which of Items exist at the destination.
	Present(ctx context.Context) (map[string]bool, error)
	// Write stores b. It never overwrites an existing item, and on failure
	// removes what it created.
	Write(ctx context.Context, b *Bundle) error
	// RecoveryHint tells an operator how to resolve a partial bundle.
	RecoveryHint() string
}

// Outcome is what Ensure did.
type Outcome int

const (
	// Generated: the sink was empty and received a new bundle.
	Generated Outcome = iota + 1
	// Skipped: the sink already held the complete bundle.
	Skipped
	// WouldGenerate: dry run on an empty sink; nothing was written.
	WouldGenerate
)

// Report describes the result of Ensure.
type Report struct {
	Outcome Outcome
	// Items are the sink's items (written, present, or to be written).
	Items []string
	// KID is the key id of a newly generated JWT key (Generated only).
	KID string
}

// Ensure makes sink hold a complete bundle: complete → Skipped; empty →
// Generated (or WouldGenerate when dryRun); partial → a FailedPrecondition
// error naming the missing items and how to recover.
func Ensure(ctx context.Context, sink Sink, opts Options, dryRun bool) (*Report, error) {
	present, err := sink.Present(ctx)
	if err != nil {
		return nil, err
	}
	items := sink.Items()
	var have, missing []string
	for _, it := range items {
		if present[it] {
			have = append(have, it)
		} else {
			missing = append(missing, it)
		}
	}
	switch {
	case len(missing) == 0:
		return &Report{Outcome: Skipped, Items: items}, nil
	case len(have) > 0:
		return nil, errdefs.FailedPrecondition(fmt.Sprintf(
			"partial PKI in %s: missing %s (present: %s); %s",
			sink, strings.Join(missing, ", "), strings.Join(have, ", "), sink.RecoveryHint()))
	case dryRun:
		return &Report{Outcome: WouldGenerate, Items: items}, nil
	}
	b, err := Generate(opts)
	if err != nil {
		return nil, err
	}
	if err := sink.Write(ctx, b); err != nil {
		return nil, err
	}
	return &Report{Outcome: Generated, Items: items, KID: b.KID}, nil
}

// Layout of a Dir, relative to its root.
const (
	CACertFile     = "ca.crt"
	CAKeyFile      = "ca.key"
	ServerCertFile = "server/tls.crt"
	ServerKeyFile  = "server/tls.key"
	ClientCertFile = "client/tls.crt"
	ClientKeyFile  = "client/tls.key"
	JWTSigningFile = "jwt/signing.pem"
	JWTPublicFile  = "jwt/public.pem"
	JWTKIDFile     = "jwt/kid"
)

// DirFiles is the generate-certs --output-dir layout.
var DirFiles = []string{CACertFile, CAKeyFile, ServerCertFile, ServerKeyFile, ClientCertFile, ClientKeyFile, JWTSigningFile, JWTPublicFile, JWTKIDFile}

// secretFiles hold private keys and are written 0600; the rest 0644.
var secretFiles = map[string]bool{CAKeyFile: true, ServerKeyFile: true, ClientKeyFile: true, JWTSigningFile: true}

// Dir is the filesystem Sink: DirFiles under Path, directories 0700,
// private keys 0600, certificates, public key and kid 0644.
type Dir struct {
	Path string
}

var _ Sink = Dir{}

func (d Dir) String() string         { return d.Path }
func (d Dir) Items() []string        { return append([]string(nil), DirFiles...) }
func (d Dir) file(rel string) string { return filepath.Join(d.Path, filepath.FromSlash(rel)) }

// RecoveryHint implements Sink.
func (d Dir) RecoveryHint() string {
	return fmt.Sprintf("restore the missing files from a backup, or remove %s and run generate-certs again (clients and sandboxes must then trust the new CA and keys)", d.Path)
}

// Present implements Sink.
func (d Dir) Present(context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	for _, rel := range DirFiles {
		fi, err := os.Stat(d.file(rel))
		switch {
		case err == nil && fi.Mode().IsRegular():
			out[rel] = true
		case err == nil:
			return nil, fmt.Errorf("%s: not a regular file", d.file(rel))
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("pki directory: %w", err)
		}
	}
	return out, nil
}

// Contents maps each DirFiles entry to its bytes in b.
func (b *Bundle) Contents() map[string][]byte {
	return map[string][]byte{
		CACertFile: b.CACert, CAKeyFile: b.CAKey,
		ServerCertFile: b.ServerCert, ServerKeyFile: b.ServerKey,
		ClientCertFile: b.ClientCert, ClientKeyFile: b.ClientKey,
		JWTSigningFile: b.JWTSigningKey, JWTPublicFile: b.JWTPublicKey,
		JWTKIDFile: []byte(b.KID),
	}
}

// Write implements Sink.
func (d Dir) Write(_ context.Context, b *Bundle) (err error) {
	var created []string // files and directories, in creation order
	defer func() {
		if err != nil {
			for i := len(created) - 1; i >= 0; i-- {
				_ = os.Remove(created[i]) // best-effort rollback; err is reported
			}
		}
	}()
	mkdir := func(p string) error {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		if parent := filepath.Dir(p); parent != p {
			if _, err := os.Stat(parent); errors.Is(err, fs.ErrNotExist) {
				if err := os.MkdirAll(parent, 0o700); err != nil {
					return err
				}
			}
		}
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		created = append(created, p)
		return os.Chmod(p, 0o700)
	}
	if err := mkdir(d.Path); err != nil {
		return fmt.Errorf("pki directory: %w", err)
	}
	contents := b.Contents()
	for _, rel := range DirFiles {
		path := d.file(rel)
		if err := mkdir(filepath.Dir(path)); err != nil {
			return fmt.Errorf("pki directory: %w", err)
		}
		mode := os.FileMode(0o644)
		if secretFiles[rel] {
			mode = 0o600
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		created = append(created, path)
		_, werr := f.Write(contents[rel])
		if werr == nil {
			werr = f.Chmod(mode)
		}
		if werr == nil {
			werr = f.Sync()
		}
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return fmt.Errorf("write %s: %w", path, werr)
		}
	}
	return nil
}
