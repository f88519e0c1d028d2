//go:build linux

package process

import (
	"bufio"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/citest"
)

// TestGatewayProxy: the sandbox's own socket (owned by its root, 0600 in a
// 0700 directory) forwards both ways to the gateway's socket, and Close
// ends open connections and removes the socket.
func TestGatewayProxy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the socket to another uid")
	}
	dir := t.TempDir()
	target := filepath.Join(dir, "gw.sock")
	gw, err := net.Listen("unix", target)
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	go func() {
		for {
			c, err := gw.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	const id = idRangeStart + 5*idRangeSize
	p, err := listenProxy(filepath.Join(dir, "sandbox", "gateway"), target, id, id)
	if err != nil {
		t.Fatalf("listenProxy() error = %v", err)
	}
	for path, mode := range map[string]os.FileMode{p.path: 0o600, filepath.Dir(p.path): 0o700} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != id || st.Gid != id || fi.Mode().Perm() != mode {
			t.Errorf("%s: owner %d:%d mode %v, want %d:%d %v", path, st.Uid, st.Gid, fi.Mode().Perm(), id, id, mode)
		}
	}
	c, err := net.Dial("unix", p.path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("echo through the proxy = %q, %v", line, err)
	}
	p.Close()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("a forwarded connection survived Close")
	}
	if _, err := os.Stat(p.path); !os.IsNotExist(err) {
		t.Errorf("socket after Close: %v, want removed", err)
	}
}

func TestAllocIDBase(t *testing.T) {
	d := &Driver{sandboxes: map[string]*sandbox{}}
	var bases []uint32
	for _, id := range []string{"a", "b", "c"} {
		sb := &sandbox{rec: record{ID: id}}
		d.sandboxes[id] = sb
		if err := d.allocIDBaseLocked(sb); err != nil {
			t.Fatal(err)
		}
		bases = append(bases, sb.rec.IDBase)
	}
	want := []uint32{idRangeStart, idRangeStart + idRangeSize, idRangeStart + 2*idRangeSize}
	for i := range want {
		if bases[i] != want[i] {
			t.Fatalf("ranges = %v, want %v", bases, want)
		}
	}
	// A freed range is reused; an allocated one is kept.
	delete(d.sandboxes, "b")
	sb := &sandbox{rec: record{ID: "d"}}
	d.sandboxes["d"] = sb
	if err := d.allocIDBaseLocked(sb); err != nil || sb.rec.IDBase != want[1] {
		t.Errorf("after delete: range %d, %v, want %d", sb.rec.IDBase, err, want[1])
	}
	if err := d.allocIDBaseLocked(d.sandboxes["a"]); err != nil || d.sandboxes["a"].rec.IDBase != want[0] {
		t.Errorf("re-allocation changed a's range to %d", d.sandboxes["a"].rec.IDBase)
	}
}

// TestShiftLayer: a writable layer left by a supervisor without a user
// namespace is converted once into the sandbox's range: owners shift by
// the base (keeping who owns what inside), setuid bits stay, overlay's
// trusted.overlay.* attributes become user.overlay.*; a converted layer is
// left alone.
func TestShiftLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	const base = idRangeStart + 7*idRangeSize
	layer := filepath.Join(t.TempDir(), "rootfs-layer")
	dir := filepath.Join(layer, "upper", "opaque")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lsetxattr(dir, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		citest.SkipOrFail(t, "trusted xattrs are required (the gateway runs as root): %v", err)
	}
	file := filepath.Join(layer, "upper", "suid")
	if err := os.WriteFile(file, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(file, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(file, 0o4755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(layer, "upper", "link")
	if err := os.Symlink("suid", link); err != nil {
		t.Fatal(err)
	}
	if err := shiftLayer(layer, base); err != nil {
		t.Fatalf("shiftLayer() = %v", err)
	}
	check := func(p string, uid, gid uint32, mode uint32) {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != uid || st.Gid != gid || (mode != 0 && st.Mode&0o7777 != mode) {
			t.Errorf("%s: %d:%d mode %o, want %d:%d mode %o", p, st.Uid, st.Gid, st.Mode&0o7777, uid, gid, mode)
		}
	}
	check(layer, base, base, 0o755)
	check(dir, base, base, 0o755)
	check(file, base+1000, base+1000, 0o4755)
	check(link, base, base, 0)
	buf := make([]byte, 16)
	if n, err := unix.Lgetxattr(dir, "user.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("user.overlay.opaque = %q, %v, want y", buf[:n], err)
	}
	if _, err := unix.Lgetxattr(dir, "trusted.overlay.opaque", buf); err == nil {
		t.Error("trusted.overlay.opaque is still there")
	}
	// Converted: a second pass changes nothing.
	if err := os.Chown(file, base+5, base+5); err != nil {
		t.Fatal(err)
	}
	if err := shiftLayer(layer, base); err != nil {
		t.Fatal(err)
	}
	check(file, base+5, base+5, 0)
}
