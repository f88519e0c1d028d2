// Package k8s stores the gateway's PKI bundle as Kubernetes Secrets: the
// `openshell-gateway generate-certs` Secrets mode, run by the Helm chart's
// pre-install/pre-upgrade hook.
//
// [Secrets] is a [pki.Sink] and follows the same idempotency contract as the
// filesystem sink through [Ensure]: all Secrets present → nothing changes;
// some present → an error naming the missing ones with a recovery hint; none
// present → a new bundle is generated and every Secret is created. Secrets are
// created, never updated: an existing Secret is never overwritten, and a run
// that fails part way deletes the Secrets it created.
//
// Layout (the key names are the ones Kubernetes uses for TLS Secrets):
//
//	server  type kubernetes.io/tls  tls.crt, tls.key, ca.crt
//	client  type kubernetes.io/tls  tls.crt, tls.key, ca.crt
//	jwt     type Opaque             signing.pem, public.pem, kid
//
// The CA private key is not stored: the bundle cannot be extended later, only
// regenerated as a whole.
package k8s

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/pki"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
)

// Keys of the Secrets.
const (
	TLSCertKey    = corev1.TLSCertKey       // "tls.crt"
	TLSKeyKey     = corev1.TLSPrivateKeyKey // "tls.key"
	CACertKey     = "ca.crt"
	JWTSigningKey = "signing.pem"
	JWTPublicKey  = "public.pem"
	JWTKIDKey     = "kid"
)

// Labels put on every Secret the sink creates.
var Labels = map[string]string{
	"app.kubernetes.io/component":  "pki",
	"app.kubernetes.io/managed-by": "openshell-generate-certs",
}

// Secrets is the Kubernetes Secrets [pki.Sink].
type Secrets struct {
	Client    kubernetes.Interface
	Namespace string
	// ServerSecretName and ClientSecretName name the kubernetes.io/tls
	// Secrets; unused (and optional) when JWTOnly.
	ServerSecretName, ClientSecretName string
	// JWTSecretName names the Opaque Secret holding the sandbox JWT key pair.
	JWTSecretName string
	// JWTOnly manages only the JWT Secret (TLS comes from elsewhere, such as
	// cert-manager).
	JWTOnly bool
	// Labels are added to the created Secrets (on top of [Labels]).
	Labels map[string]string
}

var _ pki.Sink = (*Secrets)(nil)

type secretSpec struct {
	name string
	typ  corev1.SecretType
	keys []string
	role string
}

func (s *Secrets) specs() []secretSpec {
	jwt := secretSpec{s.JWTSecretName, corev1.SecretTypeOpaque, []string{JWTSigningKey, JWTPublicKey, JWTKIDKey}, "jwt"}
	if s.JWTOnly {
		return []secretSpec{jwt}
	}
	tls := []string{TLSCertKey, TLSKeyKey, CACertKey}
	return []secretSpec{
		{s.ServerSecretName, corev1.SecretTypeTLS, tls, "server"},
		{s.ClientSecretName, corev1.SecretTypeTLS, tls, "client"},
		jwt,
	}
}

// Validate checks the configuration: a client, a valid namespace and valid,
// distinct Secret names.
func (s *Secrets) Validate() error {
	if s.Client == nil {
		return errors.New("kubernetes secrets: no client")
	}
	if s.Namespace == "" {
		return errdefs.InvalidArgument("kubernetes secrets: namespace is required")
	}
	if errs := validation.IsDNS1123Label(s.Namespace); len(errs) > 0 {
		return errdefs.InvalidArgument(fmt.Sprintf("kubernetes secrets: namespace %q is not valid: %s", s.Namespace, strings.Join(errs, "; ")))
	}
	seen := map[string]string{}
	for _, sp := range s.specs() {
		if sp.name == "" {
			return errdefs.InvalidArgument(fmt.Sprintf("kubernetes secrets: %s secret name is required", sp.role))
		}
		if errs := validation.IsDNS1123Subdomain(sp.name); len(errs) > 0 {
			return errdefs.InvalidArgument(fmt.Sprintf("kubernetes secrets: %s secret name %q is not valid: %s", sp.role, sp.name, strings.Join(errs, "; ")))
		}
		if other, dup := seen[sp.name]; dup {
			return errdefs.InvalidArgument(fmt.Sprintf("kubernetes secrets: %s and %s secrets must have different names (both %q)", other, sp.role, sp.name))
		}
		seen[sp.name] = sp.role
	}
	return nil
}

// String implements pki.Sink.
func (s *Secrets) String() string {
	return fmt.Sprintf("Kubernetes Secrets in namespace %s", s.Namespace)
}

// Items implements pki.Sink: the Secret names, server, client, jwt.
func (s *Secrets) Items() []string {
	var out []string
	for _, sp := range s.specs() {
		out = append(out, sp.name)
	}
	return out
}

// RecoveryHint implements pki.Sink.
func (s *Secrets) RecoveryHint() string {
	return fmt.Sprintf("restore the missing Secrets from a backup, or delete the remaining ones (kubectl -n %s delete secret %s) and run generate-certs again (clients and sandboxes must then trust the new CA and keys)",
		s.Namespace, strings.Join(s.Items(), " "))
}

// Present implements pki.Sink. A Secret that exists with the wrong type or
// without one of its keys is an error: it was not written by generate-certs
// and is never overwritten.
func (s *Secrets) Present(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	for _, sp := range s.specs() {
		sec, err := s.Client.CoreV1().Secrets(s.Namespace).Get(ctx, sp.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("get secret %s/%s: %w", s.Namespace, sp.name, err)
		}
		if sec.Type != sp.typ {
			return nil, errdefs.FailedPrecondition(fmt.Sprintf("secret %s/%s has type %s, want %s; it was not created by generate-certs: delete or rename it", s.Namespace, sp.name, sec.Type, sp.typ))
		}
		var lacking []string
		for _, k := range sp.keys {
			if len(sec.Data[k]) == 0 {
				lacking = append(lacking, k)
			}
		}
		if len(lacking) > 0 {
			return nil, errdefs.FailedPrecondition(fmt.Sprintf("secret %s/%s lacks %s; %s", s.Namespace, sp.name, strings.Join(lacking, ", "), s.RecoveryHint()))
		}
		out[sp.name] = true
	}
	return out, nil
}

// errRaced marks a Write that found a Secret created by someone else.
var errRaced = errors.New("created concurrently")

func (s *Secrets) data(sp secretSpec, b *pki.Bundle) map[string][]byte {
	switch sp.role {
	case "server":
		return map[string][]byte{TLSCertKey: b.ServerCert, TLSKeyKey: b.ServerKey, CACertKey: b.CACert}
	case "client":
		return map[string][]byte{TLSCertKey: b.ClientCert, TLSKeyKey: b.ClientKey, CACertKey: b.CACert}
	default:
		return map[string][]byte{JWTSigningKey: b.JWTSigningKey, JWTPublicKey: b.JWTPublicKey, JWTKIDKey: []byte(b.KID)}
	}
}

// Write implements pki.Sink: it creates each Secret (create only, never
// update) and on any failure deletes the ones it created.
func (s *Secrets) Write(ctx context.Context, b *pki.Bundle) (err error) {
	if err := s.Validate(); err != nil {
		return err
	}
	api := s.Client.CoreV1().Secrets(s.Namespace)
	var created []*corev1.Secret
	defer func() {
		if err == nil {
			return
		}
		// Roll back even when ctx is done, bounded.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for i := len(created) - 1; i >= 0; i-- {
			c := created[i]
			uid := c.UID
			derr := api.Delete(rctx, c.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
			if derr != nil && !apierrors.IsNotFound(derr) {
				err = fmt.Errorf("%w (rollback: delete secret %s/%s: %v; delete it by hand)", err, s.Namespace, c.Name, derr) //nolint:errorlint // only err is the cause; the rollback failure is detail
			}
		}
	}()
	labels := maps.Clone(s.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, Labels)
	for _, sp := range s.specs() {
		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: sp.name, Namespace: s.Namespace, Labels: labels},
			Type:       sp.typ,
			Data:       s.data(sp, b),
		}
		got, err := api.Create(ctx, sec, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("secret %s/%s: %w", s.Namespace, sp.name, errRaced)
		}
		if err != nil {
			return fmt.Errorf("create secret %s/%s: %w", s.Namespace, sp.name, err)
		}
		created = append(created, got)
	}
	return nil
}

// RaceWait bounds how long [Ensure] waits for a concurrent writer to finish.
var RaceWait = 30 * time.Second

// Ensure is [pki.Ensure] for Secrets, tolerating a concurrent run (two hook
// pods racing): when a Secret appears between the check and the create
// (AlreadyExists), it deletes what it created, never overwrites, and waits
// until the other writer has finished (all Secrets present → Skipped) or
// rolled back (none → tries again). A partial bundle that persists past
// RaceWait is reported as pki.Ensure does. A run that starts while another is
// half way through sees a partial bundle and fails; running it again after
// the other finished skips.
func Ensure(ctx context.Context, s *Secrets, opts pki.Options, dryRun bool) (*pki.Report, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(RaceWait)
	for {
		rep, err := pki.Ensure(ctx, s, opts, dryRun)
		if err == nil || time.Now().After(deadline) {
			return rep, err
		}
		if !errors.Is(err, errRaced) {
			return rep, err
		}
		// Another writer is at work: poll until it settles one way or the other.
		if err := waitSettled(ctx, s, deadline); err != nil {
			return nil, err
		}
	}
}

func waitSettled(ctx context.Context, s *Secrets, deadline time.Time) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		present, err := s.Present(ctx)
		if err != nil {
			return err
		}
		n := 0
		for _, it := range s.Items() {
			if present[it] {
				n++
			}
		}
		if n == 0 || n == len(s.Items()) || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
