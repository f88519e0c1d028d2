//go:build linux

package process

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// procStartTime returns field 22 (starttime, clock ticks since boot) of
// /proc/<pid>/stat.
func procStartTime(pid int) (uint64, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// comm (field 2) may contain spaces and parentheses; fields after
	// the last ')' start at field 3.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return 0, errors.New("short stat")
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// pidHandle is a running process watched through a pidfd.
type pidHandle struct {
	pid       int
	startTime uint64
	file      *os.File // pidfd, nonblocking, registered with the runtime poller
}

// openPid opens a pidfd for pid and checks it is still the process that
// started at startTime (0: take the current one). The check after
// pidfd_open makes pid reuse harmless: the fd pins the process.
func openPid(pid int, startTime uint64) (*pidHandle, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	st, err := procStartTime(pid)
	if err != nil || (startTime != 0 && st != startTime) {
		_ = unix.Close(fd)
		if err == nil {
			err = fmt.Errorf("pid %d was reused (start time %d, recorded %d)", pid, st, startTime)
		}
		return nil, err
	}
	return &pidHandle{pid: pid, startTime: st, file: os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid))}, nil
}

// exitInfo describes how a process ended.
type exitInfo struct {
	known  bool // false when the process was not our child
	code   int
	signal syscall.Signal
}

func (e exitInfo) String() string {
	switch {
	case !e.known:
		return "supervisor process exited (exit status unavailable: it was started by an earlier gateway process)"
	case e.signal != 0:
		return fmt.Sprintf("supervisor process killed by signal %d (%s)", int(e.signal), unix.SignalName(e.signal))
	default:
		return fmt.Sprintf("supervisor process exited with code %d", e.code)
	}
}

// wait blocks until the process exits or h.file is closed (errClosed).
func (h *pidHandle) wait() (exitInfo, error) {
	rc, err := h.file.SyscallConn()
	if err != nil {
		return exitInfo{}, err
	}
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err == nil && n > 0
	})
	if err != nil {
		return exitInfo{}, err
	}
	var ws syscall.WaitStatus
	for {
		_, err = syscall.Wait4(h.pid, &ws, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return exitInfo{}, nil //nolint:nilerr // not our child: status unknown, which is not an error
	}
	if ws.Signaled() {
		return exitInfo{known: true, signal: ws.Signal(), code: 128 + int(ws.Signal())}, nil
	}
	return exitInfo{known: true, code: ws.ExitStatus()}, nil
}

// signalGroup sends sig to the process group led by pid (Setpgid makes the
// supervisor its group leader).
func signalGroup(pid int, sig syscall.Signal) error {
	err := syscall.Kill(-pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		err = syscall.Kill(pid, sig)
	}
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// findByInstance scans /proc for processes whose environment carries
// OPENSHELL_INSTANCE_ID=<id> for one of ids, returning id → pid. It finds
// supervisors started just before a gateway crash, before their pid was
// recorded.
func findByInstance(ids map[string]bool) map[string]int {
	found := map[string]int{}
	if len(ids) == 0 {
		return found
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return found
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := os.Open(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		sc.Split(splitNUL)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "OPENSHELL_INSTANCE_ID="); ok {
				// Children inherit the environment; only the
				// supervisor leads its process group.
				if pgid, err := unix.Getpgid(pid); ids[v] && err == nil && pgid == pid {
					found[v] = pid
				}
				break
			}
		}
		f.Close()
	}
	return found
}

func splitNUL(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexByte(data, 0); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}
