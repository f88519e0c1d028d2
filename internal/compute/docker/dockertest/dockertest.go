// Package dockertest gives tests a real Docker Engine and locally built
// images.
//
// [Host] returns OPENSHELL_TEST_DOCKER_HOST when set (test/run-all.sh
// starts a daemon with test/docker/start.sh and exports it); otherwise it
// starts one with that script: one for the whole test binary, stopped by
// [Main], when the package's TestMain calls Main, else one per test,
// stopped at the test's cleanup.
// When no daemon can start the test is skipped, or fails under CI=true.
// No registry is reachable from the tests: images are built from local
// files ([BusyboxImage]: FROM scratch plus the host's static busybox).
package dockertest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/client"

	"github.com/openshell-go/openshell/internal/citest"
)

// EnvHost names the Docker endpoint of the tests.
const EnvHost = "OPENSHELL_TEST_DOCKER_HOST"

type daemon struct {
	host, dir, stop string
	err             error
}

var (
	startOnce  sync.Once
	started    daemon
	mainActive bool

	perTestMu sync.Mutex
	perTest   = map[string]*daemon{} // by top-level test name, without Main
)

// Main runs the tests and stops a daemon that Host started.
func Main(m *testing.M) {
	mainActive = true
	code := m.Run()
	if started.dir != "" {
		out, err := exec.Command(started.stop, started.dir).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "dockertest: stop dockerd: %v\n%s", err, out)
		}
	}
	os.Exit(code)
}

// Host returns the endpoint of a running Docker Engine.
func Host(t testing.TB) string {
	t.Helper()
	if h := os.Getenv(EnvHost); h != "" {
		return h
	}
	d := &started
	if mainActive {
		startOnce.Do(func() { started = start() })
	} else {
		// One daemon per top-level test: every call within it (a
		// restarted gateway, say) sees the same Engine.
		root, _, _ := strings.Cut(t.Name(), "/")
		perTestMu.Lock()
		own, ok := perTest[root]
		if !ok {
			st := start()
			own = &st
			perTest[root] = own
			if own.dir != "" {
				t.Cleanup(func() {
					perTestMu.Lock()
					delete(perTest, root)
					perTestMu.Unlock()
					if out, err := exec.Command(own.stop, own.dir).CombinedOutput(); err != nil {
						t.Errorf("stop dockerd: %v\n%s", err, out)
					}
				})
			}
		}
		perTestMu.Unlock()
		d = own
	}
	if d.err != nil {
		citest.SkipOrFail(t, "no Docker Engine (set %s or install docker.io and run as root): %v", EnvHost, d.err)
	}
	return d.host
}

func start() (started daemon) {
	script, err := repoFile("test/docker/start.sh")
	if err != nil {
		started.err = err
		return started
	}
	if _, err := exec.LookPath("dockerd"); err != nil {
		started.err = errors.New("dockerd is not installed (apt-get install -y docker.io)")
		return started
	}
	out, err := exec.Command(script).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		started.err = fmt.Errorf("test/docker/start.sh: %w", err)
		return started
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		v = strings.Trim(v, "'")
		switch k {
		case EnvHost:
			started.host = v
		case "OPENSHELL_TEST_DOCKER_DIR":
			started.dir = v
		}
	}
	started.stop = filepath.Join(filepath.Dir(script), "stop.sh")
	if started.host == "" {
		started.err = fmt.Errorf("test/docker/start.sh printed no %s", EnvHost)
	}
	return started
}

// repoFile finds rel by walking up from the working directory.
func repoFile(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found above the working directory", rel)
		}
		dir = parent
	}
}

// Client returns a client of host, closed at cleanup.
func Client(t testing.TB, host string) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// BusyboxImage is the tag of the image BusyboxImage builds.
const BusyboxImage = "openshell-test/busybox:2"

var busyboxApplets = []string{"sh", "ls", "cat", "echo", "sleep", "id", "env", "stat", "touch", "mkdir", "rm", "true", "false", "wc", "head", "ps", "grep", "stty", "tty", "nc", "uname", "printf", "seq", "tr", "expr"}

// Busybox builds BusyboxImage on host (once; a no-op when it exists):
// FROM scratch with the host's static /bin/busybox and its applet links.
func Busybox(t testing.TB, host string) string {
	t.Helper()
	cli := Client(t, host)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := cli.ImageInspect(ctx, BusyboxImage); err == nil {
		return BusyboxImage
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		citest.SkipOrFail(t, "no static busybox (apt-get install -y busybox-static): %v", err)
	}
	files := map[string][]byte{
		"Dockerfile": []byte("FROM scratch\nCOPY rootfs/ /\nCMD [\"/bin/sh\"]\n"),
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	for name, data := range files {
		_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: now})
		_, _ = tw.Write(data)
	}
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "rootfs/bin/", Mode: 0o755, ModTime: now})
	_ = tw.WriteHeader(&tar.Header{Name: "rootfs/bin/busybox", Mode: 0o755, Size: int64(len(bb)), ModTime: now})
	_, _ = tw.Write(bb)
	for _, a := range busyboxApplets {
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "rootfs/bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: now})
	}
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "rootfs/tmp/", Mode: 0o1777, ModTime: now})
	_ = tw.Close()
	resp, err := cli.ImageBuild(ctx, &buf, build.ImageBuildOptions{Tags: []string{BusyboxImage}, Remove: true, ForceRemove: true})
	if err != nil {
		t.Fatalf("build %s: %v", BusyboxImage, err)
	}
	defer resp.Body.Close()
	if err := buildError(resp.Body); err != nil {
		t.Fatalf("build %s: %v", BusyboxImage, err)
	}
	return BusyboxImage
}

func buildError(r io.Reader) error {
	dec := json.NewDecoder(r)
	for {
		var m struct {
			Error string `json:"error"`
		}
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if m.Error != "" {
			return errors.New(m.Error)
		}
	}
}

// StaticBinary builds the main package pkg (a path relative to the test's
// directory) with CGO_ENABLED=0 into dir and returns its path.
func StaticBinary(t testing.TB, pkg, dir string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}
