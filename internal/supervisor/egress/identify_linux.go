package egress

import (
	"bufio"
	"bytes"
	"crypto/sha256"
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

	"golang.org/x/sys/unix"
)

// ProcIdentifier maps a proxied connection to the processes holding its
// client socket, through a procfs mounted at Root (normally /proc) of the
// sandbox's pid and network namespaces.
type ProcIdentifier struct {
	Root string
	// Self is a pid never reported as a caller or ancestor (the
	// supervisor itself); 0 means os.Getpid().
	Self int

	mu     sync.Mutex
	byPath map[string]string  // exe path -> sha256 seen first (trust on first use)
	byFile map[fileKey]string // exe file identity -> sha256, to hash each file once
}

// maxHashCache bounds the cache of executable hashes: a sandbox writing
// many binaries cannot grow the supervisor's memory through it.
const maxHashCache = 4096

type fileKey struct {
	dev, ino   uint64
	size       int64
	mtime, ctm unix.Timespec
}

// Identify implements Config.Identify.
func (p *ProcIdentifier) Identify(client, server netip.AddrPort) ([]Caller, error) {
	ino, err := p.socketInode(client, server)
	if err != nil {
		return nil, err
	}
	pids, err := p.socketOwners(ino)
	if err != nil {
		return nil, err
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("no process holds the socket of %s", client)
	}
	out := make([]Caller, 0, len(pids))
	for _, pid := range pids {
		c := Caller{PID: pid}
		c.Exe, c.Err = p.exe(pid)
		if c.Err == nil {
			c.Err = p.verify(pid, c.Exe)
		}
		for pp := p.parent(pid); pp > 1 && pp != p.self(); pp = p.parent(pp) {
			e, err := p.exe(pp)
			if err != nil {
				break
			}
			if c.Err == nil {
				c.Err = p.verify(pp, e)
			}
			c.Ancestors = append(c.Ancestors, e)
		}
		out = append(out, c)
	}
	return out, nil
}

func (p *ProcIdentifier) self() int {
	if p.Self != 0 {
		return p.Self
	}
	return os.Getpid()
}

// socketInode finds the client socket (local address client, remote
// address server) in /proc/net/tcp and tcp6.
func (p *ProcIdentifier) socketInode(client, server netip.AddrPort) (uint64, error) {
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

// socketOwners lists the pids with an fd on socket inode ino.
func (p *ProcIdentifier) socketOwners(ino uint64) ([]int, error) {
	ents, err := os.ReadDir(p.Root)
	if err != nil {
		return nil, err
	}
	want := "socket:[" + strconv.FormatUint(ino, 10) + "]"
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == p.self() {
			continue
		}
		fdDir := filepath.Join(p.Root, e.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // exited, or a kernel thread
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil && l == want {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids, nil
}

func (p *ProcIdentifier) exe(pid int) (string, error) {
	l, err := os.Readlink(filepath.Join(p.Root, strconv.Itoa(pid), "exe"))
	if err != nil {
		return "", fmt.Errorf("read executable of pid %d: %w", pid, err)
	}
	return l, nil
}

// parent returns pid's parent pid, or 0.
func (p *ProcIdentifier) parent(pid int) int {
	data, err := os.ReadFile(filepath.Join(p.Root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// comm may contain anything; the fields after the last ')' are fixed.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 2 {
		return 0
	}
	pp, _ := strconv.Atoi(f[1])
	return pp
}

// verify hashes the executable pid runs (through /proc/<pid>/exe, so the
// file actually executed, even if the path now names another) and checks
// it against the first hash seen for path.
func (p *ProcIdentifier) verify(pid int, path string) error {
	f, err := os.Open(filepath.Join(p.Root, strconv.Itoa(pid), "exe"))
	if err != nil {
		return fmt.Errorf("open executable of pid %d: %w", pid, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("stat executable of pid %d: %w", pid, err)
	}
	k := fileKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctm: st.Ctim}
	p.mu.Lock()
	sum, ok := p.byFile[k]
	p.mu.Unlock()
	if !ok {
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return fmt.Errorf("hash executable of pid %d: %w", pid, err)
		}
		sum = hex.EncodeToString(h.Sum(nil))
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
		p.byPath[path] = sum
		return nil
	}
	if first != sum {
		return fmt.Errorf("binary %s changed since its first use in this sandbox (sha256 %.12s, first seen %.12s)", path, sum, first)
	}
	return nil
}
