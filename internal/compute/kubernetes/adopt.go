package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

var _ compute.Adopter = (*Driver)(nil)

// adoptRestartWait bounds the wait for the old pod to go during adoption.
const adoptRestartWait = 2 * time.Minute

// AdoptionEnabled implements compute.Adopter: FailedPrecondition "sandbox
// adoption is disabled on this gateway" unless allow_adoption is set.
func (d *Driver) AdoptionEnabled(context.Context) error {
	if !d.cfg.AllowAdoption {
		return errdefs.FailedPrecondition("sandbox adoption is disabled on this gateway")
	}
	return nil
}

// Adopt implements compute.Adopter: it brings an existing Sandbox CR under
// this gateway's management without deleting it. In order: adoption must be
// enabled (allow_adoption) and the namespace accepted; the CR (v1beta1, else
// v1alpha1) must exist; a CR this gateway already manages as the same
// sandbox is returned as is (or re-enriched with Reenrich), one managed by
// another gateway or as another sandbox is FailedPrecondition; the agent
// container must be identifiable (InvalidArgument naming the containers);
// the enrichment is merged into the existing podTemplate and every conflict
// fails the call before anything is written (FailedPrecondition); the pod's
// ServiceAccount must be one bootstrap accepts. With DryRun nothing is
// written. Otherwise the podTemplate and the managed-by / sandbox-id labels
// are written in one update conditioned on the resourceVersion read (a
// concurrent edit is Aborted and leaves the CR untouched), and a running pod
// is restarted from the new spec by suspending the Sandbox until the pod is
// gone and resuming it. The CR keeps its UID, claims and annotations.
func (d *Driver) Adopt(ctx context.Context, req compute.AdoptRequest) (compute.AdoptResult, error) {
	var res compute.AdoptResult
	if err := d.AdoptionEnabled(ctx); err != nil {
		return res, err
	}
	sb := req.Sandbox
	if sb.ID == "" || sb.Name == "" {
		return res, errdefs.InvalidArgument("sandbox id and name are required")
	}
	if len(validation.IsValidLabelValue(sb.ID)) > 0 {
		return res, errdefs.InvalidArgument(fmt.Sprintf("sandbox id %q is not usable as a Kubernetes label value", sb.ID))
	}
	ns := req.Namespace
	if ns == "" {
		var err error
		if ns, err = d.namespaceFor(compute.Sandbox{Workspace: sb.Workspace, Spec: sb.Spec}); err != nil {
			return res, err
		}
	}
	if !d.nsv.Accepts(ns) {
		return res, errdefs.InvalidArgument(fmt.Sprintf("namespace %q is not an accepted sandbox namespace", ns))
	}
	cr, gvr, err := d.getAnyVersion(ctx, ns, sb.Name)
	if err != nil {
		return res, err
	}
	lbl := cr.GetLabels()
	managed := lbl[LabelManagedBy] == managedByValue
	if managed && lbl[LabelGatewayID] != d.cfg.GatewayID {
		return res, errdefs.FailedPrecondition(fmt.Sprintf("sandbox %s/%s is managed by another gateway", ns, sb.Name))
	}
	if managed && lbl[LabelSandboxID] != sb.ID {
		return res, errdefs.FailedPrecondition(fmt.Sprintf("sandbox %s/%s is already managed as sandbox %s", ns, sb.Name, lbl[LabelSandboxID]))
	}
	if managed && !req.Reenrich {
		pod, err := d.podFor(ctx, cr)
		if err != nil {
			return res, err
		}
		return compute.AdoptResult{Sandbox: d.view(cr, pod), BackendUID: string(cr.GetUID())}, nil
	}

	podTemplate, _, _ := unstructured.NestedMap(cr.Object, "spec", "podTemplate")
	opts, err := d.adoptOptions(sb, ns, podTemplate, req.AgentContainer, managed)
	if err != nil {
		return res, err
	}
	if managed { // re-enrich: take out what the previous enrichment added
		podTemplate = strip(podTemplate, opts.AgentContainer)
	}
	merged, conflicts := enrich(podTemplate, opts)
	if len(conflicts) > 0 {
		return res, errdefs.FailedPrecondition("cannot adopt " + ns + "/" + sb.Name + ": " + strings.Join(conflicts, "; "))
	}
	sa, _, _ := unstructured.NestedString(merged, "spec", "serviceAccountName")
	if sa == "" {
		sa = "default"
	}
	if !d.cfg.ServiceAccountValidator().AcceptsIn(ns, sa) {
		return res, errdefs.FailedPrecondition(fmt.Sprintf("service account '%s' of sandbox %s/%s is not an accepted bootstrap service account; the sandbox could never bootstrap", sa, ns, sb.Name))
	}
	if req.DryRun {
		pod, err := d.podFor(ctx, cr)
		if err != nil {
			return res, err
		}
		return compute.AdoptResult{Sandbox: d.view(cr, pod), BackendUID: string(cr.GetUID())}, nil
	}

	// One conditional write: the update carries the resourceVersion read.
	// A conflict caused only by a status update (the controller's) is
	// retried on the fresh object; any other change since the read is a
	// concurrent edit and aborts.
	if d.beforeAdoptWrite != nil {
		d.beforeAdoptWrite()
	}
	ri := d.dyn.Resource(gvr).Namespace(ns)
	base := cr
	var written *unstructured.Unstructured
	newLbl := map[string]string{LabelManagedBy: managedByValue, LabelSandboxID: sb.ID}
	if d.cfg.GatewayID != "" {
		newLbl[LabelGatewayID] = d.cfg.GatewayID
	}
	for attempt := 0; ; attempt++ {
		// A merge patch carrying metadata.resourceVersion is conditional on
		// it; merged is a superset of the podTemplate read, so merging it
		// over the stored one yields exactly merged.
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": base.GetResourceVersion(), "labels": newLbl},
			"spec":     map[string]any{"podTemplate": merged},
		})
		if err != nil {
			return res, err
		}
		written, err = ri.Patch(ctx, sb.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsConflict(err) {
			return res, apiError("adopt sandbox "+ns+"/"+sb.Name, err)
		}
		fresh, gerr := ri.Get(ctx, sb.Name, metav1.GetOptions{})
		if gerr != nil || attempt >= 5 || !sameDesiredState(cr, fresh) {
			return res, errdefs.Conflict(fmt.Sprintf("sandbox %s/%s changed while it was being adopted; retry", ns, sb.Name))
		}
		base = fresh
	}
	d.log.Info("sandbox adopted", "sandbox_id", sb.ID, "namespace", ns, "name", sb.Name, "uid", written.GetUID(), "reenrich", managed)

	// The controller does not recreate a pod when podTemplate changes:
	// suspend until the pod is gone, then resume.
	if !suspended(written) {
		if err := d.restart(ctx, gvr, written); err != nil {
			return res, err
		}
	}
	cur, err := ri.Get(ctx, sb.Name, metav1.GetOptions{})
	if err != nil {
		return res, apiError("get sandbox "+ns+"/"+sb.Name, err)
	}
	pod, err := d.podFor(ctx, cur)
	if err != nil {
		return res, err
	}
	return compute.AdoptResult{Sandbox: d.view(cur, pod), BackendUID: string(cur.GetUID())}, nil
}

// getAnyVersion reads Sandbox ns/name at the served version (v1beta1
// first, then v1alpha1).
func (d *Driver) getAnyVersion(ctx context.Context, ns, name string) (*unstructured.Unstructured, schema.GroupVersionResource, error) {
	first, err := d.sandboxGVR(ctx)
	if err != nil {
		return nil, first, err
	}
	versions := []schema.GroupVersionResource{first}
	if other := otherVersion(first); d.cfg.SandboxAPIVersion == "" {
		versions = append(versions, other)
	}
	for _, gvr := range versions {
		u, err := d.dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return nil, gvr, apiError("get sandbox "+ns+"/"+name, err)
		}
		return u, gvr, nil
	}
	return nil, first, errdefs.NotFound(fmt.Sprintf("sandbox %q not found in namespace %s", name, ns))
}

// sameDesiredState reports whether b differs from a at most in status and
// bookkeeping metadata (resourceVersion, managedFields, generation).
func sameDesiredState(a, b *unstructured.Unstructured) bool {
	if a.GetUID() != b.GetUID() || !equality(a.GetLabels(), b.GetLabels()) || !equality(a.GetAnnotations(), b.GetAnnotations()) {
		return false
	}
	sa, _, _ := unstructured.NestedFieldNoCopy(a.Object, "spec")
	sb, _, _ := unstructured.NestedFieldNoCopy(b.Object, "spec")
	return reflect.DeepEqual(sa, sb)
}

func equality(a, b map[string]string) bool { return maps.Equal(a, b) }

func otherVersion(gvr schema.GroupVersionResource) schema.GroupVersionResource {
	if gvr.Version == SandboxV1beta1.Version {
		return SandboxV1alpha1
	}
	return SandboxV1beta1
}

// adoptOptions builds the enrichment for an existing podTemplate. The
// user's image, command and ServiceAccount stay unless the request selects
// an account (then the selectable rules apply).
func (d *Driver) adoptOptions(sb compute.Sandbox, ns string, podTemplate map[string]any, agentContainer string, reenrich bool) (enrichOptions, error) {
	spec, _ := podTemplate["spec"].(map[string]any)
	containers := list(spec, "containers")
	idx, err := agentContainerIndex(containers, agentContainer)
	if err != nil {
		return enrichOptions{}, errdefs.InvalidArgument(err.Error())
	}
	if idx < 0 {
		return enrichOptions{}, errdefs.InvalidArgument("the Sandbox's podTemplate has no containers")
	}
	agent := containers[idx].(map[string]any)
	t := sb.Spec.Template
	if err := checkResources(t.Resources); err != nil {
		return enrichOptions{}, err
	}
	env := map[string]string{}
	for k, v := range t.Environment {
		env[k] = v
	}
	for k, v := range sb.Spec.Environment {
		env[k] = v
	}
	o := enrichOptions{
		SandboxID: sb.ID, SandboxName: sb.Name, AgentContainer: name(agent),
		ImagePullPolicy: d.cfg.ImagePullPolicy, SupervisorImage: d.cfg.SupervisorImage, SupervisorPullPolicy: d.cfg.ImagePullPolicy,
		Endpoint: d.cfg.GatewayEndpoint, SupervisorEnv: d.cfg.SupervisorEnv, LogLevel: sb.Spec.LogLevel, Command: sb.Spec.Command, TTY: sb.Spec.TTY,
		Env: env, ClientTLSSecretName: d.cfg.ClientTLSSecretName, SATokenTTLSecs: d.cfg.SATokenTTLSecs,
		Resources: t.Resources, Labels: t.Labels, UserNamespaces: d.cfg.EnableUserNamespaces,
	}
	if reenrich && len(o.Command) == 0 {
		// The agent runs the supervisor already; its canonical command is
		// in the environment the previous enrichment wrote.
		for _, e := range list(agent, "env") {
			em, _ := e.(map[string]any)
			if name(e) == envCommand {
				s, _ := em["value"].(string)
				_ = json.Unmarshal([]byte(s), &o.Command)
			}
		}
	}
	if t.ServiceAccountName != "" {
		sa, err := d.resolveServiceAccount(sb.ID, ns, t.ServiceAccountName)
		if err != nil {
			return o, err
		}
		o.ServiceAccountName = sa
	}
	return o, nil
}

// strip removes from a podTemplate what enrich added, so that it can be
// enriched again (re-enrichment after a supervisor upgrade).
func strip(podTemplate map[string]any, agentName string) map[string]any {
	t := deepCopy(podTemplate).(map[string]any)
	spec := child(t, "spec")
	owned := []string{supervisorVolume, saTokenVolume, clientTLSVolume}
	spec["initContainers"] = slices.DeleteFunc(list(spec, "initContainers"), func(c any) bool { return name(c) == supervisorInitContainer })
	spec["volumes"] = slices.DeleteFunc(list(spec, "volumes"), func(v any) bool { return slices.Contains(owned, name(v)) })
	for _, c := range list(spec, "containers") {
		if name(c) != agentName {
			continue
		}
		cm := c.(map[string]any)
		cm["volumeMounts"] = slices.DeleteFunc(list(cm, "volumeMounts"), func(m any) bool { return slices.Contains(owned, name(m)) })
		cm["env"] = slices.DeleteFunc(list(cm, "env"), func(e any) bool {
			return strings.HasPrefix(name(e), "OPENSHELL_")
		})
		delete(cm, "command") // the supervisor; the canonical command is re-applied
	}
	return t
}

// restart suspends cr until its pod is gone, then resumes it.
func (d *Driver) restart(ctx context.Context, gvr schema.GroupVersionResource, cr *unstructured.Unstructured) error {
	ri := d.dyn.Resource(gvr).Namespace(cr.GetNamespace())
	patch := func(running bool) error {
		var p string
		switch {
		case d.v1beta1(gvr) && running:
			p = `{"spec":{"operatingMode":"Running"}}`
		case d.v1beta1(gvr):
			p = `{"spec":{"operatingMode":"Suspended"}}`
		case running:
			p = `{"spec":{"replicas":1}}`
		default:
			p = `{"spec":{"replicas":0}}`
		}
		_, err := ri.Patch(ctx, cr.GetName(), types.MergePatchType, []byte(p), metav1.PatchOptions{})
		if err != nil {
			return apiError("patch sandbox "+cr.GetName(), err)
		}
		return nil
	}
	pods := d.kube.CoreV1().Pods(cr.GetNamespace())
	old, err := pods.Get(ctx, podName(cr), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil // no pod: the controller creates one from the new spec
	} else if err != nil {
		return apiError("get pod", err)
	}
	if err := patch(false); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, adoptRestartWait)
	defer cancel()
	for {
		p, err := pods.Get(wctx, old.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && p.UID != old.UID) {
			break
		}
		if err != nil && wctx.Err() == nil {
			return apiError("get pod", err)
		}
		select {
		case <-wctx.Done():
			return errdefs.Unavailable(fmt.Sprintf("pod %s/%s of the adopted sandbox did not stop within %v; the sandbox stays suspended", old.Namespace, old.Name, adoptRestartWait))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return patch(true)
}
