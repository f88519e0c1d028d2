// Package postgrestest starts a throw-away PostgreSQL cluster for tests
// that must stop and start their database (outage tests), using the
// scripts in test/postgres. The shared cluster of OPENSHELL_TEST_POSTGRES_URL
// is never touched. Test helpers only: imported by tests.
package postgrestest

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openshell-go/openshell/internal/citest"
)

// Cluster is a running (or paused) cluster of the test that started it.
type Cluster struct {
	// URL connects to the cluster (postgres://…).
	URL     string
	dir     string
	scripts string
}

// Start starts a cluster that is removed when t ends. Without PostgreSQL
// binaries the test is skipped, or fails under CI=true.
func Start(t testing.TB) *Cluster {
	t.Helper()
	scripts := filepath.Join(repoRoot(t), "test", "postgres")
	out, err := exec.Command(filepath.Join(scripts, "start.sh")).Output()
	if err != nil {
		msg := err.Error()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			msg = strings.TrimSpace(string(ee.Stderr))
		}
		citest.SkipOrFail(t, "postgrestest: cannot start a cluster: %s", msg)
	}
	c := &Cluster{scripts: scripts}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		if !ok {
			continue
		}
		v = strings.Trim(v, "'")
		switch k {
		case "OPENSHELL_TEST_POSTGRES_URL":
			c.URL = v
		case "OPENSHELL_TEST_POSTGRES_DIR":
			c.dir = v
		}
	}
	if c.URL == "" || c.dir == "" {
		t.Fatalf("postgrestest: start.sh printed no URL or directory:\n%s", out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(filepath.Join(scripts, "stop.sh"), c.dir).CombinedOutput(); err != nil {
			t.Errorf("postgrestest: stop.sh: %v\n%s", err, out)
		}
	})
	return c
}

// Stop shuts the cluster down (fast: open sessions are terminated),
// keeping its data.
func (c *Cluster) Stop(t testing.TB) { t.Helper(); c.ctl(t, "stop") }

// Resume starts a stopped cluster again on the same port.
func (c *Cluster) Resume(t testing.TB) { t.Helper(); c.ctl(t, "start") }

func (c *Cluster) ctl(t testing.TB, action string) {
	t.Helper()
	if out, err := exec.Command(filepath.Join(c.scripts, "ctl.sh"), c.dir, action).CombinedOutput(); err != nil {
		t.Fatalf("postgrestest: ctl.sh %s: %v\n%s", action, err, out)
	}
}

func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("postgrestest: go.mod not found above the working directory")
		}
		dir = parent
	}
}
