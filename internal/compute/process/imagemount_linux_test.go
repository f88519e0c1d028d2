//go:build linux

package process_test

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/compute/process"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// realDriver returns a process driver running the built openshell-sandbox
// of OPENSHELL_TEST_BIN_DIR (skipping, or failing under CI=true, without
// it), and its state directory. Its gateway socket exists (the supervisor
// binds it into the sandbox root) but nothing ever answers on it.
func realDriver(t *testing.T) (*process.Driver, string) {
	t.Helper()
	dir := os.Getenv("OPENSHELL_TEST_BIN_DIR")
	bin := filepath.Join(dir, "openshell-sandbox")
	if _, err := os.Stat(bin); dir == "" || err != nil {
		citest.SkipOrFail(t, "%s is not built: set OPENSHELL_TEST_BIN_DIR to a directory with a built openshell-sandbox (OPENSHELL_TEST_BIN_DIR=%q)", bin, dir)
	}
	requireNamespaces(t)
	// Not under /tmp: the supervisor stages its root there.
	state, err := os.MkdirTemp("/var/tmp", "openshell-process-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	sock := filepath.Join(state, "gateway.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	d, err := process.Open(map[string]any{"supervisor_path": bin, "stop_grace_secs": 20}, compute.FactoryDeps{
		Logger: testLogger(t), StateDir: state, GatewayEndpoint: "unix://" + sock,
	})
	if err != nil {
		t.Fatalf("process.Open() error = %v", err)
	}
	t.Cleanup(func() { d.Close() })
	cleanupSandboxes(t, d)
	return d, state
}

// busyboxImage builds a root filesystem directory from a static busybox,
// owned by host root, under dir.
func busyboxImage(t *testing.T, dir string) string {
	t.Helper()
	const bb = "/bin/busybox"
	data, err := os.ReadFile(bb)
	if err != nil {
		citest.SkipOrFail(t, "a static busybox is required at %s (Debian package busybox-static): %v", bb, err)
	}
	root := filepath.Join(dir, "image")
	for _, d := range []string{"bin", "etc", "usr"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "cat", "id", "stat", "mount", "sleep", "echo"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{"etc/passwd": "root:x:0:0:root:/sandbox:/bin/sh\n", "marker": "image\n", "etc/secret": "root only\n"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "etc", "secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	return root
}

// treeDigest describes every entry of root: path, type, mode, owner, size
// and content hash.
func treeDigest(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		fmt.Fprintf(&b, "%s %v %d:%d %d", p, fi.Mode(), st.Uid, st.Gid, fi.Size())
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %x", sha256.Sum256(data))
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// statusIDs returns the Uid and Gid lines of /proc/<pid>/status, as the
// host sees them.
func statusIDs(t *testing.T, pid int) (uid, gid string) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			uid = strings.Join(strings.Fields(v), " ")
		}
		if v, ok := strings.CutPrefix(line, "Gid:"); ok {
			gid = strings.Join(strings.Fields(v), " ")
		}
	}
	return uid, gid
}

// TestImageUserNamespace: a dir: image sandbox runs in a user namespace of
// its own host id range, like a sandbox without an image, and sees its
// image through an id-mapped mount: the image's root-owned files are its
// root's. A process with uid 0 and every capability of that namespace is
// an unprivileged host id: it cannot write a host root file it reaches by
// a leaked path, nor the image directory; its writes to the image land in
// the sandbox's layer, owned by its range; the image directory stays
// byte-for-byte unchanged.
func TestImageUserNamespace(t *testing.T) {
	d, state := realDriver(t)
	if os.Geteuid() != 0 {
		t.Skip("id ranges need a root gateway")
	}
	// Searchable by every host id, so that only the files' owners and
	// modes stand between the sandbox's root and them.
	dir, err := os.MkdirTemp("/var/tmp", "openshell-image-userns-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	img := busyboxImage(t, dir)
	before := treeDigest(t, img)
	// A host file of root's that a leak would make reachable.
	hostFile := filepath.Join(dir, "host-root-file")
	if err := os.WriteFile(hostFile, []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ch := watch(t, d)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Spec.Template.Image = "dir:" + img
	// No gateway answers: the supervisor keeps retrying its first config
	// fetch, after it has built its root.
	sb.Spec.Environment["OPENSHELL_STARTUP_TIMEOUT"] = "2m"
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	ev := waitFor(t, ch, "ready", func(ev compute.Event) bool {
		return ev.Kind == compute.EventSandbox && ev.SandboxID == sb.ID && computetest.IsReady(ev.Sandbox)
	})
	pid := pidOf(t, ev.Sandbox)
	waitRoot(t, pid, filepath.Join(state, "sandboxes", sb.ID, "supervisor.log"), "/bin", "/etc", "/usr")

	uidMap, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(uidMap))
	if len(f) != 3 || f[0] != "0" || f[2] != "65536" {
		t.Fatalf("supervisor uid_map = %q, want 0 <base> 65536", uidMap)
	}
	base, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil || base < 1<<30 {
		t.Fatalf("sandbox root maps to host id %s, want a range from 2^30", f[1])
	}
	want := strings.Repeat(f[1]+" ", 3) + f[1]
	if uid, gid := statusIDs(t, pid); uid != want || gid != want {
		t.Errorf("supervisor host ids: Uid %q Gid %q, want all %s", uid, gid, f[1])
	}

	// Inside the sandbox's namespaces as its root, with every capability
	// there: the image's files are root's, a root-only file is readable,
	// and writing the image (even after remounting /etc writable) goes to
	// the layer.
	script := `id -u; stat -c %u:%g /bin/busybox /etc/secret; cat /etc/secret; echo changed > /marker; cat /marker
mount -o remount,bind,rw /etc && echo appended >> /etc/secret && echo etc-written`
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-U", "-m", "-p", "--", "/bin/sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter as the sandbox's root: %v\n%s", err, out)
	}
	if want := "0\n0:0\n0:0\nroot only\nchanged\netc-written\n"; string(out) != want {
		t.Errorf("as the sandbox's root inside:\n%s\nwant:\n%s", out, want)
	}
	upper := filepath.Join(state, "sandboxes", sb.ID, "rootfs-layer", "upper")
	for _, p := range []string{filepath.Join(upper, "marker"), filepath.Join(upper, "etc", "secret")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Errorf("the sandbox's write is not in its layer: %v", err)
			continue
		}
		if st := fi.Sys().(*syscall.Stat_t); uint64(st.Uid) != base || uint64(st.Gid) != base {
			t.Errorf("%s owned by %d:%d on the host, want the sandbox's root %d", p, st.Uid, st.Gid, base)
		}
	}

	// The same root, in the host's mount namespace (a leaked path): the
	// host's root files and the image directory refuse it, and the host
	// sees it as the range's unprivileged id.
	leak := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-U", "--", "/bin/sh", "-c",
		`cat "$1"; echo pwned >> "$1" && echo host-file-written; touch "$2/bin/pwned" && echo image-written; chown 0 "$2/marker" && echo chowned; exec sleep 60`,
		"sh", hostFile, img)
	// A file, not a buffer: the process writes it directly, no copying
	// goroutine races with the reads below.
	outFile, err := os.Create(filepath.Join(dir, "leak-output"))
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	leak.Stdout, leak.Stderr = outFile, outFile
	leakOut := func() string {
		data, _ := os.ReadFile(outFile.Name())
		return string(data)
	}
	if err := leak.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leak.Process.Kill(); _ = leak.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", leak.Process.Pid))
		if strings.TrimSpace(string(comm)) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leaked-path process did not reach sleep: %s", leakOut())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if uid, gid := statusIDs(t, leak.Process.Pid); uid != want || gid != want {
		t.Errorf("the namespace's root seen from the host: Uid %q Gid %q, want all %s", uid, gid, f[1])
	}
	if !strings.HasPrefix(leakOut(), "host\n") {
		t.Errorf("the leaked path did not reach the host file (output %q): the test proves nothing", leakOut())
	}
	for _, bad := range []string{"host-file-written", "image-written", "chowned"} {
		if strings.Contains(leakOut(), bad) {
			t.Errorf("the namespace's root succeeded: %s (output %q)", bad, leakOut())
		}
	}
	if data, _ := os.ReadFile(hostFile); string(data) != "host\n" {
		t.Errorf("host root file = %q, want unchanged", data)
	}
	if after := treeDigest(t, img); after != before {
		t.Errorf("the image directory changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// waitRoot waits until supervisor pid has built its sandbox root: each
// of mountPoints is mounted read-only in its mount namespace (the image's
// system directories are made read-only last).
func waitRoot(t *testing.T, pid int, logPath string, mountPoints ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		ro := map[string]bool{}
		for line := range strings.SplitSeq(string(mounts), "\n") {
			if f := strings.Fields(line); len(f) > 5 && strings.HasPrefix(f[5], "ro") {
				ro[f[4]] = true
			}
		}
		done := err == nil
		for _, m := range mountPoints {
			done = done && ro[m]
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			t.Fatalf("supervisor %d did not make %v read-only (%v); log:\n%s", pid, mountPoints, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestImageWithoutIDMapFailsClosed: an image on a filesystem that cannot
// be id-mapped (proc) fails the create with FailedPrecondition naming the
// reason, and leaves no process and no state: the sandbox never runs as
// host root instead.
func TestImageWithoutIDMapFailsClosed(t *testing.T) {
	requireNamespaces(t)
	if os.Geteuid() != 0 {
		t.Skip("id ranges need a root gateway")
	}
	state := t.TempDir()
	d := open(t, state, nil)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Spec.Template.Image = "dir:/proc/sys"
	err := d.Create(t.Context(), sb)
	if errdefs.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cannot be id-mapped") {
		t.Fatalf("Create(image on proc) = %v, want FailedPrecondition: cannot be id-mapped", err)
	}
	t.Logf("Create(image on proc) = %v", err)
	assertNothingLeft(t, state, sb.ID)
}
