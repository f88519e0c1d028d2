package kubernetes

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// SATokenAudience is the audience of the projected ServiceAccount token
// sandbox pods present to IssueSandboxToken.
const SATokenAudience = saTokenAudience

// TokenReview user extras of pod-bound tokens.
const (
	extraPodName = "authentication.kubernetes.io/pod-name"
	extraPodUID  = "authentication.kubernetes.io/pod-uid"
)

// AuthenticatorOptions configure an Authenticator.
type AuthenticatorOptions struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Namespaces accepts the namespaces sandbox pods may run in.
	Namespaces NamespaceValidator
	// ServiceAccounts accepts the ServiceAccounts sandbox pods may run as.
	ServiceAccounts ServiceAccountValidator
	// Audience defaults to SATokenAudience.
	Audience string
	Logger   *slog.Logger
}

// Authenticator is the Kubernetes ServiceAccount bootstrap authenticator:
// consulted only for IssueSandboxToken, it exchanges a projected, pod-bound
// ServiceAccount token for a sandbox principal after checking, in order:
// TokenReview (authenticated, audience), the username, the ServiceAccount,
// the namespace, the pod binding, the live pod and its UID, the pod's
// sandbox-id annotation, its single controlling Sandbox ownerReference, and
// that Sandbox's UID and sandbox-id label. A token the apiserver does not
// authenticate is "not mine" (nil, nil); every later failure is an error
// with a fixed text (Unauthenticated for the audience, NotFound for a
// missing pod, PermissionDenied otherwise). It is safe for concurrent use.
type Authenticator struct {
	o   AuthenticatorOptions
	log *slog.Logger
}

var _ auth.Authenticator = (*Authenticator)(nil)

// NewAuthenticator returns the bootstrap authenticator.
func NewAuthenticator(o AuthenticatorOptions) *Authenticator {
	if o.Audience == "" {
		o.Audience = SATokenAudience
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Authenticator{o: o, log: o.Logger.With("component", "auth/k8s_sa")}
}

var _ compute.BootstrapAuthenticatorProvider = (*Driver)(nil)

// BootstrapAuthenticator implements compute.BootstrapAuthenticatorProvider:
// the IssueSandboxToken authenticator for this driver's namespaces and
// ServiceAccounts. It is nil when bootstrap_auth is false.
func (d *Driver) BootstrapAuthenticator(context.Context) (auth.Authenticator, error) {
	if !d.cfg.BootstrapAuth {
		return nil, nil
	}
	sav := d.cfg.ServiceAccountValidator()
	d.log.Info("K8s ServiceAccount bootstrap authenticator enabled", "namespace", d.nsv.String(), "accepted_service_accounts", sav.Names())
	return NewAuthenticator(AuthenticatorOptions{
		Kube: d.kube, Dynamic: d.dyn, Namespaces: d.nsv, ServiceAccounts: sav, Logger: d.base,
	}), nil
}

func denied(msg string) error { return errdefs.PermissionDenied(msg) }

// Authenticate implements auth.Authenticator.
func (a *Authenticator) Authenticate(ctx context.Context, req *auth.Request) (*auth.Principal, error) {
	if req.FullMethod != auth.IssueSandboxTokenMethod {
		return nil, nil
	}
	token := req.BearerToken()
	if token == "" {
		return nil, nil
	}
	review, err := a.o.Kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{a.o.Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		a.log.Warn("K8s TokenReview failed", "err", err)
		return nil, fmt.Errorf("tokenreview: %w", err)
	}
	st := review.Status
	if !st.Authenticated {
		a.log.Debug("K8s TokenReview did not authenticate the token", "error", st.Error)
		return nil, nil
	}
	if !slices.Contains(st.Audiences, a.o.Audience) {
		a.log.Warn("K8s TokenReview authenticated a token without the expected audience", "audiences", st.Audiences)
		return nil, errdefs.Unauthenticated("SA token audience not accepted")
	}
	username := st.User.Username
	ns, sa, ok := parseSAUsername(username)
	if !ok {
		a.log.Warn("K8s TokenReview username is not a service account", "username", username)
		return nil, denied("SA token username format not recognized")
	}
	if !a.o.ServiceAccounts.AcceptsIn(ns, sa) {
		a.log.Warn("K8s TokenReview principal is not an accepted sandbox service account",
			"username", username, "service_account", sa, "accepted_service_accounts", a.o.ServiceAccounts.Names())
		return nil, denied("SA token is not from an accepted sandbox service account")
	}
	if !a.o.Namespaces.Accepts(ns) {
		a.log.Warn("K8s TokenReview ServiceAccount namespace not accepted", "username", username, "namespace", ns)
		return nil, denied("SA token is not from an accepted sandbox namespace")
	}
	podName, err := extraOne(st.User.Extra, extraPodName)
	var podUID string
	if err == nil {
		podUID, err = extraOne(st.User.Extra, extraPodUID)
	}
	if err != nil {
		a.log.Warn("K8s SA token rejected: not bound to exactly one pod", "username", username, "reason", err.Error())
		return nil, err
	}
	pod, err := a.o.Kube.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		a.log.Warn("sandbox pod referenced by SA token not found", "namespace", ns, "pod", podName)
		return nil, errdefs.NotFound("sandbox pod not found")
	} else if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", ns, podName, err)
	}
	if string(pod.UID) != podUID {
		a.log.Warn("SA token pod UID does not match the live pod", "pod", podName, "claimed_uid", podUID, "actual_uid", pod.UID)
		return nil, denied("SA token pod UID mismatch")
	}
	sandboxID := pod.Annotations[AnnotationSandboxID]
	if sandboxID == "" {
		a.log.Warn("pod has no sandbox-id annotation", "pod", podName)
		return nil, denied("pod is not bound to a sandbox identity")
	}
	owner, err := sandboxOwner(pod)
	if err != nil {
		a.log.Warn("sandbox pod rejected: not controlled by exactly one OpenShell Sandbox", "namespace", ns, "pod", podName, "reason", err.Error())
		return nil, err
	}
	cr, err := a.getSandbox(ctx, ns, owner)
	if err != nil {
		return nil, err
	}
	if cr == nil {
		a.log.Warn("pod ownerReference points to a Sandbox that does not exist", "pod", podName, "sandbox_owner", owner.Name)
		return nil, denied("sandbox owner not found")
	}
	if cr.GetUID() != owner.UID {
		a.log.Warn("pod Sandbox ownerReference UID does not match the live Sandbox", "sandbox_owner", owner.Name, "owner_uid", owner.UID, "actual_uid", cr.GetUID())
		return nil, denied("sandbox owner UID mismatch")
	}
	if got := cr.GetLabels()[LabelSandboxID]; got != sandboxID {
		a.log.Warn("pod sandbox annotation does not match the owning Sandbox label", "sandbox_owner", owner.Name, "pod_sandbox_id", sandboxID, "cr_sandbox_id", got)
		return nil, denied("sandbox owner ID mismatch")
	}
	a.log.Info("sandbox bootstrapped from a K8s ServiceAccount token", "sandbox_id", sandboxID, "namespace", ns, "pod", podName, "service_account", sa)
	return &auth.Principal{
		Kind:        auth.KindSandbox,
		Source:      auth.SourceK8sSABootstrap,
		Subject:     "spiffe://openshell/sandbox/" + sandboxID,
		DisplayName: ns + "/" + podName,
		SandboxID:   sandboxID,
	}, nil
}

// parseSAUsername splits "system:serviceaccount:<ns>:<sa>".
func parseSAUsername(u string) (ns, sa string, ok bool) {
	rest, ok := strings.CutPrefix(u, "system:serviceaccount:")
	if !ok {
		return "", "", false
	}
	ns, sa, ok = strings.Cut(rest, ":")
	if !ok || ns == "" || sa == "" || strings.Contains(sa, ":") {
		return "", "", false
	}
	return ns, sa, true
}

func extraOne(extra map[string]authenticationv1.ExtraValue, key string) (string, error) {
	v, ok := extra[key]
	if !ok {
		return "", denied("SA token is not pod-bound")
	}
	if len(v) != 1 || v[0] == "" {
		return "", denied("SA token has invalid pod binding")
	}
	return v[0], nil
}

func sandboxAPIVersion(v string) bool {
	return v == SandboxV1beta1.GroupVersion().String() || v == SandboxV1alpha1.GroupVersion().String()
}

// sandboxOwner returns the pod's single controlling Sandbox ownerReference.
func sandboxOwner(pod *corev1.Pod) (metav1.OwnerReference, error) {
	var refs []metav1.OwnerReference
	for _, o := range pod.OwnerReferences {
		if o.Kind == sandboxKind && sandboxAPIVersion(o.APIVersion) {
			refs = append(refs, o)
		}
	}
	switch {
	case len(refs) == 0:
		return metav1.OwnerReference{}, denied("pod is not controlled by an OpenShell Sandbox")
	case len(refs) > 1:
		return metav1.OwnerReference{}, denied("pod has multiple OpenShell Sandbox owners")
	case refs[0].Controller == nil || !*refs[0].Controller:
		return metav1.OwnerReference{}, denied("pod Sandbox ownerReference is not controlling")
	case refs[0].Name == "" || refs[0].UID == "":
		return metav1.OwnerReference{}, denied("pod Sandbox ownerReference is incomplete")
	}
	return refs[0], nil
}

// getSandbox fetches the owning Sandbox, trying the owner's API version
// first and then the other one; nil when neither has it.
func (a *Authenticator) getSandbox(ctx context.Context, ns string, owner metav1.OwnerReference) (*unstructured.Unstructured, error) {
	versions := []string{SandboxV1beta1.Version, SandboxV1alpha1.Version}
	if owner.APIVersion == SandboxV1alpha1.GroupVersion().String() {
		slices.Reverse(versions)
	}
	for _, v := range versions {
		gvr := SandboxV1beta1
		gvr.Version = v
		u, err := a.o.Dynamic.Resource(gvr).Namespace(ns).Get(ctx, owner.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			a.log.Warn("failed to fetch the owning Sandbox", "sandbox_owner", owner.Name, "version", v, "err", err)
			return nil, fmt.Errorf("get sandbox %s/%s: %w", ns, owner.Name, err)
		}
		return u, nil
	}
	return nil, nil
}
