package gatewaytest

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute/docker"
	"github.com/openshell-go/openshell/internal/compute/docker/dockertest"
)

// dockerGateway starts a gateway with the docker driver on a test Docker
// Engine that has the locally built busybox image.
func dockerGateway(t testing.TB, o Options) (*Gateway, *client.Client, string) {
	t.Helper()
	host := dockertest.Host(t)
	img := dockertest.Busybox(t, host)
	o.ExtraArgs = append(o.ExtraArgs, "--drivers", "docker")
	o.Env = append(o.Env, "DOCKER_HOST="+host)
	return Start(t, o), dockertest.Client(t, host), img
}

func createDocker(ctx context.Context, t *testing.T, c openshellv1.OpenShellClient, name, img string) *openshellv1.Sandbox {
	t.Helper()
	resp, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{
		Command:  []string{"sleep", "1000000"},
		Template: &openshellv1.SandboxTemplate{Image: img},
	}})
	if err != nil {
		t.Fatalf("CreateSandbox(%s, image %s): %v", name, img, err)
	}
	return resp.GetSandbox()
}

// dockerObjects lists the containers and volumes of a sandbox id.
func dockerObjects(t *testing.T, cli *client.Client, id string) ([]container.Summary, []*volume.Volume) {
	t.Helper()
	f := filters.NewArgs(filters.Arg("label", docker.LabelSandboxID+"="+id))
	cs, err := cli.ContainerList(t.Context(), container.ListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	vs, err := cli.VolumeList(t.Context(), volume.ListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	return cs, vs.Volumes
}

// TestDockerSandboxLifecycle: a sandbox created through the public API
// from a locally built image by name and tag reaches READY, runs exec as
// the unprivileged agent user (which cannot read the supervisor's token),
// keeps its workspace across stop and start, and leaves no container and
// no volume after delete.
func TestDockerSandboxLifecycle(t *testing.T) {
	g, cli, img := dockerGateway(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb := createDocker(ctx, t, c, "docked", img)
	id := sb.GetMetadata().GetId()
	WaitPhase(ctx, t, c, "docked", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 60*time.Second)

	out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", "id -u; pwd; echo kept > kept.txt"}})
	if err != nil || code != 0 {
		t.Fatalf("exec: %q %q %d %v", out, errOut, code, err)
	}
	if out != "1000\n/sandbox\n" {
		t.Errorf("exec printed %q, want uid 1000 in /sandbox", out)
	}
	if out, _, code, _ := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"cat", docker.TokenDir + "/token"}}); code == 0 || out != "" {
		t.Errorf("the agent read the sandbox token: %q (exit %d)", out, code)
	}
	cs, vs := dockerObjects(t, cli, id)
	if len(cs) != 1 || len(vs) != 1 || cs[0].State != "running" {
		t.Fatalf("docker objects of %s: containers %+v volumes %+v, want one running container and one volume", id, cs, vs)
	}
	ctr := cs[0].ID

	if _, err := c.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: "docked"}); err != nil {
		t.Fatalf("StopSandbox: %v", err)
	}
	WaitPhase(ctx, t, c, "docked", openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, 60*time.Second)
	if cs, _ := dockerObjects(t, cli, id); len(cs) != 1 || cs[0].State == "running" {
		t.Errorf("container after stop: %+v, want one, not running", cs)
	}
	if _, err := c.StartSandbox(ctx, &openshellv1.StartSandboxRequest{Name: "docked"}); err != nil {
		t.Fatalf("StartSandbox: %v", err)
	}
	WaitPhase(ctx, t, c, "docked", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 60*time.Second)
	out, _, code, err = Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"cat", "kept.txt"}})
	if err != nil || code != 0 || out != "kept\n" {
		t.Errorf("workspace after stop/start: %q %d %v, want kept", out, code, err)
	}
	if cs, _ := dockerObjects(t, cli, id); len(cs) != 1 || cs[0].ID != ctr {
		t.Errorf("container after start: %+v, want the same %s", cs, ctr)
	}

	if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "docked"}); err != nil {
		t.Fatal(err)
	}
	waitGone(ctx, t, c, "docked")
	if cs, vs := dockerObjects(t, cli, id); len(cs) != 0 || len(vs) != 0 {
		t.Errorf("after delete: containers %+v volumes %+v, want none", cs, vs)
	}
}

func waitGone(ctx context.Context, t *testing.T, c openshellv1.OpenShellClient, name string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: name})
		if status.Code(err) == codes.NotFound {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still there after delete: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDockerGatewayKillReattaches: after kill -9 of the gateway with ten
// containers running, a new gateway on the same state directory finds the
// same containers (never restarted, no duplicates), their supervisors
// reconnect and exec works again.
func TestDockerGatewayKillReattaches(t *testing.T) {
	const n = 10
	g, cli, img := dockerGateway(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ids[i] = createDocker(ctx, t, c, fmt.Sprintf("kept-%d", i), img).GetMetadata().GetId()
		})
	}
	wg.Wait()
	type seen struct{ id, started string }
	before := map[string]seen{}
	for i, id := range ids {
		WaitPhase(ctx, t, c, fmt.Sprintf("kept-%d", i), openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 90*time.Second)
		cs, _ := dockerObjects(t, cli, id)
		if len(cs) != 1 {
			t.Fatalf("containers of %s: %+v", id, cs)
		}
		info, err := cli.ContainerInspect(ctx, cs[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		before[id] = seen{cs[0].ID, info.State.StartedAt}
	}

	g.Kill()
	g2, _, _ := dockerGateway(t, Options{StateDir: g.StateDir, TLSDir: g.TLSDir, Port: g.Port})
	c2 := g2.Client()
	for i, id := range ids {
		WaitPhase(ctx, t, c2, fmt.Sprintf("kept-%d", i), openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 90*time.Second)
		cs, _ := dockerObjects(t, cli, id)
		if len(cs) != 1 {
			t.Fatalf("containers of %s after restart: %+v, want exactly one", id, cs)
		}
		info, err := cli.ContainerInspect(ctx, cs[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		if got := (seen{cs[0].ID, info.State.StartedAt}); got != before[id] {
			t.Errorf("container of %s after restart = %+v, want the same, never restarted: %+v", id, got, before[id])
		}
	}
	all, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", docker.LabelManagedBy))})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != n {
		t.Errorf("%d openshell containers after restart, want %d", len(all), n)
	}
	// The new gateway controls the containers it found: stop and start
	// one, the same container.
	if _, err := c2.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: "kept-0"}); err != nil {
		t.Fatalf("StopSandbox after restart: %v", err)
	}
	WaitPhase(ctx, t, c2, "kept-0", openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, 60*time.Second)
	if cs, _ := dockerObjects(t, cli, ids[0]); len(cs) != 1 || cs[0].State == "running" || cs[0].ID != before[ids[0]].id {
		t.Errorf("container of kept-0 after stop: %+v, want %s stopped", cs, before[ids[0]].id)
	}
	if _, err := c2.StartSandbox(ctx, &openshellv1.StartSandboxRequest{Name: "kept-0"}); err != nil {
		t.Fatalf("StartSandbox after restart: %v", err)
	}
	WaitPhase(ctx, t, c2, "kept-0", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 60*time.Second)
	out, _, code, err := Exec(ctx, t, c2, &openshellv1.ExecSandboxRequest{SandboxId: ids[0], Command: []string{"echo", "back"}})
	if err != nil || code != 0 || strings.TrimSpace(out) != "back" {
		t.Errorf("exec after restart: %q %d %v", out, code, err)
	}
	for i := range n {
		if _, err := c2.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: fmt.Sprintf("kept-%d", i)}); err != nil {
			t.Errorf("DeleteSandbox(kept-%d): %v", i, err)
		}
	}
	for i, id := range ids {
		waitGone(ctx, t, c2, fmt.Sprintf("kept-%d", i))
		if cs, vs := dockerObjects(t, cli, id); len(cs) != 0 || len(vs) != 0 {
			t.Errorf("after delete of %s: containers %+v volumes %+v", id, cs, vs)
		}
	}
}

// TestDockerPullFailureInEvents: a create naming an image that is absent
// and cannot be pulled succeeds, and the sandbox's event stream carries
// the pull failure naming the image; the sandbox goes to ERROR with it.
func TestDockerPullFailureInEvents(t *testing.T) {
	g, cli, _ := dockerGateway(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	img := ln.Addr().String() + "/openshell/absent:1" // a registry nothing serves
	ln.Close()
	sb := createDocker(ctx, t, c, "unpullable", img)
	id := sb.GetMetadata().GetId()
	stream, err := c.WatchSandbox(ctx, &openshellv1.WatchSandboxRequest{Id: id, FollowEvents: true, FollowStatus: true, EventTail: 100})
	if err != nil {
		t.Fatal(err)
	}
	var warned bool
	for !warned {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("watch ended before the pull failure: %v", err)
		}
		if p := ev.GetEvent(); p != nil && p.GetReason() == "ErrImagePull" {
			if p.GetType() != "Warning" || !strings.Contains(p.GetMessage(), img) {
				t.Errorf("pull failure event = %v, want a warning naming %s", p, img)
			}
			warned = true
		}
	}
	got := WaitPhase(ctx, t, c, "unpullable", openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR, 60*time.Second)
	var cond *openshellv1.SandboxCondition
	for _, c := range got.GetStatus().GetConditions() {
		if c.GetType() == "Ready" {
			cond = c
		}
	}
	if cond.GetReason() != "ErrImagePull" || !strings.Contains(cond.GetMessage(), img) {
		t.Errorf("Ready condition = %v, want ErrImagePull naming %s", cond, img)
	}
	if cs, vs := dockerObjects(t, cli, id); len(cs) != 0 || len(vs) != 0 {
		t.Errorf("docker objects of an unpulled sandbox: %+v %+v", cs, vs)
	}
	if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "unpullable"}); err != nil {
		t.Fatal(err)
	}
	waitGone(ctx, t, c, "unpullable")
}

// TestDockerCallbackSocket: the socket bind-mounted into containers
// serves sandbox RPCs only (a user RPC is refused even from the host), and
// the agent in the container cannot even reach its directory.
func TestDockerCallbackSocket(t *testing.T) {
	g, _, img := dockerGateway(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	id := createDocker(ctx, t, c, "caller", img).GetMetadata().GetId()
	WaitPhase(ctx, t, c, "caller", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 60*time.Second)
	out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"ls", docker.CallbackDir}})
	if err != nil || code == 0 {
		t.Errorf("agent listed the callback socket directory: %q %q exit %d %v", out, errOut, code, err)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(g.StateDir, "run", "gateway.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = openshellv1.NewOpenShellClient(conn).ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("ListSandboxes on the callback socket = %v, want PermissionDenied", err)
	}
}

// copyInto writes one file into a container through the Engine's archive
// API.
func copyInto(t *testing.T, cli *client.Client, ctr, dir, name string, data []byte, mode int64) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cli.CopyToContainer(t.Context(), ctr, dir, &buf, container.CopyToContainerOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestDockerForwardTcp: a TCP forward through the gateway reaches a
// server on the container's loopback (the supervisor dials it inside the
// container's network namespace).
func TestDockerForwardTcp(t *testing.T) {
	g, cli, img := dockerGateway(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	port := freeLocalPort(t)
	resp, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "fwd", Spec: &openshellv1.SandboxSpec{
		Command:  []string{"sh", "-c", `until [ -f /sandbox/.ready ]; do sleep 0.05; done; exec /sandbox/.sbhelper echo "$0"`, strconv.Itoa(int(port))},
		Template: &openshellv1.SandboxTemplate{Image: img},
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetSandbox().GetMetadata().GetId()
	WaitPhase(ctx, t, c, "fwd", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 60*time.Second)
	helper, err := os.ReadFile(HelperBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	copyInto(t, cli, "openshell-"+id, "/sandbox", ".sbhelper", helper, 0o755)
	copyInto(t, cli, "openshell-"+id, "/sandbox", ".ready", nil, 0o644)

	sess, err := c.CreateSshSession(ctx, &openshellv1.CreateSshSessionRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	target := &openshellv1.TcpForwardInit_Tcp{Tcp: &openshellv1.TcpRelayTarget{Host: "127.0.0.1", Port: port}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := forward(ctx, t, c, &openshellv1.TcpForwardInit{SandboxId: id, Target: target, AuthorizationToken: sess.GetToken()})
		if err != nil {
			t.Fatal(err)
		}
		if err = s.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: []byte("ping")}}); err == nil {
			if f, rerr := s.Recv(); rerr == nil && string(f.GetData()) == "ping" {
				_ = s.CloseSend()
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("echo server in the container never answered through the forward: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "fwd"}); err != nil {
		t.Fatal(err)
	}
	waitGone(ctx, t, c, "fwd")
}

// BenchmarkDockerCreateReady measures CreateSandbox to phase READY
// (container started, supervisor session connected) on the docker driver
// against `docker run` of the same image to its first output, in the same
// run, and reports the ratio.
func BenchmarkDockerCreateReady(b *testing.B) {
	host := dockertest.Host(b)
	g, _, img := dockerGateway(b, Options{})
	c := g.Client()
	ctx := b.Context()
	var create, run []time.Duration
	i := 0
	for b.Loop() {
		name := fmt.Sprintf("bench-%d", i)
		i++
		start := time.Now()
		if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{
			Command: []string{"sleep", "1000000"}, Template: &openshellv1.SandboxTemplate{Image: img},
		}}); err != nil {
			b.Fatal(err)
		}
		waitReadyFast(ctx, b, c, name)
		create = append(create, time.Since(start))
		b.StopTimer()
		run = append(run, dockerRunFirstOutput(b, host, img))
		if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: name}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	mc, mr := median(create), median(run)
	b.ReportMetric(float64(mc.Milliseconds()), "ms-create-ready")
	b.ReportMetric(float64(mr.Milliseconds()), "ms-docker-run")
	b.ReportMetric(float64(mc)/float64(mr), "ratio")
}

// dockerRunFirstOutput times `docker run --rm --network none img echo
// ready` from start to the first byte of its output.
func dockerRunFirstOutput(tb testing.TB, host, img string) time.Duration {
	tb.Helper()
	cmd := exec.Command("docker", "run", "--rm", "--network", "none", img, "echo", "ready")
	cmd.Env = append(os.Environ(), "DOCKER_HOST="+host)
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	var one [1]byte
	if _, err := io.ReadFull(out, one[:]); err != nil {
		tb.Fatalf("docker run printed nothing: %v", err)
	}
	d := time.Since(start)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		tb.Fatalf("docker run: %v", err)
	}
	return d
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestDockerCLIConnect: the CLI creates a docker sandbox from a locally
// built image (--image name:tag) and connects to it through a pty.
func TestDockerCLIConnect(t *testing.T) {
	g, _, img := dockerGateway(t, Options{})
	c := newCLI(t, g)
	if _, errOut, code := c.run("", "sandbox", "create", "--name", "dcli", "--image", img, "--detach", "--", "sleep", "1000000"); code != 0 || !strings.Contains(errOut, "Sandbox dcli is ready") {
		t.Fatalf("create --image %s = %d %q", img, code, errOut)
	}
	ptmx, err := pty.Start(c.cmd("sandbox", "connect", "dcli"))
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	_ = pty.Setsize(ptmx, &pty.Winsize{Rows: 30, Cols: 100})
	if _, err := ptmx.Write([]byte("echo hi-$((40+2)) $(id -u); stty size; exit\n")); err != nil {
		t.Fatal(err)
	}
	screen := readAll(ptmx, 20*time.Second)
	if !strings.Contains(screen, "hi-42 1000") || !strings.Contains(screen, "30 100") {
		t.Fatalf("pty screen lacks the command output (as uid 1000) and size:\n%s", screen)
	}
	c.ok("sandbox", "delete", "dcli")
}
