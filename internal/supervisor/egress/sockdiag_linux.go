package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// errNoSockDiag means the kernel's sock_diag netlink interface cannot be
// used here (no socket family, refused). ProcIdentifier falls back to
// /proc/net/tcp on any sock_diag error.
var errNoSockDiag = errors.New("sock_diag unavailable")

// Sizes of the kernel's structures (linux/netlink.h, linux/inet_diag.h).
const (
	nlmsgHdrLen   = 16
	inetDiagReqV2 = 56 // family, protocol, ext, pad, states, sockid (48)
	inetDiagMsg   = 72 // family, state, timer, retrans, sockid, expires, rqueue, wqueue, uid, inode
)

// diagSocket asks the kernel (NETLINK_SOCK_DIAG, an exact INET_DIAG
// lookup) for the TCP socket whose local address is local and whose peer
// is remote, in the caller's network namespace, and returns its inode and
// owner uid. It costs a few system calls whatever the number of sockets
// in the namespace (/proc/net/tcp lists them all). An IPv4 tuple is also
// looked up as the IPv4-mapped form on AF_INET6 sockets.
func diagSocket(local, remote netip.AddrPort) (ino uint64, uid uint32, err error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %w", errNoSockDiag, err)
	}
	defer unix.Close(fd) //nolint:errcheck // read-only query socket
	try := []uint8{unix.AF_INET6}
	if local.Addr().Unmap().Is4() && remote.Addr().Unmap().Is4() {
		try = []uint8{unix.AF_INET, unix.AF_INET6}
	}
	for _, fam := range try {
		ino, uid, err = diagQuery(fd, fam, local, remote)
		if !errors.Is(err, unix.ENOENT) {
			return ino, uid, err
		}
	}
	return 0, 0, fmt.Errorf("no socket %s -> %s", local, remote)
}

func diagQuery(fd int, family uint8, local, remote netip.AddrPort) (uint64, uint32, error) {
	var req [nlmsgHdrLen + inetDiagReqV2]byte
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(req[8:], 1) // sequence
	r := req[nlmsgHdrLen:]
	r[0], r[1] = family, unix.IPPROTO_TCP
	ne.PutUint32(r[4:], 0xffffffff) // every state
	id := r[8:]
	binary.BigEndian.PutUint16(id[0:], local.Port())
	binary.BigEndian.PutUint16(id[2:], remote.Port())
	putDiagAddr(id[4:20], family, local.Addr())
	putDiagAddr(id[20:36], family, remote.Addr())
	// id[36:40] interface 0; the cookie INET_DIAG_NOCOOKIE.
	ne.PutUint32(id[40:], 0xffffffff)
	ne.PutUint32(id[44:], 0xffffffff)
	if err := unix.Sendto(fd, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, 0, fmt.Errorf("%w: %w", errNoSockDiag, err)
	}
	var buf [512]byte
	for {
		n, _, err := unix.Recvfrom(fd, buf[:], 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, 0, fmt.Errorf("sock_diag: %w", err)
		}
		return parseDiagReply(buf[:n])
	}
}

// putDiagAddr writes a in the kernel's __be32[4] form: an IPv4 address in
// the first four bytes for AF_INET, the 16-byte (mapped) form for AF_INET6.
func putDiagAddr(dst []byte, family uint8, a netip.Addr) {
	if family == unix.AF_INET {
		b := a.Unmap().As4()
		copy(dst, b[:])
		return
	}
	b := a.As16() // As16 of an IPv4 address is its mapped form
	copy(dst, b[:])
}

func parseDiagReply(b []byte) (uint64, uint32, error) {
	ne := binary.NativeEndian
	if len(b) < nlmsgHdrLen {
		return 0, 0, errors.New("sock_diag: short reply")
	}
	switch ne.Uint16(b[4:]) {
	case unix.NLMSG_ERROR:
		if len(b) < nlmsgHdrLen+4 {
			return 0, 0, errors.New("sock_diag: short error reply")
		}
		errno := unix.Errno(-int32(ne.Uint32(b[nlmsgHdrLen:])))
		if errno == 0 {
			return 0, 0, errors.New("sock_diag: empty reply")
		}
		return 0, 0, errno
	case unix.SOCK_DIAG_BY_FAMILY:
		if len(b) < nlmsgHdrLen+inetDiagMsg {
			return 0, 0, errors.New("sock_diag: short reply")
		}
		m := b[nlmsgHdrLen:]
		return uint64(ne.Uint32(m[68:])), ne.Uint32(m[64:]), nil
	default:
		return 0, 0, fmt.Errorf("sock_diag: unexpected reply type %d", ne.Uint16(b[4:]))
	}
}
