package isolation

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The seccomp filter is assembled here rather than with a filter library:
// the denylist libraries available jump foreign architectures to the
// default action, which for a denylist is "allow", so an i386 int 0x80
// call would bypass every rule. This filter kills the process on any
// architecture but the native one and on the x32 ABI.

// deniedSyscalls fail with EPERM. Most of them also need a capability the
// agent does not have; the filter is the second wall and shrinks the
// kernel surface the agent can reach (io_uring, bpf, userfaultfd, keys).
var deniedSyscalls = []struct {
	name string
	nr   uint32
}{
	{"mount", unix.SYS_MOUNT},
	{"umount2", unix.SYS_UMOUNT2},
	{"fsopen", unix.SYS_FSOPEN},
	{"fsconfig", unix.SYS_FSCONFIG},
	{"fsmount", unix.SYS_FSMOUNT},
	{"fspick", unix.SYS_FSPICK},
	{"move_mount", unix.SYS_MOVE_MOUNT},
	{"open_tree", unix.SYS_OPEN_TREE},
	{"mount_setattr", unix.SYS_MOUNT_SETATTR},
	{"pivot_root", unix.SYS_PIVOT_ROOT},
	{"ptrace", unix.SYS_PTRACE},
	{"process_vm_readv", unix.SYS_PROCESS_VM_READV},
	{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV},
	{"kexec_load", unix.SYS_KEXEC_LOAD},
	{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
	{"bpf", unix.SYS_BPF},
	{"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
	{"keyctl", unix.SYS_KEYCTL},
	{"add_key", unix.SYS_ADD_KEY},
	{"request_key", unix.SYS_REQUEST_KEY},
	{"unshare", unix.SYS_UNSHARE},
	{"setns", unix.SYS_SETNS},
	{"init_module", unix.SYS_INIT_MODULE},
	{"finit_module", unix.SYS_FINIT_MODULE},
	{"delete_module", unix.SYS_DELETE_MODULE},
	{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT},
	{"name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT},
	{"userfaultfd", unix.SYS_USERFAULTFD},
	{"io_uring_setup", unix.SYS_IO_URING_SETUP},
	{"io_uring_enter", unix.SYS_IO_URING_ENTER},
	{"io_uring_register", unix.SYS_IO_URING_REGISTER},
}

// cloneNamespaceFlags are the clone(2) flags that create namespaces
// (CLONE_NEWTIME shares its bit with the exit signal in clone(2) and is
// only reachable through unshare and clone3, both refused).
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// sockPacket is the obsolete SOCK_PACKET socket type.
const sockPacket = 10

// nativeArch is the AUDIT_ARCH value of the running architecture.
func nativeArch() (uint32, error) {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64, nil
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64, nil
	}
	return 0, fmt.Errorf("seccomp filter: architecture %s is not supported", runtime.GOARCH)
}

const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retKill   = unix.SECCOMP_RET_KILL_PROCESS
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)

	// struct seccomp_data offsets (little-endian: an argument's low 32
	// bits come first).
	offNr   = 0
	offArch = 4
	offArg0 = 16
	offArg1 = 24
	offArg2 = 32

	x32SyscallBit = 0x40000000
)

// asm is a tiny assembler with forward labels for classic BPF.
type asm struct {
	ins    []bpf.Instruction
	labels map[string]int
	fixups []fixup
}

type fixup struct {
	at              int
	onTrue, onFalse string // "" falls through
	cond            bpf.JumpTest
	val             uint32
}

func (a *asm) emit(i bpf.Instruction) { a.ins = append(a.ins, i) }
func (a *asm) label(name string)      { a.labels[name] = len(a.ins) }
func (a *asm) load(off uint32)        { a.emit(bpf.LoadAbsolute{Off: off, Size: 4}) }
func (a *asm) ret(v uint32)           { a.emit(bpf.RetConstant{Val: v}) }

// jump emits "if A <cond> val goto onTrue else goto onFalse" ("" falls through).
func (a *asm) jump(cond bpf.JumpTest, val uint32, onTrue, onFalse string) {
	a.fixups = append(a.fixups, fixup{at: len(a.ins), cond: cond, val: val, onTrue: onTrue, onFalse: onFalse})
	a.emit(nil)
}

func (a *asm) assemble() ([]bpf.RawInstruction, error) {
	for _, f := range a.fixups {
		skip := func(l string) (uint8, error) {
			if l == "" {
				return 0, nil
			}
			t, ok := a.labels[l]
			if !ok {
				return 0, fmt.Errorf("seccomp filter: unknown label %q", l)
			}
			d := t - f.at - 1
			if d < 0 || d > 255 {
				return 0, fmt.Errorf("seccomp filter: jump to %q out of range", l)
			}
			return uint8(d), nil
		}
		st, err := skip(f.onTrue)
		if err != nil {
			return nil, err
		}
		sf, err := skip(f.onFalse)
		if err != nil {
			return nil, err
		}
		a.ins[f.at] = bpf.JumpIf{Cond: f.cond, Val: f.val, SkipTrue: st, SkipFalse: sf}
	}
	return bpf.Assemble(a.ins)
}

// filterProgram assembles the agent's seccomp filter.
func filterProgram() ([]bpf.RawInstruction, error) {
	arch, err := nativeArch()
	if err != nil {
		return nil, err
	}
	a := &asm{labels: map[string]int{}}
	a.load(offArch)
	a.jump(bpf.JumpEqual, arch, "", "kill")
	a.load(offNr)
	if runtime.GOARCH == "amd64" {
		a.jump(bpf.JumpGreaterOrEqual, x32SyscallBit, "kill", "")
	}
	for _, s := range deniedSyscalls {
		a.jump(bpf.JumpEqual, s.nr, "eperm", "")
	}
	// clone3 passes its flags in memory the filter cannot read: ENOSYS
	// makes libc fall back to clone(2), whose flags are checked.
	a.jump(bpf.JumpEqual, unix.SYS_CLONE3, "enosys", "")
	a.jump(bpf.JumpEqual, unix.SYS_CLONE, "clone", "")
	a.jump(bpf.JumpEqual, unix.SYS_SOCKET, "socket", "")
	a.ret(retAllow)

	a.label("clone")
	a.load(offArg0)
	a.jump(bpf.JumpBitsSet, cloneNamespaceFlags, "eperm", "")
	a.ret(retAllow)

	// socket(domain, type, protocol): no packet sockets, no raw sockets
	// (netlink's SOCK_RAW is its normal type and carries no traffic), no
	// ICMP datagram sockets.
	a.label("socket")
	a.load(offArg0)
	a.jump(bpf.JumpEqual, unix.AF_PACKET, "eperm", "")
	a.jump(bpf.JumpEqual, unix.AF_NETLINK, "allow", "")
	a.jump(bpf.JumpEqual, unix.AF_INET, "inet", "")
	a.jump(bpf.JumpEqual, unix.AF_INET6, "inet", "")
	a.load(offArg1)
	a.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xf})
	a.jump(bpf.JumpEqual, unix.SOCK_RAW, "eperm", "")
	a.jump(bpf.JumpEqual, sockPacket, "eperm", "")
	a.ret(retAllow)

	a.label("inet")
	a.load(offArg1)
	a.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xf})
	a.jump(bpf.JumpEqual, unix.SOCK_RAW, "eperm", "")
	a.jump(bpf.JumpEqual, sockPacket, "eperm", "")
	a.load(offArg2)
	a.jump(bpf.JumpEqual, unix.IPPROTO_ICMP, "eperm", "")
	a.jump(bpf.JumpEqual, unix.IPPROTO_ICMPV6, "eperm", "")
	a.label("allow")
	a.ret(retAllow)

	a.label("eperm")
	a.ret(retEPERM)
	a.label("enosys")
	a.ret(retENOSYS)
	a.label("kill")
	a.ret(retKill)
	return a.assemble()
}

// loadFilter installs prog on the calling OS thread only (no TSYNC: the
// domain thread's filter is for the agents it forks, not for the rest of
// the supervisor). no_new_privs must already be set.
func loadFilter(prog []bpf.RawInstruction) error {
	filter := make([]unix.SockFilter, len(prog))
	for i, ins := range prog {
		filter[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	_, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return fmt.Errorf("seccomp: %w", errno)
	}
	return nil
}
