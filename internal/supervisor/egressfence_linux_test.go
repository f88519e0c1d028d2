package supervisor_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/sshexec"
)

// TestBinaryPodEgressFence runs the real binary as a Kubernetes pod runs
// it (internal/compute/kubernetes: root, no_new_privs, a bounding set of
// exactly the pod spec's capabilities, OPENSHELL_EGRESS_FENCE=nftables),
// in a network namespace of its own standing in for the pod's (loopback
// up, nothing else). With NET_ADMIN the policy is LOADED, agent processes
// have no capability left (NET_ADMIN included), reach an allowed upstream
// through the proxy, get 403 for another host, and direct TCP and UDP
// fail. Without NET_ADMIN the fence cannot be installed: FAILED naming
// it; under best_effort the agent runs and (truthfully) reaches the
// upstream directly, under hard_requirement no agent process starts.
func TestBinaryPodEgressFence(t *testing.T) {
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "needs root: network namespaces, nftables and the agent's confinement")
	}
	tools := map[string]string{}
	for _, name := range []string{"setpriv", "ip", "curl", "bash"} {
		p, err := exec.LookPath(name)
		if err != nil {
			citest.SkipOrFail(t, "needs %s: %v", name, err)
		}
		tools[name] = p
	}
	curl, err := filepath.EvalSymlinks(tools["curl"])
	if err != nil {
		t.Fatal(err)
	}
	bin := supervisorBinary(t)
	const podCaps = "+chown,+kill,+net_admin,+setgid,+setpcap,+setuid"
	for _, tt := range []struct {
		name, caps, compat string
		wantFailed         []string // empty: LOADED
		agentRuns, fenced  bool
	}{
		{name: "pod spec set", caps: podCaps, compat: "best_effort", agentRuns: true, fenced: true},
		{name: "without NET_ADMIN, best_effort", caps: strings.Replace(podCaps, "+net_admin,", "", 1), compat: "best_effort",
			wantFailed: []string{"network policies are not enforced as written", "agent processes are not fenced off the pod's network", "CAP_NET_ADMIN"}, agentRuns: true},
		{name: "without NET_ADMIN, hard_requirement", caps: strings.Replace(podCaps, "+net_admin,", "", 1), compat: "hard_requirement",
			wantFailed: []string{"agent confinement failed, no agent process starts", "CAP_NET_ADMIN", "landlock compatibility is hard_requirement"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			gw := relaytest.Start(t, relaytest.Options{})
			id := "sb-fence"
			ws, err := os.MkdirTemp("/var/tmp", "openshell-fence-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(ws) })
			gw.SetPolicy(id, &sandboxv1.SandboxPolicy{Version: 1,
				Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true,
					ReadOnly: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}, ReadWrite: []string{"/tmp"}},
				Landlock: &sandboxv1.LandlockPolicy{Compatibility: tt.compat},
				NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{"up": {Name: "up",
					Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: 18080, AllowedIps: []string{"127.0.0.1"}}},
					Binaries:  []*sandboxv1.NetworkBinary{{Path: curl}}}}})
			// A fresh network namespace with loopback up, as a pod's.
			cmd := exec.Command("/bin/sh", "-c", tools["ip"]+` link set lo up && exec "$@"`, "sh",
				tools["setpriv"], "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all,"+tt.caps, "--", bin)
			cmd.Dir = ws
			cmd.Env = []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"OPENSHELL_ENDPOINT=" + gw.Endpoint(),
				"OPENSHELL_SANDBOX_ID=" + id,
				"OPENSHELL_SANDBOX_TOKEN=" + gw.AddSandbox(id),
				"OPENSHELL_WORKSPACE_DIR=" + ws,
				"OPENSHELL_EGRESS_FENCE=nftables",
				"OPENSHELL_EGRESS_TEST_HOSTS=allowed.test=127.0.0.1,denied.test=127.0.0.1",
				"OPENSHELL_SANDBOX_COMMAND=" + mustJSON(t, []string{"sh", "-c", "echo started > main-ran; exec sleep 600"}),
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			stopAtCleanup(t, cmd, &stderr)
			serveInNetns(t, cmd.Process.Pid, "127.0.0.1:18080")

			var st *openshellv1.ReportPolicyStatusRequest
			gw.WaitFor(t, 30*time.Second, "policy status", func(s *relaytest.State) bool {
				if ss := s.Statuses(); len(ss) > 0 {
					st = ss[0]
					return true
				}
				return false
			})
			gw.WaitFor(t, 30*time.Second, "session of the binary", func(s *relaytest.State) bool { return s.Connected(id) })
			if len(tt.wantFailed) == 0 {
				if st.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
					t.Fatalf("policy status = %v %q, want LOADED", st.GetStatus(), st.GetLoadError())
				}
			} else {
				if st.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_FAILED {
					t.Fatalf("policy status = %v, want FAILED", st.GetStatus())
				}
				for _, w := range tt.wantFailed {
					if !strings.Contains(st.GetLoadError(), w) {
						t.Errorf("load error %q does not say %q", st.GetLoadError(), w)
					}
				}
			}
			sh := func(script string) (execResult, error) {
				return execIn(t, gw, id, sshexec.Request{Command: []string{"sh", "-c", script}})
			}
			if !tt.agentRuns {
				if got, err := sh("true"); err == nil {
					t.Errorf("exec = %+v, want refused", got)
				}
				if _, err := os.Stat(filepath.Join(ws, "main-ran")); !os.IsNotExist(err) {
					t.Errorf("main process ran (stat main-ran: %v), want none", err)
				}
				return
			}
			for _, c := range []struct {
				name, script, want string
				fails              bool // the command fails (non-zero exit)
			}{
				{name: "no capability left", script: "grep -E '^Cap(Bnd|Eff|Prm|Amb):' /proc/self/status",
					want: "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n"},
				{name: "proxy variables", script: `printf '%s %s' "$HTTP_PROXY" "$https_proxy"`, want: "http://127.0.0.1:3128 http://127.0.0.1:3128"},
				{name: "allowed through the proxy", script: "curl -sS --max-time 10 -w ' %{http_code}' http://allowed.test:18080/", want: "hello 200"},
				{name: "denied through the proxy", script: "curl -sS --max-time 10 -o /dev/null -w '%{http_code}' http://denied.test:18080/", want: "403"},
				{name: "direct TCP", script: "curl -sS --noproxy '*' --max-time 5 http://127.0.0.1:18080/", want: "hello", fails: tt.fenced},
				{name: "UDP", script: tools["bash"] + " -c 'echo x > /dev/udp/127.0.0.1/18081'", fails: tt.fenced},
			} {
				got, err := sh(c.script)
				if err != nil {
					t.Errorf("%s: exec: %v", c.name, err)
					continue
				}
				switch {
				case c.fails && got.code == 0:
					t.Errorf("%s: %+v, want failure (fenced)", c.name, got)
				case !c.fails && (got.code != 0 || got.stdout != c.want):
					t.Errorf("%s: %+v, want exit 0 and %q", c.name, got, c.want)
				}
			}
		})
	}
}

// serveInNetns serves HTTP "hello" on addr inside the network namespace
// of pid: the listener is created by a thread that joins it and returns
// to its own namespace before it is released (a thread that ended would
// SIGKILL children it started with Pdeathsig); serving runs anywhere.
func serveInNetns(t *testing.T, pid int, addr string) {
	t.Helper()
	lnc := make(chan net.Listener, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return // the thread ends locked
		}
		defer own.Close()
		f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		defer func() {
			if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
				runtime.UnlockOSThread()
			}
		}()
		// Loopback has its address once the wrapper brought it up.
		deadline := time.Now().Add(10 * time.Second)
		for {
			ln, err := net.Listen("tcp", addr)
			if err == nil {
				lnc <- ln
				return
			}
			if time.Now().After(deadline) {
				errc <- err
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	var ln net.Listener
	select {
	case ln = <-lnc:
	case err := <-errc:
		t.Fatalf("upstream in the sandbox's network namespace: %v", err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}
