package securityevent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRotatingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "events.jsonl")
	w, err := OpenSink(path, 1, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rf := w.(*RotatingFile)
	rf.MaxBytes = 100 // rotate in the test without writing megabytes
	line := []byte(strings.Repeat("x", 39) + "\n")
	for range 7 { // 280 bytes: two per file, so path, path.1, path.2 and one dropped
		if _, err := w.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{path, path + ".1", path + ".2"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("stat %s: %v", p, err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", p, st.Mode().Perm())
		}
		if st.Size() > 100 || st.Size()%40 != 0 {
			t.Errorf("%s size %d: want whole lines, at most 100 bytes", p, st.Size())
		}
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf("%s.3 exists (err %v), want at most 2 rotated files", path, err)
	}
}

func TestOpenSinkRefusesRelativePath(t *testing.T) {
	if _, err := OpenSink("events.jsonl", 1, 1, nil); err == nil {
		t.Fatal("OpenSink(relative) = nil error")
	}
}

func TestStdoutSinkAndSandboxHook(t *testing.T) {
	var out bytes.Buffer
	w, err := OpenSink(SinkStdout, 1, 1, &out)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	l, err := New(Options{Sink: w, OnSandboxEvent: func(id string, line []byte, _ Event) { got = append(got, id+" "+string(line)) }})
	if err != nil {
		t.Fatal(err)
	}
	l.Emit(context.Background(), Event{Class: ProcessActivity, Activity: ActivityLaunch, Outcome: Success, SandboxID: "sb1"})
	l.Emit(context.Background(), Event{Class: HTTPActivity, Activity: ActivityPost, Outcome: Denied})
	if n := strings.Count(out.String(), "\n"); n != 2 {
		t.Errorf("stdout has %d lines, want 2:\n%s", n, out.String())
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], `sb1 {"time":`) || !strings.Contains(got[0], `"class_uid":1007`) {
		t.Errorf("sandbox hook got %q, want the one sandbox event", got)
	}
}
