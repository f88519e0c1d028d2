package gatewaytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// TestRemoteProcessDriver runs the process driver as a separate
// `openshell-gateway driver serve` process and the gateway against it over
// the Unix socket (openshell.compute.v1), then the SDK flow end to end.
func TestRemoteProcessDriver(t *testing.T) {
	bin := BinDir(t)
	state := TempDir(t)
	gwState := filepath.Join(state, "gateway")
	if err := os.MkdirAll(gwState, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(state, "driver.sock")
	drv := exec.Command(filepath.Join(bin, "openshell-gateway"), "driver", "serve", "--driver", "process",
		"--socket", sock, "--state-dir", filepath.Join(state, "driver"),
		"--gateway-endpoint", "unix://"+filepath.Join(gwState, "run", "gateway.sock"))
	logs := &syncBuffer{}
	drv.Stdout, drv.Stderr = logs, logs
	drv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := drv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = drv.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { drv.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = drv.Process.Kill()
		}
		if t.Failed() {
			t.Logf("driver log:\n%s", logs.String())
		}
	})
	g := Start(t, Options{StateDir: gwState, ExtraArgs: []string{"--drivers", "local-process", "--compute-driver-socket", sock, "--enable-mtls-auth"}})
	info, err := g.Client().GetGatewayInfo(t.Context(), &openshellv1.GetGatewayInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if d := info.GetComputeDrivers(); len(d) != 1 || d[0].GetName() != "local-process" || d[0].GetCapabilities().GetDriverName() != "process" {
		t.Fatalf("GetGatewayInfo drivers = %v, want local-process backed by the process driver", d)
	}
	sdkFlow(t, g)
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("driver socket: %v", err)
	}
}
