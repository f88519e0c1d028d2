package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// logPusher streams log lines to the gateway with PushSandboxLogs. Lines
// wait in a bounded buffer; when the gateway is slow or away the oldest
// lines are dropped, never the supervisor's progress.
type logPusher struct {
	client    openshellv1.OpenShellClient
	sandboxID string
	max       int
	batch     int

	// tap, when set, sees every line first (the OCSF JSON file).
	tap atomic.Pointer[func(*openshellv1.SandboxLogLine)]

	mu      sync.Mutex
	lines   []*openshellv1.SandboxLogLine
	dropped int
	wake    chan struct{}
}

func newLogPusher(client openshellv1.OpenShellClient, sandboxID string, max int) *logPusher {
	if max <= 0 {
		max = 4096
	}
	return &logPusher{client: client, sandboxID: sandboxID, max: max, batch: 256, wake: make(chan struct{}, 1)}
}

// setTap makes tap see every line added from now on.
func (p *logPusher) setTap(tap func(*openshellv1.SandboxLogLine)) { p.tap.Store(&tap) }

func (p *logPusher) add(l *openshellv1.SandboxLogLine) {
	if p == nil {
		return
	}
	l.SandboxId = p.sandboxID
	if tap := p.tap.Load(); tap != nil {
		(*tap)(l)
	}
	p.mu.Lock()
	if len(p.lines) >= p.max {
		n := len(p.lines) - p.max + 1
		clear(p.lines[:n])
		p.lines = p.lines[n:]
		p.dropped += n
	}
	p.lines = append(p.lines, l)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *logPusher) take() []*openshellv1.SandboxLogLine {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropped > 0 {
		p.lines = append([]*openshellv1.SandboxLogLine{{
			SandboxId:   p.sandboxID,
			TimestampMs: time.Now().UnixMilli(),
			Level:       "WARN",
			Target:      "openshell_sandbox::logs",
			Message:     fmt.Sprintf("dropped %d log lines: gateway too slow", p.dropped),
			Source:      "sandbox",
		}}, p.lines...)
		p.dropped = 0
	}
	n := min(len(p.lines), p.batch)
	out := append([]*openshellv1.SandboxLogLine(nil), p.lines[:n]...)
	clear(p.lines[:n])
	p.lines = p.lines[n:]
	if len(p.lines) == 0 {
		p.lines = nil
	}
	return out
}

// run pushes lines until ctx ends, reopening the stream with backoff; at
// the end it flushes what is left for up to two seconds.
func (p *logPusher) run(ctx context.Context) {
	b := newBackoff(250*time.Millisecond, 10*time.Second)
	for ctx.Err() == nil {
		if p.pushUntilError(ctx) {
			b.reset()
		}
		if sleepCtx(ctx, b.next()) != nil {
			break
		}
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	p.flush(fctx)
}

func (p *logPusher) pushUntilError(ctx context.Context) (sent bool) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.client.PushSandboxLogs(sctx)
	if err != nil {
		return false
	}
	for {
		batch := p.take()
		if len(batch) == 0 {
			select {
			case <-p.wake:
				continue
			case <-ctx.Done():
				stream.CloseAndRecv() //nolint:errcheck
				return sent
			}
		}
		if err := stream.Send(&openshellv1.PushSandboxLogsRequest{SandboxId: p.sandboxID, Logs: batch}); err != nil {
			return sent
		}
		sent = true
	}
}

func (p *logPusher) flush(ctx context.Context) {
	batch := p.take()
	if len(batch) == 0 {
		return
	}
	stream, err := p.client.PushSandboxLogs(ctx)
	if err != nil {
		return
	}
	for len(batch) > 0 {
		if stream.Send(&openshellv1.PushSandboxLogsRequest{SandboxId: p.sandboxID, Logs: batch}) != nil {
			return
		}
		batch = p.take()
	}
	stream.CloseAndRecv() //nolint:errcheck
}

// teeHandler writes records to inner and, as SandboxLogLines, to the pusher.
type teeHandler struct {
	inner  slog.Handler
	pusher *logPusher
	attrs  []slog.Attr
	group  string
}

func (h *teeHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *teeHandler) Handle(ctx context.Context, r slog.Record) error {
	fields := map[string]string{}
	for _, a := range h.attrs {
		fields[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		k := a.Key
		if h.group != "" {
			k = h.group + "." + k
		}
		fields[k] = a.Value.String()
		return true
	})
	target := "openshell_sandbox"
	if c, ok := fields["component"]; ok {
		target += "::" + c
		delete(fields, "component")
	}
	h.pusher.add(&openshellv1.SandboxLogLine{
		TimestampMs: r.Time.UnixMilli(),
		Level:       levelName(r.Level),
		Target:      target,
		Message:     r.Message,
		Source:      "sandbox",
		Fields:      fields,
	})
	return h.inner.Handle(ctx, r)
}

func (h *teeHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := *h
	n.inner = h.inner.WithAttrs(attrs)
	n.attrs = append(append([]slog.Attr(nil), h.attrs...), attrs...)
	if h.group != "" {
		for i := len(h.attrs); i < len(n.attrs); i++ {
			n.attrs[i].Key = h.group + "." + n.attrs[i].Key
		}
	}
	return &n
}

func (h *teeHandler) WithGroup(name string) slog.Handler {
	n := *h
	n.inner = h.inner.WithGroup(name)
	if h.group != "" {
		name = h.group + "." + name
	}
	n.group = name
	return &n
}

func levelName(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "ERROR"
	case l >= slog.LevelWarn:
		return "WARN"
	case l >= slog.LevelInfo:
		return "INFO"
	}
	return "DEBUG"
}

// processLine turns one line of the main process's output into a log line.
func processLine(stream, line string) *openshellv1.SandboxLogLine {
	level := "INFO"
	if stream == "stderr" {
		level = "WARN"
	}
	return &openshellv1.SandboxLogLine{
		TimestampMs: time.Now().UnixMilli(),
		Level:       level,
		Target:      "main_process",
		Message:     strings.TrimRight(line, "\r\n"),
		Source:      "sandbox",
		Fields:      map[string]string{"stream": stream},
	}
}
