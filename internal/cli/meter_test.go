package cli

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestMeter: on a terminal the meter ends with the full count; off a
// terminal, or for small transfers, it draws nothing.
func TestMeter(t *testing.T) {
	var out lockedBuffer
	m := newMeterEvery(&out, true, "Uploading", 16<<20, time.Millisecond)
	if _, err := io.Copy(io.Discard, meterReader{r: bytes.NewReader(make([]byte, 16<<20)), m: m}); err != nil {
		t.Fatal(err)
	}
	m.stop()
	got := out.String()
	last := got[strings.LastIndex(got, "\r\033[K")+1:]
	if !strings.HasPrefix(last, "\033[KUploading 16.0 / 16.0 MiB (100%)") || !strings.HasSuffix(got, "\n") {
		t.Errorf("meter output = %q, want a final 16.0 / 16.0 MiB (100%%) line", got)
	}
	for _, tc := range []struct {
		tty   bool
		total int64
	}{{false, 16 << 20}, {true, 1 << 20}} {
		var quiet lockedBuffer
		m := newMeter(&quiet, tc.tty, "Uploading", tc.total)
		_, _ = io.Copy(meterWriter{w: io.Discard, m: m}, bytes.NewReader(make([]byte, tc.total)))
		m.stop()
		if quiet.String() != "" {
			t.Errorf("meter (tty %v, %d bytes) drew %q, want nothing", tc.tty, tc.total, quiet.String())
		}
	}
}
