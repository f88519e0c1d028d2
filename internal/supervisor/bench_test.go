package supervisor_test

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/sshexec"
)

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

// BenchmarkExecTrue measures a full exec round trip of `true`: OpenRelay
// (RelayOpen → supervisor dials its SSH socket → RelayStream claim), SSH
// handshake, exec, exit status. Baseline: fork/exec of `true` in-process.
func BenchmarkExecTrue(b *testing.B) {
	gw := relaytest.Start(b, relaytest.Options{})
	startSupervisor(b, gw, "sb-bench-exec", nil)
	reg := gw.Registry()
	var lat, base []time.Duration
	for b.Loop() {
		start := time.Now()
		conn, err := reg.OpenRelay(b.Context(), "sb-bench-exec", relay.SSHTarget())
		if err != nil {
			b.Fatal(err)
		}
		code, err := sshexec.Exec(b.Context(), conn, sshexec.Request{Command: []string{"true"}})
		if err != nil || code != 0 {
			b.Fatalf("Exec(true) = %d, %v", code, err)
		}
		lat = append(lat, time.Since(start))

		start = time.Now()
		if err := exec.Command("true").Run(); err != nil {
			b.Fatal(err)
		}
		base = append(base, time.Since(start))
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(lat, 0.5)), "p50-ms")
	b.ReportMetric(ms(percentile(lat, 0.95)), "p95-ms")
	b.ReportMetric(ms(percentile(base, 0.5)), "forkexec-p50-ms")
	b.ReportMetric(float64(percentile(lat, 0.5))/float64(percentile(base, 0.5)), "x-forkexec")
}

// rawEcho is the baseline: a bare gRPC server whose RelayStream echoes
// every data frame, on the same kind of transport (Unix socket).
type rawEcho struct {
	openshellv1.UnimplementedOpenShellServer
}

func (rawEcho) RelayStream(s openshellv1.OpenShell_RelayStreamServer) error {
	for {
		f, err := s.Recv()
		if err != nil {
			return nil //nolint:nilerr // the client ending the stream ends the echo
		}
		if err := s.Send(f); err != nil {
			return err
		}
	}
}

func startRawEcho(b *testing.B) openshellv1.OpenShellClient {
	dir, err := os.MkdirTemp("", "rawecho-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	openshellv1.RegisterOpenShellServer(srv, rawEcho{})
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(l) })
	b.Cleanup(func() { srv.Stop(); wg.Wait() })
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return openshellv1.NewOpenShellClient(cc)
}

// echoThrough writes n bytes to w while reading n bytes back from r.
func echoThrough(b *testing.B, w io.Writer, r io.Reader, n int) {
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64*1024)
		for left := n; left > 0; {
			k := min(left, len(buf))
			if _, err := w.Write(buf[:k]); err != nil {
				b.Error(err)
				return
			}
			left -= k
		}
	})
	if _, err := io.CopyN(io.Discard, r, int64(n)); err != nil {
		b.Fatal(err)
	}
	wg.Wait()
}

// streamRW adapts a raw RelayStream client to io.Writer/io.Reader with
// 16 KiB frames, like the relay does.
type streamRW struct {
	s    openshellv1.OpenShell_RelayStreamClient
	rbuf []byte
}

func (s *streamRW) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), relay.ChunkSize)
		if err := s.s.Send(&openshellv1.RelayFrame{Payload: &openshellv1.RelayFrame_Data{Data: slices.Clone(p[:k])}}); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

func (s *streamRW) Read(p []byte) (int, error) {
	for len(s.rbuf) == 0 {
		f, err := s.s.Recv()
		if err != nil {
			return 0, err
		}
		s.rbuf = f.GetData()
	}
	n := copy(p, s.rbuf)
	s.rbuf = s.rbuf[n:]
	return n, nil
}

// BenchmarkRelayThroughput moves 8 MiB per iteration through a TCP relay
// to an echo server inside the sandbox and, in the same iteration, through
// a raw gRPC bidi stream to an echo handler; it reports both rates and
// their ratio.
func BenchmarkRelayThroughput(b *testing.B) {
	const n = 8 << 20
	gw := relaytest.Start(b, relaytest.Options{})
	startSupervisor(b, gw, "sb-bench-tcp", nil)
	port := echoServer(b)
	conn, err := gw.Registry().OpenRelay(b.Context(), "sb-bench-tcp", relay.TCPTarget("127.0.0.1", uint32(port)))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	raw := startRawEcho(b)
	rs, err := raw.RelayStream(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	rawRW := &streamRW{s: rs}
	var relayT, rawT time.Duration
	b.SetBytes(n)
	for b.Loop() {
		start := time.Now()
		echoThrough(b, conn, conn, n)
		relayT += time.Since(start)
		start = time.Now()
		echoThrough(b, rawRW, rawRW, n)
		rawT += time.Since(start)
	}
	rate := func(d time.Duration) float64 { return float64(n*b.N) / d.Seconds() / (1 << 20) }
	b.ReportMetric(rate(relayT), "relay-MiB/s")
	b.ReportMetric(rate(rawT), "rawgrpc-MiB/s")
	b.ReportMetric(rawT.Seconds()/relayT.Seconds(), "x-rawgrpc")
	rs.CloseSend()
}
