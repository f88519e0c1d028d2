package cli

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// meter shows a transfer's progress on a terminal: bytes done of the
// total, percent and rate, redrawn in place every interval by a goroutine
// the meter owns and stop joins. Off a terminal it draws nothing.
type meter struct {
	w        io.Writer
	verb     string
	total    int64
	done     atomic.Int64
	start    time.Time
	interval time.Duration

	stopCh chan struct{}
	wg     sync.WaitGroup
}

// minMeterBytes: smaller transfers finish before a bar would be useful.
const minMeterBytes = 8 << 20

func newMeter(w io.Writer, tty bool, verb string, total int64) *meter {
	return newMeterEvery(w, tty, verb, total, 200*time.Millisecond)
}

func newMeterEvery(w io.Writer, tty bool, verb string, total int64, interval time.Duration) *meter {
	m := &meter{w: w, verb: verb, total: total, start: time.Now(), interval: interval, stopCh: make(chan struct{})}
	if tty && total >= minMeterBytes {
		m.wg.Go(m.loop)
	}
	return m
}

func (m *meter) add(n int64) { m.done.Add(n) }

func (m *meter) loop() {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-m.stopCh:
			m.draw()
			_, _ = fmt.Fprint(m.w, "\n")
			return
		case <-t.C:
			m.draw()
		}
	}
}

func (m *meter) draw() {
	done := m.done.Load()
	pct := 100.0
	if m.total > 0 {
		pct = 100 * float64(done) / float64(m.total)
	}
	rate := float64(done) / max(time.Since(m.start).Seconds(), 0.001) / (1 << 20)
	_, _ = fmt.Fprintf(m.w, "\r\033[K%s %.1f / %.1f MiB (%3.0f%%) %.1f MiB/s", m.verb, float64(done)/(1<<20), float64(m.total)/(1<<20), pct, rate)
}

// stop ends the redraw goroutine, leaving the last line drawn.
func (m *meter) stop() {
	close(m.stopCh)
	m.wg.Wait()
}

// meterReader counts what is read through it.
type meterReader struct {
	r io.Reader
	m *meter
}

func (r meterReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.m.add(int64(n))
	return n, err
}

// meterWriter counts what is written through it.
type meterWriter struct {
	w io.Writer
	m *meter
}

func (w meterWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.m.add(int64(n))
	return n, err
}
