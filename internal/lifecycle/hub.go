package lifecycle

import (
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// Update is one change a watcher of a sandbox sees: a new snapshot of the
// sandbox, a platform event, or a change of its policy advisor drafts.
type Update struct {
	Sandbox  *openshellv1.Sandbox
	Platform *openshellv1.PlatformEvent
	// Draft is set when the sandbox's draft policy chunks changed (not
	// kept in the event tail).
	Draft *openshellv1.DraftPolicyUpdate
	// Deleted is set with the last snapshot when the sandbox row is gone.
	Deleted bool
}

const (
	subscriberBuffer = 64
	eventTail        = 100
)

// ReasonPhasePrefix starts the reason of the platform event the gateway
// records for every phase transition: "PhaseReady", "PhaseStopped", ...
const ReasonPhasePrefix = "Phase"

// hub fans sandbox updates out to watchers and keeps a short tail of
// platform events per sandbox, including one event per phase transition,
// so a watcher that comes later can replay how the sandbox got where it
// is. Slow watchers lose intermediate updates rather than blocking the
// engine (each snapshot is complete, so the next one supersedes a dropped
// one); the final Deleted update is never lost, so every watcher learns
// that its sandbox is gone.
type hub struct {
	now    func() time.Time
	mu     sync.Mutex
	subs   map[string]map[chan Update]struct{}
	events map[string][]*openshellv1.PlatformEvent
	phases map[string]openshellv1.SandboxPhase
}

func newHub() *hub {
	return &hub{
		now:    time.Now,
		subs:   map[string]map[chan Update]struct{}{},
		events: map[string][]*openshellv1.PlatformEvent{},
		phases: map[string]openshellv1.SandboxPhase{},
	}
}

func (h *hub) subscribe(id string) (chan Update, func()) {
	ch := make(chan Update, subscriberBuffer)
	h.mu.Lock()
	if h.subs[id] == nil {
		h.subs[id] = map[chan Update]struct{}{}
	}
	h.subs[id][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[id], ch)
		if len(h.subs[id]) == 0 {
			delete(h.subs, id)
		}
		h.mu.Unlock()
	}
}

// phaseEvent is the platform event of a transition to phase (from prev
// when known).
func phaseEvent(prev, phase openshellv1.SandboxPhase, known bool, ts time.Time) *openshellv1.PlatformEvent {
	name := strings.TrimPrefix(phase.String(), "SANDBOX_PHASE_")
	title := name[:1] + strings.ToLower(name[1:])
	ev := &openshellv1.PlatformEvent{
		TimestampMs: ts.UnixMilli(), Source: "gateway", Type: "Normal", Reason: ReasonPhasePrefix + title,
		Message:  "sandbox is " + strings.ToLower(name),
		Metadata: map[string]string{"phase": name},
	}
	if known {
		from := strings.TrimPrefix(prev.String(), "SANDBOX_PHASE_")
		ev.Message = "sandbox phase " + from + " -> " + name
		ev.Metadata["previous_phase"] = from
	}
	if phase == openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR || phase == openshellv1.SandboxPhase_SANDBOX_PHASE_UNKNOWN {
		ev.Type = "Warning"
	}
	return ev
}

func (h *hub) publish(id string, u Update) {
	if u.Sandbox != nil {
		u.Sandbox = proto.Clone(u.Sandbox).(*openshellv1.Sandbox)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if u.Sandbox != nil {
		// A phase transition is recorded (and fanned out) as a platform
		// event just before the snapshot that shows it.
		phase := u.Sandbox.GetStatus().GetPhase()
		if prev, known := h.phases[id]; !known || prev != phase {
			h.phases[id] = phase
			h.fanOutLocked(id, Update{Platform: phaseEvent(prev, phase, known, h.now())})
		}
	}
	h.fanOutLocked(id, u)
	if u.Deleted {
		delete(h.events, id)
		delete(h.phases, id)
	}
}

// fanOutLocked records a platform event and delivers u to every
// subscriber of id without blocking. A Deleted update displaces the
// oldest queued update of a full subscriber: only publish sends on the
// channels, under h.mu, so the freed slot stays free.
func (h *hub) fanOutLocked(id string, u Update) {
	if u.Platform != nil {
		tail := append(h.events[id], u.Platform)
		if len(tail) > eventTail {
			tail = tail[len(tail)-eventTail:]
		}
		h.events[id] = tail
	}
	for ch := range h.subs[id] {
		select {
		case ch <- u:
			continue
		default:
		}
		if !u.Deleted {
			continue
		}
		select {
		case <-ch:
		default:
		}
		select {
		case ch <- u:
		default:
		}
	}
}

func (h *hub) eventTail(id string, n int) []*openshellv1.PlatformEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	ev := h.events[id]
	if n > 0 && len(ev) > n {
		ev = ev[len(ev)-n:]
	}
	return append([]*openshellv1.PlatformEvent(nil), ev...)
}
