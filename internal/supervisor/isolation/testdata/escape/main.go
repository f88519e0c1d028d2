// Command escape tries one way out of the agent confinement. It prints
// "ESCAPED ..." and exits 0 when the attempt worked, "denied: ..." and
// exits 1 when the kernel refused it, and exits 2 on a usage error. The
// x32 and i386 attempts are expected to be killed by the seccomp filter.
package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: escape ATTEMPT [ARGS]")
		os.Exit(2)
	}
	arg := func(i int) string {
		if len(os.Args) <= i+1 {
			fmt.Fprintln(os.Stderr, "missing argument")
			os.Exit(2)
		}
		return os.Args[i+1]
	}
	pid := func(i int) int { n, _ := strconv.Atoi(arg(i)); return n }
	var err error
	switch os.Args[1] {
	case "mount":
		err = unix.Mount("none", arg(1), "tmpfs", 0, "")
	case "ptrace":
		err = unix.PtraceAttach(pid(1))
	case "unshare-net":
		err = unix.Unshare(unix.CLONE_NEWNET)
	case "unshare-user":
		err = unix.Unshare(unix.CLONE_NEWUSER)
	case "clone-userns":
		cmd := exec.Command("/proc/self/exe", "tcp-socket")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET}
		err = cmd.Run()
	case "setns":
		var f *os.File
		if f, err = os.Open("/proc/1/ns/net"); err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		}
	case "raw-socket":
		err = socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	case "raw6-socket":
		err = socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	case "packet-socket":
		err = socket(unix.AF_PACKET, unix.SOCK_RAW, 0x0300) // htons(ETH_P_ALL)
	case "packet-dgram-socket":
		err = socket(unix.AF_PACKET, unix.SOCK_DGRAM, 0x0300)
	case "icmp-socket":
		err = socket(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)
	case "tcp-socket":
		err = socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	case "connect":
		var c net.Conn
		if c, err = net.DialTimeout("tcp", arg(1), 3*time.Second); err == nil {
			c.Close()
		}
	case "loopback":
		// A positive: loopback inside the sandbox works.
		l, lerr := net.Listen("tcp", "127.0.0.1:0")
		if lerr == nil {
			var c net.Conn
			if c, lerr = net.Dial("tcp", l.Addr().String()); lerr == nil {
				c.Close()
				fmt.Println("works loopback")
				os.Exit(0)
			}
		}
		fmt.Printf("broken: %v\n", lerr)
		os.Exit(1)
	case "fds":
		// Descriptors besides stdio inherited from the parent (the
		// runtime's own anon inodes and the listing itself excepted).
		var d *os.File
		if d, err = os.Open("/proc/self/fd"); err == nil {
			names, _ := d.Readdirnames(-1)
			var extra []string
			for _, n := range names {
				fd, _ := strconv.Atoi(n)
				link, _ := os.Readlink("/proc/self/fd/" + n)
				if fd > 2 && fd != int(d.Fd()) && !strings.HasPrefix(link, "anon_inode:") {
					extra = append(extra, n+"->"+link)
				}
			}
			if len(extra) > 0 {
				fmt.Println("ESCAPED fds", extra)
				os.Exit(0)
			}
			err = fmt.Errorf("no inherited descriptors")
		}
	case "kill":
		err = unix.Kill(pid(1), unix.SIGKILL)
	case "abstract-connect":
		// Connects to the abstract unix socket @NAME.
		err = abstractConnect(arg(1))
	case "abstract-self":
		// A positive: an abstract socket of this process's own domain.
		name := fmt.Sprintf("openshell-escape-self-%d", os.Getpid())
		l, lerr := net.Listen("unix", "@"+name)
		if lerr == nil {
			defer l.Close()
			lerr = abstractConnect(name)
		}
		if lerr != nil {
			fmt.Printf("broken: %v\n", lerr)
			os.Exit(1)
		}
		fmt.Println("works abstract-self")
		os.Exit(0)
	case "signal0":
		err = unix.Kill(pid(1), 0)
	case "init-module":
		err = unix.InitModule([]byte{0x7f, 'E', 'L', 'F'}, "")
	case "finit-module":
		var f *os.File
		if f, err = os.Open("/dev/null"); err == nil {
			err = unix.FinitModule(int(f.Fd()), "", 0)
		}
	case "write":
		err = os.WriteFile(arg(1), []byte("escaped\n"), 0o644)
	case "read":
		_, err = os.ReadFile(arg(1))
	case "open":
		var f *os.File
		if f, err = os.Open(arg(1)); err == nil {
			f.Close()
		}
	case "mknod":
		err = unix.Mknod(arg(1), unix.S_IFBLK|0o666, int(unix.Mkdev(7, 0)))
	case "bpf":
		err = errno(unix.Syscall(unix.SYS_BPF, 0 /* BPF_MAP_CREATE */, 0, 0))
	case "perf":
		err = errno(unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0, 0))
	case "keyctl":
		err = errno(unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, ^uintptr(2), 0))
	case "add-key":
		_, err = unix.AddKey("user", "escape", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
	case "userfaultfd":
		err = errno(unix.Syscall(unix.SYS_USERFAULTFD, 0, 0, 0))
	case "io-uring":
		var params [120]byte
		err = errno(unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0))
	case "open-by-handle":
		fdcwd := unix.AT_FDCWD
		err = errno(unix.Syscall(unix.SYS_OPEN_BY_HANDLE_AT, uintptr(fdcwd), 0, 0))
	case "kexec":
		err = errno(unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0, 0, 0))
	case "pivot-root":
		err = unix.PivotRoot(".", ".")
	case "x32":
		err = errno(unix.RawSyscall(0x40000000|unix.SYS_GETPID, 0, 0, 0))
	case "i386":
		err = errno(int80getpid(), 0, 0)
	case "euid":
		if unix.Geteuid() == 0 {
			fmt.Println("ESCAPED euid 0")
			os.Exit(0)
		}
		err = fmt.Errorf("euid %d", unix.Geteuid())
	case "status":
		// Prints the confinement the kernel reports for this process.
		b, rerr := os.ReadFile("/proc/self/status")
		if rerr != nil {
			fmt.Fprintln(os.Stderr, rerr)
			os.Exit(2)
		}
		for _, l := range strings.Split(string(b), "\n") {
			for _, k := range []string{"Uid:", "Gid:", "Groups:", "Cap", "NoNewPrivs:", "Seccomp:"} {
				if strings.HasPrefix(l, k) {
					fmt.Println(strings.Join(strings.Fields(l), " "))
				}
			}
		}
		os.Exit(0)
	default:
		fmt.Fprintln(os.Stderr, "unknown attempt", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Printf("denied: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("ESCAPED", os.Args[1])
}

func socket(domain, typ, proto int) error {
	fd, err := unix.Socket(domain, typ, proto)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

func errno(r1, _ uintptr, e syscall.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

func abstractConnect(name string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + name})
}
