package isolation_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/supervisor/isolation"
	"github.com/openshell-go/openshell/internal/supervisor/isolation/isolationtest"
)

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "needs root: the confinement drops privileges for real")
	}
}

func escapeBinary(t testing.TB) string { return isolationtest.EscapeBinary(t) }

// layout is a test sandbox tree under a world-traversable directory.
type layout struct {
	base, ws, ro, secret string
	escape, suid         string // the helper, and a setuid-root copy of it
}

func newLayout(t *testing.T) layout {
	t.Helper()
	// Outside /tmp, which the policy makes read-write.
	base, err := os.MkdirTemp("/var/tmp", "openshell-iso-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	l := layout{base: base, ws: filepath.Join(base, "ws"), ro: filepath.Join(base, "ro"), secret: filepath.Join(base, "secret")}
	for _, d := range []string{l.ws, l.ro, l.secret} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.Chmod(base, 0o755))
	must(t, os.Chown(l.ws, isolation.DefaultUID, isolation.DefaultGID))
	must(t, os.WriteFile(filepath.Join(l.ro, "file"), []byte("read-only data\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(l.secret, "file"), []byte("secret\n"), 0o644))
	src, err := os.ReadFile(escapeBinary(t))
	must(t, err)
	l.escape = filepath.Join(l.ro, "escape")
	must(t, os.WriteFile(l.escape, src, 0o755))
	l.suid = filepath.Join(l.ro, "escape-suid")
	must(t, os.WriteFile(l.suid, src, 0o755))
	must(t, os.Chmod(l.suid, 0o4755|os.ModeSetuid))
	return l
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (l layout) policy() *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{
		Version: 1,
		Filesystem: &sandboxv1.FilesystemPolicy{
			IncludeWorkdir: true,
			ReadOnly:       []string{"/usr", "/bin", "/lib", "/lib64", "/etc", l.ro},
			ReadWrite:      []string{"/tmp"},
		},
		Landlock: &sandboxv1.LandlockPolicy{Compatibility: isolation.HardRequirement},
	}
}

type result struct {
	out    string
	status syscall.WaitStatus
}

// run starts argv confined by c in dir and waits for it.
func run(t *testing.T, c *isolation.Confinement, dir string, argv ...string) (result, error) {
	t.Helper()
	cmd, l, err := c.Command(argv, []string{"PATH=/usr/bin:/bin"}, dir)
	if err != nil {
		return result{}, err // the program cannot be resolved
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := l.Started(l.Start(cmd)); err != nil {
		if cmd.Process != nil {
			cmd.Wait() //nolint:errcheck // a process that started after all
		}
		return result{}, err
	}
	cmd.Wait() //nolint:errcheck // the status is read below
	return result{out: out.String(), status: cmd.ProcessState.Sys().(syscall.WaitStatus)}, nil
}

// runPlain runs argv as uid/gid 1000 without any confinement: the
// control that shows an attempt would work without it.
func runPlain(t *testing.T, argv ...string) result {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: isolation.DefaultUID, Gid: isolation.DefaultGID}}
	cmd.Run() //nolint:errcheck // the status is read below
	return result{out: out.String(), status: cmd.ProcessState.Sys().(syscall.WaitStatus)}
}

// rootSleeper starts a root process standing in for the supervisor.
func rootSleeper(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
	return cmd.Process.Pid
}

func confinement(t *testing.T, p *sandboxv1.SandboxPolicy, workdir string) *isolation.Confinement {
	t.Helper()
	c, err := isolation.FromPolicy(p, "/nonexistent-root", workdir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestEscapes runs every escape attempt as the confined agent; each must
// be refused. Where the refusal is this package's doing rather than the
// uid's, a control runs the same attempt as uid 1000 without confinement
// and must succeed, so the test cannot pass for the wrong reason.
func TestEscapes(t *testing.T) {
	needRoot(t)
	if isolation.LandlockABI() < 1 {
		citest.SkipOrFail(t, "kernel without Landlock")
	}
	l := newLayout(t)
	c := confinement(t, l.policy(), l.ws)
	victim := strconv.Itoa(rootSleeper(t))
	// A descriptor the supervisor holds without close-on-exec (children
	// inherit it unless the spawn stops it), numbered high enough
	// that os/exec's own descriptor shuffling does not cover it.
	fd, err := syscall.Open(filepath.Join(l.secret, "file"), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	const leak = 100
	err = syscall.Dup2(fd, leak)
	syscall.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(leak)
	tests := []struct {
		name    string
		argv    []string
		control bool // also escapes as plain uid 1000
		killed  bool // killed by the seccomp filter
	}{
		{name: "mount", argv: []string{"mount", l.ws}},
		{name: "ptrace the supervisor", argv: []string{"ptrace", victim}},
		{name: "kill the supervisor", argv: []string{"kill", victim}},
		{name: "unshare -n", argv: []string{"unshare-net"}},
		{name: "unshare user namespace", argv: []string{"unshare-user"}},
		{name: "clone into new user and net namespaces", argv: []string{"clone-userns"}, control: userNamespacesAllowed()},
		{name: "setns", argv: []string{"setns"}},
		{name: "raw socket", argv: []string{"raw-socket"}},
		{name: "raw ipv6 socket", argv: []string{"raw6-socket"}},
		{name: "packet socket", argv: []string{"packet-socket"}},
		{name: "packet datagram socket", argv: []string{"packet-dgram-socket"}},
		{name: "icmp datagram socket", argv: []string{"icmp-socket"}, control: pingAllowed()},
		{name: "setuid-root binary", argv: []string{"@suid", "euid"}, control: true},
		{name: "load a module", argv: []string{"init-module"}},
		{name: "load a module from a file", argv: []string{"finit-module"}},
		{name: "write /proc/sys", argv: []string{"write", "/proc/sys/kernel/hostname"}},
		{name: "open a block device", argv: []string{"open", "/dev/loop0"}},
		{name: "create a block device", argv: []string{"mknod", filepath.Join(l.ws, "blk")}},
		{name: "write outside read_write", argv: []string{"write", filepath.Join(l.secret, "new")}},
		{name: "write into read_only", argv: []string{"write", filepath.Join(l.ro, "new")}},
		{name: "read outside read_only", argv: []string{"read", filepath.Join(l.secret, "file")}, control: true},
		{name: "bpf", argv: []string{"bpf"}},
		{name: "perf_event_open", argv: []string{"perf"}},
		{name: "keyctl", argv: []string{"keyctl"}, control: true},
		{name: "add_key", argv: []string{"add-key"}, control: true},
		{name: "userfaultfd", argv: []string{"userfaultfd"}},
		{name: "io_uring", argv: []string{"io-uring"}, control: true},
		{name: "open_by_handle_at", argv: []string{"open-by-handle"}},
		{name: "kexec_load", argv: []string{"kexec"}},
		{name: "pivot_root", argv: []string{"pivot-root"}},
		{name: "inherit a descriptor of the supervisor", argv: []string{"fds"}, control: true},
		{name: "x32 syscall", argv: []string{"x32"}, killed: true},
		{name: "i386 syscall", argv: []string{"i386"}, killed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := l.escape
			args := tt.argv
			if args[0] == "@suid" {
				bin, args = l.suid, args[1:]
			}
			argv := append([]string{bin}, args...)
			got, err := run(t, c, l.ws, argv...)
			if err != nil {
				t.Fatalf("confined start: %v", err)
			}
			switch {
			case tt.killed:
				if !got.status.Signaled() || got.status.Signal() != syscall.SIGSYS {
					t.Errorf("%v = %v (%q), want killed by SIGSYS", args, got.status, got.out)
				}
			case got.status.Exited() && got.status.ExitStatus() == 1 && strings.HasPrefix(got.out, "denied: "):
			default:
				t.Errorf("%v = %v %q, want denied", args, got.status, got.out)
			}
			if tt.control {
				if ctl := runPlain(t, argv...); !strings.HasPrefix(ctl.out, "ESCAPED") {
					t.Errorf("control (uid 1000, unconfined) %v = %q, want ESCAPED: the attempt proves nothing", args, ctl.out)
				}
			}
		})
	}
}

func userNamespacesAllowed() bool {
	b, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	return err == nil && strings.TrimSpace(string(b)) != "0"
}

func pingAllowed() bool {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ping_group_range")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return false
	}
	lo, _ := strconv.Atoi(f[0])
	hi, _ := strconv.Atoi(f[1])
	return lo <= isolation.DefaultGID && isolation.DefaultGID <= hi
}

// TestConfinedProcess checks what the kernel reports for the agent and
// that the allowed paths stay usable.
func TestConfinedProcess(t *testing.T) {
	needRoot(t)
	l := newLayout(t)
	c := confinement(t, l.policy(), l.ws)

	got, err := run(t, c, l.ws, l.escape, "status")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Uid: 1000 1000 1000 1000", "Gid: 1000 1000 1000 1000", "Groups:\n",
		"CapInh: 0000000000000000", "CapPrm: 0000000000000000", "CapEff: 0000000000000000",
		"CapBnd: 0000000000000000", "CapAmb: 0000000000000000",
		"NoNewPrivs: 1", "Seccomp: 2",
	} {
		if !strings.Contains(got.out, want) {
			t.Errorf("agent status lacks %q:\n%s", want, got.out)
		}
	}

	t.Run("read_write is writable", func(t *testing.T) {
		got, err := run(t, c, l.ws, "/bin/sh", "-c", "echo hi > new && mkdir d && mv new d/ && cat d/new && echo tmp > /tmp/iso-$$ && rm /tmp/iso-$$")
		if err != nil || got.status.ExitStatus() != 0 || got.out != "hi\n" {
			t.Fatalf("write in workspace = %q %v %v", got.out, got.status, err)
		}
	})
	t.Run("read_only is readable", func(t *testing.T) {
		got, err := run(t, c, l.ws, "cat", filepath.Join(l.ro, "file"))
		if err != nil || got.out != "read-only data\n" {
			t.Fatalf("read = %q %v %v", got.out, got.status, err)
		}
	})
	t.Run("loopback tcp sockets still work", func(t *testing.T) {
		got, err := run(t, c, l.ws, l.escape, "tcp-socket")
		if err != nil || !strings.HasPrefix(got.out, "ESCAPED") {
			t.Fatalf("tcp socket = %q %v", got.out, err)
		}
	})
	t.Run("dev null and tty baseline", func(t *testing.T) {
		got, err := run(t, c, l.ws, "/bin/sh", "-c", "echo x > /dev/null && head -c 4 /dev/urandom | wc -c")
		if err != nil || strings.TrimSpace(got.out) != "4" {
			t.Fatalf("baseline devices = %q %v %v", got.out, got.status, err)
		}
	})
	t.Run("policy user and group", func(t *testing.T) {
		p := l.policy()
		p.Process = &sandboxv1.ProcessPolicy{RunAsUser: "1500", RunAsGroup: "1600"}
		got, err := run(t, confinement(t, p, ""), "/", l.escape, "status")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got.out, "Uid: 1500 1500 1500 1500") || !strings.Contains(got.out, "Gid: 1600 1600 1600 1600") {
			t.Fatalf("status = %s", got.out)
		}
	})
}

// TestFailsClosed: a confinement that cannot be applied never runs the
// agent; the spawn returns the reason.
func TestFailsClosed(t *testing.T) {
	needRoot(t)
	l := newLayout(t)
	marker := filepath.Join(l.ws, "ran")
	tests := []struct {
		name   string
		policy func(*sandboxv1.SandboxPolicy)
		argv   []string
		want   string
	}{
		{
			name: "hard requirement with a missing path",
			policy: func(p *sandboxv1.SandboxPolicy) {
				p.Filesystem.ReadOnly = append(p.Filesystem.ReadOnly, "/does/not/exist")
			},
			argv: []string{"/bin/sh", "-c", "touch " + marker},
			want: "landlock path /does/not/exist",
		},
		{
			name:   "workdir the user cannot enter",
			policy: func(p *sandboxv1.SandboxPolicy) {},
			argv:   []string{"/bin/sh", "-c", "touch " + marker},
			want:   "permission denied", // os/exec's child failed its chdir
		},
		{
			name:   "unknown program",
			policy: func(p *sandboxv1.SandboxPolicy) {},
			argv:   []string{"no-such-program-here"},
			want:   "executable file not found",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := l.policy()
			tt.policy(p)
			dir := l.ws
			if tt.name == "workdir the user cannot enter" {
				dir = "/root"
			}
			_, err := run(t, confinement(t, p, l.ws), dir, tt.argv...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("start error = %v, want one containing %q", err, tt.want)
			}
			if _, serr := os.Stat(marker); serr == nil {
				t.Fatal("the agent ran although its confinement failed")
			}
		})
	}

	t.Run("started outside the agents' domain", func(t *testing.T) {
		// cmd.Start instead of Launch.Start: outside the domain thread
		// the agent would run unconfined, so cmd.Start refuses.
		cmd, l2, err := confinement(t, l.policy(), l.ws).Command([]string{"/bin/sh", "-c", "touch " + marker}, nil, l.ws)
		must(t, err)
		err = l2.Started(cmd.Start())
		if err == nil || !strings.Contains(err.Error(), "Launch.Start") {
			t.Fatalf("Started(cmd.Start()) = %v, want refused", err)
		}
		if _, serr := os.Stat(marker); serr == nil {
			t.Fatal("the agent ran outside the agents' Landlock domain")
		}
	})

	t.Run("best effort skips a missing path", func(t *testing.T) {
		p := l.policy()
		p.Landlock.Compatibility = isolation.BestEffort
		p.Filesystem.ReadOnly = append(p.Filesystem.ReadOnly, "/does/not/exist")
		c := confinement(t, p, l.ws)
		abi, skipped, err := c.CheckLandlock()
		if err != nil || abi < 1 || len(skipped) != 1 || skipped[0].Path != "/does/not/exist" || skipped[0].Reason() != "path does not exist" {
			t.Fatalf("CheckLandlock() = %d, %v, %v; want the ABI and /does/not/exist skipped", abi, skipped, err)
		}
		got, err := run(t, c, l.ws, "/bin/sh", "-c", "touch "+marker+" && cat "+filepath.Join(l.secret, "file"))
		if err != nil || got.status.ExitStatus() == 0 {
			t.Fatalf("best effort run = %q %v %v, want started and the secret unreadable", got.out, got.status, err)
		}
		if _, err := os.Stat(marker); err != nil {
			t.Fatal("agent did not run under best effort")
		}
	})
}

// TestLandlockScopes: on a kernel with Landlock ABI 6 or later the agent
// may signal, and connect to abstract unix sockets of, only processes in
// its own Landlock domain. A process of the agent's own uid outside the
// domain (what the supervisor's other children and other sessions are)
// and an abstract socket the supervisor listens on are out of reach; the
// controls, unconfined as uid 1000, reach both. Inside its own domain
// both still work.
func TestLandlockScopes(t *testing.T) {
	needRoot(t)
	abi := isolation.LandlockABI()
	if abi < 6 {
		citest.SkipOrFail(t, "kernel Landlock ABI %d: scopes need 6", abi)
	}
	if got := strings.Join(isolation.LandlockScopes(abi), ","); got != "abstract_unix_socket,signal" {
		t.Errorf("LandlockScopes(%d) = %q, want abstract_unix_socket,signal", abi, got)
	}
	l := newLayout(t)
	c := confinement(t, l.policy(), l.ws)
	denied := func(t *testing.T, argv ...string) {
		t.Helper()
		got, err := run(t, c, l.ws, append([]string{l.escape}, argv...)...)
		if err != nil {
			t.Fatalf("confined start: %v", err)
		}
		if !got.status.Exited() || got.status.ExitStatus() != 1 || !strings.HasPrefix(got.out, "denied: ") {
			t.Errorf("confined %v = %v %q, want denied", argv, got.status, got.out)
		}
	}
	escapes := func(t *testing.T, argv ...string) {
		t.Helper()
		if ctl := runPlain(t, append([]string{l.escape}, argv...)...); !strings.HasPrefix(ctl.out, "ESCAPED") {
			t.Errorf("control (uid 1000, unconfined) %v = %q, want ESCAPED: the attempt proves nothing", argv, ctl.out)
		}
	}

	t.Run("signal a process of its uid outside its domain", func(t *testing.T) {
		victim := uidSleeper(t)
		denied(t, "kill", strconv.Itoa(victim))
		if err := syscall.Kill(victim, 0); err != nil {
			t.Errorf("victim gone after the confined kill: %v", err)
		}
		escapes(t, "kill", strconv.Itoa(victim))
	})
	t.Run("signal another agent process", func(t *testing.T) {
		// Every agent start of one confinement (main process, exec, SSH
		// session) shares its domain: an exec may stop what the main
		// process started.
		cmd, lc, err := c.Command([]string{"sleep", "60"}, []string{"PATH=/usr/bin:/bin"}, l.ws)
		must(t, err)
		must(t, lc.Started(lc.Start(cmd)))
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
		got, err := run(t, c, l.ws, l.escape, "kill", strconv.Itoa(cmd.Process.Pid))
		if err != nil || !strings.HasPrefix(got.out, "ESCAPED") {
			t.Errorf("kill of another agent process = %q %v, want it to work (one domain)", got.out, err)
		}
		// Another sandbox's confinement is another domain.
		other := confinement(t, l.policy(), l.ws)
		cmd2, lc2, err := other.Command([]string{"sleep", "60"}, []string{"PATH=/usr/bin:/bin"}, l.ws)
		must(t, err)
		must(t, lc2.Started(lc2.Start(cmd2)))
		t.Cleanup(func() { cmd2.Process.Kill(); cmd2.Wait() }) //nolint:errcheck
		denied(t, "kill", strconv.Itoa(cmd2.Process.Pid))
	})
	t.Run("connect to an abstract socket outside its domain", func(t *testing.T) {
		name := "openshell-scope-test-" + strconv.Itoa(os.Getpid())
		ln, err := net.Listen("unix", "@"+name)
		must(t, err)
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		denied(t, "abstract-connect", name)
		escapes(t, "abstract-connect", name)
	})
	t.Run("inside its own domain", func(t *testing.T) {
		got, err := run(t, c, l.ws, "/bin/sh", "-c", l.escape+` abstract-self && { sleep 60 & kill $!; wait $!; echo "child status $?"; }`)
		if err != nil || !strings.HasPrefix(got.out, "works abstract-self\n") || !strings.HasSuffix(got.out, "child status 143\n") {
			t.Errorf("own domain = %q %v %v, want the abstract socket and the kill of its own child to work", got.out, got.status, err)
		}
	})
}

// uidSleeper starts an unconfined process of the agent's uid, as another
// process of that uid outside the agent's Landlock domain.
func uidSleeper(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: isolation.DefaultUID, Gid: isolation.DefaultGID}}
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
	return cmd.Process.Pid
}
