package supervisor_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/sshexec"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// supervisorBinary builds cmd/openshell-sandbox once per test run.
func supervisorBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "openshell-sandbox-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "openshell-sandbox")
		// Static, as `make build` builds it: it runs inside root filesystems
		// that have no C library.
		cmd := exec.Command("go", "build", "-o", binPath, "../../cmd/openshell-sandbox")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = err
			binPath = string(out)
		}
	})
	if buildErr != nil {
		t.Fatalf("go build openshell-sandbox: %v\n%s", buildErr, binPath)
	}
	return binPath
}

// TestBinaryInNamespaces runs the real binary the way the process driver
// does: new pid/mount/uts/ipc namespaces, PID 1, hostname and private /tmp.
func TestBinaryInNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "needs root for namespaces")
	}
	bin := supervisorBinary(t)
	gw := relaytest.Start(t, relaytest.Options{})
	const id = "sb-bin"
	tok := gw.AddSandbox(id)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	// The workspace must live outside /tmp, which becomes a private tmpfs.
	work, err := os.MkdirTemp("/var/tmp", "openshell-ws-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	cmdJSON, _ := json.Marshal([]string{"sh", "-c", "echo $$ > main.pid; echo main-started; exec sleep 600"})
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"OPENSHELL_ENDPOINT="+gw.Endpoint(),
		"OPENSHELL_SANDBOX_ID="+id,
		"OPENSHELL_SANDBOX_TOKEN_FILE="+tokFile,
		"OPENSHELL_INSTANCE_ID=inst-bin",
		"OPENSHELL_WORKSPACE_DIR="+work,
		"OPENSHELL_SANDBOX_COMMAND="+string(cmdJSON),
		"OPENSHELL_SANDBOX_HOSTNAME=sandbox-host",
		"OPENSHELL_PRIVATE_TMP=true",
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		citest.SkipOrFail(t, "cannot start in new namespaces: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("supervisor stderr:\n%s", stderr.String())
		}
	})
	gw.WaitFor(t, 30*time.Second, "session of the binary", func(s *relaytest.State) bool { return s.Connected(id) })
	gw.WaitFor(t, 10*time.Second, "main process output", func(s *relaytest.State) bool { return s.HasLog(id, "main-started") })

	marker, err := os.CreateTemp("", "host-marker-")
	if err != nil {
		t.Fatal(err)
	}
	marker.Close()
	t.Cleanup(func() { os.Remove(marker.Name()) })
	got, err := execIn(t, gw, id, sshexec.Request{Command: []string{"sh", "-c", `hostname; echo $$; test -e "$1" && echo 1 || echo 0; env | grep -c OPENSHELL_SANDBOX_TOKEN= || true`, "sh", marker.Name()}})
	if err != nil || got.code != 0 {
		t.Fatalf("exec = %+v, %v", got, err)
	}
	lines := strings.Fields(got.stdout)
	if len(lines) != 4 || lines[0] != "sandbox-host" || lines[2] != "0" || lines[3] != "0" {
		t.Errorf("hostname / pid / host /tmp file visible / token vars = %q, want sandbox-host, <pid>, 0, 0", lines)
	}
	if pid, _ := strconv.Atoi(lines[1]); pid <= 1 || pid > 1000 {
		t.Errorf("pid inside sandbox = %s, want a small pid of the new namespace", lines[1])
	}

	// Orphans re-parented to the supervisor (PID 1) are reaped.
	if got, err := execIn(t, gw, id, sshexec.Request{Command: []string{"sh", "-c", "for i in 1 2 3 4 5; do (true &); done; true"}}); err != nil || got.code != 0 {
		t.Fatalf("exec orphans = %+v, %v", got, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		z := zombieChildren(t, cmd.Process.Pid)
		if z == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d zombie children of the supervisor remain", z)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Killing the main process is reported as 128+9.
	if got, err := execIn(t, gw, id, sshexec.Request{Command: []string{"sh", "-c", "kill -9 $(cat main.pid)"}, Workdir: "/sandbox"}); err != nil || got.code != 0 {
		t.Fatalf("exec kill = %+v, %v", got, err)
	}
	gw.WaitFor(t, 15*time.Second, "exit report", func(s *relaytest.State) bool {
		e := s.Exits()
		return len(e) == 1 && e[0].GetExitCode() == 137 && e[0].GetInstanceId() == "inst-bin"
	})
}

// zombieChildren counts children of pid in state Z, as seen from the host.
func zombieChildren(t testing.TB, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
	if err != nil {
		t.Fatalf("read children: %v", err)
	}
	n := 0
	for _, c := range strings.Fields(string(b)) {
		st, err := os.ReadFile("/proc/" + c + "/stat")
		if err != nil {
			continue
		}
		// state follows the parenthesized command name
		s := string(st)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && s[i+2] == 'Z' {
			n++
		}
	}
	return n
}
