//go:build linux

package process

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/supervisor/egress/hostdial"
)

// Host id ranges of user-namespace sandboxes: sandbox slot n maps its ids
// 0..65535 to host ids idRangeStart+n*65536 onward, so its root is an
// unprivileged host id no other sandbox and no host account shares.
const (
	idRangeStart = 1 << 30
	idRangeSize  = 1 << 16
	idRangeSlots = 1 << 14
)

// mappedUserNS reports whether sandboxes run in a user namespace mapping
// their root to a host id range of their own: when the gateway is root (it
// may write such maps). A dir: image is then given to the sandbox through
// an id-mapped mount (see sendImageMount).
func mappedUserNS() bool { return !unprivileged() }

// allocIDBaseLocked gives sb a host id range not used by another sandbox.
// d.mu must be held.
func (d *Driver) allocIDBaseLocked(sb *sandbox) error {
	if sb.rec.IDBase != 0 {
		return nil
	}
	used := map[uint32]bool{}
	for _, o := range d.sandboxes {
		used[o.rec.IDBase] = true
	}
	for n := range uint32(idRangeSlots) {
		if base := idRangeStart + n*idRangeSize; !used[base] {
			sb.rec.IDBase = base
			return nil
		}
	}
	return fmt.Errorf("sandbox %q: all %d host id ranges are in use", sb.rec.ID, idRangeSlots)
}

// userNSAttr adds a user namespace mapping ids 0..65535 to base onward.
func userNSAttr(attr *syscall.SysProcAttr, base uint32) {
	attr.Cloneflags |= syscall.CLONE_NEWUSER
	attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: idRangeSize}}
	attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: idRangeSize}}
	attr.GidMappingsEnableSetgroups = true
	// The gateway's own uid is outside the range: become the namespace's
	// root (host id base) before exec.
	attr.Credential = &syscall.Credential{Uid: 0, Gid: 0}
}

// chownTree makes dir and everything in it owned by uid:gid, unless dir
// already is (a workspace from before user namespaces is converted once).
func chownTree(dir string, uid, gid int) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	if int(st.Uid) == uid && int(st.Gid) == gid {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// openTree returns a detached copy of the mount of directory p for
// handing to the supervisor, which cannot walk the gateway's state
// directory from inside its user namespace and cannot bind a path of the
// gateway's mount namespace either; it attaches the copy with move_mount.
func openTree(p string) (*os.File, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, &os.PathError{Op: "open_tree", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// openPath opens directory p with O_PATH.
func openPath(p string) (*os.File, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// gatewayProxy forwards connections from a sandbox's own Unix socket,
// owned by the sandbox's root, to the gateway's callback socket, which
// belongs to the gateway's user. It is owned by its sandbox; Close joins
// its goroutines.
type gatewayProxy struct {
	ln     *net.UnixListener
	path   string
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// unixEndpointPath returns the socket path of a unix:// endpoint, or "".
func unixEndpointPath(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "unix" {
		return ""
	}
	return u.Path
}

// proxySocketName is the socket's name in <sandbox>/gateway/.
const proxySocketName = "gateway.sock"

// dialerSocketName is the host dialer's socket in <sandbox>/gateway/.
const dialerSocketName = "egress-dialer.sock"

// dialTimeout bounds each upstream dial of the host dialer.
const dialTimeout = 10 * time.Second

// listenDialer serves the host dialer at dir/egress-dialer.sock (owned by
// uid:gid, mode 0600, in listenProxy's directory) for peers of host uid
// uid only: the supervisor reconnects there when the inherited channel
// ended with the previous gateway process.
func listenDialer(dir string, uid, gid int) (*hostdial.Listener, error) {
	return hostdial.Listen(dir, dialerSocketName, uid, gid, dialTimeout, nil)
}

// listenProxy listens on dir/gateway.sock (dir and socket owned by
// uid:gid, modes 0700 and 0600) and forwards to target.
func listenProxy(dir, target string, uid, gid int) (*gatewayProxy, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, proxySocketName)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	// Bound through the directory's fd: sun_path holds 108 bytes only.
	d, err := openPath(dir)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: "/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + proxySocketName, Net: "unix"})
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	err = os.Lchown(path, uid, gid)
	if err == nil {
		err = os.Chmod(path, 0o600)
	}
	if err != nil {
		_ = ln.Close()
		_ = os.Remove(path)
		return nil, err
	}
	p := &gatewayProxy{ln: ln, path: path, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

func (p *gatewayProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.wg.Go(func() { p.pipe(c) })
	}
}

// track registers c for Close; false when the proxy is closed.
func (p *gatewayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *gatewayProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

// pipe copies both ways between the sandbox's connection and a new one to
// the gateway, half-closing each side at EOF.
func (p *gatewayProxy) pipe(c net.Conn) {
	defer p.untrack(c)
	up, err := net.Dial("unix", p.target)
	if err != nil {
		return
	}
	if !p.track(up) {
		up.Close()
		return
	}
	defer p.untrack(up)
	var wg sync.WaitGroup
	half := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}
	wg.Go(func() { half(up, c) })
	half(c, up)
	wg.Wait()
}

// Close stops listening, ends every forwarded connection, removes the
// socket and waits for the proxy's goroutines.
func (p *gatewayProxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
	_ = os.Remove(p.path)
}

// inherited collects the files a supervisor inherits beyond fd 3; the
// caller closes them once the process started.
type inherited struct {
	cmd   *exec.Cmd
	files []*os.File
}

// pass appends f to the supervisor's inherited fds and returns the name
// the supervisor opens it by, /proc/self/fd/N.
func (in *inherited) pass(f *os.File) string {
	in.files = append(in.files, f)
	in.cmd.ExtraFiles = append(in.cmd.ExtraFiles, f)
	return "/proc/self/fd/" + strconv.Itoa(2+len(in.cmd.ExtraFiles))
}

// close closes the collected files.
func (in *inherited) close() {
	for _, f := range in.files {
		f.Close()
	}
}

// prepareUserNS hands a user-namespace supervisor what it cannot reach by
// path from its host ids (the gateway's state directory is private to the
// gateway's user): its binary, workspace and token as inherited fds named
// /proc/self/fd/N, and a gateway socket of its own. It makes the
// workspace the sandbox root's. For a dir: image it passes the writable
// layer likewise and returns the gateway's end of the socket on which
// sendImageMount hands over the image once the process exists (nil
// without an image).
func (d *Driver) prepareUserNS(sb *sandbox, in *inherited, base uint32, rootfs string) (imageSock *os.File, err error) {
	id := sb.rec.ID
	cmd := in.cmd
	if err := chownTree(d.workspaceDir(id), int(base), int(base)); err != nil {
		return nil, fmt.Errorf("sandbox %q: workspace owner: %w", id, err)
	}
	bin, err := os.Open(d.cfg.supervisorPath)
	if err != nil {
		return nil, errdefs.FailedPrecondition(fmt.Sprintf("open supervisor %s: %v", d.cfg.supervisorPath, err))
	}
	// Executed through the fd: the binary's directory need not be
	// searchable by the sandbox's host ids.
	cmd.Path = in.pass(bin)
	ws, err := openTree(d.workspaceDir(id))
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", id, err)
	}
	setEnv(cmd, "OPENSHELL_WORKSPACE_DIR", in.pass(ws))
	cmd.Dir = "/"
	if tok, err := os.Open(d.tokenPath(id)); err == nil {
		// Read from the fd: the file stays the gateway's, mode 0600.
		setEnv(cmd, "OPENSHELL_SANDBOX_TOKEN_FILE", in.pass(tok))
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sandbox %q: token file: %w", id, err)
	}
	if err := d.prepareSockets(sb, cmd, in.pass); err != nil {
		return nil, err
	}
	if rootfs == "" {
		return nil, nil
	}
	return d.prepareImage(sb, in, base)
}

// prepareSockets serves sb's gateway socket and host dialer socket in
// <sandbox>/gateway/, owned by the host uid its supervisor runs as, and
// names them to the supervisor: through pass, an inherited fd of a
// detached copy of the directory, or, with pass nil, by path. Without a
// unix callback endpoint there is nothing to forward to.
func (d *Driver) prepareSockets(sb *sandbox, cmd *exec.Cmd, pass func(*os.File) string) error {
	id := sb.rec.ID
	target := unixEndpointPath(d.cfg.endpoint)
	if target == "" {
		return nil
	}
	uid, gid := d.supervisorIDs(sb)
	d.mu.Lock()
	p := sb.proxy
	d.mu.Unlock()
	if p == nil {
		var err error
		if p, err = listenProxy(d.proxyDir(id), target, uid, gid); err != nil {
			return fmt.Errorf("sandbox %q: gateway socket: %w", id, err)
		}
		dl, err := listenDialer(d.proxyDir(id), uid, gid)
		if err != nil {
			p.Close()
			return fmt.Errorf("sandbox %q: host dialer socket: %w", id, err)
		}
		d.mu.Lock()
		sb.proxy, sb.dialer = p, dl
		d.mu.Unlock()
	}
	dir := d.proxyDir(id)
	if pass != nil {
		f, err := openTree(dir)
		if err != nil {
			return fmt.Errorf("sandbox %q: %w", id, err)
		}
		dir = pass(f)
	}
	setEnv(cmd, "OPENSHELL_ENDPOINT", "unix://"+dir+"/"+proxySocketName)
	setEnv(cmd, "OPENSHELL_EGRESS_DIALER_SOCKET", dialerSocketName)
	return nil
}

// prepareOwnIDs gives a supervisor without an id range of its own (a
// gateway not running as root) the same sockets as prepareUserNS. It runs
// as the gateway's own host uid, which owns them and can open their
// directory by path (pinUnixEndpoint pins it).
func (d *Driver) prepareOwnIDs(sb *sandbox, cmd *exec.Cmd) error {
	return d.prepareSockets(sb, cmd, nil)
}

// supervisorIDs returns the host uid and gid sb's supervisor runs as: the
// root of its id range, else the gateway's own.
func (d *Driver) supervisorIDs(sb *sandbox) (int, int) {
	if sb.rec.IDBase != 0 {
		return int(sb.rec.IDBase), int(sb.rec.IDBase)
	}
	return os.Geteuid(), os.Getegid()
}

// setEnv replaces k's entry in cmd.Env.
func setEnv(cmd *exec.Cmd, k, v string) {
	for i, kv := range cmd.Env {
		if strings.HasPrefix(kv, k+"=") {
			cmd.Env[i] = k + "=" + v
			return
		}
	}
	cmd.Env = append(cmd.Env, k+"="+v)
}

// closeProxyLocked stops sb's gateway proxy. d.mu must be held; the
// proxy's own goroutines do not take it.
func closeProxyLocked(sb *sandbox) {
	if sb.proxy != nil {
		sb.proxy.Close()
		sb.proxy = nil
	}
	if sb.dialer != nil {
		sb.dialer.Close()
		sb.dialer = nil
	}
}

// resumeProxyLocked restarts the gateway proxy and the host dialer socket
// of a re-attached supervisor. d.mu must be held.
func (d *Driver) resumeProxyLocked(sb *sandbox) {
	target := unixEndpointPath(d.cfg.endpoint)
	if target == "" || sb.proxy != nil {
		return
	}
	uid, gid := d.supervisorIDs(sb)
	p, err := listenProxy(d.proxyDir(sb.rec.ID), target, uid, gid)
	if err != nil {
		d.logger.Error("gateway socket for re-attached supervisor", "sandbox_id", sb.rec.ID, "error", err)
		return
	}
	dl, err := listenDialer(d.proxyDir(sb.rec.ID), uid, gid)
	if err != nil {
		// The supervisor talks to the gateway but its egress fails.
		d.logger.Error("host dialer socket for re-attached supervisor", "sandbox_id", sb.rec.ID, "error", err)
	}
	sb.proxy, sb.dialer = p, dl
}
