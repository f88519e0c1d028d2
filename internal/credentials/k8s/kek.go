// Package k8s reads the provider credentials' key-encryption key (KEK) from
// a Kubernetes Secret: the gateway's --credentials-kek-secret source.
//
// The Secret holds the current KEK under one data key (default [DefaultKey])
// and, during a rotation, previous KEKs under data keys named
// "previous-<key>" or starting with "previous-<key>-". A value is either
// the 32 raw key bytes or their base64 or hex text. A Secret that does not
// exist is created (type Opaque, 32 random bytes under the data key) when
// the gateway may create it; it is never updated or overwritten. The Secret
// is read once, at start: a change needs a restart.
package k8s

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/openshell-go/openshell/internal/credentials"
	"github.com/openshell-go/openshell/internal/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
)

// DefaultKey is the data key of the current KEK when none is configured.
const DefaultKey = "kek"

// PreviousPrefix starts the data keys of previous KEKs: "previous-<key>".
const PreviousPrefix = "previous-"

// Labels put on a Secret the gateway creates.
var Labels = map[string]string{
	"app.kubernetes.io/component":  "credentials-kek",
	"app.kubernetes.io/managed-by": "openshell-gateway",
}

// Secret is the Kubernetes Secret source of the KEK.
type Secret struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	// Key is the data key of the current KEK ("" = DefaultKey).
	Key string
}

// Keys is what a Secret holds: the current KEK and any previous ones, by
// data key in name order.
type Keys struct {
	Current  *credentials.Keyring
	Previous []*credentials.Keyring
	// Created is true when this call created the Secret.
	Created bool
}

// ParseRef splits "NAMESPACE/NAME" and validates both parts.
func ParseRef(ref string) (namespace, name string, err error) {
	ns, n, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || n == "" {
		return "", "", errdefs.InvalidArgument(fmt.Sprintf("%q is not NAMESPACE/NAME", ref))
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return "", "", errdefs.InvalidArgument(fmt.Sprintf("namespace %q is not valid: %s", ns, strings.Join(errs, "; ")))
	}
	if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
		return "", "", errdefs.InvalidArgument(fmt.Sprintf("secret name %q is not valid: %s", n, strings.Join(errs, "; ")))
	}
	return ns, n, nil
}

// ValidKey reports whether key can be a Secret data key.
func ValidKey(key string) error {
	if errs := validation.IsConfigMapKey(key); len(errs) > 0 {
		return errdefs.InvalidArgument(fmt.Sprintf("secret data key %q is not valid: %s", key, strings.Join(errs, "; ")))
	}
	return nil
}

func (s *Secret) key() string {
	if s.Key == "" {
		return DefaultKey
	}
	return s.Key
}

func (s *Secret) String() string {
	return fmt.Sprintf("key-encryption key secret %s/%s", s.Namespace, s.Name)
}

// Load reads the Secret, creating it with a random KEK when it does not
// exist. Errors name the Secret and the data key, never a key's bytes.
func (s *Secret) Load(ctx context.Context) (Keys, error) {
	if s.Client == nil {
		return Keys{}, errors.New("key-encryption key secret: no kubernetes client")
	}
	api := s.Client.CoreV1().Secrets(s.Namespace)
	sec, err := api.Get(ctx, s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return s.create(ctx)
	case apierrors.IsForbidden(err):
		return Keys{}, fmt.Errorf("%s: the gateway may not read it (grant get on secrets %q in namespace %s): %w", s, s.Name, s.Namespace, errors.Join(err, errdefs.ErrPermissionDenied))
	case err != nil:
		return Keys{}, fmt.Errorf("%s: %w", s, err)
	}
	return s.parse(sec)
}

func (s *Secret) create(ctx context.Context) (Keys, error) {
	kek := make([]byte, credentials.KeySize)
	if _, err := rand.Read(kek); err != nil {
		return Keys{}, err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: Labels},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{s.key(): kek},
	}
	_, err := s.Client.CoreV1().Secrets(s.Namespace).Create(ctx, sec, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err): // another replica won the race: use its key
		got, gerr := s.Client.CoreV1().Secrets(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		if gerr != nil {
			return Keys{}, fmt.Errorf("%s: %w", s, gerr)
		}
		return s.parse(got)
	case apierrors.IsForbidden(err):
		return Keys{}, fmt.Errorf("%s does not exist and the gateway may not create it: create it with %d random bytes under data key %q (or grant create on secrets in namespace %s): %w",
			s, credentials.KeySize, s.key(), s.Namespace, errors.Join(err, errdefs.ErrPermissionDenied))
	case err != nil:
		return Keys{}, fmt.Errorf("create %s: %w", s, err)
	}
	cur, err := credentials.NewKeyring(kek)
	if err != nil {
		return Keys{}, err
	}
	return Keys{Current: cur, Created: true}, nil
}

func (s *Secret) parse(sec *corev1.Secret) (Keys, error) {
	key := s.key()
	raw, ok := sec.Data[key]
	if !ok {
		return Keys{}, errdefs.FailedPrecondition(fmt.Sprintf("%s has no data key %q (it is never overwritten: add the key, or name another one with --credentials-kek-secret-key)", s, key))
	}
	cur, err := keyring(raw)
	if err != nil {
		return Keys{}, errdefs.FailedPrecondition(fmt.Sprintf("%s, data key %q: %v", s, key, err))
	}
	out := Keys{Current: cur}
	var prev []string
	for k := range sec.Data {
		if k == PreviousPrefix+key || strings.HasPrefix(k, PreviousPrefix+key+"-") {
			prev = append(prev, k)
		}
	}
	slices.Sort(prev)
	for _, k := range prev {
		p, err := keyring(sec.Data[k])
		if err != nil {
			return Keys{}, errdefs.FailedPrecondition(fmt.Sprintf("%s, data key %q: %v", s, k, err))
		}
		out.Previous = append(out.Previous, p)
	}
	return out, nil
}

// keyring accepts the 32 raw bytes or their base64 or hex text.
func keyring(v []byte) (*credentials.Keyring, error) {
	if len(v) == credentials.KeySize {
		return credentials.NewKeyring(v)
	}
	kek, err := credentials.ParseKEK(string(v))
	if err != nil {
		return nil, fmt.Errorf("value is %d bytes: want %d raw bytes or their base64 or hex text", len(v), credentials.KeySize)
	}
	return credentials.NewKeyring(kek)
}
