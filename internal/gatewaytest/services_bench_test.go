package gatewaytest

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// BenchmarkServiceHTTP compares sequential keep-alive GETs of a sandbox's
// web app through its service URL (plaintext loopback path: auth, routing,
// ReverseProxy, relay) with GETs over a raw ForwardTcp relay to the same
// port, in one run, and reports the ratio (issue target: at least 0.5).
// Sandboxes of the process driver have their own network namespace, so
// the relay is the closest baseline to "direct".
func BenchmarkServiceHTTP(b *testing.B) {
	g := Start(b, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	port := freePort(b)
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "bench", Spec: &openshellv1.SandboxSpec{Command: HelperCommand("http", strconv.Itoa(port))}}); err != nil {
		b.Fatal(err)
	}
	sb := WaitPhase(ctx, b, c, "bench", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	id := sb.GetMetadata().GetId()
	g.InstallHelper(b, id)
	exp, err := c.ExposeService(ctx, &openshellv1.ExposeServiceRequest{Sandbox: "bench", Service: "app", TargetPort: uint32(port)})
	if err != nil {
		b.Fatal(err)
	}
	sess, err := c.CreateSshSession(ctx, &openshellv1.CreateSshSessionRequest{SandboxId: id})
	if err != nil {
		b.Fatal(err)
	}
	viaService := g.serviceClient(nil)
	viaRelay := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		s, err := c.ForwardTcp(sctx)
		if err == nil {
			err = s.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Init{Init: &openshellv1.TcpForwardInit{
				SandboxId: id, AuthorizationToken: sess.GetToken(),
				Target: &openshellv1.TcpForwardInit_Tcp{Tcp: &openshellv1.TcpRelayTarget{Host: "127.0.0.1", Port: uint32(port)}},
			}}})
		}
		if err != nil {
			stop()
			return nil, err
		}
		return ForwardConn(s, stop), nil
	}}}
	get := func(cl *http.Client, url string) {
		resp, err := cl.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s = %s", url, resp.Status)
		}
	}
	// Wait for the app, then measure both paths for the same duration.
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := viaService.Get(exp.GetUrl())
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("service never answered: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rate := func(cl *http.Client, url string) float64 {
		n, start := 0, time.Now()
		for time.Since(start) < 3*time.Second {
			get(cl, url)
			n++
		}
		return float64(n) / time.Since(start).Seconds()
	}
	for b.Loop() {
		relay := rate(viaRelay, "http://127.0.0.1:"+strconv.Itoa(port)+"/")
		service := rate(viaService, exp.GetUrl())
		b.ReportMetric(service, "service-req/s")
		b.ReportMetric(relay, "relay-req/s")
		b.ReportMetric(service/relay, "ratio")
	}
}

// BenchmarkUploadVsCat uploads 64 MiB with SFTP and pipes 64 MiB into
// `cat > FILE` over the same SSH connection on the same relay, in one run,
// and reports the ratio of throughputs (issue target: at least 0.7).
func BenchmarkUploadVsCat(b *testing.B) {
	g := Start(b, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	sb := readySandboxTB(ctx, b, c, "bench")
	id := sb.GetMetadata().GetId()
	sess, err := c.CreateSshSession(ctx, &openshellv1.CreateSshSessionRequest{SandboxId: id})
	if err != nil {
		b.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	s, err := c.ForwardTcp(sctx)
	if err == nil {
		err = s.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Init{Init: &openshellv1.TcpForwardInit{
			SandboxId: id, AuthorizationToken: sess.GetToken(), Target: &openshellv1.TcpForwardInit_Ssh{Ssh: &openshellv1.SshRelayTarget{}},
		}}})
	}
	if err != nil {
		b.Fatal(err)
	}
	conn, chans, reqs, err := ssh.NewClientConn(ForwardConn(s, stop), "bench", &ssh.ClientConfig{
		User: "sandbox", HostKeyCallback: ssh.InsecureIgnoreHostKey(), //nolint:gosec // relay authorized by the gateway, as in the CLI
	})
	if err != nil {
		b.Fatal(err)
	}
	client := ssh.NewClient(conn, chans, reqs)
	defer client.Close()
	sc, err := sftp.NewClient(client, sftp.UseConcurrentWrites(true))
	if err != nil {
		b.Fatal(err)
	}
	defer sc.Close()
	const size = 64 << 20
	data := make([]byte, size)
	viaCat := func() time.Duration {
		se, err := client.NewSession()
		if err != nil {
			b.Fatal(err)
		}
		defer se.Close()
		se.Stdin = bytes.NewReader(data)
		start := time.Now()
		if err := se.Run("cat > /sandbox/cat.bin"); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	viaSFTP := func() time.Duration {
		start := time.Now()
		f, err := sc.OpenFile("/sandbox/sftp.bin", os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.ReadFrom(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for b.Loop() {
		cat, up := viaCat(), viaSFTP()
		mib := float64(size) / (1 << 20)
		b.ReportMetric(mib/up.Seconds(), "sftp-MiB/s")
		b.ReportMetric(mib/cat.Seconds(), "cat-MiB/s")
		b.ReportMetric(cat.Seconds()/up.Seconds(), "ratio")
	}
}
