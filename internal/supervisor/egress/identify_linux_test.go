package egress

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/citest"
	"golang.org/x/sys/unix"
)

// needTool returns the path of a real client binary; under CI=true a
// missing one fails the test.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		citest.SkipOrFail(t, "%s is required: %v", name, err)
	}
	p, err = filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func copyFile(t *testing.T, src, dst string, extra []byte) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	// Write a new file and rename it over dst: a replaced binary is a new
	// inode at the same path.
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, append(b, extra...), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// TestBinaryIdentity runs real clients through the proxy: the process
// holding the client socket is found through /proc, and only the allowed
// executable at the allowed path with its first-seen content gets through.
func TestBinaryIdentity(t *testing.T) {
	curl := needTool(t, "curl")
	wget := needTool(t, "wget")
	port := upstream(t)
	dir := t.TempDir()
	allowed := filepath.Join(dir, "allowed", "curl")
	elsewhere := filepath.Join(dir, "elsewhere", "curl")
	copyFile(t, curl, allowed, nil)
	copyFile(t, curl, elsewhere, nil)
	rules := map[string]*sandboxv1.NetworkPolicyRule{"up": {Name: "up",
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: port, AllowedIps: []string{"127.0.0.1"}}},
		Binaries:  []*sandboxv1.NetworkBinary{{Path: allowed}}}}
	id := &ProcIdentifier{Root: "/proc"}
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: id.Identify}, rules)
	target := fmt.Sprintf("http://allowed.test:%d/x", port)

	run := func(bin string, args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "http_proxy=" + tp.url.String(), "no_proxy="}
		out, _ := cmd.CombinedOutput() // the status is in the output
		return strings.TrimSpace(string(out))
	}
	curlStatus := func(bin string) string {
		return run(bin, "-s", "-o", "/dev/null", "-w", "%{http_code}", "-x", tp.url.String(), target)
	}
	wantEvent := func(decision, binary, reason string) {
		t.Helper()
		ev := tp.events.last(t)
		if ev.Decision != decision || ev.Binary != binary || ev.PID <= 1 || !strings.Contains(ev.Reason, reason) {
			t.Errorf("event = %+v, want %s by %s (reason containing %q)", ev, decision, binary, reason)
		}
	}

	if got := curlStatus(allowed); got != "200" {
		t.Fatalf("allowed binary: status %s, want 200", got)
	}
	wantEvent("allow", allowed, "")
	if got := curlStatus(elsewhere); got != "403" {
		t.Errorf("same content at another path: status %s, want 403", got)
	}
	wantEvent("deny", elsewhere, "not allowed in policy 'up'")
	if out := run(wget, "-q", "-O", "-", target); strings.Contains(out, "hello") {
		t.Errorf("wget got through: %q", out)
	}
	wantEvent("deny", wget, "not allowed in policy 'up'")
	// The allowed path now holds different content: trust on first use
	// denies it.
	copyFile(t, curl, allowed, []byte("changed"))
	if got := curlStatus(allowed); got != "403" {
		t.Errorf("replaced binary at the allowed path: status %s, want 403", got)
	}
	wantEvent("deny", allowed, "changed since its first use")
	// A shell parent running the allowed binary: the exe is the curl copy,
	// the ancestor /bin/sh is not trusted for anything.
	copyFile(t, curl, filepath.Join(dir, "allowed2", "curl"), nil)
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	rules["up"].Binaries = []*sandboxv1.NetworkBinary{{Path: sh}}
	tp.proxy.SetSnapshot(mustCompile(t, rules))
	out := run(sh, "-c", fmt.Sprintf("%s -s -o /dev/null -w %%{http_code} -x %s %s; echo", filepath.Join(dir, "allowed2", "curl"), tp.url, target))
	if out != "200" {
		t.Errorf("binary allowed through its ancestor %s: status %q, want 200", sh, out)
	}
	wantEvent("allow", filepath.Join(dir, "allowed2", "curl"), "")
}

// A binary rewritten in place with its size and modification time kept
// (same device and inode) is not taken from the hash cache: its ctime
// changed, so it is hashed again and denied.
func TestBinaryRewrittenInPlace(t *testing.T) {
	curl := needTool(t, "curl")
	port := upstream(t)
	allowed := filepath.Join(t.TempDir(), "curl")
	copyFile(t, curl, allowed, nil)
	rules := map[string]*sandboxv1.NetworkPolicyRule{"up": {Name: "up",
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: port, AllowedIps: []string{"127.0.0.1"}}},
		Binaries:  []*sandboxv1.NetworkBinary{{Path: allowed}}}}
	tp := startProxy(t, Config{Resolver: loopbackResolver("allowed.test"), Identify: (&ProcIdentifier{Root: "/proc"}).Identify}, rules)
	status := func() string {
		out, _ := exec.Command(allowed, "-s", "-o", "/dev/null", "-w", "%{http_code}", "-x", tp.url.String(),
			fmt.Sprintf("http://allowed.test:%d/x", port)).CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	if got := status(); got != "200" {
		t.Fatalf("allowed binary: status %s, want 200", got)
	}
	before, err := os.Stat(allowed)
	if err != nil {
		t.Fatal(err)
	}
	// Change the last byte (the section header table, which the loader
	// does not read), then set the mtime back.
	f, err := os.OpenFile(allowed, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, before.Size()-1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{last[0] ^ 0xff}, before.Size()-1); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(allowed, before.ModTime(), before.ModTime()); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(allowed)
	if err != nil || after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("rewrite changed size or mtime: %v %v (%v)", before, after, err)
	}
	if got := status(); got != "403" {
		t.Errorf("binary rewritten in place: status %s, want 403", got)
	}
	if ev := tp.events.last(t); ev.Decision != "deny" || !strings.Contains(ev.Reason, "changed since its first use") {
		t.Errorf("event = %+v, want a denial for the changed binary", ev)
	}
}

// fakeProc builds a procfs-like tree under dir: process pid runs exe
// (whose parent is ppid) and holds socket inode ino at descriptor 3.
func fakeProc(t *testing.T, dir string, pid, ppid int, exe string, ino uint64) {
	t.Helper()
	p := filepath.Join(dir, strconv.Itoa(pid))
	if err := os.MkdirAll(filepath.Join(p, "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fmt.Sprintf("socket:[%d]", ino), filepath.Join(p, "fd", "3")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, filepath.Join(p, "exe")); err != nil {
		t.Fatal(err)
	}
	stat := fmt.Sprintf("%d (x) S %d 0 0\n", pid, ppid)
	if err := os.WriteFile(filepath.Join(p, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A holder that exits after the descriptor scan, its pid then taken by a
// process running an allowed binary, is still identified as the process
// that held the socket: its executable is read through the /proc
// directory opened during the scan, never through the pid again.
func TestIdentifyPIDReuse(t *testing.T) {
	root := t.TempDir()
	bins := t.TempDir()
	evil, allowed := filepath.Join(bins, "evil"), filepath.Join(bins, "allowed")
	for _, b := range []string{evil, allowed} {
		if err := os.WriteFile(b, []byte(b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const ino = 4242
	fakeProc(t, root, 100, 1, evil, ino)
	id := &ProcIdentifier{Root: root, Self: -1,
		lookup: func(netip.AddrPort, netip.AddrPort) (uint64, error) { return ino, nil }}
	id.afterScan = func() {
		// pid 100 exits and is reused by an allowed process (which does
		// not even hold the socket).
		if err := os.Rename(filepath.Join(root, "100"), filepath.Join(root, "gone")); err != nil {
			t.Fatal(err)
		}
		fakeProc(t, root, 100, 1, allowed, 1)
	}
	a := netip.MustParseAddrPort("127.0.0.1:5000")
	callers, err := id.Identify(a, a)
	if err != nil {
		t.Fatal(err)
	}
	if len(callers) != 1 || callers[0].Exe != evil {
		t.Errorf("Identify = %+v, want the process that held the socket (%s)", callers, evil)
	}
}

// The kernel's exact socket lookup (sock_diag) finds the same inode as
// /proc/net/tcp, for IPv4 and IPv6 connections, and an unknown tuple is
// an error.
func TestSockDiag(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			addr := map[string]string{"tcp4": "127.0.0.1:0", "tcp6": "[::1]:0"}[network]
			ln, err := net.Listen(network, addr)
			if err != nil {
				if network == "tcp6" {
					citest.SkipOrFail(t, "no IPv6 loopback: %v", err)
				}
				t.Fatal(err)
			}
			defer ln.Close()
			c, err := net.Dial(network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			local := netip.MustParseAddrPort(c.LocalAddr().String())
			remote := netip.MustParseAddrPort(c.RemoteAddr().String())
			ino, uid, err := diagSocket(local, remote)
			if err != nil {
				t.Fatalf("diagSocket(%s, %s): %v", local, remote, err)
			}
			want, err := (&ProcIdentifier{Root: "/proc"}).procNetInode(local, remote)
			if err != nil {
				t.Fatal(err)
			}
			if ino != want || uid != uint32(os.Getuid()) {
				t.Errorf("diagSocket = inode %d uid %d, want inode %d (from /proc/net) uid %d", ino, uid, want, os.Getuid())
			}
			if _, _, err := diagSocket(remote, local); err != nil {
				t.Errorf("diagSocket of the accepted end: %v", err)
			}
			gone := netip.AddrPortFrom(local.Addr(), 1)
			if _, _, err := diagSocket(gone, remote); err == nil {
				t.Errorf("diagSocket(%s, %s) found a socket that does not exist", gone, remote)
			}
		})
	}
}

// BenchmarkIdentify measures caller identification alone, for a client
// socket held by the benchmark itself against the host's /proc (every
// process of the machine is scanned) and for one held by a shell in a pid
// namespace of its own with two other processes, against that
// namespace's /proc, as the supervisor (pid 1 of the sandbox's pid
// namespace, its own descriptors skipped) sees a sandbox.
func BenchmarkIdentify(b *testing.B) {
	var mu sync.Mutex
	accepted := make(chan net.Conn, 4)
	ln := loopbackServer(b, func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		b.Cleanup(func() { c.Close() })
		accepted <- c
	})
	run := func(b *testing.B, id *ProcIdentifier, c net.Conn) {
		client := netip.MustParseAddrPort(c.RemoteAddr().String())
		server := netip.MustParseAddrPort(c.LocalAddr().String())
		for b.Loop() {
			if cs, err := id.Identify(client, server); err != nil || len(cs) != 1 {
				b.Fatalf("Identify = %+v, %v", cs, err)
			}
		}
		b.ReportMetric(float64(procCount(id.Root)), "procs")
		b.ReportMetric(float64(fdCount(id.Root)), "fds")
	}
	b.Run("host", func(b *testing.B) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		run(b, &ProcIdentifier{Root: "/proc", Self: -1}, <-accepted)
	})
	b.Run("pidns", func(b *testing.B) {
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		_, out, root := startInPIDNamespace(b, exec.Command("bash", "-c", "sleep 600 & sleep 600 & exec 3<>/dev/tcp/127.0.0.1/"+port+"; echo ready; read"))
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "ready\n" {
			b.Fatalf("namespace shell: %q, %v", line, err)
		}
		run(b, &ProcIdentifier{Root: root, Self: -1}, <-accepted)
	})
}

// The same attack with real processes: in a pid namespace of its own, the
// process holding the socket is killed after the descriptor scan and its
// pid handed (through ns_last_pid) to a process running another binary.
// The holder's executable is read through its /proc directory opened
// during the scan, which fails for the dead process: the new process is
// never reported as the caller.
func TestIdentifyPIDReuseRealProcesses(t *testing.T) {
	sleep := needTool(t, "sleep")
	needTool(t, "bash")
	dir := t.TempDir()
	evil, good := filepath.Join(dir, "evil"), filepath.Join(dir, "good")
	copyFile(t, sleep, evil, nil)
	copyFile(t, sleep, good, nil)
	accepted := make(chan net.Conn, 1)
	ln := loopbackServer(t, func(c net.Conn) {
		t.Cleanup(func() { c.Close() })
		accepted <- c
	})
	_, port := splitAddr(t, ln.Addr().String())
	// pid 1 of the namespace: starts the holder, then on "reuse" kills it
	// and starts the good binary under the holder's pid (each reported
	// once it runs its binary; the test builtin forks nothing).
	script := `bash -c 'exec 3<>/dev/tcp/127.0.0.1/` + port + `; exec ` + evil + ` 1000' &
H=$!
until [ /proc/$H/exe -ef ` + evil + ` ]; do :; done
echo "holder $H"
read cmd
kill -9 $H; wait $H
echo $((H-1)) > /proc/sys/kernel/ns_last_pid
` + good + ` 1000 &
N=$!
until [ /proc/$N/exe -ef ` + good + ` ]; do :; done
echo "reused $N"
read cmd`
	in, out, root := startInPIDNamespace(t, exec.Command("bash", "-c", script))
	lines := bufio.NewScanner(out)
	next := func() string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("namespace shell ended: %v", lines.Err())
		}
		return lines.Text()
	}
	holder := strings.TrimPrefix(next(), "holder ")
	c := <-accepted
	client := netip.MustParseAddrPort(c.RemoteAddr().String())
	server := netip.MustParseAddrPort(c.LocalAddr().String())
	var reused string
	id := &ProcIdentifier{Root: root, Self: -1, afterScan: func() {
		fmt.Fprintln(in, "reuse")
		reused = strings.TrimPrefix(next(), "reused ")
	}}
	callers, err := id.Identify(client, server)
	if reused != holder {
		t.Fatalf("the new process got pid %s, the holder had %s: no reuse to test", reused, holder)
	}
	for _, cl := range callers {
		if cl.Exe == good && cl.Err == nil {
			t.Fatalf("Identify attributed the socket to %s, which took the dead holder's pid %s", good, holder)
		}
	}
	if err == nil && (len(callers) == 0 || callers[0].Err == nil) {
		t.Errorf("Identify = %+v, want the dead holder reported unreadable", callers)
	}
}

func splitAddr(t *testing.T, addr string) (string, string) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return h, p
}

// A kernel whose sock_diag answers every lookup ENOENT (tcp_diag not
// loaded) does not break identification: /proc/net/tcp finds the socket,
// and sock_diag is not asked again.
func TestSocketInodeFallsBackFromSockDiag(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	remote := netip.MustParseAddrPort(c.RemoteAddr().String())
	calls := 0
	id := &ProcIdentifier{Root: "/proc", diag: func(netip.AddrPort, netip.AddrPort) (uint64, uint32, error) {
		calls++
		return 0, 0, unix.ENOENT
	}}
	want, err := id.procNetInode(local, remote)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if ino, err := id.socketInode(local, remote); err != nil || ino != want {
			t.Fatalf("socketInode = %d, %v; want %d from /proc/net/tcp", ino, err, want)
		}
	}
	if calls != 1 {
		t.Errorf("sock_diag asked %d times, want once (then left off)", calls)
	}
	gone := netip.AddrPortFrom(local.Addr(), 1)
	if _, err := id.socketInode(gone, remote); err == nil {
		t.Errorf("socketInode(%s) found a socket that does not exist", gone)
	}
}

// The first-use hashes are bounded without forgetting any: past the
// bound a new executable path is refused, known ones still pass.
func TestTrustedPathsBounded(t *testing.T) {
	dir := t.TempDir()
	const ino = 4242
	id := &ProcIdentifier{Root: dir, Self: -1, maxPaths: 2,
		lookup: func(netip.AddrPort, netip.AddrPort) (uint64, error) { return ino, nil }}
	bins := t.TempDir()
	identify := func(name string) Caller {
		t.Helper()
		bin := filepath.Join(bins, name)
		if _, err := os.Stat(bin); err != nil {
			if err := os.WriteFile(bin, []byte(name), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		root := t.TempDir()
		fakeProc(t, root, 100, 1, bin, ino)
		id.Root = root
		a := netip.MustParseAddrPort("127.0.0.1:5000")
		cs, err := id.Identify(a, a)
		if err != nil || len(cs) != 1 {
			t.Fatalf("Identify = %+v, %v", cs, err)
		}
		return cs[0]
	}
	for _, n := range []string{"a", "b"} {
		if c := identify(n); c.Err != nil {
			t.Errorf("%s: %v, want trusted on first use", n, c.Err)
		}
	}
	if c := identify("c"); c.Err == nil || !strings.Contains(c.Err.Error(), "more than 2 distinct executables") {
		t.Errorf("third path: %v, want refused past the bound", c.Err)
	}
	if c := identify("a"); c.Err != nil {
		t.Errorf("a known path past the bound: %v, want still trusted", c.Err)
	}
}

// heldAtProbeEnv makes the test binary scan the descriptors of the pid it
// names (see TestMain) and print "links-read first-errno".
const heldAtProbeEnv = "OPENSHELL_EGRESS_HELDAT_PROBE"

func heldAtProbe(pid string) {
	root, err := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	want := []byte("socket:[0]") // no socket has inode 0: every link is read until the end
	_, _, reads := heldAt(root, pid+"/fd", make([]byte, 16<<10), make([]byte, len(want)+1), want)
	_, err = os.Readlink("/proc/" + pid + "/fd/0")
	fmt.Println(reads, errors.Is(err, unix.EACCES))
	os.Exit(0)
}

// TestHeldAtStopsWhenDenied: a process whose descriptor links the
// supervisor may not read (another user, no CAP_SYS_PTRACE; the host's pid
// namespace is full of them) costs one readlink, not one per descriptor.
// The scanner is this test binary run as nobody with only
// CAP_DAC_READ_SEARCH (it may list the descriptors of a root process, not
// read their links); the scanned process is this test, root.
func TestHeldAtStopsWhenDenied(t *testing.T) {
	if os.Getuid() != 0 {
		citest.SkipOrFail(t, "needs root (to run the scanner as another user)")
	}
	// Descriptors to scan: a few open files of this process.
	for range 8 {
		f, err := os.Open("/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A copy nobody may run (the test binary's directory is root's only).
	dir, err := os.MkdirTemp("", "heldat")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	probe := filepath.Join(dir, "probe")
	copyFile(t, self, probe, nil)
	cmd := exec.Command(probe, "-test.run", "^$")
	cmd.Env = append(os.Environ(), heldAtProbeEnv+"="+strconv.Itoa(os.Getpid()))
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: 65534, Gid: 65534},
		AmbientCaps: []uintptr{unix.CAP_DAC_READ_SEARCH},
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scanner: %v: %s", err, out)
	}
	var reads int
	var denied bool
	if _, err := fmt.Sscan(string(out), &reads, &denied); err != nil {
		t.Fatalf("scanner answered %q: %v", out, err)
	}
	if !denied {
		t.Fatalf("the scanner could read this process's descriptor links (%s): nothing tested", strings.TrimSpace(string(out)))
	}
	if reads != 1 {
		t.Errorf("links read in a process that denies them = %d, want 1", reads)
	}
}
