package isolation

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "tool")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, file string
		env        []string
		want       string // "" means not found
	}{
		{name: "found in PATH", file: "tool", env: []string{"PATH=/nonexistent:" + dir}, want: dir + "/tool"},
		{name: "last PATH wins", file: "tool", env: []string{"PATH=/nonexistent", "PATH=" + dir}, want: dir + "/tool"},
		{name: "not executable", file: "data", env: []string{"PATH=" + dir}},
		{name: "a directory", file: "sub", env: []string{"PATH=" + dir}},
		{name: "empty PATH searches nothing", file: "tool", env: []string{"PATH="}},
		{name: "with a slash, as given", file: "./x/y", env: nil, want: "./x/y"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := lookPath(tt.file, tt.env, "")
			if tt.want == "" {
				if err == nil {
					t.Fatalf("lookPath(%q) = %q, want not found", tt.file, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("lookPath(%q) = %q, %v; want %q", tt.file, got, err, tt.want)
			}
		})
	}
	t.Run("empty PATH element is the working directory", func(t *testing.T) {
		t.Chdir(dir)
		got, err := lookPath("tool", []string{"PATH=/nonexistent::"}, "")
		if err != nil || got != "./tool" {
			t.Fatalf("lookPath = %q, %v; want ./tool", got, err)
		}
	})
}
