package relay_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/relay/relaytest"
)

// fakeSupervisor is a hand-driven supervisor session over real gRPC.
type fakeSupervisor struct {
	t      testing.TB
	client openshellv1.OpenShellClient
	token  string
	stream openshellv1.OpenShell_ConnectSupervisorClient
	msgs   chan *openshellv1.GatewayMessage
	cancel context.CancelFunc
}

func connect(t testing.TB, cc *grpc.ClientConn, token, sandboxID, instance string) *fakeSupervisor {
	t.Helper()
	ctx, cancel := context.WithCancel(relaytest.WithToken(t.Context(), token))
	client := openshellv1.NewOpenShellClient(cc)
	stream, err := client.ConnectSupervisor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_Hello{Hello: &openshellv1.SupervisorHello{SandboxId: sandboxID, InstanceId: instance}}}); err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatalf("ConnectSupervisor(%s) = %v", sandboxID, err)
	}
	if first.GetSessionAccepted().GetSessionId() == "" {
		t.Fatalf("first message = %v, want session_accepted", first)
	}
	f := &fakeSupervisor{t: t, client: client, token: token, stream: stream, msgs: make(chan *openshellv1.GatewayMessage, 64), cancel: cancel}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(f.msgs)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			f.msgs <- m
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return f
}

func (f *fakeSupervisor) nextRelayOpen() *openshellv1.RelayOpen {
	f.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m, ok := <-f.msgs:
			if !ok {
				f.t.Fatal("session ended while waiting for RelayOpen")
			}
			if ro := m.GetRelayOpen(); ro != nil {
				return ro
			}
		case <-timeout:
			f.t.Fatal("no RelayOpen within 10s")
		}
	}
}

// claim opens a RelayStream with the given token and init.
func claim(ctx context.Context, t testing.TB, client openshellv1.OpenShellClient, token, channelID string) openshellv1.OpenShell_RelayStreamClient {
	t.Helper()
	rs, err := client.RelayStream(relaytest.WithToken(ctx, token))
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&openshellv1.RelayFrame{Payload: &openshellv1.RelayFrame_Init{Init: &openshellv1.RelayInit{ChannelId: channelID}}}); err != nil {
		t.Fatal(err)
	}
	return rs
}

type openResult struct {
	conn *relay.Conn
	err  error
}

func openAsync(ctx context.Context, reg *relay.Registry, id string, target relay.RelayTarget) <-chan openResult {
	ch := make(chan openResult, 1)
	go func() {
		c, err := reg.OpenRelay(ctx, id, target)
		ch <- openResult{c, err}
	}()
	return ch
}

func TestConnectSupervisorRejects(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	tokA := gw.AddSandbox("sb-a")
	gw.AddSandbox("sb-b")
	cc := gw.Dial(t)
	client := openshellv1.NewOpenShellClient(cc)

	hello := func(id string) *openshellv1.SupervisorMessage {
		return &openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_Hello{Hello: &openshellv1.SupervisorHello{SandboxId: id, InstanceId: "i"}}}
	}
	tests := []struct {
		name     string
		token    string
		first    *openshellv1.SupervisorMessage // nil: close before hello
		wantCode codes.Code
		wantMsg  string
	}{
		{"heartbeat first", tokA, &openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_Heartbeat{Heartbeat: &openshellv1.SupervisorHeartbeat{}}}, codes.InvalidArgument, "expected SupervisorHello"},
		{"closed before hello", tokA, nil, codes.InvalidArgument, "stream closed before hello"},
		{"empty sandbox id", tokA, hello(""), codes.InvalidArgument, "sandbox_id is required"},
		{"other sandbox", tokA, hello("sb-b"), codes.PermissionDenied, "cross-sandbox access denied: principal does not own this sandbox"},
		{"no principal", "", hello("sb-a"), codes.PermissionDenied, "supervisor RPCs require a sandbox principal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			if tt.token != "" {
				ctx = relaytest.WithToken(ctx, tt.token)
			}
			stream, err := client.ConnectSupervisor(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tt.first != nil {
				if err := stream.Send(tt.first); err != nil {
					t.Fatal(err)
				}
			} else {
				stream.CloseSend()
			}
			_, err = stream.Recv()
			if s := status.Convert(err); s.Code() != tt.wantCode || s.Message() != tt.wantMsg {
				t.Errorf("Recv() = %v, want %v %q", err, tt.wantCode, tt.wantMsg)
			}
		})
	}
	if n := gw.Registry().PendingCount(); n != 0 {
		t.Errorf("PendingCount() = %d, want 0", n)
	}
	if _, ok := gw.Registry().Connected("sb-a"); ok {
		t.Error("rejected session left a registration behind")
	}
}

func TestConnectSupervisorUnknownSandbox(t *testing.T) {
	reg := relay.New(relay.Config{SandboxExists: func(context.Context, string) error { return errdefs.ErrNotFound }})
	defer reg.Close()
	err := reg.HandleConnect(&helloOnlyStream{id: "sb-x", ctx: t.Context()}, "sb-x")
	if errdefs.Code(err) != codes.NotFound || err.Error() != "sandbox not found" {
		t.Errorf("HandleConnect(unknown) = %v, want NotFound %q", err, "sandbox not found")
	}
}

// helloOnlyStream is a minimal server stream yielding one hello.
type helloOnlyStream struct {
	grpc.ServerStream
	id  string
	ctx context.Context
}

func (s *helloOnlyStream) Context() context.Context { return s.ctx }
func (s *helloOnlyStream) Recv() (*openshellv1.SupervisorMessage, error) {
	return &openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_Hello{Hello: &openshellv1.SupervisorHello{SandboxId: s.id}}}, nil
}
func (s *helloOnlyStream) Send(*openshellv1.GatewayMessage) error {
	return errors.New("unexpected send")
}

func TestRelayRoundTripAndPresence(t *testing.T) {
	var mu sync.Mutex
	var events []string
	gw := relaytest.Start(t, relaytest.Options{Relay: relay.Config{OnSessionChange: func(id string, connected bool, inst string) {
		mu.Lock()
		defer mu.Unlock()
		if connected {
			events = append(events, "up:"+id+":"+inst)
		} else {
			events = append(events, "down:"+id)
		}
	}}})
	tok := gw.AddSandbox("sb-a")
	cc := gw.Dial(t)
	sup := connect(t, cc, tok, "sb-a", "inst-1")
	if inst, ok := gw.Registry().Connected("sb-a"); !ok || inst != "inst-1" {
		t.Fatalf("Connected(sb-a) = %q, %v; want inst-1, true", inst, ok)
	}

	res := openAsync(t.Context(), gw.Registry(), "sb-a", relay.TCPTarget("127.0.0.1", 8080))
	ro := sup.nextRelayOpen()
	if got := ro.GetTcp(); got.GetHost() != "127.0.0.1" || got.GetPort() != 8080 {
		t.Fatalf("RelayOpen target = %v", ro.GetTarget())
	}
	rs := claim(t.Context(), t, sup.client, tok, ro.GetChannelId())
	r := <-res
	if r.err != nil {
		t.Fatalf("OpenRelay() = %v", r.err)
	}
	conn := r.conn

	// supervisor → gateway, 40 KiB arrives intact in ≤16 KiB frames.
	payload := bytes.Repeat([]byte("0123456789abcdef"), 40*1024/16)
	if err := rs.Send(&openshellv1.RelayFrame{Payload: &openshellv1.RelayFrame_Data{Data: payload}}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("ReadFull = %v, equal %v", err, bytes.Equal(got, payload))
	}
	// gateway → supervisor is chunked at 16 KiB.
	go conn.Write(payload)
	var recv []byte
	for len(recv) < len(payload) {
		f, err := rs.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if n := len(f.GetData()); n > relay.ChunkSize {
			t.Fatalf("frame of %d bytes exceeds %d", n, relay.ChunkSize)
		}
		recv = append(recv, f.GetData()...)
	}
	if !bytes.Equal(recv, payload) {
		t.Fatal("gateway → supervisor bytes differ")
	}
	// Supervisor half-close: gateway reads EOF, can still write.
	rs.CloseSend()
	if n, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("Read after CloseSend = %d, %v; want EOF", n, err)
	}
	if _, err := conn.Write([]byte("late")); err != nil {
		t.Fatalf("Write after peer half-close = %v", err)
	}
	if f, err := rs.Recv(); err != nil || string(f.GetData()) != "late" {
		t.Fatalf("Recv = %v, %v", f, err)
	}
	conn.Close()
	if _, err := rs.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after gateway Close = %v, want EOF", err)
	}

	// The channel id is single use.
	rs2 := claim(t.Context(), t, sup.client, tok, ro.GetChannelId())
	if _, err := rs2.Recv(); status.Code(err) != codes.NotFound || status.Convert(err).Message() != "unknown or expired relay channel" {
		t.Fatalf("second claim = %v, want NotFound unknown or expired relay channel", err)
	}

	sup.cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := gw.Registry().Connected("sb-a"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("session still registered after the supervisor went away")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gw.WaitFor(t, 5*time.Second, "disconnect event", func(s *relaytest.State) bool { return !s.Connected("sb-a") })
	mu.Lock()
	defer mu.Unlock()
	want := []string{"up:sb-a:inst-1", "down:sb-a"}
	if len(events) != 2 || events[0] != want[0] || events[1] != want[1] {
		t.Errorf("presence events = %v, want %v", events, want)
	}
}

func TestRelayStreamFirstFrame(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	tok := gw.AddSandbox("sb-a")
	client := openshellv1.NewOpenShellClient(gw.Dial(t))
	for _, tt := range []struct {
		name  string
		frame *openshellv1.RelayFrame
	}{
		{"data first", &openshellv1.RelayFrame{Payload: &openshellv1.RelayFrame_Data{Data: []byte("x")}}},
		{"empty channel", &openshellv1.RelayFrame{Payload: &openshellv1.RelayFrame_Init{Init: &openshellv1.RelayInit{}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rs, err := client.RelayStream(relaytest.WithToken(t.Context(), tok))
			if err != nil {
				t.Fatal(err)
			}
			rs.Send(tt.frame)
			_, err = rs.Recv()
			if s := status.Convert(err); s.Code() != codes.InvalidArgument || s.Message() != "first RelayFrame must be init with non-empty channel_id" {
				t.Errorf("Recv() = %v", err)
			}
		})
	}
}

func TestRelayCrossSandboxClaimRefused(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	tokA := gw.AddSandbox("sb-a")
	tokB := gw.AddSandbox("sb-b")
	cc := gw.Dial(t)
	supA := connect(t, cc, tokA, "sb-a", "a")
	res := openAsync(t.Context(), gw.Registry(), "sb-a", relay.SSHTarget())
	ro := supA.nextRelayOpen()
	if ro.GetSsh() == nil {
		t.Fatalf("target = %v, want ssh", ro.GetTarget())
	}
	rsB := claim(t.Context(), t, supA.client, tokB, ro.GetChannelId())
	if _, err := rsB.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("claim with sb-b's token = %v, want PermissionDenied", err)
	}
	// The slot survives the refused claim; the owner can still claim it.
	claim(t.Context(), t, supA.client, tokA, ro.GetChannelId())
	if r := <-res; r.err != nil {
		t.Fatalf("OpenRelay() = %v", r.err)
	} else {
		r.conn.Close()
	}
}

func TestRelayLimits(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{Relay: relay.Config{MaxPending: 40, MaxPendingPerSandbox: 32}})
	tokA := gw.AddSandbox("sb-a")
	tokB := gw.AddSandbox("sb-b")
	cc := gw.Dial(t)
	connect(t, cc, tokA, "sb-a", "a") // never answers RelayOpen
	connect(t, cc, tokB, "sb-b", "b")
	reg := gw.Registry()
	ctx, cancel := context.WithCancel(t.Context())
	var results []<-chan openResult
	for range 32 {
		results = append(results, openAsync(ctx, reg, "sb-a", relay.SSHTarget()))
	}
	waitPending(t, reg, 32)
	_, err := reg.OpenRelay(t.Context(), "sb-a", relay.SSHTarget())
	if errdefs.Code(err) != codes.ResourceExhausted {
		t.Fatalf("33rd OpenRelay(sb-a) = %v, want ResourceExhausted", err)
	}
	// Global limit: 8 more fit for sb-b, the 9th does not.
	for range 8 {
		results = append(results, openAsync(ctx, reg, "sb-b", relay.SSHTarget()))
	}
	waitPending(t, reg, 40)
	if _, err := reg.OpenRelay(t.Context(), "sb-b", relay.SSHTarget()); errdefs.Code(err) != codes.ResourceExhausted {
		t.Fatalf("41st OpenRelay = %v, want ResourceExhausted", err)
	}
	cancel()
	for _, r := range results {
		if res := <-r; !errors.Is(res.err, context.Canceled) {
			t.Errorf("cancelled OpenRelay = %v, want context.Canceled", res.err)
		}
	}
	if n := reg.PendingCount(); n != 0 {
		t.Errorf("PendingCount() after cancel = %d, want 0", n)
	}
}

func waitPending(t testing.TB, reg *relay.Registry, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for reg.PendingCount() != n {
		if time.Now().After(deadline) {
			t.Fatalf("PendingCount() = %d, want %d", reg.PendingCount(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRelayClaimTimeoutAndOpenFailure(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{Relay: relay.Config{ClaimTimeout: 300 * time.Millisecond}})
	tok := gw.AddSandbox("sb-a")
	sup := connect(t, gw.Dial(t), tok, "sb-a", "a")
	reg := gw.Registry()

	res := openAsync(t.Context(), reg, "sb-a", relay.SSHTarget())
	ro := sup.nextRelayOpen()
	r := <-res
	if !errors.Is(r.err, relay.ErrRelayTimedOut) || errdefs.Code(r.err) != codes.DeadlineExceeded || r.err.Error() != "relay channel timed out" {
		t.Fatalf("OpenRelay() = %v, want relay channel timed out", r.err)
	}
	late := claim(t.Context(), t, sup.client, tok, ro.GetChannelId())
	if _, err := late.Recv(); status.Code(err) != codes.NotFound {
		t.Fatalf("late claim = %v, want NotFound", err)
	}

	res = openAsync(t.Context(), reg, "sb-a", relay.TCPTarget("10.1.2.3", 80))
	ro = sup.nextRelayOpen()
	sup.stream.Send(&openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_RelayOpenResult{RelayOpenResult: &openshellv1.RelayOpenResult{
		ChannelId: ro.GetChannelId(), Error: "relay target 10.1.2.3 is not a loopback address",
	}}})
	r = <-res
	if errdefs.Code(r.err) != codes.Unavailable || r.err.Error() != "relay open failed: relay target 10.1.2.3 is not a loopback address" {
		t.Fatalf("OpenRelay() = %v", r.err)
	}
}

func TestRelayNoSession(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{Relay: relay.Config{SessionWait: 300 * time.Millisecond}})
	gw.AddSandbox("sb-a")
	start := time.Now()
	_, err := gw.Registry().OpenRelay(t.Context(), "sb-a", relay.SSHTarget())
	if errdefs.Code(err) != codes.Unavailable {
		t.Fatalf("OpenRelay(no session) = %v, want Unavailable", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 3*time.Second {
		t.Errorf("OpenRelay waited %s, want about 300ms", d)
	}
	if _, err := gw.Registry().OpenRelay(t.Context(), "sb-a", relay.TCPTarget("", 1)); errdefs.Code(err) != codes.InvalidArgument {
		t.Errorf("OpenRelay(empty host) = %v, want InvalidArgument", err)
	}
}

func TestRelayWaitsForSessionAndSupersedeReplays(t *testing.T) {
	var mu sync.Mutex
	var ups []string
	gw := relaytest.Start(t, relaytest.Options{Relay: relay.Config{OnSessionChange: func(id string, c bool, inst string) {
		mu.Lock()
		defer mu.Unlock()
		ups = append(ups, inst)
	}}})
	tok := gw.AddSandbox("sb-a")
	cc := gw.Dial(t)
	reg := gw.Registry()

	// The caller waits for a session that connects later.
	res := openAsync(t.Context(), reg, "sb-a", relay.SSHTarget())
	old := connect(t, cc, tok, "sb-a", "old")
	ro := old.nextRelayOpen()

	// A newer session supersedes the old one and gets the pending relay again.
	newer := connect(t, cc, tok, "sb-a", "new")
	ro2 := newer.nextRelayOpen()
	if ro2.GetChannelId() != ro.GetChannelId() {
		t.Fatalf("replayed channel = %s, want %s", ro2.GetChannelId(), ro.GetChannelId())
	}
	if inst, _ := reg.Connected("sb-a"); inst != "new" {
		t.Fatalf("Connected() instance = %q, want new", inst)
	}
	// The old stream ends.
	for range old.msgs {
	}
	claim(t.Context(), t, newer.client, tok, ro2.GetChannelId())
	r := <-res
	if r.err != nil {
		t.Fatalf("OpenRelay() = %v", r.err)
	}
	r.conn.Close()
	// The superseded session ending does not report the sandbox as gone.
	if _, ok := reg.Connected("sb-a"); !ok {
		t.Fatal("sandbox reported disconnected after the old session ended")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ups) != 2 || ups[0] != "old" || ups[1] != "new" {
		t.Errorf("presence instances = %v, want [old new]", ups)
	}
}

func TestHeartbeatAnswered(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	tok := gw.AddSandbox("sb-a")
	sup := connect(t, gw.Dial(t), tok, "sb-a", "a")
	sup.stream.Send(&openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_Heartbeat{Heartbeat: &openshellv1.SupervisorHeartbeat{}}})
	select {
	case m := <-sup.msgs:
		if m.GetHeartbeat() == nil {
			t.Fatalf("got %v, want heartbeat", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no heartbeat answer")
	}
}

func TestSilentSessionEnds(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{Relay: relay.Config{HeartbeatInterval: 300 * time.Millisecond}})
	tok := gw.AddSandbox("sb-a")
	sup := connect(t, gw.Dial(t), tok, "sb-a", "a")
	// The fake never sends heartbeats: after three intervals the gateway ends it.
	select {
	case _, ok := <-sup.msgs:
		for ok {
			_, ok = <-sup.msgs
		}
	case <-time.After(10 * time.Second):
		t.Fatal("silent session was not ended")
	}
	gw.WaitFor(t, 5*time.Second, "disconnect", func(s *relaytest.State) bool { return !s.Connected("sb-a") })
}

func TestSupervisorRelayCloseEndsConn(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{})
	tok := gw.AddSandbox("sb-a")
	sup := connect(t, gw.Dial(t), tok, "sb-a", "a")
	res := openAsync(t.Context(), gw.Registry(), "sb-a", relay.SSHTarget())
	ro := sup.nextRelayOpen()
	claim(t.Context(), t, sup.client, tok, ro.GetChannelId())
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	sup.stream.Send(&openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_RelayClose{RelayClose: &openshellv1.RelayClose{ChannelId: ro.GetChannelId(), Reason: "target closed"}}})
	select {
	case <-r.conn.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("relay_close did not end the relay")
	}
	if _, err := r.conn.Write([]byte("x")); err == nil {
		t.Error("Write after relay_close succeeded")
	}
}

func TestFirstMessageTimeout(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{Relay: relay.Config{FirstMessageTimeout: 200 * time.Millisecond}})
	tok := gw.AddSandbox("sb-a")
	client := openshellv1.NewOpenShellClient(gw.Dial(t))
	cs, err := client.ConnectSupervisor(relaytest.WithToken(t.Context(), tok))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("ConnectSupervisor without hello = %v, want DeadlineExceeded", err)
	}
	rs, err := client.RelayStream(relaytest.WithToken(t.Context(), tok))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("RelayStream without init = %v, want DeadlineExceeded", err)
	}
}

func TestGatewaySendsHeartbeatsWhenSilent(t *testing.T) {
	gw := relaytest.Start(t, relaytest.Options{Relay: relay.Config{HeartbeatInterval: 200 * time.Millisecond}})
	tok := gw.AddSandbox("sb-a")
	sup := connect(t, gw.Dial(t), tok, "sb-a", "a")
	// The fake never writes; the gateway still heartbeats before it gives
	// up on the silent session.
	select {
	case m := <-sup.msgs:
		if m.GetHeartbeat() == nil {
			t.Fatalf("got %v, want a gateway heartbeat", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no gateway heartbeat")
	}
}
