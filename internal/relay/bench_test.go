package relay_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
)

type echoServer struct {
	openshellv1.UnimplementedOpenShellServer
}

// ConnectSupervisor answers every message with a heartbeat: the raw gRPC
// baseline for an idle session.
func (echoServer) ConnectSupervisor(s openshellv1.OpenShell_ConnectSupervisorServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			return nil //nolint:nilerr // the client ending the stream ends the echo
		}
		if err := s.Send(&openshellv1.GatewayMessage{Payload: &openshellv1.GatewayMessage_Heartbeat{Heartbeat: &openshellv1.GatewayHeartbeat{}}}); err != nil {
			return err
		}
	}
}

func heapInuse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

var heartbeat = &openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_Heartbeat{Heartbeat: &openshellv1.SupervisorHeartbeat{}}}

// heartbeatRound sends one heartbeat on every stream and waits for every
// answer.
func heartbeatRound(b *testing.B, streams []openshellv1.OpenShell_ConnectSupervisorClient) {
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Go(func() {
			if err := s.Send(heartbeat); err != nil {
				b.Error(err)
				return
			}
			if m, err := s.Recv(); err != nil || m.GetHeartbeat() == nil {
				b.Errorf("Recv() = %v, %v", m, err)
			}
		})
	}
	wg.Wait()
}

// BenchmarkIdleSessions holds 500 supervisor sessions on one registry and
// measures the gateway heap per session and the cost of one heartbeat
// round, against 500 bare bidi streams on a plain gRPC server in the same
// process.
func BenchmarkIdleSessions(b *testing.B) {
	const n = 500
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()

	// Baseline: plain gRPC server, one bidi stream per "sandbox".
	dir, err := os.MkdirTemp("", "idle-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	l, err := net.Listen("unix", filepath.Join(dir, "raw.sock"))
	if err != nil {
		b.Fatal(err)
	}
	raw := grpc.NewServer()
	openshellv1.RegisterOpenShellServer(raw, echoServer{})
	var srvWG sync.WaitGroup
	srvWG.Go(func() { raw.Serve(l) })
	defer func() { raw.Stop(); srvWG.Wait() }()
	rawCC, err := grpc.NewClient("unix://"+l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer rawCC.Close()

	gw := relaytest.Start(b, relaytest.Options{})
	cc := gw.Dial(b)
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = gw.AddSandbox(fmt.Sprintf("sb-%d", i))
	}

	before := heapInuse()
	rawStreams := make([]openshellv1.OpenShell_ConnectSupervisorClient, n)
	for i := range rawStreams {
		s, err := openshellv1.NewOpenShellClient(rawCC).ConnectSupervisor(ctx)
		if err != nil {
			b.Fatal(err)
		}
		rawStreams[i] = s
	}
	heartbeatRound(b, rawStreams)
	rawHeap := float64(heapInuse()-before) / n

	before = heapInuse()
	streams := make([]openshellv1.OpenShell_ConnectSupervisorClient, n)
	client := openshellv1.NewOpenShellClient(cc)
	for i := range streams {
		s, err := client.ConnectSupervisor(relaytest.WithToken(ctx, tokens[i]))
		if err != nil {
			b.Fatal(err)
		}
		s.Send(&openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_Hello{Hello: &openshellv1.SupervisorHello{SandboxId: fmt.Sprintf("sb-%d", i), InstanceId: "i"}}})
		if m, err := s.Recv(); err != nil || m.GetSessionAccepted() == nil {
			b.Fatalf("session %d: %v, %v", i, m, err)
		}
		streams[i] = s
	}
	heartbeatRound(b, streams)
	sessHeap := float64(heapInuse()-before) / n

	var relayT, rawT time.Duration
	for b.Loop() {
		start := time.Now()
		heartbeatRound(b, streams)
		relayT += time.Since(start)
		start = time.Now()
		heartbeatRound(b, rawStreams)
		rawT += time.Since(start)
	}
	// Heap figures include both ends (client and server run in-process).
	b.ReportMetric(sessHeap/1024, "session-heap-KiB")
	b.ReportMetric(rawHeap/1024, "rawstream-heap-KiB")
	b.ReportMetric(float64(relayT.Microseconds())/float64(b.N*n), "heartbeat-µs/session")
	b.ReportMetric(float64(rawT.Microseconds())/float64(b.N*n), "raw-µs/stream")
	b.ReportMetric(relayT.Seconds()/rawT.Seconds(), "x-raw")
}
