package supervisor

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	// ocsfFilePrefix names the daily OCSF files:
	// openshell-ocsf.YYYY-MM-DD.log (UTC date).
	ocsfFilePrefix = "openshell-ocsf."
	// shortFilePrefix names the daily shorthand files:
	// openshell.YYYY-MM-DD.log (UTC date).
	shortFilePrefix = "openshell."
	// maxShortLine bounds a shorthand line.
	maxShortLine = 1024
)

// ocsfLog writes the supervisor's egress and inference decisions to two
// daily files in dir: always a shorthand line each (openshell.<date>.log),
// and, while the ocsf_json_enabled setting is true (read from every config
// poll), an OCSF JSON line each (openshell-ocsf.<date>.log): the same
// records the gateway's security event stream has
// (securityevent.FromSandboxLog: identifiers only, no query, header, body
// or placeholder), rate limited like the gateway's.
type ocsfLog struct {
	log       *slog.Logger
	sandboxID string
	on        atomic.Bool
	file      *dailyFile // OCSF JSON
	short     *dailyFile
	events    *securityevent.Log
	queue     chan *openshellv1.SandboxLogLine
	dropped   atomic.Int64
}

// ocsfQueue is how many decision lines wait for the writer.
const ocsfQueue = 4096

func newOCSFLog(log *slog.Logger, sandboxID, dir string, now func() time.Time) (*ocsfLog, error) {
	if now == nil {
		now = time.Now
	}
	o := &ocsfLog{
		log: log, sandboxID: sandboxID,
		file:  &dailyFile{dir: dir, prefix: ocsfFilePrefix, now: now},
		short: &dailyFile{dir: dir, prefix: shortFilePrefix, now: now},
		queue: make(chan *openshellv1.SandboxLogLine, ocsfQueue),
	}
	var err error
	o.events, err = securityevent.New(securityevent.Options{
		Sink: jsonGate{o}, Now: now, Product: securityevent.SandboxProduct,
		OnSandboxEvent: func(_ string, _ []byte, ev securityevent.Event) {
			_, _ = o.short.Write([]byte(shorthand(ev) + "\n")) // a full /var/log drops the line
		},
	})
	return o, err
}

// jsonGate passes the JSON lines to the OCSF file while the setting is on.
type jsonGate struct{ o *ocsfLog }

func (g jsonGate) Write(p []byte) (int, error) {
	if !g.o.on.Load() {
		return len(p), nil
	}
	return g.o.file.Write(p)
}

// shorthand is the line of ev in the shorthand file: the UTC time, the
// action (ALLOWED, DENIED, AUDITED; FINDING for a detection, SUPPRESSED
// for a rate-limit summary), kind, binary, destination, method and path
// (never a query), policy rule and reason.
func shorthand(ev securityevent.Event) string {
	b := strings.Builder{}
	b.WriteString(ev.Time.UTC().Format(time.RFC3339Nano))
	switch {
	case ev.Finding != nil && ev.Finding.UID == securityevent.FindingEventsSuppressed:
		b.WriteString(" SUPPRESSED " + ev.Fields["suppressed"] + " decisions: over the rate limit")
		return b.String()
	case ev.Finding != nil:
		b.WriteString(" FINDING " + ev.Finding.UID)
	default:
		b.WriteString(" " + strings.ToUpper(map[securityevent.Outcome]string{
			securityevent.Success: "allowed", securityevent.Denied: "denied", securityevent.Audited: "audited",
		}[ev.Outcome]))
	}
	b.WriteString(" " + cmp.Or(ev.Fields["kind"], "-") + " ")
	if ev.Process != nil {
		b.WriteString(ev.Process.Name)
	} else {
		b.WriteString("-")
	}
	if ev.Dst != nil {
		b.WriteString(" -> " + ev.Dst.Hostname + ":" + strconv.Itoa(ev.Dst.Port))
	}
	if ev.HTTP != nil {
		b.WriteString(" " + ev.HTTP.Method)
		if ev.HTTP.URL != nil && ev.HTTP.URL.Path != "" {
			b.WriteString(" " + ev.HTTP.URL.Path)
		}
	}
	if ev.Rule != nil && ev.Rule.Name != "" {
		b.WriteString(" policy:" + ev.Rule.Name)
	}
	if ev.StatusDetail != "" {
		b.WriteString(" reason: " + ev.StatusDetail)
	}
	// One line: no value can start another or move the cursor.
	line := strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, b.String())
	if len(line) > maxShortLine {
		line = strings.ToValidUTF8(line[:maxShortLine], "")
	}
	return line
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
//
// It only queues the decision lines (the egress proxy calls it on its
// request path); run writes them. A full queue drops the line and counts
// it, and the shorthand file says so.
func (o *ocsfLog) observe(l *openshellv1.SandboxLogLine) {
	if o == nil || (l.GetTarget() != securityevent.TargetEgress && l.GetTarget() != securityevent.TargetInference) {
		return
	}
	select {
	case o.queue <- l:
	default:
		o.dropped.Add(1)
	}
}

// run writes the queued lines until ctx ends, then what is still queued,
// and closes the files.
func (o *ocsfLog) run(ctx context.Context) {
	defer func() {
		_ = o.file.Close()
		_ = o.short.Close()
	}()
	for {
		select {
		case l := <-o.queue:
			o.write(l)
		case <-ctx.Done():
			for {
				select {
				case l := <-o.queue:
					o.write(l)
				default:
					return
				}
			}
		}
	}
}

// write records the events of one decision line.
func (o *ocsfLog) write(l *openshellv1.SandboxLogLine) {
	if n := o.dropped.Swap(0); n > 0 {
		line := o.file.now().UTC().Format(time.RFC3339Nano) + " DROPPED " + strconv.FormatInt(n, 10) + " decisions: the log writer fell behind\n"
		_, _ = o.short.Write([]byte(line))
	}
	for _, ev := range securityevent.FromSandboxLog(l) {
		ev.SandboxID = o.sandboxID
		o.events.Emit(context.Background(), ev)
	}
}

// dailyFile appends to dir/<prefix><UTC date>.log, switching files when
// the date changes. Files are created 0644: readable by the agent,
// writable by the supervisor's user only.
type dailyFile struct {
	dir    string
	prefix string
	now    func() time.Time

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
		f, err := openLogFile(filepath.Join(d.dir, d.prefix+day+".log"))
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
