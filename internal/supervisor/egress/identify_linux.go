package egress

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ProcIdentifier maps a proxied connection to the processes holding its
// client socket, through a procfs mounted at Root (normally /proc) of the
// sandbox's pid namespace, in the sandbox's network namespace.
//
// Per connection it asks the kernel for the socket's inode (sock_diag, an
// exact lookup; /proc/net/tcp{,6} when that fails, and from then on once
// the socket was found there only), then scans
// every process's descriptors for that inode: the complete set of holders
// is needed (a socket handed to another process must not be attributed to
// the first one only), and no cache of descriptors can prove that (a
// descriptor number is reused for another file without notice). Each
// holder's /proc/<pid> directory is opened during the scan and its
// executable and parents are read through that descriptor, so a holder
// that exits and whose pid is reused by another process is not confused
// with it (reads through the old directory fail). The executable hashes
// for trust on first use are cached by file identity (device, inode,
// size, mtime, ctime), so an unchanged binary is hashed once.
type ProcIdentifier struct {
	Root string
	// Self is a pid never reported as a caller or ancestor (the
	// supervisor itself); 0 means os.Getpid().
	Self int

	// lookup, when set, replaces the whole socket lookup, and diag the
	// sock_diag query only (tests).
	lookup func(client, server netip.AddrPort) (uint64, error)
	diag   func(local, remote netip.AddrPort) (uint64, uint32, error)
	// noDiag is set once sock_diag missed a socket /proc/net/tcp showed
	// (a kernel without tcp_diag loaded answers every lookup ENOENT).
	noDiag atomic.Bool
	// afterScan, when set, runs between the descriptor scan and the
	// reading of the holders' executables (tests).
	afterScan func()
	// maxPaths overrides maxTrustedPaths (tests).
	maxPaths int

	mu     sync.Mutex
	byPath map[string]string  // exe path -> sha256 seen first (trust on first use)
	byFile map[fileKey]string // exe file identity -> sha256, to hash each file once
}

// maxHashCache bounds the cache of executable hashes: a sandbox writing
// many binaries cannot grow the supervisor's memory through it.
const maxHashCache = 4096

// maxTrustedPaths bounds the first-use hashes kept by executable path.
const maxTrustedPaths = 1 << 16

func (p *ProcIdentifier) pathLimit() int {
	if p.maxPaths > 0 {
		return p.maxPaths
	}
	return maxTrustedPaths
}

type fileKey struct {
	dev, ino   uint64
	size       int64
	mtime, ctm unix.Timespec
}

// holder is a process holding the socket, with its /proc/<pid> directory
// open.
type holder struct {
	pid int
	dir int
}

// Identify implements Config.Identify.
func (p *ProcIdentifier) Identify(client, server netip.AddrPort) ([]Caller, error) {
	ino, err := p.socketInode(client, server)
	if err != nil {
		return nil, err
	}
	root, err := unix.Open(p.Root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p.Root, err)
	}
	defer unix.Close(root) //nolint:errcheck // read-only directory
	holders, err := p.socketOwners(root, ino)
	defer func() {
		for _, h := range holders {
			_ = unix.Close(h.dir)
		}
	}()
	if err != nil {
		return nil, err
	}
	if len(holders) == 0 {
		return nil, fmt.Errorf("no process holds the socket of %s", client)
	}
	if p.afterScan != nil {
		p.afterScan()
	}
	out := make([]Caller, 0, len(holders))
	for _, h := range holders {
		out = append(out, p.caller(root, h))
	}
	return out, nil
}

// caller reads the executable of holder h and of its parents.
func (p *ProcIdentifier) caller(root int, h holder) Caller {
	c := Caller{PID: h.pid}
	c.Exe, c.Err = readExe(h.dir, h.pid)
	if c.Err == nil {
		c.Err = p.verify(h.dir, h.pid, c.Exe)
	}
	cur := h.dir
	defer func() {
		if cur != h.dir {
			_ = unix.Close(cur)
		}
	}()
	for range maxAncestors {
		pp := parentPID(cur)
		if pp <= 1 || pp == p.self() {
			return c
		}
		pd, err := unix.Openat(root, strconv.Itoa(pp), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return c
		}
		// The parent may have exited and its pid been reused between
		// reading it and opening its directory: then the child has been
		// reparented and names another parent now.
		if parentPID(cur) != pp {
			_ = unix.Close(pd)
			if c.Err == nil {
				c.Err = fmt.Errorf("parent of pid %d changed while identifying it", h.pid)
			}
			return c
		}
		if cur != h.dir {
			_ = unix.Close(cur)
		}
		cur = pd
		e, err := readExe(pd, pp)
		if err != nil {
			return c
		}
		if c.Err == nil {
			c.Err = p.verify(pd, pp, e)
		}
		c.Ancestors = append(c.Ancestors, e)
	}
	return c
}

// maxAncestors bounds the walk up the process tree.
const maxAncestors = 64

func (p *ProcIdentifier) self() int {
	if p.Self != 0 {
		return p.Self
	}
	return os.Getpid()
}

// socketInode finds the inode of the client socket (local address client,
// remote address server).
func (p *ProcIdentifier) socketInode(client, server netip.AddrPort) (uint64, error) {
	if p.lookup != nil {
		return p.lookup(client, server)
	}
	if p.noDiag.Load() {
		return p.procNetInode(client, server)
	}
	diag := p.diag
	if diag == nil {
		diag = diagSocket
	}
	ino, _, err := diag(client, server)
	switch {
	case err == nil && ino == 0:
		return 0, fmt.Errorf("socket of %s has no inode (already closed)", client)
	case err == nil:
		return ino, nil
	}
	// Not found, or sock_diag unusable here (no netlink family, or no
	// tcp_diag in the kernel, which answers every lookup ENOENT):
	// /proc/net/tcp decides, and a socket found only there turns
	// sock_diag off for this identifier.
	ino, perr := p.procNetInode(client, server)
	if perr != nil {
		return 0, perr
	}
	p.noDiag.Store(true)
	return ino, nil
}

// procNetInode finds the client socket in /proc/net/tcp and tcp6.
func (p *ProcIdentifier) procNetInode(client, server netip.AddrPort) (uint64, error) {
	for _, f := range []string{"net/tcp", "net/tcp6"} {
		data, err := os.ReadFile(filepath.Join(p.Root, f))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return 0, err
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 {
				continue
			}
			local, err1 := parseProcAddr(fields[1])
			remote, err2 := parseProcAddr(fields[2])
			if err1 != nil || err2 != nil || local != client || remote != server {
				continue
			}
			ino, err := strconv.ParseUint(fields[9], 10, 64)
			if err != nil || ino == 0 {
				return 0, fmt.Errorf("socket of %s has no inode (already closed)", client)
			}
			return ino, nil
		}
	}
	return 0, fmt.Errorf("no socket %s -> %s in %s/net/tcp{,6}", client, server, p.Root)
}

// parseProcAddr parses "0100007F:1F90" (IPv4) or the 32-hex-digit IPv6
// form: 32-bit words in host byte order (little-endian here), port in hex.
func parseProcAddr(s string) (netip.AddrPort, error) {
	h, ps, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, errors.New("no port")
	}
	port, err := strconv.ParseUint(ps, 16, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, errors.New("bad address")
	}
	for i := 0; i < len(raw); i += 4 {
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	a, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(a.Unmap(), uint16(port)), nil
}

// socketOwners lists the processes with a descriptor on socket inode ino,
// each with its /proc/<pid> directory open (the caller closes them). It
// uses raw getdents and readlinkat relative to open directories: this
// scan is the cost of identification.
func (p *ProcIdentifier) socketOwners(root int, ino uint64) ([]holder, error) {
	want := []byte("socket:[" + strconv.FormatUint(ino, 10) + "]")
	self := p.self()
	var pids []int
	dents := make([]byte, 16<<10)
	err := eachDirent(root, dents, func(name []byte) {
		if pid, ok := atoi(name); ok && pid != self {
			pids = append(pids, pid)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", p.Root, err)
	}
	var holders []holder
	link := make([]byte, len(want)+1)
	for _, pid := range pids {
		ps := strconv.Itoa(pid)
		fd, ok, _ := heldAt(root, ps+"/fd", dents, link, want)
		if !ok {
			continue
		}
		// Bind the holder to its process: open its directory and check
		// the descriptor through it (the pid may have been reused since
		// the scan; a process that exited fails the check).
		pd, err := unix.Openat(root, ps, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if n, err := unix.Readlinkat(pd, "fd/"+fd, link); err != nil || n != len(want) || !bytes.Equal(link[:n], want) {
			_ = unix.Close(pd)
			continue
		}
		holders = append(holders, holder{pid: pid, dir: pd})
	}
	return holders, nil
}

// heldAt returns the descriptor (its name in the fd directory at path
// under root) whose link reads want, if any, and how many links it read.
func heldAt(root int, path string, dents, link, want []byte) (string, bool, int) {
	fdd, err := unix.Openat(root, path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", false, 0 // exited, or a kernel thread
	}
	defer unix.Close(fdd) //nolint:errcheck // read-only directory
	var found string
	denied, reads := false, 0
	_ = eachDirent(fdd, dents, func(name []byte) {
		if found != "" || denied || name[0] < '0' || name[0] > '9' {
			return
		}
		reads++
		n, err := unix.Readlinkat(fdd, string(name), link)
		switch {
		case err == nil && n == len(want) && bytes.Equal(link[:n], want):
			found = string(name)
		case errors.Is(err, unix.EACCES):
			// The kernel checks access to the process (ptrace read
			// access), not to each descriptor: every other link of this
			// process fails the same way, so none is read (a host's pid
			// namespace can hold processes with hundreds of
			// descriptors the supervisor may not read).
			denied = true
		}
	})
	return found, found != "", reads
}

// eachDirent calls f with the name of every entry of the open directory
// fd, read with getdents64 into buf.
func eachDirent(fd int, buf []byte, f func(name []byte)) error {
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return nil
		}
		last := n+maxDirent <= len(buf)
		// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
		for off := 0; off+19 < n; {
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			if reclen <= 19 || off+reclen > n {
				return errors.New("malformed directory entry")
			}
			name := buf[off+19 : off+reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			off += reclen
			if len(name) > 0 {
				f(name)
			}
		}
		if last {
			// procfs fills the buffer until an entry does not fit: room
			// left for the largest entry means the listing is complete
			// (saves a getdents per process).
			return nil
		}
	}
}

// maxDirent is the size of the largest linux_dirent64 (a 255-byte name).
const maxDirent = 19 + 256 + 5

// atoi parses a decimal pid.
func atoi(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// readExe reads the executable link of the process of /proc directory pd.
func readExe(pd, pid int) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(pd, "exe", buf)
	if err != nil {
		return "", fmt.Errorf("read executable of pid %d: %w", pid, err)
	}
	return string(buf[:n]), nil
}

// parentPID returns the parent pid of the process of /proc directory pd,
// or 0.
func parentPID(pd int) int {
	fd, err := unix.Openat(pd, "stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd) //nolint:errcheck // read-only file
	var buf [1024]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil || n <= 0 {
		return 0
	}
	data := buf[:n]
	// comm may contain anything; the fields after the last ')' are fixed.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(data[i+1:])
	if len(f) < 2 {
		return 0
	}
	pp, _ := atoi(f[1])
	return pp
}

// verify checks the executable pid runs (through /proc/<pid>/exe, so the
// file actually executed, even if the path now names another) against the
// first hash seen for path. The file is hashed only when its identity
// (device, inode, size, mtime, ctime) is not in the cache: rewriting a
// file changes its ctime, whatever its mtime is set back to.
func (p *ProcIdentifier) verify(pd, pid int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(pd, "exe", &st, 0); err != nil {
		return fmt.Errorf("stat executable of pid %d: %w", pid, err)
	}
	k := keyOf(&st)
	p.mu.Lock()
	sum, ok := p.byFile[k]
	p.mu.Unlock()
	if !ok {
		var err error
		if k, sum, err = hashExe(pd, pid); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byFile == nil {
		p.byFile, p.byPath = map[fileKey]string{}, map[string]string{}
	}
	if len(p.byFile) >= maxHashCache {
		// Only a cache of work done: the first-use hashes in byPath stay.
		clear(p.byFile)
	}
	p.byFile[k] = sum
	first, seen := p.byPath[path]
	if !seen {
		// First-use hashes are never forgotten (that would let a changed
		// binary pass as new): past the bound, new paths are refused.
		if len(p.byPath) >= p.pathLimit() {
			return fmt.Errorf("binary %s: more than %d distinct executables used in this sandbox, no more are trusted", path, p.pathLimit())
		}
		p.byPath[path] = sum
		return nil
	}
	if first != sum {
		return fmt.Errorf("binary %s changed since its first use in this sandbox (sha256 %.12s, first seen %.12s)", path, sum, first)
	}
	return nil
}

func keyOf(st *unix.Stat_t) fileKey {
	return fileKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctm: st.Ctim}
}

// hashExe hashes the executable of the process of /proc directory pd and
// returns the identity of the file it hashed.
func hashExe(pd, pid int) (fileKey, string, error) {
	fd, err := unix.Openat(pd, "exe", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fileKey{}, "", fmt.Errorf("open executable of pid %d: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), "exe")
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileKey{}, "", fmt.Errorf("stat executable of pid %d: %w", pid, err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fileKey{}, "", fmt.Errorf("hash executable of pid %d: %w", pid, err)
	}
	return keyOf(&st), hex.EncodeToString(h.Sum(nil)), nil
}
