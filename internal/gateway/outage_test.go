package gateway

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/cli"
	"github.com/openshell-go/openshell/internal/store/postgres/postgrestest"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// eventually polls cond every 50 ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s (last: %s)", what, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readyz(addr string) (int, string) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestDatabaseOutage runs the gateway on a real PostgreSQL cluster that is
// down at start-up and stopped again for 10 s while the gateway serves:
//   - start-up waits for the database (logging why) instead of exiting;
//   - /readyz answers 503 naming the store while the database is down, 200
//     before and after; Health says DEGRADED;
//   - RPCs fail with Unavailable "database unavailable" and no user,
//     database name or address; the CLI says the gateway is up and its
//     database is not;
//   - everything works again once the database is back.
func TestDatabaseOutage(t *testing.T) {
	pg := postgrestest.Start(t)
	u, err := url.Parse(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	connDetails := []string{"user=" + u.User.Username(), "database=" + strings.TrimPrefix(u.Path, "/"), u.Host, u.Port()}
	pg.Stop(t)

	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		runErr = Run(ctx, []string{
			"--bind-address", "127.0.0.1", "--port", strconv.Itoa(l.Addr().(*net.TCPAddr).Port),
			"--disable-tls", "--allow-unauthenticated-users", "--drivers", "process",
			"--db-url", pg.URL, "--state-dir", t.TempDir(), "--database-wait-secs", "60",
		}, logs, logs)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if runErr != nil {
			t.Errorf("gateway Run() = %v", runErr)
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", logs.String())
		}
	})

	// Start-up waits for the database and says why.
	eventually(t, 30*time.Second, "start-up logs that it waits for the database", func() (bool, string) {
		select {
		case <-done:
			t.Fatal("gateway exited while the database was down")
		default:
		}
		return strings.Contains(logs.String(), "database unavailable; waiting"), ""
	})
	pg.Resume(t)
	eventually(t, 60*time.Second, "/readyz 200 once the database is up", func() (bool, string) {
		code, body := readyz(addr)
		return code == http.StatusOK, strconv.Itoa(code) + " " + body
	})

	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := openshellv1.NewOpenShellClient(cc)
	if _, err := c.ListSandboxes(t.Context(), &openshellv1.ListSandboxesRequest{}); err != nil {
		t.Fatalf("ListSandboxes with the database up = %v", err)
	}

	// Outage: 10 s, as in the issue.
	pg.Stop(t)
	outageStart := time.Now()
	eventually(t, 30*time.Second, "/readyz 503 during the outage", func() (bool, string) {
		code, body := readyz(addr)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "database unavailable"), strconv.Itoa(code) + " " + body
	})
	_, body := readyz(addr)
	for _, rpc := range []struct {
		name string
		call func(context.Context) error
	}{
		{"ListSandboxes", func(ctx context.Context) error {
			_, err := c.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{})
			return err
		}},
		{"GetSandbox", func(ctx context.Context) error {
			_, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: "nope"})
			return err
		}},
	} {
		// Twice: broken pooled connections first, then fresh dials.
		for range 2 {
			err := rpc.call(t.Context())
			st := status.Convert(err)
			if st.Code() != codes.Unavailable || !strings.HasSuffix(st.Message(), "database unavailable") {
				t.Errorf("%s during the outage = %v, want Unavailable ending in \"database unavailable\"", rpc.name, err)
			}
			for _, d := range connDetails {
				if strings.Contains(st.Message(), d) || strings.Contains(body, d) {
					t.Errorf("%s during the outage: %q / readyz %q names %q", rpc.name, st.Message(), body, d)
				}
			}
		}
	}
	if h, err := c.Health(t.Context(), &openshellv1.HealthRequest{}); err != nil || h.GetStatus() != openshellv1.ServiceStatus_SERVICE_STATUS_DEGRADED {
		t.Errorf("Health during the outage = %v, %v, want DEGRADED", h.GetStatus(), err)
	}
	var out, errOut bytes.Buffer
	cliErr := cli.Run(t.Context(), []string{"--gateway-endpoint", "http://" + addr, "sandbox", "list"}, &out, &errOut)
	if cliErr == nil || !strings.Contains(cliErr.Error(), "is up, but its database is unavailable") || strings.Contains(cliErr.Error(), "is openshell-gateway running") {
		t.Errorf("openshell sandbox list during the outage = %v, want \"is up, but its database is unavailable\"", cliErr)
	}

	out.Reset()
	if err := cli.Run(t.Context(), []string{"--gateway-endpoint", "http://" + addr, "status"}, &out, &errOut); err != nil || !strings.Contains(out.String(), "database or compute driver is not answering") {
		t.Errorf("openshell status during the outage = %v, output:\n%s\nwant it to say the database or driver is not answering", err, out.String())
	}

	// /readyz stays 503 for the whole outage.
	for time.Since(outageStart) < 10*time.Second {
		if code, body := readyz(addr); code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz %s into the outage = %d %q, want 503", time.Since(outageStart).Round(time.Second), code, body)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// Recovery.
	pg.Resume(t)
	eventually(t, 60*time.Second, "/readyz 200 after the outage", func() (bool, string) {
		code, body := readyz(addr)
		return code == http.StatusOK, strconv.Itoa(code) + " " + body
	})
	if _, err := c.ListSandboxes(t.Context(), &openshellv1.ListSandboxesRequest{}); err != nil {
		t.Errorf("ListSandboxes after the outage = %v", err)
	}
}
