package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/citest"
)

// benchClientEnv makes the test binary a BenchmarkConnect client (see
// TestMain): "proxy-addr direct-addr authority".
const benchClientEnv = "OPENSHELL_EGRESS_BENCH_CLIENT"

func TestMain(m *testing.M) {
	if v := os.Getenv(benchClientEnv); v != "" {
		if err := benchClient(v, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if v := os.Getenv(heldAtProbeEnv); v != "" {
		heldAtProbe(v)
	}
	os.Exit(m.Run())
}

// benchPerConn is what BenchmarkConnect sends through each connection.
const benchPerConn = 16 << 20

// connectVia opens a CONNECT tunnel to authority through the proxy at addr.
func connectVia(addr, authority string) (net.Conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n", authority)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || br.Buffered() != 0 {
		c.Close()
		return nil, fmt.Errorf("CONNECT: %s", resp.Status)
	}
	return c, nil
}

// measureConn dials, then sends benchPerConn bytes to a discarding sink
// and waits for its end of stream: it returns the setup and transfer
// times.
func measureConn(dial func() (net.Conn, error), buf []byte) (setup, xfer time.Duration, err error) {
	t0 := time.Now()
	c, err := dial()
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	setup = time.Since(t0)
	t1 := time.Now()
	for n := 0; n < benchPerConn; n += len(buf) {
		if _, err := c.Write(buf); err != nil {
			return 0, 0, err
		}
	}
	_ = c.(*net.TCPConn).CloseWrite()
	_, _ = io.Copy(io.Discard, c) // EOF once the sink has read everything
	return setup, time.Since(t1), nil
}

// benchClient measures one direct and one proxied connection per line
// read from in and writes "setupD xferD setupP xferP" (ns) for each.
func benchClient(spec string, in io.Reader, out io.Writer) error {
	f := strings.Fields(spec)
	if len(f) != 3 {
		return fmt.Errorf("%s: want proxy, direct and authority", benchClientEnv)
	}
	buf := make([]byte, 64<<10)
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		sd, xd, err := measureConn(func() (net.Conn, error) { return net.Dial("tcp", f[1]) }, buf)
		if err != nil {
			return err
		}
		sp, xp, err := measureConn(func() (net.Conn, error) { return connectVia(f[0], f[2]) }, buf)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%d %d %d %d\n", sd, xd, sp, xp)
	}
	return sc.Err()
}

// BenchmarkConnect compares, in one run, loopback connections through the
// proxy (CONNECT, with the real caller identification through /proc and
// the decision) with direct ones to the same sink: setup latency (p50
// added by the proxy) and bulk throughput (x-direct: proxied MB/s over
// direct MB/s). "host": the benchmark itself is the client, identified
// among every process of the machine. "relay": a bare relay with the
// proxy's copy both ways, the floor of the proxy's throughput;
// "relay-splice": the same splicing through io.Copy. "pidns": the client is this binary
// run in a pid namespace of its own (through unshare), identified through
// that namespace's /proc, as the supervisor sees a sandbox.
func BenchmarkConnect(b *testing.B) {
	sink := loopbackServer(b, func(c net.Conn) {
		go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
	})
	port := uint32(sink.Addr().(*net.TCPAddr).Port)
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	rules := curlRules(port, "127.0.0.1")
	rules["up"].Binaries = []*sandboxv1.NetworkBinary{{Path: self}}
	authority := fmt.Sprintf("allowed.test:%d", port)
	start := func(b *testing.B, id *ProcIdentifier) (*testProxy, func() time.Duration) {
		var mu sync.Mutex
		var times []time.Duration
		identify := func(client, server netip.AddrPort) ([]Caller, error) {
			t0 := time.Now()
			cs, err := id.Identify(client, server)
			mu.Lock()
			times = append(times, time.Since(t0))
			mu.Unlock()
			return cs, err
		}
		tp := startProxy(b, Config{Resolver: loopbackResolver("allowed.test"), Identify: identify}, rules)
		return tp, func() time.Duration {
			mu.Lock()
			defer mu.Unlock()
			return p50(times)
		}
	}
	report := func(b *testing.B, r benchRun, identifyP50 time.Duration, root string) {
		mbps := func(x time.Duration) float64 { return float64(benchPerConn*len(r.setupD)) / x.Seconds() / 1e6 }
		b.ReportMetric(mbps(r.xferD), "direct-MB/s")
		b.ReportMetric(mbps(r.xferP), "proxy-MB/s")
		b.ReportMetric(mbps(r.xferP)/mbps(r.xferD), "x-direct")
		b.ReportMetric(float64(p50(r.setupP)-p50(r.setupD))/1e3, "setup-added-p50-us")
		b.ReportMetric(float64(identifyP50)/1e3, "identify-p50-us")
		b.ReportMetric(float64(procCount(root)), "procs")
		b.ReportMetric(float64(fdCount(root)), "fds")
	}

	direct := func() (net.Conn, error) { return net.Dial("tcp", sink.Addr().String()) }
	b.Run("host", func(b *testing.B) {
		tp, idP50 := start(b, &ProcIdentifier{Root: "/proc", Self: -1}) // the benchmark itself is the caller
		r := measurePairs(b, direct, func() (net.Conn, error) { return connectVia(tp.url.Host, authority) })
		report(b, r, idP50(), "/proc")
	})

	// The floor of the proxy's data path: no CONNECT, no identification,
	// no decision, the proxy's own copy (pump) both ways between the
	// accepted and the dialed connection. "relay-splice": the same with
	// io.Copy, which splices TCP to TCP through a pipe (what the proxy
	// did before pump; slower on loopback).
	bareRelay := func(b *testing.B, cp func(dst, src net.Conn)) {
		relay := startBareRelay(b, sink.Addr().String(), cp)
		r := measurePairs(b, direct, func() (net.Conn, error) { return net.Dial("tcp", relay.Addr().String()) })
		mbps := func(x time.Duration) float64 { return float64(benchPerConn*len(r.setupD)) / x.Seconds() / 1e6 }
		b.ReportMetric(mbps(r.xferP)/mbps(r.xferD), "x-direct")
	}
	b.Run("relay", func(b *testing.B) { bareRelay(b, pump) })
	b.Run("relay-splice", func(b *testing.B) {
		bareRelay(b, func(dst, src net.Conn) { _, _ = io.Copy(dst, src) })
	})

	b.Run("pidns", func(b *testing.B) {
		id := &ProcIdentifier{Self: -1}
		tp, idP50 := start(b, id)
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), benchClientEnv+"="+tp.url.Host+" "+sink.Addr().String()+" "+authority)
		cmd.Stderr = os.Stderr
		in, outR, root := startInPIDNamespace(b, cmd)
		id.Root = root
		out := bufio.NewScanner(outR)
		var r benchRun
		for b.Loop() {
			fmt.Fprintln(in, "go")
			if !out.Scan() {
				b.Fatalf("client in the pid namespace ended: %v", out.Err())
			}
			var v [4]int64
			if _, err := fmt.Sscan(out.Text(), &v[0], &v[1], &v[2], &v[3]); err != nil {
				b.Fatalf("client answered %q: %v", out.Text(), err)
			}
			r.add(time.Duration(v[0]), time.Duration(v[1]), time.Duration(v[2]), time.Duration(v[3]))
		}
		report(b, r, idP50(), id.Root)
	})
}

// measurePairs measures, per benchmark iteration, one connection made
// by direct and then one made by via.
func measurePairs(b *testing.B, direct, via func() (net.Conn, error)) benchRun {
	buf := make([]byte, 64<<10)
	var r benchRun
	for b.Loop() {
		sd, xd, err := measureConn(direct, buf)
		if err != nil {
			b.Fatal(err)
		}
		sp, xp, err := measureConn(via, buf)
		if err != nil {
			b.Fatal(err)
		}
		r.add(sd, xd, sp, xp)
	}
	return r
}

// benchRun accumulates BenchmarkConnect's measurements.
type benchRun struct {
	setupD, setupP []time.Duration
	xferD, xferP   time.Duration
}

func (r *benchRun) add(sd, xd, sp, xp time.Duration) {
	r.setupD, r.setupP = append(r.setupD, sd), append(r.setupP, sp)
	r.xferD += xd
	r.xferP += xp
}

func p50(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

// startInPIDNamespace starts cmd as pid 1 of a new pid namespace with a
// procfs of its own (through unshare; a user namespace too when not
// root) and returns its stdin and stdout and the path of that procfs.
// The command ends when its stdin closes (Cleanup closes it and waits).
func startInPIDNamespace(b testing.TB, cmd *exec.Cmd) (io.WriteCloser, io.Reader, string) {
	b.Helper()
	args := []string{"--pid", "--fork", "--mount-proc", "--kill-child"}
	if os.Getuid() != 0 {
		args = append([]string{"--user", "--map-root-user"}, args...)
	}
	ucmd := exec.Command("unshare", append(append(args, cmd.Path), cmd.Args[1:]...)...)
	ucmd.Env, ucmd.Stderr = cmd.Env, cmd.Stderr
	in, err := ucmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := ucmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := ucmd.Start(); err != nil {
		citest.SkipOrFail(b, "unshare: %v", err)
	}
	b.Cleanup(func() { in.Close(); _ = ucmd.Process.Kill(); _ = ucmd.Wait() })
	return in, out, fmt.Sprintf("/proc/%d/root/proc", ucmd.Process.Pid)
}

// startBareRelay serves a relay to target on loopback that copies with
// cp both ways (half-closing each direction at its end): no CONNECT, no
// identification, no decision, the floor of any proxy's data path.
func startBareRelay(tb testing.TB, target string, cp func(dst, src net.Conn)) net.Listener {
	return loopbackServer(tb, func(c net.Conn) {
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			return
		}
		go func() {
			defer c.Close()
			defer up.Close()
			done := make(chan struct{})
			go func() { cp(c, up); _ = c.(*net.TCPConn).CloseWrite(); close(done) }()
			cp(up, c)
			_ = up.(*net.TCPConn).CloseWrite()
			<-done
		}()
	})
}
