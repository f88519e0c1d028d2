package gatewaytest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
)

// TestSFTPChown drives the sandbox's SFTP server with OpenSSH's sftp
// client (through 'openshell sandbox ssh-config'): the agent may chown and
// chgrp its own files to its own ids; giving a file to root is refused as
// permission denied and changes nothing.
func TestSFTPChown(t *testing.T) {
	sftpBin, err := exec.LookPath("sftp")
	if err != nil {
		citest.SkipOrFail(t, "sftp client not installed (apt-get install openssh-client)")
	}
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "owner")
	exec1 := func(script string) string {
		t.Helper()
		out, stderr, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"sh", "-c", script}})
		if err != nil || code != 0 {
			t.Fatalf("exec %q = %q %q exit %d, %v", script, out, stderr, code, err)
		}
		return strings.TrimSpace(out)
	}
	ids := strings.Fields(exec1("touch /sandbox/owned && id -u && id -g"))
	if len(ids) != 2 || ids[0] == "0" {
		t.Fatalf("agent ids = %v, want a non-root uid and a gid", ids)
	}
	uid, gid := ids[0], ids[1]

	cl := newCLI(t, g)
	cfgFile := filepath.Join(TempDir(t), "ssh_config")
	if err := os.WriteFile(cfgFile, []byte(cl.ok("sandbox", "ssh-config", "owner")), 0o600); err != nil {
		t.Fatal(err)
	}
	batch := func(cmd string) (string, error) {
		c := exec.CommandContext(ctx, sftpBin, "-F", cfgFile, "-o", "BatchMode=yes", "-b", "-", "openshell-owner")
		c.Env = cl.env
		c.Stdin = strings.NewReader(cmd + "\n")
		out, err := c.CombinedOutput()
		return string(out), err
	}
	for _, cmd := range []string{"chown " + uid + " /sandbox/owned", "chgrp " + gid + " /sandbox/owned"} {
		if out, err := batch(cmd); err != nil {
			t.Errorf("sftp %q = %v\n%s", cmd, err, out)
		}
	}
	for _, cmd := range []string{"chown 0 /sandbox/owned", "chgrp 0 /sandbox/owned"} {
		out, err := batch(cmd)
		if err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("sftp %q = %v\n%s\nwant permission denied", cmd, err, out)
		}
	}
	if got := exec1("stat -c %u:%g /sandbox/owned"); got != uid+":"+gid {
		t.Errorf("/sandbox/owned is owned by %s, want %s:%s", got, uid, gid)
	}
}
