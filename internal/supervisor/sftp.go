package supervisor

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/supervisor/sftpd"
)

// sftpServerCmd is the supervisor's hidden subcommand that serves SFTP on
// stdin/stdout, confined to the workspace given as its argument. The SSH
// server starts it for the "sftp" subsystem as an agent process, so it runs
// as the agent's user under the agent's Landlock rules and seccomp filter.
const sftpServerCmd = "sftp-server"

// selfImage is a sealed in-memory copy of the supervisor's executable,
// made on first use. The agent process execs it through the supervisor's
// descriptor (/proc/self/fd/N, still open at execve): the supervisor's
// binary itself is neither visible in the sandbox's filesystem view nor
// executable under the agent's Landlock rules.
var selfImage struct {
	once sync.Once
	file *os.File // kept referenced: its finalizer would close the descriptor
	path string
	err  error
}

func selfExecPath() (string, error) {
	selfImage.once.Do(func() {
		data, err := os.ReadFile("/proc/self/exe")
		if err != nil {
			selfImage.err = fmt.Errorf("read the supervisor's executable: %w", err)
			return
		}
		fd, err := unix.MemfdCreate("openshell-sandbox", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			selfImage.err = fmt.Errorf("memfd_create: %w", err)
			return
		}
		f := os.NewFile(uintptr(fd), "openshell-sandbox")
		if _, err := f.Write(data); err != nil {
			f.Close()
			selfImage.err = fmt.Errorf("copy the supervisor's executable: %w", err)
			return
		}
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
			f.Close()
			selfImage.err = fmt.Errorf("seal the supervisor's executable copy: %w", err)
			return
		}
		// f stays open for the supervisor's lifetime.
		selfImage.file = f
		selfImage.path = fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	})
	return selfImage.path, selfImage.err
}

// sftpArgv is the agent command of an SFTP session.
func (s *sshServer) sftpArgv() ([]string, error) {
	if s.workdir == "" {
		return nil, errors.New("the sandbox has no workspace directory")
	}
	exe, err := selfExecPath()
	if err != nil {
		return nil, err
	}
	return []string{exe, sftpServerCmd, s.workdir}, nil
}

type stdio struct{}

func (stdio) Read(p []byte) (int, error)  { return os.Stdin.Read(p) }
func (stdio) Write(p []byte) (int, error) { return os.Stdout.Write(p) }
func (stdio) Close() error                { return os.Stdout.Close() }

func runSFTPServer(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: openshell-sandbox sftp-server WORKSPACE")
	}
	return sftpd.Serve(stdio{}, args[0])
}
