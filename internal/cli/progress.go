package cli

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// progress shows provisioning progress on stderr: a spinner line redrawn in
// place on a terminal, plain lines otherwise. Its redraw goroutine is owned
// by the progress and joined by stop.
type progress struct {
	w     io.Writer
	tty   bool
	start time.Time
	name  string

	mu    sync.Mutex
	phase string

	done chan struct{}
	wg   sync.WaitGroup
}

var spinnerFrames = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

func newProgress(w io.Writer, tty bool, name string) *progress {
	p := &progress{w: w, tty: tty, start: time.Now(), name: name, done: make(chan struct{})}
	if tty {
		p.wg.Go(p.loop)
	}
	return p
}

func (p *progress) loop() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-p.done:
			return
		case <-t.C:
			p.mu.Lock()
			p.redrawLocked(spinnerFrames[i%len(spinnerFrames)])
			p.mu.Unlock()
		}
	}
}

func (p *progress) redrawLocked(frame string) {
	phase := p.phase
	if phase == "" {
		phase = "Waiting"
	}
	_, _ = fmt.Fprintf(p.w, "\r\033[K%s %s sandbox %s (%ds)", frame, phase, p.name, int(time.Since(p.start).Seconds()))
}

// setPhase records a phase change.
func (p *progress) setPhase(phase string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if phase == p.phase {
		return
	}
	p.phase = phase
	if !p.tty {
		_, _ = fmt.Fprintf(p.w, "sandbox %s: %s\n", p.name, phase)
	}
}

// line prints an event line above the spinner.
func (p *progress) line(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		_, _ = fmt.Fprint(p.w, "\r\033[K")
	}
	_, _ = fmt.Fprintf(p.w, format+"\n", args...)
	if p.tty {
		p.redrawLocked(spinnerFrames[0])
	}
}

// stop ends the spinner and clears its line.
func (p *progress) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	close(p.done)
	p.wg.Wait()
	if p.tty {
		p.mu.Lock()
		_, _ = fmt.Fprint(p.w, "\r\033[K")
		p.mu.Unlock()
	}
}
