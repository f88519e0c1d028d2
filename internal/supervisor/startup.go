package supervisor

import "time"

// startupClock times the steps of a supervisor start (logged at debug
// level as "supervisor startup" once the SSH server runs; the gateway
// marks the sandbox READY at the session that follows).
type startupClock struct {
	start, last time.Time
	attrs       []any
}

func newStartupClock() *startupClock {
	now := time.Now()
	return &startupClock{start: now, last: now}
}

// mark records the time since the previous mark as step.
func (c *startupClock) mark(step string) {
	now := time.Now()
	c.attrs = append(c.attrs, step, now.Sub(c.last).Round(time.Microsecond))
	c.last = now
}

// fields are the recorded steps and the total, as slog key-value pairs.
func (c *startupClock) fields() []any {
	return append(c.attrs, "total", c.last.Sub(c.start).Round(time.Microsecond))
}
