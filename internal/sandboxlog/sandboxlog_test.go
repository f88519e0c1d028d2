package sandboxlog

import (
	"fmt"
	"testing"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

func line(i int, src, level string) *openshellv1.SandboxLogLine {
	return &openshellv1.SandboxLogLine{SandboxId: "s", TimestampMs: int64(i), Source: src, Level: level, Message: fmt.Sprint(i)}
}

func TestRingFilters(t *testing.T) {
	b := New(5)
	for i := 1; i <= 8; i++ {
		src, lvl := SourceSandbox, "info"
		if i%2 == 0 {
			src, lvl = SourceGateway, "debug"
		}
		b.Append(line(i, src, lvl))
	}
	msgs := func(ls []*openshellv1.SandboxLogLine) string {
		s := ""
		for _, l := range ls {
			s += l.Message
		}
		return s
	}
	tests := []struct {
		name string
		f    Filter
		want string
	}{
		{"all kept, oldest dropped", Filter{}, "45678"},
		{"tail", Filter{Tail: 2}, "78"},
		{"since", Filter{SinceMs: 6}, "678"},
		{"source", Filter{Sources: []string{SourceGateway}}, "468"},
		{"level", Filter{MinLevel: "info"}, "57"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, total := b.Read("s", tt.f)
			if msgs(got) != tt.want || total != 8 {
				t.Fatalf("Read(%+v) = %q total %d, want %q total 8", tt.f, msgs(got), total, tt.want)
			}
		})
	}
}

func TestFollow(t *testing.T) {
	b := New(0)
	ch, cancel := b.Follow("s")
	defer cancel()
	b.Append(line(1, SourceSandbox, "info"))
	if got := <-ch; got.Message != "1" {
		t.Fatalf("followed %q, want 1", got.Message)
	}
	if got, _ := b.Read("other", Filter{}); len(got) != 0 {
		t.Fatalf("unknown sandbox has %d lines", len(got))
	}
}
