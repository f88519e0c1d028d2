package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/version"
)

// DriverName is the name the gateway registers this driver under.
const DriverName = "kubernetes"

// Sandbox resources of the agent-sandbox API.
var (
	SandboxV1beta1  = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	SandboxV1alpha1 = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1alpha1", Resource: "sandboxes"}
)

const sandboxKind = "Sandbox"

// podNameAnnotation is set by agent-sandbox on Sandboxes whose pod is not
// named after the Sandbox (warm pools).
const podNameAnnotation = "agents.x-k8s.io/pod-name"

// deleteWait bounds how long Delete waits for the CR to disappear.
const deleteWait = 15 * time.Second

// Driver is the Kubernetes compute driver.
type Driver struct {
	cfg  Config
	log  *slog.Logger // scoped: component=compute/kubernetes
	base *slog.Logger // unscoped, for components the driver builds
	kube kubernetes.Interface
	dyn  dynamic.Interface
	nsv  NamespaceValidator

	mu  sync.Mutex
	gvr schema.GroupVersionResource // discovered; zero until then

	// beforeAdoptWrite, when set (tests), runs between Adopt's read and
	// its conditional write.
	beforeAdoptWrite func()
}

var (
	_ compute.Driver                 = (*Driver)(nil)
	_ compute.WorkspaceScoper        = (*Driver)(nil)
	_ compute.ServiceAccountSelector = (*Driver)(nil)
)

// SelectsServiceAccounts implements compute.ServiceAccountSelector: a
// template may name one of the selectable ServiceAccounts
// (selectable_service_account_names).
func (d *Driver) SelectsServiceAccounts() {}

// New is the compute.Factory of the driver.
func New(cfg map[string]any, deps compute.FactoryDeps) (compute.Driver, error) {
	return Open(cfg, deps)
}

// Open builds the driver from its config table. It connects lazily: the
// Sandbox API version is discovered on first use.
func Open(cfg map[string]any, deps compute.FactoryDeps) (*Driver, error) {
	c, err := ParseConfig(cfg)
	if err != nil {
		return nil, err
	}
	var rc *rest.Config
	if c.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes driver: cluster connection (set kubeconfig when not in a cluster): %w", errors.Join(err, errdefs.ErrInvalidArgument))
	}
	c.SupervisorEnv = deps.SupervisorEnv
	return NewForConfig(rc, c, deps.Logger)
}

// NewForConfig builds the driver from a parsed Config and a rest.Config.
func NewForConfig(rc *rest.Config, c Config, logger *slog.Logger) (*Driver, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	rc = rest.CopyConfig(rc)
	rc.UserAgent = "openshell-gateway/" + version.Version
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes driver: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes driver: %w", err)
	}
	return &Driver{cfg: c, log: logger.With("component", "compute/kubernetes"), base: logger, kube: kube, dyn: dyn, nsv: c.NamespaceValidator()}, nil
}

// Config returns the driver's configuration.
func (d *Driver) Config() Config { return d.cfg }

// sandboxGVR returns the served Sandbox version: v1beta1 when served, else
// v1alpha1. Discovery runs once successfully.
func (d *Driver) sandboxGVR(ctx context.Context) (schema.GroupVersionResource, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.gvr.Empty() {
		return d.gvr, nil
	}
	var errs []error
	candidates := []schema.GroupVersionResource{SandboxV1beta1, SandboxV1alpha1}
	switch d.cfg.SandboxAPIVersion {
	case SandboxV1beta1.Version:
		candidates = candidates[:1]
	case SandboxV1alpha1.Version:
		candidates = candidates[1:]
	}
	for _, gvr := range candidates {
		list, err := d.kube.Discovery().ServerResourcesForGroupVersion(gvr.GroupVersion().String())
		if err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
			continue
		}
		for _, r := range list.APIResources {
			if r.Name == gvr.Resource {
				d.gvr = gvr
				d.log.Info("sandbox API discovered", "version", gvr.Version)
				return gvr, nil
			}
		}
	}
	if len(errs) > 0 {
		return schema.GroupVersionResource{}, fmt.Errorf("kubernetes driver: discover the Sandbox API: %w", errors.Join(append(errs, errdefs.ErrUnavailable)...))
	}
	want := "v1beta1 or v1alpha1"
	if d.cfg.SandboxAPIVersion != "" {
		want = d.cfg.SandboxAPIVersion
	}
	return schema.GroupVersionResource{}, errdefs.FailedPrecondition(fmt.Sprintf("the agents.x-k8s.io Sandbox API (%s) is not served by this cluster; install agent-sandbox", want))
}

func (d *Driver) v1beta1(gvr schema.GroupVersionResource) bool { return gvr.Version == "v1beta1" }

// Capabilities implements compute.Driver.
func (d *Driver) Capabilities(context.Context) (compute.Capabilities, error) {
	return compute.Capabilities{DriverName: DriverName, DriverVersion: version.Version, DefaultImage: d.cfg.DefaultImage}, nil
}

// managedSelector selects this gateway's Sandbox CRs.
func (d *Driver) managedSelector(extra ...string) string {
	s := []string{LabelManagedBy + "=" + managedByValue}
	if d.cfg.GatewayID != "" {
		s = append(s, LabelGatewayID+"="+d.cfg.GatewayID)
	}
	return strings.Join(append(s, extra...), ",")
}

// listScope is the namespace lists run in: the sandbox namespace in shared
// mode, all namespaces (filtered by the validator) otherwise.
func (d *Driver) listScope() string {
	if d.cfg.WorkspaceMode == ModeShared {
		return d.cfg.SandboxNamespace
	}
	return metav1.NamespaceAll
}

// namespaceFor picks the namespace a new sandbox goes to.
func (d *Driver) namespaceFor(sb compute.Sandbox) (string, error) {
	var ns string
	switch d.cfg.WorkspaceMode {
	case ModeShared:
		ns = d.cfg.SandboxNamespace
		if sb.Namespace != "" && sb.Namespace != ns {
			return "", errdefs.InvalidArgument(fmt.Sprintf("namespace %q is not an accepted sandbox namespace", sb.Namespace))
		}
	case ModeManaged:
		var err error
		if ns, err = d.workspaceNamespace(sb.Workspace); err != nil {
			return "", err
		}
	case ModeOperator:
		ns = sb.Namespace
		if ns == "" && sb.Workspace != "" && d.nsv.Accepts(sb.Workspace) {
			ns = sb.Workspace
		}
		if ns == "" {
			ns = d.cfg.SandboxNamespace
		}
	}
	if !d.nsv.Accepts(ns) {
		return "", errdefs.InvalidArgument(fmt.Sprintf("namespace %q is not an accepted sandbox namespace", ns))
	}
	return ns, nil
}

// workspaceNamespace is the managed-mode namespace of a workspace.
func (d *Driver) workspaceNamespace(ws string) (string, error) {
	if ws == "" {
		ws = "default"
	}
	ns := d.cfg.managedPrefix() + ws
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return "", errdefs.InvalidArgument(fmt.Sprintf("workspace %q does not make a valid namespace name %q: %s", ws, ns, strings.Join(errs, "; ")))
	}
	return ns, nil
}

// EnsureWorkspace implements compute.WorkspaceScoper: in managed mode it creates the
// workspace namespace and the sandbox ServiceAccount in it; otherwise it
// does nothing.
func (d *Driver) EnsureWorkspace(ctx context.Context, ws string) error {
	if d.cfg.WorkspaceMode != ModeManaged {
		return nil
	}
	ns, err := d.workspaceNamespace(ws)
	if err != nil {
		return err
	}
	lbl := map[string]string{LabelManagedBy: managedByValue, LabelGatewayID: d.cfg.GatewayID}
	_, err = d.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: lbl}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return apiError("namespace "+ns, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: d.cfg.ServiceAccountName, Namespace: ns, Labels: lbl}}
	_, err = d.kube.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return apiError("serviceaccount "+ns+"/"+d.cfg.ServiceAccountName, err)
	}
	return nil
}

// DeleteWorkspace implements compute.WorkspaceScoper: in managed mode it deletes the
// workspace namespace (only one this gateway created).
func (d *Driver) DeleteWorkspace(ctx context.Context, ws string) error {
	if d.cfg.WorkspaceMode != ModeManaged {
		return nil
	}
	ns, err := d.workspaceNamespace(ws)
	if err != nil {
		return err
	}
	got, err := d.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return apiError("namespace "+ns, err)
	}
	if got.Labels[LabelManagedBy] != managedByValue || got.Labels[LabelGatewayID] != d.cfg.GatewayID {
		return errdefs.FailedPrecondition(fmt.Sprintf("namespace %s is not managed by this gateway", ns))
	}
	err = d.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &got.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return apiError("namespace "+ns, err)
	}
	return nil
}

// apiError maps an apiserver error to an errdefs kind.
func apiError(what string, err error) error {
	var kind error
	switch {
	case apierrors.IsNotFound(err):
		kind = errdefs.ErrNotFound
	case apierrors.IsAlreadyExists(err):
		kind = errdefs.ErrAlreadyExists
	case apierrors.IsConflict(err):
		kind = errdefs.ErrConflict
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		kind = errdefs.ErrInvalidArgument
	case apierrors.IsForbidden(err):
		kind = errdefs.ErrFailedPrecondition
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsServiceUnavailable(err), apierrors.IsTooManyRequests(err):
		kind = errdefs.ErrUnavailable
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, errors.Join(kind, err))
}

// plan is a validated create request.
type plan struct {
	namespace string
	opts      enrichOptions
	driverCfg driverConfig
}

// driverConfig is the per-sandbox template.driver_config.kubernetes block.
type driverConfig struct {
	nodeSelector      map[string]string
	tolerations       []any
	priorityClassName string
}

func parseDriverConfig(m map[string]any) (driverConfig, error) {
	var dc driverConfig
	for k, v := range m {
		switch k {
		case "node_selector":
			sel, ok := v.(map[string]any)
			if !ok {
				return dc, errdefs.InvalidArgument("driver_config.kubernetes.node_selector must be a map of strings")
			}
			dc.nodeSelector = map[string]string{}
			for sk, sv := range sel {
				s, ok := sv.(string)
				if !ok {
					return dc, errdefs.InvalidArgument("driver_config.kubernetes.node_selector must be a map of strings")
				}
				dc.nodeSelector[sk] = s
			}
		case "tolerations":
			l, ok := v.([]any)
			if !ok {
				return dc, errdefs.InvalidArgument("driver_config.kubernetes.tolerations must be a list of objects")
			}
			for _, e := range l {
				if _, ok := e.(map[string]any); !ok {
					return dc, errdefs.InvalidArgument("driver_config.kubernetes.tolerations must be a list of objects")
				}
			}
			dc.tolerations = l
		case "priority_class_name":
			s, ok := v.(string)
			if !ok || len(validation.IsDNS1123Subdomain(s)) > 0 {
				return dc, errdefs.InvalidArgument("driver_config.kubernetes.priority_class_name must be a valid name")
			}
			dc.priorityClassName = s
		default:
			return dc, errdefs.InvalidArgument(fmt.Sprintf("driver_config.kubernetes: unknown key %q (known: node_selector, tolerations, priority_class_name)", k))
		}
	}
	return dc, nil
}

// ValidateCreate implements compute.Driver. It has no side effects.
func (d *Driver) ValidateCreate(ctx context.Context, sb compute.Sandbox) error {
	p, err := d.plan(sb)
	if err != nil {
		return err
	}
	return d.checkSelectedAccount(ctx, p)
}

// checkSelectedAccount: in managed mode a non-default ServiceAccount must
// already exist in the workspace namespace (EnsureWorkspace only creates the
// default one), or the pod could never start.
func (d *Driver) checkSelectedAccount(ctx context.Context, p plan) error {
	sa := p.opts.ServiceAccountName
	if d.cfg.WorkspaceMode != ModeManaged || sa == d.cfg.ServiceAccountName {
		return nil
	}
	_, err := d.kube.CoreV1().ServiceAccounts(p.namespace).Get(ctx, sa, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return errdefs.FailedPrecondition(fmt.Sprintf("service account '%s' does not exist in namespace %s", sa, p.namespace))
	} else if err != nil {
		return apiError("get serviceaccount "+p.namespace+"/"+sa, err)
	}
	return nil
}

func (d *Driver) plan(sb compute.Sandbox) (plan, error) {
	var p plan
	if sb.ID == "" {
		return p, errdefs.InvalidArgument("sandbox id is required")
	}
	if errs := validation.IsValidLabelValue(sb.ID); len(errs) > 0 {
		return p, errdefs.InvalidArgument(fmt.Sprintf("sandbox id %q is not usable as a Kubernetes label value", sb.ID))
	}
	if sb.Name == "" {
		return p, errdefs.InvalidArgument("sandbox name is required")
	}
	if errs := validation.IsDNS1123Label(sb.Name); len(errs) > 0 {
		return p, errdefs.InvalidArgument(fmt.Sprintf("sandbox name %q is not a valid Kubernetes name: %s", sb.Name, strings.Join(errs, "; ")))
	}
	ns, err := d.namespaceFor(sb)
	if err != nil {
		return p, err
	}
	t := sb.Spec.Template
	image := t.Image
	if image == "" {
		image = d.cfg.DefaultImage
	}
	if image == "" {
		return p, errdefs.InvalidArgument("template.image is required: this gateway has no default_image")
	}
	if err := checkImage("template.image", image); err != nil {
		return p, errdefs.InvalidArgument(err.Error())
	}
	if err := checkResources(t.Resources); err != nil {
		return p, err
	}
	sa, err := d.resolveServiceAccount(sb.ID, ns, t.ServiceAccountName)
	if err != nil {
		return p, err
	}
	runtimeClass := d.cfg.RuntimeClassName
	if s := t.RuntimeClassName; s != "" {
		if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
			return p, errdefs.InvalidArgument(fmt.Sprintf("template.runtime_class_name %q is not a valid Kubernetes name: %s", s, strings.Join(errs, "; ")))
		}
		runtimeClass = s
	}
	annotations := map[string]string{}
	for k, v := range t.Annotations {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return p, errdefs.InvalidArgument(fmt.Sprintf("template annotation key %q is not valid: %s", k, strings.Join(errs, "; ")))
		}
		annotations[k] = v
	}
	for k, v := range t.Labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return p, errdefs.InvalidArgument(fmt.Sprintf("template label key %q is not valid: %s", k, strings.Join(errs, "; ")))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return p, errdefs.InvalidArgument(fmt.Sprintf("template label %q value is not valid: %s", k, strings.Join(errs, "; ")))
		}
	}
	userns := d.cfg.EnableUserNamespaces
	if t.UserNamespaces != nil {
		userns = *t.UserNamespaces
	}
	dc, err := parseDriverConfig(t.DriverConfig)
	if err != nil {
		return p, err
	}
	env := map[string]string{}
	for k, v := range t.Environment {
		env[k] = v
	}
	for k, v := range sb.Spec.Environment {
		env[k] = v
	}
	for k := range env {
		if errs := validation.IsEnvVarName(k); len(errs) > 0 {
			return p, errdefs.InvalidArgument(fmt.Sprintf("environment variable name %q is not valid", k))
		}
	}
	p = plan{namespace: ns, driverCfg: dc, opts: enrichOptions{
		SandboxID: sb.ID, SandboxName: sb.Name, Image: image, ImagePullPolicy: d.cfg.ImagePullPolicy,
		SupervisorImage: d.cfg.SupervisorImage, SupervisorPullPolicy: d.cfg.ImagePullPolicy,
		Endpoint: d.cfg.GatewayEndpoint, SupervisorEnv: d.cfg.SupervisorEnv, LogLevel: sb.Spec.LogLevel, Command: sb.Spec.Command, TTY: sb.Spec.TTY,
		Env: env, ClientTLSSecretName: d.cfg.ClientTLSSecretName, SATokenTTLSecs: d.cfg.SATokenTTLSecs,
		ServiceAccountName: sa, RuntimeClassName: runtimeClass, Resources: t.Resources,
		Labels: t.Labels, Annotations: annotations, NodeSelector: dc.nodeSelector, Tolerations: dc.tolerations,
		PriorityClassName: dc.priorityClassName, UserNamespaces: userns,
	}}
	if d.cfg.WorkspacePVC != nil {
		p.opts.WorkspaceClaim = workspaceVolume
	}
	if _, conflicts := enrich(nil, p.opts); len(conflicts) > 0 {
		return p, errdefs.InvalidArgument(strings.Join(conflicts, "; "))
	}
	return p, nil
}

// resolveServiceAccount picks the pod's ServiceAccount: the configured
// service_account_name when requested is empty, else requested (trimmed)
// when it is selectable in namespace ns. A blank or non-selectable request
// is InvalidArgument: never a fallback.
func (d *Driver) resolveServiceAccount(sandboxID, ns, requested string) (string, error) {
	if requested == "" {
		return d.cfg.ServiceAccountName, nil
	}
	sel := d.cfg.SelectableServiceAccounts()
	if t := strings.TrimSpace(requested); t != "" && sel.AcceptsIn(ns, t) {
		return t, nil
	}
	d.log.Warn("rejected a sandbox ServiceAccount request that is not selectable",
		"sandbox_id", sandboxID, "requested_service_account", requested, "selectable_service_accounts", sel.Names())
	return "", errdefs.InvalidArgument(fmt.Sprintf("service_account_name '%s' is not selectable on this gateway", requested))
}

func checkResources(r compute.Resources) error {
	parse := func(what, q string) (*resource.Quantity, error) {
		if q == "" {
			return nil, nil
		}
		v, err := resource.ParseQuantity(q)
		if err != nil {
			return nil, errdefs.InvalidArgument(fmt.Sprintf("resources.%s %q is not a valid quantity", what, q))
		}
		if v.Sign() < 0 {
			return nil, errdefs.InvalidArgument(fmt.Sprintf("resources.%s %q must not be negative", what, q))
		}
		return &v, nil
	}
	pairs := []struct{ kind, req, lim string }{{"cpu", r.CPURequest, r.CPULimit}, {"memory", r.MemoryRequest, r.MemoryLimit}}
	for _, p := range pairs {
		req, err := parse(p.kind+"_request", p.req)
		if err != nil {
			return err
		}
		lim, err := parse(p.kind+"_limit", p.lim)
		if err != nil {
			return err
		}
		if req != nil && lim != nil && req.Cmp(*lim) > 0 {
			return errdefs.InvalidArgument(fmt.Sprintf("resources.%s_request %s exceeds %s_limit %s", p.kind, p.req, p.kind, p.lim))
		}
	}
	return nil
}

// sandboxObject builds the Sandbox CR for a plan.
func (d *Driver) sandboxObject(gvr schema.GroupVersionResource, sb compute.Sandbox, p plan) (*unstructured.Unstructured, error) {
	pt, conflicts := enrich(nil, p.opts)
	if len(conflicts) > 0 {
		return nil, errdefs.InvalidArgument(strings.Join(conflicts, "; "))
	}
	lbl := map[string]any{LabelManagedBy: managedByValue, LabelSandboxID: sb.ID}
	if d.cfg.GatewayID != "" {
		lbl[LabelGatewayID] = d.cfg.GatewayID
	}
	spec := map[string]any{"podTemplate": pt}
	if d.v1beta1(gvr) {
		spec["operatingMode"] = "Running"
	} else {
		spec["replicas"] = int64(1)
	}
	if pvc := d.cfg.WorkspacePVC; pvc != nil {
		claim := map[string]any{
			"accessModes": []any{"ReadWriteOnce"},
			"resources":   map[string]any{"requests": map[string]any{"storage": pvc.Size}},
		}
		if pvc.StorageClass != "" {
			claim["storageClassName"] = pvc.StorageClass
		}
		spec["volumeClaimTemplates"] = []any{map[string]any{"metadata": map[string]any{"name": workspaceVolume}, "spec": claim}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(),
		"kind":       sandboxKind,
		"metadata":   map[string]any{"name": sb.Name, "namespace": p.namespace, "labels": lbl},
		"spec":       spec,
	}}, nil
}

// Create implements compute.Driver.
func (d *Driver) Create(ctx context.Context, sb compute.Sandbox) error {
	p, err := d.plan(sb)
	if err != nil {
		return err
	}
	if err := d.checkSelectedAccount(ctx, p); err != nil {
		return err
	}
	gvr, err := d.sandboxGVR(ctx)
	if err != nil {
		return err
	}
	if _, err := d.find(ctx, compute.Ref{ID: sb.ID}); err == nil {
		return errdefs.AlreadyExists(fmt.Sprintf("sandbox %s already exists", sb.ID))
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	obj, err := d.sandboxObject(gvr, sb, p)
	if err != nil {
		return err
	}
	if _, err := d.dyn.Resource(gvr).Namespace(p.namespace).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return errdefs.AlreadyExists(fmt.Sprintf("sandbox %q already exists in namespace %s", sb.Name, p.namespace))
		}
		return apiError(fmt.Sprintf("create sandbox %s/%s", p.namespace, sb.Name), err)
	}
	d.log.Info("sandbox created", "sandbox_id", sb.ID, "namespace", p.namespace, "name", sb.Name, "api_version", gvr.Version)
	return nil
}

// find returns the CR for ref: by id (label) first, then by name.
func (d *Driver) find(ctx context.Context, ref compute.Ref) (*unstructured.Unstructured, error) {
	gvr, err := d.sandboxGVR(ctx)
	if err != nil {
		return nil, err
	}
	ri := d.dyn.Resource(gvr).Namespace(d.listScope())
	var opts metav1.ListOptions
	switch {
	case ref.ID != "":
		if len(validation.IsValidLabelValue(ref.ID)) > 0 {
			return nil, errdefs.NotFound(fmt.Sprintf("sandbox %s not found", ref.ID))
		}
		opts.LabelSelector = d.managedSelector(LabelSandboxID + "=" + ref.ID)
	case ref.Name != "":
		opts.LabelSelector = d.managedSelector()
		opts.FieldSelector = "metadata.name=" + ref.Name
	default:
		return nil, errdefs.InvalidArgument("sandbox id or name is required")
	}
	l, err := ri.List(ctx, opts)
	if err != nil {
		return nil, apiError("list sandboxes", err)
	}
	for i := range l.Items {
		u := &l.Items[i]
		if !d.nsv.Accepts(u.GetNamespace()) {
			continue
		}
		if ref.Name != "" && u.GetName() != ref.Name {
			continue
		}
		return u, nil
	}
	what := ref.ID
	if what == "" {
		what = ref.Name
	}
	return nil, errdefs.NotFound(fmt.Sprintf("sandbox %s not found", what))
}

// podFor returns the live pod of cr, or nil.
func (d *Driver) podFor(ctx context.Context, cr *unstructured.Unstructured) (*corev1.Pod, error) {
	pod, err := d.kube.CoreV1().Pods(cr.GetNamespace()).Get(ctx, podName(cr), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, apiError("get pod", err)
	}
	if !ownedBy(pod, cr) {
		return nil, nil
	}
	return pod, nil
}

func podName(cr *unstructured.Unstructured) string {
	if n := cr.GetAnnotations()[podNameAnnotation]; n != "" {
		return n
	}
	return cr.GetName()
}

// ownedBy reports whether pod's controller is cr.
func ownedBy(pod *corev1.Pod, cr *unstructured.Unstructured) bool {
	for _, o := range pod.OwnerReferences {
		if o.Controller != nil && *o.Controller && o.Kind == sandboxKind && o.UID == cr.GetUID() {
			return true
		}
	}
	return false
}

// Get implements compute.Driver.
func (d *Driver) Get(ctx context.Context, ref compute.Ref) (compute.Sandbox, error) {
	cr, err := d.find(ctx, ref)
	if err != nil {
		return compute.Sandbox{}, err
	}
	pod, err := d.podFor(ctx, cr)
	if err != nil {
		return compute.Sandbox{}, err
	}
	return d.view(cr, pod), nil
}

// List implements compute.Driver.
func (d *Driver) List(ctx context.Context) ([]compute.Sandbox, error) {
	gvr, err := d.sandboxGVR(ctx)
	if err != nil {
		return nil, err
	}
	l, err := d.dyn.Resource(gvr).Namespace(d.listScope()).List(ctx, metav1.ListOptions{LabelSelector: d.managedSelector()})
	if err != nil {
		return nil, apiError("list sandboxes", err)
	}
	pods, err := d.kube.CoreV1().Pods(d.listScope()).List(ctx, metav1.ListOptions{LabelSelector: LabelSandboxID})
	if err != nil {
		return nil, apiError("list pods", err)
	}
	byKey := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		byKey[p.Namespace+"/"+p.Name] = p
	}
	var out []compute.Sandbox
	for i := range l.Items {
		cr := &l.Items[i]
		if !d.nsv.Accepts(cr.GetNamespace()) {
			continue
		}
		pod := byKey[cr.GetNamespace()+"/"+podName(cr)]
		if pod != nil && !ownedBy(pod, cr) {
			pod = nil
		}
		out = append(out, d.view(cr, pod))
	}
	slices.SortFunc(out, func(a, b compute.Sandbox) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// suspended reports whether cr asks for no pod.
func suspended(cr *unstructured.Unstructured) bool {
	if strings.HasSuffix(cr.GetAPIVersion(), "/v1alpha1") {
		r, found, _ := unstructured.NestedInt64(cr.Object, "spec", "replicas")
		return found && r == 0
	}
	m, _, _ := unstructured.NestedString(cr.Object, "spec", "operatingMode")
	return m == "Suspended"
}

func crCondition(cr *unstructured.Unstructured, typ string) (compute.Condition, bool) {
	conds, _, _ := unstructured.NestedSlice(cr.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] != typ {
			continue
		}
		s := func(k string) string { v, _ := m[k].(string); return v }
		return compute.Condition{Type: typ, Status: s("status"), Reason: s("reason"), Message: s("message"), LastTransitionTime: s("lastTransitionTime")}, true
	}
	return compute.Condition{}, false
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// terminalWaiting are container waiting reasons after which the pod will not
// become ready by itself.
var terminalWaiting = []string{"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerError", "CreateContainerConfigError"}

// view composes the backend's view of one sandbox from its CR and pod.
func (d *Driver) view(cr *unstructured.Unstructured, pod *corev1.Pod) compute.Sandbox {
	sb := compute.Sandbox{
		ID:        cr.GetLabels()[LabelSandboxID],
		Name:      cr.GetName(),
		Namespace: cr.GetNamespace(),
		Status:    compute.Status{SandboxName: cr.GetName(), Deleting: cr.GetDeletionTimestamp() != nil},
	}
	if pod != nil && pod.DeletionTimestamp == nil {
		sb.Status.InstanceID = string(pod.UID)
	}
	// Transition times come from the objects, never the clock, so that an
	// unchanged state yields an identical view.
	since := cr.GetCreationTimestamp().UTC().Format(time.RFC3339)
	if c, ok := crCondition(cr, compute.ConditionReady); ok && c.LastTransitionTime != "" {
		since = c.LastTransitionTime
	}
	susp := suspended(cr)
	suspCond := compute.Condition{Type: compute.ConditionSuspended, Status: "False", Reason: "Running", LastTransitionTime: since}
	if c, ok := crCondition(cr, compute.ConditionSuspended); ok && !susp {
		suspCond = c
		suspCond.Status = "False"
	}
	if susp {
		suspCond = compute.Condition{Type: compute.ConditionSuspended, Status: "True", Reason: "Suspended", Message: "sandbox is suspended", LastTransitionTime: since}
		if c, ok := crCondition(cr, compute.ConditionSuspended); ok && c.LastTransitionTime != "" {
			suspCond.LastTransitionTime = c.LastTransitionTime
		}
	}
	ready := compute.Condition{Type: compute.ConditionReady, Status: "False", Reason: "PodNotReady", Message: "waiting for the sandbox pod", LastTransitionTime: since}
	crReady, haveCR := crCondition(cr, compute.ConditionReady)
	switch {
	case sb.Status.Deleting:
		ready.Reason, ready.Message = "Deleting", "sandbox is being deleted"
	case susp:
		ready.Reason, ready.Message = "Suspended", "sandbox is suspended"
	case pod == nil:
		ready.Reason, ready.Message = "PodPending", "waiting for the sandbox pod to be created"
	case pod.Status.Phase == corev1.PodFailed:
		ready.Reason, ready.Message = "Failed", "sandbox pod failed: "+pod.Status.Message
	case pod.Status.Phase == corev1.PodSucceeded:
		ready.Reason, ready.Message = "ProcessExited", "sandbox pod exited"
	case podReady(pod) && (!haveCR || crReady.Status == "True"):
		ready.Status, ready.Reason, ready.Message = "True", "DependenciesReady", "sandbox pod is ready"
		if haveCR {
			ready.Reason, ready.Message, ready.LastTransitionTime = crReady.Reason, crReady.Message, crReady.LastTransitionTime
		}
	default:
		for _, cs := range pod.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && slices.Contains(terminalWaiting, w.Reason) {
				ready.Reason, ready.Message = w.Reason, w.Message
			}
		}
		if haveCR && crReady.Reason != "" && ready.Reason == "PodNotReady" {
			ready.Message = crReady.Message
		}
	}
	sb.Status.Conditions = []compute.Condition{ready, suspCond}
	return sb
}

func (d *Driver) setRunning(ctx context.Context, ref compute.Ref, running bool) error {
	cr, err := d.find(ctx, ref)
	if err != nil {
		return err
	}
	if cr.GetDeletionTimestamp() != nil {
		return errdefs.FailedPrecondition(fmt.Sprintf("sandbox %s is being deleted", cr.GetName()))
	}
	if suspended(cr) == !running {
		return nil
	}
	gvr := schema.GroupVersionResource{Group: SandboxV1beta1.Group, Version: strings.TrimPrefix(cr.GetAPIVersion(), SandboxV1beta1.Group+"/"), Resource: SandboxV1beta1.Resource}
	var patch string
	switch {
	case d.v1beta1(gvr) && running:
		patch = `{"spec":{"operatingMode":"Running"}}`
	case d.v1beta1(gvr):
		patch = `{"spec":{"operatingMode":"Suspended"}}`
	case running:
		patch = `{"spec":{"replicas":1}}`
	default:
		patch = `{"spec":{"replicas":0}}`
	}
	if _, err := d.dyn.Resource(gvr).Namespace(cr.GetNamespace()).Patch(ctx, cr.GetName(), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return apiError("patch sandbox "+cr.GetName(), err)
	}
	d.log.Info("sandbox operating mode changed", "sandbox_id", cr.GetLabels()[LabelSandboxID], "running", running)
	return nil
}

// Stop implements compute.Driver: operatingMode Suspended (v1beta1) or
// replicas 0 (v1alpha1); the controller deletes the pod.
func (d *Driver) Stop(ctx context.Context, ref compute.Ref) error {
	return d.setRunning(ctx, ref, false)
}

// Start implements compute.Driver: operatingMode Running or replicas 1.
func (d *Driver) Start(ctx context.Context, ref compute.Ref) error {
	return d.setRunning(ctx, ref, true)
}

// Delete implements compute.Driver. It deletes the Sandbox CR (its pod and
// claims go by owner references) and waits a bounded time for it to go.
func (d *Driver) Delete(ctx context.Context, ref compute.Ref) (bool, error) {
	cr, err := d.find(ctx, ref)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	gvr, err := d.sandboxGVR(ctx)
	if err != nil {
		return false, err
	}
	ri := d.dyn.Resource(gvr).Namespace(cr.GetNamespace())
	uid := cr.GetUID()
	bg := metav1.DeletePropagationBackground
	err = ri.Delete(ctx, cr.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg, Preconditions: &metav1.Preconditions{UID: &uid}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return false, nil
	} else if err != nil {
		return false, apiError("delete sandbox "+cr.GetName(), err)
	}
	d.log.Info("sandbox deleted", "sandbox_id", cr.GetLabels()[LabelSandboxID], "namespace", cr.GetNamespace(), "name", cr.GetName())
	wctx, cancel := context.WithTimeout(ctx, deleteWait)
	defer cancel()
	for {
		got, err := ri.Get(wctx, cr.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && got.GetUID() != uid) {
			return true, nil
		}
		select {
		case <-wctx.Done():
			return true, nil // deletion is under way (finalizers); Get reports Deleting
		case <-time.After(50 * time.Millisecond):
		}
	}
}
