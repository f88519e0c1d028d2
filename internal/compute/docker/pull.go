package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/docker/docker/api/types/image"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// pending is a sandbox whose container waits for its image. It lives in
// memory only: a gateway that dies during the pull loses it (the gateway
// then removes the sandbox, whose create never finished).
type pending struct {
	plan   plan
	view   compute.Sandbox // what Get reports
	cancel context.CancelFunc
}

func (d *Driver) startPull(p plan) error {
	ctx, cancel := context.WithCancel(context.Background())
	pd := &pending{plan: p, cancel: cancel}
	pd.view = p.sb
	pd.view.Spec = compute.Spec{Template: compute.Template{Image: p.image}}
	pd.view.Status = compute.Status{Conditions: []compute.Condition{
		cond(compute.ConditionReady, "False", "Pulling", "pulling image "+p.image, time.Now().UTC().Format(time.RFC3339)),
	}}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		cancel()
		return errdefs.Unavailable("docker driver is closed")
	}
	d.pending[p.sb.ID] = pd
	d.emitLocked(compute.Event{Kind: compute.EventSandbox, SandboxID: p.sb.ID, Sandbox: pd.view})
	d.wg.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.wg.Done()
		defer cancel()
		d.pullAndCreate(ctx, pd)
	}()
	return nil
}

// pullAndCreate pulls the image, reporting progress as platform events,
// then creates the container. A failure stays on the sandbox
// (Ready=False/ErrImagePull or CreateContainerError) until it is deleted.
func (d *Driver) pullAndCreate(ctx context.Context, pd *pending) {
	id, img := pd.plan.sb.ID, pd.plan.image
	d.platform(id, "Normal", "Pulling", "pulling image "+img, nil)
	err := d.pull(ctx, id, img)
	if ctx.Err() != nil {
		return // deleted or driver closed
	}
	if err != nil {
		d.logger.Warn("image pull failed", "sandbox_id", id, "image", img, "error", err)
		d.fail(pd, "ErrImagePull", fmt.Sprintf("pull image %q: %v", img, err))
		return
	}
	d.platform(id, "Normal", "Pulled", "pulled image "+img, nil)
	unlock := d.op(id)
	defer unlock()
	d.mu.Lock()
	still := d.pending[id] == pd
	d.mu.Unlock()
	if !still {
		return
	}
	if err := d.createContainer(ctx, pd.plan); err != nil {
		if ctx.Err() != nil {
			return
		}
		d.fail(pd, "CreateContainerError", err.Error())
		return
	}
	d.mu.Lock()
	if d.pending[id] == pd {
		delete(d.pending, id)
	}
	d.mu.Unlock()
}

// pullMessage is one line of the Engine's pull progress stream.
type pullMessage struct {
	Status      string          `json:"status"`
	ID          string          `json:"id"`
	Progress    json.RawMessage `json:"progressDetail"`
	Error       string          `json:"error"`
	ErrorDetail *struct {
		Message string `json:"message"`
	} `json:"errorDetail"`
}

func (d *Driver) pull(ctx context.Context, id, img string) error {
	rc, err := d.cli.ImagePull(ctx, img, image.PullOptions{})
	if err != nil {
		return err
	}
	defer rc.Close()
	dec := json.NewDecoder(rc)
	last := ""
	for {
		var m pullMessage
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if m.ErrorDetail != nil && m.ErrorDetail.Message != "" {
			return errors.New(m.ErrorDetail.Message)
		}
		if m.Error != "" {
			return errors.New(m.Error)
		}
		// Layer states and summaries, not every byte-count tick.
		if m.Status == "" || strings.HasPrefix(m.Status, "Downloading") || strings.HasPrefix(m.Status, "Extracting") {
			continue
		}
		msg := m.Status
		if m.ID != "" {
			msg = m.ID + ": " + m.Status
		}
		if msg != last {
			last = msg
			d.platform(id, "Normal", "PullProgress", msg, map[string]string{"image": img})
		}
	}
}

// fail records a pending sandbox's failure and tells watchers.
func (d *Driver) fail(pd *pending, reason, msg string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending[pd.plan.sb.ID] != pd {
		return
	}
	pd.view.Status.Conditions = []compute.Condition{cond(compute.ConditionReady, "False", reason, msg, time.Now().UTC().Format(time.RFC3339))}
	d.emitLocked(compute.Event{Kind: compute.EventPlatform, SandboxID: pd.plan.sb.ID, Platform: compute.PlatformEvent{
		Time: time.Now().UTC(), Source: "compute/docker", Type: "Warning", Reason: reason, Message: msg,
	}})
	d.emitLocked(compute.Event{Kind: compute.EventSandbox, SandboxID: pd.plan.sb.ID, Sandbox: pd.view})
}

func (d *Driver) platform(id, typ, reason, msg string, meta map[string]string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.emitLocked(compute.Event{Kind: compute.EventPlatform, SandboxID: id, Platform: compute.PlatformEvent{
		Time: time.Now().UTC(), Source: "compute/docker", Type: typ, Reason: reason, Message: msg, Metadata: meta,
	}})
}

func (d *Driver) pendingOf(ref compute.Ref) *compute.Sandbox {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.pending {
		if (ref.ID != "" && p.plan.sb.ID == ref.ID) || (ref.ID == "" && ref.Name != "" && p.plan.sb.Name == ref.Name) {
			v := p.view
			return &v
		}
	}
	return nil
}

func (d *Driver) pendingList() []compute.Sandbox {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]compute.Sandbox, 0, len(d.pending))
	for _, p := range d.pending {
		out = append(out, p.view)
	}
	return out
}

// dropPending cancels the pull of ref's sandbox; it returns the
// sandbox's id and whether there was one.
func (d *Driver) dropPending(ref compute.Ref) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, p := range d.pending {
		if (ref.ID != "" && id == ref.ID) || (ref.ID == "" && p.plan.sb.Name == ref.Name) {
			p.cancel()
			delete(d.pending, id)
			d.emitLocked(compute.Event{Kind: compute.EventDeleted, SandboxID: id})
			return id, true
		}
	}
	return "", false
}
