package kubernetes

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic/dynamicinformer"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/openshell-go/openshell/internal/compute"
)

// Progress metadata keys of platform events (as OpenShell's drivers use).
const (
	ProgressCompleteStep  = "openshell.progress.complete_step"
	ProgressCompleteLabel = "openshell.progress.complete_label"
	ProgressActiveStep    = "openshell.progress.active_step"
	ProgressActiveDetail  = "openshell.progress.active_detail"

	stepRequestingSandbox = "requesting_sandbox"
	stepStartingSandbox   = "starting_sandbox"
)

// watcher turns informer notifications into compute events. Handlers run
// on the informers' goroutines; mu serializes them so each event is
// computed from a consistent pair of stores.
type watcher struct {
	d    *Driver
	ctx  context.Context
	out  chan compute.Event
	mu   sync.Mutex
	crs  cache.Store
	pods cache.Store
}

// Watch implements compute.Driver. It runs an informer on this gateway's
// Sandbox CRs and one on sandbox pods (label openshell.ai/sandbox-id) and
// emits: EventSandbox on every change of either, EventDeleted when a CR
// goes, EventPlatform with openshell.progress.* metadata on pod phase
// changes. The channel closes after ctx ends and both informers stopped.
func (d *Driver) Watch(ctx context.Context) (<-chan compute.Event, func() error, error) {
	gvr, err := d.sandboxGVR(ctx)
	if err != nil {
		return nil, nil, err
	}
	scope := d.listScope()
	crInf := dynamicinformer.NewFilteredDynamicInformer(d.dyn, gvr, scope, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.LabelSelector = d.managedSelector()
	}).Informer()
	podInf := coreinformers.NewFilteredPodInformer(d.kube, scope, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.LabelSelector = LabelSandboxID
	})
	w := &watcher{d: d, ctx: ctx, out: make(chan compute.Event, 64), crs: crInf.GetStore(), pods: podInf.GetStore()}
	if _, err := crInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.crChanged(o, true) },
		UpdateFunc: func(_, o any) { w.crChanged(o, false) },
		DeleteFunc: w.crDeleted,
	}); err != nil {
		return nil, nil, err
	}
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.podChanged(nil, o, false) },
		UpdateFunc: func(old, o any) { w.podChanged(old, o, false) },
		DeleteFunc: func(o any) { w.podChanged(nil, o, true) },
	}); err != nil {
		return nil, nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() { crInf.RunWithContext(ctx) })
	wg.Go(func() { podInf.RunWithContext(ctx) })
	go func() {
		wg.Wait()
		close(w.out)
	}()
	return w.out, func() error { return nil }, nil
}

func (w *watcher) send(ev compute.Event) {
	select {
	case w.out <- ev:
	case <-w.ctx.Done():
	}
}

func unwrapTombstone(o any) any {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return o
}

// podOf returns the stored pod controlled by cr, or nil.
func (w *watcher) podOf(cr *unstructured.Unstructured) *corev1.Pod {
	o, ok, _ := w.pods.GetByKey(cr.GetNamespace() + "/" + podName(cr))
	if !ok {
		return nil
	}
	pod, _ := o.(*corev1.Pod)
	if pod == nil || !ownedBy(pod, cr) {
		return nil
	}
	return pod
}

func (w *watcher) crChanged(o any, added bool) {
	cr, ok := o.(*unstructured.Unstructured)
	if !ok || !w.d.nsv.Accepts(cr.GetNamespace()) || cr.GetLabels()[LabelSandboxID] == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	pod := w.podOf(cr)
	// The two informers are independent: a pod may be seen before its CR,
	// and podChanged then drops it. Replay its progress when the CR shows up.
	if added && pod != nil {
		if ev, ok := progressEvent(pod, "", false, false); ok {
			w.send(compute.Event{Kind: compute.EventPlatform, SandboxID: cr.GetLabels()[LabelSandboxID], Platform: ev})
		}
	}
	sb := w.d.view(cr, pod)
	w.send(compute.Event{Kind: compute.EventSandbox, SandboxID: sb.ID, Sandbox: sb})
}

func (w *watcher) crDeleted(o any) {
	cr, ok := unwrapTombstone(o).(*unstructured.Unstructured)
	if !ok || !w.d.nsv.Accepts(cr.GetNamespace()) {
		return
	}
	id := cr.GetLabels()[LabelSandboxID]
	if id == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.send(compute.Event{Kind: compute.EventDeleted, SandboxID: id})
}

// controllerCR returns the stored Sandbox CR controlling pod, or nil.
func (w *watcher) controllerCR(pod *corev1.Pod) *unstructured.Unstructured {
	for _, ref := range pod.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller || ref.Kind != sandboxKind {
			continue
		}
		o, ok, _ := w.crs.GetByKey(pod.Namespace + "/" + ref.Name)
		if !ok {
			return nil
		}
		cr, _ := o.(*unstructured.Unstructured)
		if cr == nil || cr.GetUID() != ref.UID {
			return nil
		}
		return cr
	}
	return nil
}

func (w *watcher) podChanged(oldObj, o any, deleted bool) {
	pod, ok := unwrapTombstone(o).(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	cr := w.controllerCR(pod)
	if cr == nil || !w.d.nsv.Accepts(cr.GetNamespace()) {
		return
	}
	id := cr.GetLabels()[LabelSandboxID]
	if id == "" {
		return
	}
	var cur *corev1.Pod
	if !deleted {
		cur = pod
	}
	sb := w.d.view(cr, cur)
	var oldPhase corev1.PodPhase
	oldReady := false
	if old, ok := oldObj.(*corev1.Pod); ok {
		oldPhase, oldReady = old.Status.Phase, podReady(old)
	}
	if ev, ok := progressEvent(pod, oldPhase, oldReady, deleted); ok {
		w.send(compute.Event{Kind: compute.EventPlatform, SandboxID: id, Platform: ev})
	}
	w.send(compute.Event{Kind: compute.EventSandbox, SandboxID: id, Sandbox: sb})
}

// progressEvent describes a pod phase or readiness change.
func progressEvent(pod *corev1.Pod, oldPhase corev1.PodPhase, oldReady, deleted bool) (compute.PlatformEvent, bool) {
	ev := compute.PlatformEvent{Time: time.Now(), Source: "kubernetes", Type: "Normal", Metadata: map[string]string{}}
	ready := podReady(pod)
	switch {
	case deleted:
		ev.Reason, ev.Message = "PodDeleted", "sandbox pod "+pod.Name+" deleted"
	case oldPhase == "" && pod.Status.Phase == corev1.PodPending:
		ev.Reason, ev.Message = "PodCreated", "sandbox pod "+pod.Name+" created"
		ev.Metadata[ProgressCompleteStep] = stepRequestingSandbox
		ev.Metadata[ProgressCompleteLabel] = "Sandbox allocated"
		ev.Metadata[ProgressActiveStep] = stepStartingSandbox
	case pod.Status.Phase != oldPhase || ready != oldReady:
		ev.Reason = "Pod" + string(pod.Status.Phase)
		ev.Message = "sandbox pod " + pod.Name + " is " + string(pod.Status.Phase)
		switch {
		case pod.Status.Phase == corev1.PodFailed:
			ev.Type = "Warning"
			ev.Metadata[ProgressActiveDetail] = pod.Status.Message
		case ready:
			ev.Reason, ev.Message = "PodReady", "sandbox pod "+pod.Name+" is ready"
			ev.Metadata[ProgressCompleteStep] = stepStartingSandbox
			ev.Metadata[ProgressCompleteLabel] = "Sandbox pod ready"
		default:
			ev.Metadata[ProgressActiveStep] = stepStartingSandbox
			ev.Metadata[ProgressActiveDetail] = string(pod.Status.Phase)
		}
	default:
		return ev, false
	}
	return ev, true
}
