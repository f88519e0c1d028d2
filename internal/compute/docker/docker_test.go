package docker_test

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/compute/docker"
	"github.com/openshell-go/openshell/internal/compute/docker/dockertest"
)

func TestMain(m *testing.M) { dockertest.Main(m) }

var (
	fakeOnce sync.Once
	fakePath string
)

// fakeSupervisor builds testdata/fakesupervisor (static) once.
func fakeSupervisor(t testing.TB) string {
	t.Helper()
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "openshell-docker-fake-")
		if err != nil {
			t.Fatal(err)
		}
		fakePath = dockertest.StaticBinary(t, "./testdata/fakesupervisor", dir)
	})
	if fakePath == "" {
		t.Fatal("fake supervisor not built")
	}
	return fakePath
}

// env is one driver's surroundings: a Docker Engine, a state directory
// and a callback socket that accepts connections.
type env struct {
	host, stateDir, callback string
	cli                      *client.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	host := dockertest.Host(t)
	e := &env{host: host, stateDir: t.TempDir(), cli: dockertest.Client(t, host)}
	dockertest.Busybox(t, host)
	run := filepath.Join(e.stateDir, "run")
	if err := os.MkdirAll(run, 0o700); err != nil {
		t.Fatal(err)
	}
	e.callback = filepath.Join(run, "gateway.sock")
	ln, err := net.Listen("unix", e.callback)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return e
}

func (e *env) open(t *testing.T, cfg map[string]any) *docker.Driver {
	t.Helper()
	full := map[string]any{"socket_path": e.host, "supervisor_bin": fakeSupervisor(t), "stop_timeout_secs": 5}
	for k, v := range cfg {
		full[k] = v
	}
	d, err := docker.Open(full, compute.FactoryDeps{StateDir: e.stateDir, GatewayEndpoint: "unix://" + e.callback, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("Open() error = %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// cleanupSandboxes deletes whatever the driver still has at the end.
func cleanupSandboxes(t *testing.T, d *docker.Driver) {
	t.Cleanup(func() {
		list, _ := d.List(context.Background())
		for _, sb := range list {
			_, _ = d.Delete(context.Background(), compute.Ref{ID: sb.ID})
		}
	})
}

func goodSandbox(id, name string) compute.Sandbox {
	return compute.Sandbox{ID: id, Name: name, Workspace: "default", Spec: compute.Spec{
		SandboxToken: "token-" + id,
		Template:     compute.Template{Image: dockertest.BusyboxImage, Environment: map[string]string{"FROM_TEMPLATE": "t"}},
		Environment:  map[string]string{"FROM_SPEC": "s"},
	}}
}

func TestConformance(t *testing.T) {
	e := newEnv(t)
	computetest.Run(t, func(t *testing.T) compute.Driver {
		d := e.open(t, nil)
		cleanupSandboxes(t, d)
		return d
	}, computetest.Options{
		Sandbox: goodSandbox,
		Invalid: map[string]func(id, name string) compute.Sandbox{
			"rootfs directory": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.Image = "dir:/srv/rootfs"
				return sb
			},
			"runtime class": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.RuntimeClassName = "kata"
				return sb
			},
			"cpu request over limit": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.Resources.CPURequest, sb.Spec.Template.Resources.CPULimit = "2", "1"
				return sb
			},
			"bad name": func(id, _ string) compute.Sandbox { return goodSandbox(id, "Not_A_Label") },
			"path id":  func(_, name string) compute.Sandbox { return goodSandbox("../escape", name) },
			"driver config": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.DriverConfig = map[string]any{"privileged": true}
				return sb
			},
		},
		Timeout: 30 * time.Second,
	})
}

// waitReady waits until Get reports Ready=True.
func waitReady(t *testing.T, d compute.Driver, id string) compute.Sandbox {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sb, err := d.Get(t.Context(), compute.Ref{ID: id})
		if err == nil && computetest.IsReady(sb) {
			return sb
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s not ready: %+v, %v", id, sb.Status, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type report struct {
	UID        int               `json:"uid"`
	Hostname   string            `json:"hostname"`
	Cwd        string            `json:"cwd"`
	Args       []string          `json:"args"`
	Env        map[string]string `json:"env"`
	TokenMode  string            `json:"token_mode"`
	TokenDir   string            `json:"token_dir_mode"`
	TokenUID   int               `json:"token_uid"`
	Token      string            `json:"token"`
	Interfaces []string          `json:"interfaces"`
	CapEff     string            `json:"cap_eff"`
	NoNewPrivs string            `json:"no_new_privs"`
	Callback   string            `json:"callback"`
	PidsMax    string            `json:"pids_max"`
}

// readFile copies one file out of a container.
func readFile(t *testing.T, cli *client.Client, ctr, path string) []byte {
	t.Helper()
	rc, _, err := cli.CopyFromContainer(t.Context(), ctr, path)
	if err != nil {
		t.Fatalf("copy %s from %s: %v", path, ctr, err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	if _, err := tr.Next(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(tr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// reports waits for n start reports in the sandbox's workspace.
func reports(t *testing.T, cli *client.Client, id string, n int) []report {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var out []report
		rc, _, err := cli.CopyFromContainer(t.Context(), "openshell-"+id, "/sandbox/report.json")
		if err == nil {
			tr := tar.NewReader(rc)
			if _, err := tr.Next(); err == nil {
				sc := bufio.NewScanner(tr)
				sc.Buffer(nil, 1<<20)
				for sc.Scan() {
					var r report
					if json.Unmarshal(sc.Bytes(), &r) == nil {
						out = append(out, r)
					}
				}
			}
			rc.Close()
		}
		if len(out) >= n {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d start reports of %s, want %d (last error %v)", len(out), id, n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func labelFilter(kv ...string) filters.Args {
	f := filters.NewArgs()
	for _, s := range kv {
		f.Add("label", s)
	}
	return f
}

func containersOf(t *testing.T, cli *client.Client, id string) []container.Summary {
	t.Helper()
	list, err := cli.ContainerList(t.Context(), container.ListOptions{All: true, Filters: labelFilter(docker.LabelSandboxID + "=" + id)})
	if err != nil {
		t.Fatal(err)
	}
	return list
}

func volumesOf(t *testing.T, cli *client.Client, id string) []*volume.Volume {
	t.Helper()
	list, err := cli.VolumeList(t.Context(), volume.ListOptions{Filters: labelFilter(docker.LabelSandboxID + "=" + id)})
	if err != nil {
		t.Fatal(err)
	}
	return list.Volumes
}
