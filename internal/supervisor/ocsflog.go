package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/securityevent"
)

const (
	// ocsfSettingKey is the setting that turns the OCSF JSON file on.
	ocsfSettingKey = "ocsf_json_enabled"
	// sandboxLogDir is where the sandbox's own log files are, as the
	// agent sees it (a tmpfs of the supervisor's in a process-driver
	// sandbox, see mountLogDir).
	sandboxLogDir = "/var/log"
	// ocsfFilePrefix names the daily files: openshell-ocsf.YYYY-MM-DD.log
	// (UTC date).
	ocsfFilePrefix = "openshell-ocsf."
)

// ocsfLog writes the supervisor's egress and inference decisions as OCSF
// JSON lines, the same records the gateway's security event stream has
// (securityevent.FromSandboxLog: identifiers only, no query, header, body
// or placeholder), to a daily file in dir while the ocsf_json_enabled
// setting is true. It is read from every config poll.
type ocsfLog struct {
	log       *slog.Logger
	sandboxID string
	on        atomic.Bool
	file      *dailyFile
	events    *securityevent.Log
}

func newOCSFLog(log *slog.Logger, sandboxID, dir string, now func() time.Time) (*ocsfLog, error) {
	if now == nil {
		now = time.Now
	}
	o := &ocsfLog{log: log, sandboxID: sandboxID, file: &dailyFile{dir: dir, now: now}}
	var err error
	o.events, err = securityevent.New(securityevent.Options{Sink: o.file, Now: now, Product: securityevent.SandboxProduct})
	return o, err
}

// setSettings applies the effective settings of a config poll.
func (o *ocsfLog) setSettings(s map[string]*sandboxv1.EffectiveSetting) {
	if o == nil {
		return
	}
	on := s[ocsfSettingKey].GetValue().GetBoolValue()
	if o.on.Swap(on) == on {
		return
	}
	if on {
		o.log.Info("OCSF JSON log enabled", "setting", ocsfSettingKey, "dir", o.file.dir)
		return
	}
	o.log.Info("OCSF JSON log disabled", "setting", ocsfSettingKey)
	o.file.Close() //nolint:errcheck // nothing to report: the next write reopens
}

// observe records the events of one log line the supervisor emits.
func (o *ocsfLog) observe(l *openshellv1.SandboxLogLine) {
	if o == nil || !o.on.Load() {
		return
	}
	for _, ev := range securityevent.FromSandboxLog(l) {
		ev.SandboxID = o.sandboxID
		o.events.Emit(context.Background(), ev)
	}
}

// dailyFile appends to dir/openshell-ocsf.<UTC date>.log, switching files
// when the date changes. Files are created 0644: readable by the agent,
// writable by the supervisor's user only.
type dailyFile struct {
	dir string
	now func() time.Time

	mu  sync.Mutex
	day string
	f   *os.File
}

func (d *dailyFile) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	day := d.now().UTC().Format(time.DateOnly)
	if d.f != nil && d.day != day {
		_ = d.f.Close()
		d.f = nil
	}
	if d.f == nil {
		f, err := openLogFile(filepath.Join(d.dir, ocsfFilePrefix+day+".log"))
		if err != nil {
			return 0, err
		}
		d.f, d.day = f, day
	}
	return d.f.Write(p)
}

// Close closes the current file; the next Write reopens it.
func (d *dailyFile) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return nil
	}
	err := d.f.Close()
	d.f = nil
	return err
}

// openLogFile opens path for appending, creating it 0644. A symlink or
// anything but a regular file there is refused.
func openLogFile(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o644)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", path)
	}
	if err == nil {
		err = f.Chmod(0o644) // whatever the umask made of it
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
