package nftfence_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
	"github.com/openshell-go/openshell/internal/supervisor/nftfence"
)

// The test binary plays three roles, chosen by roleEnv: the test itself,
// the same tests inside a fresh network namespace (netns), and a probe
// that makes one network attempt as whatever uid it runs as (probe).
const (
	roleEnv   = "NFTFENCE_TEST_ROLE"
	agentID   = 1000 // the fenced uid and gid
	proxyAddr = "127.0.0.1:3128"
)

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "probe" {
		os.Exit(probeMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// TestFence re-executes itself in a network namespace of its own
// (CLONE_NEWNET), as root, so that the fence never touches the host's
// network, and there runs testFenceInNetns.
func TestFence(t *testing.T) {
	if os.Getenv(roleEnv) == "netns" {
		testFenceInNetns(t)
		return
	}
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "needs root: creates a network namespace and runs probes as uid %d", agentID)
	}
	exe := publicCopy(t)
	cmd := exec.Command(exe, "-test.run=^TestFence$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), roleEnv+"=netns")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	t.Logf("in a new network namespace:\n%s", out)
	if err != nil {
		t.Fatalf("TestFence in a new network namespace: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: TestFence") {
		t.Fatal("TestFence did not pass in the new network namespace")
	}
}

// publicCopy copies the test binary where uid agentID can run it (go
// test's build directory is private to root).
func publicCopy(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "openshell-nftfence-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "nftfence.test")
	if err := os.WriteFile(exe, b, 0o755); err != nil { //nolint:gosec // a test binary run by an unprivileged uid
		t.Fatal(err)
	}
	return exe
}

// testFenceInNetns installs the fence for uid and gid agentID in the
// test's own network namespace, with the egress proxy on 127.0.0.1:3128
// and loopback servers, and makes each attempt as agentID (fenced) and,
// as a control, as root (not fenced), which must succeed where the fenced
// attempt fails: what stops the agent is the fence.
func testFenceInNetns(t *testing.T) {
	loUp(t)
	// Let every group open ICMP datagram ("ping") sockets in this
	// namespace, so that refusing ICMP is the fence's doing.
	if err := os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 2147483647"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := startServers(t)
	startProxy(t, srv.httpPort)

	fenceTable := "openshell_fence_test"
	install := func() *nftfence.Fence {
		t.Helper()
		f, err := nftfence.Install(nftfence.Config{UID: agentID, GID: agentID, Proxy: netip.MustParseAddrPort(proxyAddr), Table: fenceTable})
		if err != nil {
			t.Fatalf("Install: %v", err)
		}
		return f
	}
	install()
	f := install() // replaces the first table atomically
	if n := tablesNamed(t, fenceTable); n != 1 {
		t.Fatalf("tables named %s after two installs = %d, want 1", fenceTable, n)
	}

	allowed := fmt.Sprintf("http://allowed.test:%d/", srv.httpPort)
	denied := fmt.Sprintf("http://denied.test:%d/", srv.httpPort)
	up4 := fmt.Sprintf("127.0.0.1:%d", srv.httpPort)
	up6 := fmt.Sprintf("[::1]:%d", srv.http6Port)
	udp := fmt.Sprintf("127.0.0.1:%d", srv.udpPort)
	dns := fmt.Sprintf("127.0.0.1:%d", srv.dnsPort)

	exe, _ := os.Executable()
	for _, tt := range []struct {
		name string
		cred *syscall.Credential // nil: uid and gid agentID
		args []string
		// wantAgent: the fenced attempt succeeds (and its output contains
		// wantOut); otherwise it fails and the control succeeds.
		wantAgent bool
		wantOut   string
		noControl bool // the control is pointless (the proxy's own denial)
	}{
		{name: "direct TCP to the upstream", args: []string{"tcp", up4}},
		{name: "direct TCP to another loopback address", args: []string{"tcp", "127.0.0.2:" + strconv.Itoa(srv.httpPort)}},
		{name: "direct TCP with only the uid fenced", cred: &syscall.Credential{Uid: agentID, Gid: agentID + 1}, args: []string{"tcp", up4}},
		{name: "direct TCP with only the gid fenced", cred: &syscall.Credential{Uid: agentID + 1, Gid: agentID}, args: []string{"tcp", up4}},
		{name: "IPv6 loopback", args: []string{"tcp", up6}},
		{name: "UDP", args: []string{"udp", udp}},
		{name: "DNS over UDP", args: []string{"dns", dns}},
		{name: "ICMP echo (ping socket)", args: []string{"ping", "127.0.0.1"}},
		{name: "raw socket", args: []string{"raw", "127.0.0.1"}},
		{name: "proxy to an allowed destination", args: []string{"proxy", allowed}, wantAgent: true, wantOut: "status 200 body hello"},
		{name: "proxy to a denied destination", args: []string{"proxy", denied}, wantAgent: true, wantOut: "status 403", noControl: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cred := tt.cred
			if cred == nil {
				cred = &syscall.Credential{Uid: agentID, Gid: agentID}
			}
			ok, out := probe(t, exe, cred, tt.args...)
			switch {
			case tt.wantAgent && (!ok || !strings.Contains(out, tt.wantOut)):
				t.Fatalf("as uid %d gid %d: %s, want success with %q", cred.Uid, cred.Gid, out, tt.wantOut)
			case !tt.wantAgent && ok:
				t.Fatalf("as uid %d gid %d: %s, want failure (fenced)", cred.Uid, cred.Gid, out)
			}
			t.Logf("as uid %d gid %d: %s", cred.Uid, cred.Gid, out)
			if tt.wantAgent || tt.noControl {
				return
			}
			if tt.args[0] == "raw" {
				// Without capabilities a raw socket is refused before the
				// fence; root has CAP_NET_RAW and is not fenced.
				if !strings.Contains(out, "operation not permitted") {
					t.Fatalf("raw socket as uid %d: %s, want EPERM", agentID, out)
				}
			}
			if ok, cout := probe(t, exe, nil, tt.args...); !ok {
				t.Fatalf("control as root: %s, want success (the fence is not what refused it)", cout)
			}
		})
	}

	t.Run("the supervisor reaches the agent's loopback listener", func(t *testing.T) {
		cmd, port := startEchoProbe(t, exe)
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "ping\n" {
			t.Fatalf("echo from uid %d = %q, %v; want %q", agentID, line, err, "ping\n")
		}
		c.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("echo probe: %v", err)
		}
	})

	t.Run("a peer in another network namespace", func(t *testing.T) {
		testOutsidePeer(t, exe)
	})

	t.Run("install without CAP_NET_ADMIN", func(t *testing.T) {
		ok, out := probe(t, exe, &syscall.Credential{Uid: agentID, Gid: agentID}, "install")
		if ok || !strings.Contains(out, "CAP_NET_ADMIN") {
			t.Fatalf("install as uid %d: %s, want an error naming CAP_NET_ADMIN", agentID, out)
		}
	})

	t.Run("remove", func(t *testing.T) {
		if err := f.Remove(); err != nil {
			t.Fatal(err)
		}
		if n := tablesNamed(t, fenceTable); n != 0 {
			t.Fatalf("tables named %s after Remove = %d, want 0", fenceTable, n)
		}
		if ok, out := probe(t, exe, &syscall.Credential{Uid: agentID, Gid: agentID}, "tcp", up4); !ok {
			t.Fatalf("direct TCP as uid %d after Remove: %s, want success", agentID, out)
		}
	})
}

func tablesNamed(t *testing.T, name string) int {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tb := range ts {
		if tb.Name == name {
			n++
		}
	}
	return n
}

// loUp brings up the namespace's loopback interface.
func loUp(t *testing.T) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		t.Fatal(err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		t.Fatalf("bring up lo: %v", err)
	}
}

type servers struct {
	httpPort, http6Port, udpPort, dnsPort int
}

// startServers starts servers: HTTP on every IPv4 address and on IPv6
// loopback, and on IPv4 loopback a UDP echo
// and a DNS responder answering every query with 127.0.0.1.
func startServers(t *testing.T) servers {
	t.Helper()
	var s servers
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello") })
	for _, a := range []struct {
		addr string
		port *int
	}{{"0.0.0.0:0", &s.httpPort}, {"[::1]:0", &s.http6Port}} {
		ln, err := net.Listen("tcp", a.addr)
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hs.Serve(ln) }()
		t.Cleanup(func() { _ = hs.Close() })
		*a.port = ln.Addr().(*net.TCPAddr).Port
	}
	udp := listenUDP(t, func(b []byte) []byte { return b })
	s.udpPort = udp
	s.dnsPort = listenUDP(t, dnsAnswer)
	return s
}

func listenUDP(t *testing.T, answer func([]byte) []byte) int {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if r := answer(buf[:n]); r != nil {
				_, _ = pc.WriteTo(r, from)
			}
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).Port
}

func dnsAnswer(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
	_ = b.StartQuestions()
	_ = b.Question(qs[0])
	_ = b.StartAnswers()
	_ = b.AResource(dnsmessage.ResourceHeader{Name: qs[0].Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}})
	out, _ := b.Finish()
	return out
}

// startProxy runs the egress proxy on proxyAddr: allowed.test on the
// upstream's port is allowed for any binary, everything else denied.
func startProxy(t *testing.T, port int) {
	t.Helper()
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	snap, err := egress.Compile(map[string]*sandboxv1.NetworkPolicyRule{"up": {Name: "up",
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: uint32(port), AllowedIps: []string{"127.0.0.1"}}},
		Binaries:  []*sandboxv1.NetworkBinary{{Path: "/**"}}}})
	if err != nil {
		t.Fatal(err)
	}
	p := egress.New(egress.Config{
		Resolver: egress.StaticResolver{"allowed.test": lo, "denied.test": lo},
		Dial: func(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", a.String())
		},
		Identify: (&egress.ProcIdentifier{Root: "/proc"}).Identify,
		OnEvent:  func(ev egress.Event) { t.Logf("egress %s %s:%d %s", ev.Decision, ev.Host, ev.Port, ev.Reason) },
	}, snap)
	ln, err := net.Listen("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("proxy Serve: %v", err)
		}
	})
}

// probe runs one attempt as cred (nil: root, unfenced) and returns
// whether it worked and its report.
func probe(t *testing.T, exe string, cred *syscall.Credential, args ...string) (bool, string) {
	t.Helper()
	return probeVia(t, nil, exe, cred, args...)
}

// probeVia is probe with argv prefixed by via (nsenter into another
// namespace, say).
func probeVia(t *testing.T, via []string, exe string, cred *syscall.Credential, args ...string) (bool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	argv := append(append(append([]string{}, via...), exe), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = []string{roleEnv + "=probe"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		t.Fatalf("probe %v: %v: %s", args, err, s)
	}
	return strings.HasPrefix(s, "ok"), s
}

// startEchoProbe starts the echo probe as uid agentID and returns it and
// the loopback port it listens on.
func startEchoProbe(t *testing.T, exe string) (*exec.Cmd, string) {
	t.Helper()
	return startListener(t, exe, &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: agentID, Gid: agentID}, Pdeathsig: syscall.SIGKILL}, "echo")
}

// startServer starts the serve probe on addr with attr, stopped when the
// test ends, and returns the port it listens on.
func startServer(t *testing.T, exe string, attr *syscall.SysProcAttr, addr string) (*exec.Cmd, string) {
	t.Helper()
	cmd, port := startListener(t, exe, attr, "serve", addr)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, port
}

// startListener starts a probe that prints "listening PORT" first.
func startListener(t *testing.T, exe string, attr *syscall.SysProcAttr, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(exe, args...)
	cmd.Env = []string{roleEnv + "=probe"}
	cmd.SysProcAttr = attr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("%v probe: %v", args, err)
	}
	port, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if !ok {
		t.Fatalf("%v probe said %q", args, line)
	}
	return cmd, port
}

// probeMain makes one attempt and prints "ok ..." or "failed: ...".
func probeMain(args []string) int {
	if len(args) == 0 {
		fmt.Println("failed: no probe")
		return 2
	}
	switch args[0] {
	case "echo":
		return echoOnce()
	case "serve":
		if len(args) != 2 {
			fmt.Println("failed: serve ADDR")
			return 2
		}
		return serve(args[1])
	}
	var target string
	if len(args) > 1 {
		target = args[1]
	}
	res, err := attempt(args[0], target)
	if err != nil {
		fmt.Printf("failed: %s: %v\n", args[0], err)
		return 0
	}
	fmt.Printf("ok %s\n", res)
	return 0
}

func attempt(kind, target string) (string, error) {
	const timeout = 3 * time.Second
	switch kind {
	case "tcp":
		c, err := net.DialTimeout("tcp", target, timeout)
		if err != nil {
			return "", err
		}
		c.Close()
		return "connected", nil
	case "udp":
		return udpExchange(target, []byte("ping"))
	case "dns":
		q := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
		_ = q.StartQuestions()
		_ = q.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("example.com."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		b, _ := q.Finish()
		return udpExchange(target, b)
	case "ping":
		return icmpEcho(target)
	case "raw":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
		if err != nil {
			return "", fmt.Errorf("socket: %w", err)
		}
		unix.Close(fd)
		return "raw socket opened", nil
	case "proxy":
		pu, _ := url.Parse("http://" + proxyAddr)
		c := &http.Client{Timeout: timeout, Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}
		resp, err := c.Get(target)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("status %d body %s", resp.StatusCode, body), nil
	case "install":
		f, err := nftfence.Install(nftfence.Config{UID: agentID, GID: agentID, Proxy: netip.MustParseAddrPort(proxyAddr), Table: "openshell_fence_unprivileged"})
		if err != nil {
			return "", err
		}
		_ = f.Remove()
		return "installed", nil
	}
	return "", fmt.Errorf("unknown probe %q", kind)
}

func udpExchange(target string, msg []byte) (string, error) {
	c, err := net.Dial("udp", target)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return "", fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		return "", fmt.Errorf("receive: %w", err)
	}
	return fmt.Sprintf("%d bytes back", n), nil
}

// icmpEcho sends an echo request on an ICMP datagram socket and waits for
// the reply.
func icmpEcho(target string) (string, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)
	if err != nil {
		return "", fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((3 * time.Second).Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	a := netip.MustParseAddr(target).As4()
	echo := []byte{8, 0, 0, 0, 0, 0, 0, 1, 'p', 'i', 'n', 'g'} // the kernel sets id and checksum
	if err := unix.Sendto(fd, echo, 0, &unix.SockaddrInet4{Addr: a}); err != nil {
		return "", fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 1500)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return "", fmt.Errorf("receive: %w", err)
	}
	if n < 1 || buf[0] != 0 {
		return "", errors.New("no echo reply")
	}
	return "echo reply", nil
}

// serve listens on addr, prints the port, and accepts connections (closing
// each) until it is killed.
func serve(addr string) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Printf("failed: %v\n", err)
		return 1
	}
	fmt.Printf("listening %d\n", ln.Addr().(*net.TCPAddr).Port)
	for {
		c, err := ln.Accept()
		if err != nil {
			return 1
		}
		c.Close()
	}
}

// echoOnce listens on loopback, prints the port, and echoes one line of
// one connection.
func echoOnce() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Printf("failed: %v\n", err)
		return 1
	}
	defer ln.Close()
	fmt.Printf("listening %d\n", ln.Addr().(*net.TCPAddr).Port)
	c, err := ln.Accept()
	if err != nil {
		return 1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 1
	}
	if _, err := io.WriteString(c, line); err != nil {
		return 1
	}
	return 0
}

// testOutsidePeer links the test's namespace to a peer namespace with a
// veth pair (10.77.0.1 here, 10.77.0.2 there), as a pod is linked to the
// rest of the cluster. The fenced uid can neither connect to a server of
// the peer nor answer the peer's connection to its own listener; root
// (not fenced) can do both.
func testOutsidePeer(t *testing.T, exe string) {
	ip, err := exec.LookPath("ip")
	if err != nil {
		citest.SkipOrFail(t, "needs ip (iproute2) to create a veth pair: %v", err)
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		citest.SkipOrFail(t, "needs nsenter (util-linux) to run in the peer namespace: %v", err)
	}
	// The peer's server runs in a network namespace of its own.
	peer, peerPort := startServer(t, exe, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}, "0.0.0.0:0")
	inPeer := []string{nsenter, "--net=/proc/" + strconv.Itoa(peer.Process.Pid) + "/ns/net"}
	for _, argv := range [][]string{
		{ip, "link", "add", "fence-v0", "type", "veth", "peer", "name", "fence-v1", "netns", strconv.Itoa(peer.Process.Pid)},
		{ip, "addr", "add", "10.77.0.1/24", "dev", "fence-v0"},
		{ip, "link", "set", "fence-v0", "up"},
		append(slices.Clone(inPeer), ip, "addr", "add", "10.77.0.2/24", "dev", "fence-v1"),
		append(slices.Clone(inPeer), ip, "link", "set", "fence-v1", "up"),
		append(slices.Clone(inPeer), ip, "link", "set", "lo", "up"),
	} {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", argv, err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command(ip, "link", "del", "fence-v0").Run() })
	agent := &syscall.Credential{Uid: agentID, Gid: agentID}
	to := "10.77.0.2:" + peerPort
	if ok, out := probe(t, exe, agent, "tcp", to); ok {
		t.Errorf("TCP to the peer as uid %d: %s, want failure (fenced)", agentID, out)
	}
	if ok, out := probe(t, exe, nil, "tcp", to); !ok {
		t.Errorf("control: TCP to the peer as root: %s, want success", out)
	}
	_, agentPort := startServer(t, exe, &syscall.SysProcAttr{Credential: agent, Pdeathsig: syscall.SIGKILL}, "0.0.0.0:0")
	if ok, out := probeVia(t, inPeer, exe, nil, "tcp", "10.77.0.1:"+agentPort); ok {
		t.Errorf("the peer connecting to a listener of uid %d: %s, want failure (its replies are fenced)", agentID, out)
	}
	_, rootPort := startServer(t, exe, &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}, "0.0.0.0:0")
	if ok, out := probeVia(t, inPeer, exe, nil, "tcp", "10.77.0.1:"+rootPort); !ok {
		t.Errorf("control: the peer connecting to a listener of root: %s, want success", out)
	}
}
