package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/securityevent"
)

func ocsfSetting(on bool) map[string]*sandboxv1.EffectiveSetting {
	return map[string]*sandboxv1.EffectiveSetting{ocsfSettingKey: {Value: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: on}}}}
}

func denyLine(host string) *openshellv1.SandboxLogLine {
	return &openshellv1.SandboxLogLine{
		Target: securityevent.TargetEgress, Message: "egress decision",
		Fields: map[string]string{"decision": "deny", "kind": "http", "host": host, "port": "80", "method": "GET",
			"path": "/p?token=query-secret", "binary": "/usr/bin/curl", "pid": "7", "reason": "not allowed"},
	}
}

// TestOCSFLogFile: OCSF lines are written only while the setting is on,
// to a file named by the UTC date that changes with it, mode 0644, one
// record per line without the query; the shorthand file has a line per
// decision whatever the setting; a symlink planted at the day's name is
// not followed.
func TestOCSFLogFile(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	now := time.Date(2026, 3, 1, 23, 59, 0, 0, time.FixedZone("UTC+5", 5*3600)) // 18:59 UTC
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	o, err := newOCSFLog(slog.New(slog.NewTextHandler(io.Discard, nil)), "sb-1", dir, clock)
	if err != nil {
		t.Fatal(err)
	}
	o.write(denyLine("off.test"))
	if m, _ := filepath.Glob(filepath.Join(dir, "openshell-ocsf.*")); len(m) != 0 {
		t.Fatalf("OCSF files written with the setting unset: %v", m)
	}
	o.setSettings(ocsfSetting(true))
	o.write(denyLine("day1.test"))
	o.write(&openshellv1.SandboxLogLine{Target: "main_process", Message: "hello"}) // not an event
	mu.Lock()
	now = now.Add(6 * time.Hour) // 00:59 UTC the next day
	mu.Unlock()
	o.write(denyLine("day2.test"))
	o.setSettings(ocsfSetting(false))
	o.write(denyLine("off-again.test"))

	for day, host := range map[string]string{"2026-03-01": "day1.test", "2026-03-02": "day2.test"} {
		p := filepath.Join(dir, "openshell-ocsf."+day+".log")
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if st, _ := os.Stat(p); st.Mode().Perm() != 0o644 {
			t.Errorf("%s mode %v, want 0644", p, st.Mode().Perm())
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		var r securityevent.Record
		if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &r) != nil {
			t.Fatalf("%s = %q, want one JSON record", p, data)
		}
		if r.DstEndpoint == nil || r.DstEndpoint.Hostname != host || r.ClassUID != int(securityevent.HTTPActivity) ||
			r.Unmapped["sandbox_id"] != "sb-1" || r.HTTPRequest.URL.Path != "/p" || strings.Contains(string(data), "query-secret") {
			t.Errorf("%s record = %s, want a denied HTTP Activity to %s of sb-1, path /p without the query", p, data, host)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "openshell-ocsf.*")); len(m) != 2 {
		t.Errorf("OCSF files = %v, want the two days only", m)
	}
	// The shorthand file has every decision, whatever the setting.
	for day, want := range map[string][]string{
		"2026-03-01": {"DENIED http /usr/bin/curl -> off.test:80 GET /p reason: not allowed", "DENIED http /usr/bin/curl -> day1.test:80 GET /p reason: not allowed"},
		"2026-03-02": {"DENIED http /usr/bin/curl -> day2.test:80 GET /p reason: not allowed", "DENIED http /usr/bin/curl -> off-again.test:80 GET /p reason: not allowed"},
	} {
		p := filepath.Join(dir, "openshell."+day+".log")
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) != len(want) || strings.Contains(string(data), "query-secret") {
			t.Fatalf("%s = %q, want %d lines without the query", p, data, len(want))
		}
		for i, l := range lines {
			if _, rest, _ := strings.Cut(l, " "); rest != want[i] {
				t.Errorf("%s line %d = %q, want the time and %q", p, i, l, want[i])
			}
		}
	}

	// A symlink at the day's name is refused, not followed.
	target := filepath.Join(t.TempDir(), "target")
	if err := os.Symlink(target, filepath.Join(dir, "openshell-ocsf.2026-03-03.log")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(24 * time.Hour)
	mu.Unlock()
	o.setSettings(ocsfSetting(true))
	o.write(denyLine("day3.test"))
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Errorf("the symlink's target was created (err %v)", err)
	}
}

// TestOCSFLogQueue: observe only queues decision lines (others are
// ignored); run writes them, drains the queue when its context ends, and
// a line dropped on a full queue is reported in the shorthand file.
func TestOCSFLogQueue(t *testing.T) {
	dir := t.TempDir()
	o, err := newOCSFLog(slog.New(slog.NewTextHandler(io.Discard, nil)), "sb-1", dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	o.observe(&openshellv1.SandboxLogLine{Target: "main_process", Message: "not queued"})
	for i := range ocsfQueue + 3 {
		o.observe(denyLine(fmt.Sprintf("h%d.test", i)))
	}
	if got := o.dropped.Load(); got != 3 {
		t.Fatalf("dropped = %d, want 3", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o.run(ctx) // drains what is queued, then returns
	m, _ := filepath.Glob(filepath.Join(dir, "openshell.*.log"))
	if len(m) == 0 {
		t.Fatal("no shorthand file")
	}
	var data []byte
	for _, p := range m {
		b, _ := os.ReadFile(p)
		data = append(data, b...)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	// The limiter lets a burst through, and what refills while they are
	// written (50/s).
	if n := len(lines) - 1; n < securityevent.DefaultSandboxBurst || n > securityevent.DefaultSandboxBurst+securityevent.DefaultSandboxRate ||
		!strings.Contains(lines[0], " DROPPED 3 decisions: the log writer fell behind") {
		t.Errorf("shorthand: %d lines, first %q; want the DROPPED line and %d decisions (a few more if the bucket refilled)", len(lines), lines[0], securityevent.DefaultSandboxBurst)
	}
}

// TestShorthandOneLine: control characters in a pushed value cannot start
// a new shorthand line.
func TestShorthandOneLine(t *testing.T) {
	l := denyLine("x.test")
	l.Fields["reason"] = "a\nFORGED\rline\x1b[2K"
	evs := securityevent.FromSandboxLog(l)
	if len(evs) != 1 {
		t.Fatalf("events = %d, want 1", len(evs))
	}
	got := shorthand(evs[0])
	if strings.ContainsAny(got, "\n\r\x1b") || !strings.HasSuffix(got, "reason: a FORGED line [2K") {
		t.Errorf("shorthand = %q, want one line with the control characters blanked", got)
	}
}
