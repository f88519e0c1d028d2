package supervisor

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// replayGateway is a gRPC OpenShell server that opens one relay twice (as
// a superseding session's replay does), then closes it once a RelayStream
// for it is up. It counts the RelayStream calls that start and end.
type replayGateway struct {
	openshellv1.UnimplementedOpenShellServer
	target  *openshellv1.RelayOpen
	started chan struct{}

	mu            sync.Mutex
	opened, ended int
}

func (g *replayGateway) ConnectSupervisor(stream openshellv1.OpenShell_ConnectSupervisorServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	msgs := []*openshellv1.GatewayMessage{
		{Payload: &openshellv1.GatewayMessage_SessionAccepted{SessionAccepted: &openshellv1.SessionAccepted{SessionId: "s1", HeartbeatIntervalSecs: 60}}},
		{Payload: &openshellv1.GatewayMessage_RelayOpen{RelayOpen: g.target}},
		{Payload: &openshellv1.GatewayMessage_RelayOpen{RelayOpen: g.target}},
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	select {
	case <-g.started:
	case <-stream.Context().Done():
		return nil
	}
	if err := stream.Send(&openshellv1.GatewayMessage{Payload: &openshellv1.GatewayMessage_RelayClose{
		RelayClose: &openshellv1.RelayClose{ChannelId: g.target.GetChannelId(), Reason: "test"},
	}}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (g *replayGateway) RelayStream(stream openshellv1.OpenShell_RelayStreamServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	g.mu.Lock()
	g.opened++
	if g.opened == 1 {
		close(g.started)
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.ended++
		g.mu.Unlock()
	}()
	for {
		if _, err := stream.Recv(); err != nil {
			return nil //nolint:nilerr // the supervisor ending the call is the point
		}
	}
}

func (g *replayGateway) counts() (opened, ended int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.opened, g.ended
}

// TestReplayedRelayOpenClosesEveryRelay: the gateway sends the same
// RelayOpen twice, then RelayClose. The relay serving the channel must end
// (its RelayStream call with it) and nothing must stay tracked. Before the
// fix the second RelayOpen overwrote the first relay's cancel func, so
// RelayClose cancelled the second relay only and the first ran on.
func TestReplayedRelayOpenClosesEveryRelay(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	t.Cleanup(held.Wait)
	t.Cleanup(func() { target.Close() })
	held.Go(func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			held.Go(func() { _, _ = c.Read(make([]byte, 1)); c.Close() })
		}
	})
	port := target.Addr().(*net.TCPAddr).Port
	gw := &replayGateway{
		started: make(chan struct{}),
		target: &openshellv1.RelayOpen{ChannelId: "ch-1", Target: &openshellv1.RelayOpen_Tcp{
			Tcp: &openshellv1.TcpRelayTarget{Host: "127.0.0.1", Port: uint32(port)},
		}},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	openshellv1.RegisterOpenShellServer(srv, gw)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })

	sc := &sessionClient{
		log:       slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
		client:    openshellv1.NewOpenShellClient(cc),
		sandboxID: "sb-1",
	}
	ctx, cancel := context.WithCancel(t.Context())
	var runWG sync.WaitGroup
	runWG.Go(func() { _, _ = sc.run(ctx) })
	defer func() {
		cancel()
		runWG.Wait()
		sc.relays.Wait()
	}()

	deadline := time.Now().Add(10 * time.Second)
	for {
		opened, ended := gw.counts()
		sc.mu.Lock()
		tracked := len(sc.active)
		sc.mu.Unlock()
		if opened > 0 && opened == ended && tracked == 0 {
			if opened != 1 {
				t.Errorf("RelayStream calls for one channel = %d, want 1", opened)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after RelayClose: %d RelayStream calls opened, %d ended, %d relays tracked; want all ended and none tracked", opened, ended, tracked)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
