package lifecycle

import (
	"sync"

	"google.golang.org/protobuf/proto"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// Update is one change a watcher of a sandbox sees: a new snapshot of the
// sandbox or a platform event.
type Update struct {
	Sandbox  *openshellv1.Sandbox
	Platform *openshellv1.PlatformEvent
	// Deleted is set with the last snapshot when the sandbox row is gone.
	Deleted bool
}

const (
	subscriberBuffer = 64
	eventTail        = 100
)

// hub fans sandbox updates out to watchers and keeps a short tail of
// platform events per sandbox. Slow watchers lose intermediate updates
// rather than blocking the engine (each snapshot is complete, so the next
// one supersedes a dropped one).
type hub struct {
	mu     sync.Mutex
	subs   map[string]map[chan Update]struct{}
	events map[string][]*openshellv1.PlatformEvent
}

func newHub() *hub {
	return &hub{subs: map[string]map[chan Update]struct{}{}, events: map[string][]*openshellv1.PlatformEvent{}}
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

func (h *hub) publish(id string, u Update) {
	if u.Platform != nil {
		h.mu.Lock()
		tail := append(h.events[id], u.Platform)
		if len(tail) > eventTail {
			tail = tail[len(tail)-eventTail:]
		}
		h.events[id] = tail
		h.mu.Unlock()
	}
	if u.Sandbox != nil {
		u.Sandbox = proto.Clone(u.Sandbox).(*openshellv1.Sandbox)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[id] {
		select {
		case ch <- u:
		default:
		}
	}
	if u.Deleted {
		delete(h.events, id)
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
