package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/pkg/sftp"
	"github.com/spf13/cobra"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// The transfer commands copy files and directories over SFTP on the
// sandbox's SSH server (relayed like 'sandbox connect'). The server runs as
// the sandbox's agent user and resolves every path beneath the sandbox's
// workspace; a path outside it is refused. Modes and modification times are
// kept; symbolic links are not followed on either side.

// sandboxWorkspace is the workspace path inside sandboxes; a relative
// REMOTE is relative to it.
const sandboxWorkspace = "/sandbox"

func (a *app) newSandboxUploadCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "upload NAME LOCAL [REMOTE]",
		Short: "Copy a local file or directory into a sandbox's workspace",
		Long: `Copy LOCAL (a file or a directory tree) to REMOTE inside the sandbox; REMOTE
defaults to the workspace (` + sandboxWorkspace + `), a relative REMOTE is relative to it, and
an existing directory REMOTE receives LOCAL under its own name. Modes and
modification times are kept. Paths outside the sandbox's workspace are refused.`,
		Example:           "  openshell sandbox upload my-app ./src\n  openshell sandbox upload my-app data.csv input/data.csv",
		Args:              argsUsage(cobra.RangeArgs(2, 3)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			remote := ""
			if len(args) == 3 {
				remote = args[2]
			}
			return a.withSFTP(cmd.Context(), args[0], func(c *sftp.Client) error {
				return a.upload(c, args[1], remote, a.stdout)
			})
		},
	}
}

func (a *app) newSandboxDownloadCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "download NAME REMOTE [LOCAL]",
		Short: "Copy a file or directory out of a sandbox's workspace",
		Long: `Copy REMOTE (a file or a directory tree inside the sandbox's workspace; a
relative REMOTE is relative to ` + sandboxWorkspace + `) to LOCAL, default the current
directory; an existing directory LOCAL receives REMOTE under its own name.
Modes and modification times are kept.`,
		Example:           "  openshell sandbox download my-app results\n  openshell sandbox download my-app out/report.pdf ./report.pdf",
		Args:              argsUsage(cobra.RangeArgs(2, 3)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			local := "."
			if len(args) == 3 {
				local = args[2]
			}
			return a.withSFTP(cmd.Context(), args[0], func(c *sftp.Client) error {
				return a.download(c, args[1], local)
			})
		},
	}
}

// remotePath resolves a REMOTE argument against the workspace and refuses
// one that leaves it.
func remotePath(p string) (string, error) {
	if !path.IsAbs(p) {
		p = path.Join(sandboxWorkspace, p)
	}
	p = path.Clean(p)
	if p != sandboxWorkspace && !strings.HasPrefix(p, sandboxWorkspace+"/") {
		return "", &userError{msg: fmt.Sprintf("%s is outside the sandbox workspace %s", p, sandboxWorkspace)}
	}
	return p, nil
}

// withSFTP opens an SFTP session on sandbox name and runs fn.
func (a *app) withSFTP(ctx context.Context, name string, fn func(*sftp.Client) error) error {
	sb, err := a.getSandbox(ctx, name)
	if err != nil {
		return err
	}
	if ph := sb.GetStatus().GetPhase(); ph != openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		return &userError{msg: fmt.Sprintf("sandbox %q is %s, not Ready", name, phaseName(ph))}
	}
	client, closeSSH, err := a.dialSandboxSSH(ctx, sb)
	if err != nil {
		return err
	}
	defer closeSSH()
	c, err := sftp.NewClient(client, sftp.UseConcurrentWrites(true), sftp.UseConcurrentReads(true))
	if err != nil {
		return fmt.Errorf("sandbox %q: start sftp: %w", name, err)
	}
	defer func() { _ = c.Close() }()
	if err := fn(c); err != nil {
		return transferError(err)
	}
	return nil
}

// transferError phrases a refusal of the sandbox's SFTP server.
func transferError(err error) error {
	var se *sftp.StatusError
	if errors.As(err, &se) && strings.Contains(se.Error(), "path escapes the sandbox workspace") {
		return &userError{msg: "refused: the path leads outside the sandbox workspace (through .. or a symbolic link)", cause: err}
	}
	return err
}

func (a *app) upload(c *sftp.Client, local, remote string, report io.Writer) error {
	if remote == "" {
		remote = sandboxWorkspace
	}
	dst, err := remotePath(remote)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(local)
	if err != nil {
		return &userError{msg: fmt.Sprintf("local %s: %v", local, err)}
	}
	if rfi, err := c.Stat(dst); err == nil && rfi.IsDir() {
		dst = path.Join(dst, filepath.Base(filepath.Clean(local)))
	}
	var total int64
	_ = filepath.WalkDir(local, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				total += info.Size()
			}
		}
		return nil
	})
	m := newMeter(a.stderr, a.stderrTerminal(), "Uploading", total)
	var files, bytes int64
	err = filepath.WalkDir(local, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(local, p)
		if err != nil {
			return err
		}
		target := dst
		if rel != "." {
			target = path.Join(dst, filepath.ToSlash(rel))
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			if err := c.Mkdir(target); err != nil {
				if st, serr := c.Lstat(target); serr != nil || !st.IsDir() {
					return fmt.Errorf("mkdir %s: %w", target, err)
				}
			}
			return nil
		case info.Mode().IsRegular():
			n, err := putFile(c, p, target, info, m)
			files++
			bytes += n
			return err
		default:
			_, _ = fmt.Fprintf(a.stderr, "skipping %s: not a regular file or directory\n", p)
			return nil
		}
	})
	m.stop()
	if err != nil {
		return err
	}
	// Directory times last: writing into a directory changes its mtime.
	if fi.IsDir() {
		if err := setDirTimes(local, func(p string, info fs.FileInfo) error {
			rel, _ := filepath.Rel(local, p)
			target := path.Join(dst, filepath.ToSlash(rel))
			if err := c.Chmod(target, info.Mode().Perm()); err != nil {
				return err
			}
			return c.Chtimes(target, info.ModTime(), info.ModTime())
		}); err != nil {
			return err
		}
	}
	_, _ = fmt.Fprintf(report, "Uploaded %d file(s), %d bytes to %s\n", files, bytes, dst)
	return nil
}

func putFile(c *sftp.Client, local, remote string, info fs.FileInfo, m *meter) (int64, error) {
	in, err := os.Open(local)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := c.OpenFile(remote, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", remote, err)
	}
	n, err := out.ReadFrom(meterReader{r: in, m: m})
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, fmt.Errorf("write %s: %w", remote, err)
	}
	if err := c.Chmod(remote, info.Mode().Perm()); err != nil {
		return n, err
	}
	return n, c.Chtimes(remote, info.ModTime(), info.ModTime())
}

// setDirTimes calls fn for every directory under root, deepest first.
func setDirTimes(root string, fn func(string, fs.FileInfo) error) error {
	var dirs []string
	if err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return err
	}); err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		info, err := os.Stat(dirs[i])
		if err != nil {
			return err
		}
		if err := fn(dirs[i], info); err != nil {
			return err
		}
	}
	return nil
}

func (a *app) download(c *sftp.Client, remote, local string) error {
	src, err := remotePath(remote)
	if err != nil {
		return err
	}
	if _, err := c.Lstat(src); err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	dst := local
	if lfi, err := os.Stat(local); err == nil && lfi.IsDir() {
		dst = filepath.Join(local, path.Base(src))
	}
	type entry struct {
		path string
		info fs.FileInfo
	}
	var entries []entry
	var total int64
	for w := c.Walk(src); w.Step(); {
		if err := w.Err(); err != nil {
			return err
		}
		entries = append(entries, entry{w.Path(), w.Stat()})
		if w.Stat().Mode().IsRegular() {
			total += w.Stat().Size()
		}
	}
	m := newMeter(a.stderr, a.stderrTerminal(), "Downloading", total)
	defer m.stop()
	var files, bytes int64
	var dirs []string
	for _, e := range entries {
		info := e.info
		rel := strings.TrimPrefix(strings.TrimPrefix(e.path, src), "/")
		target := filepath.Join(dst, filepath.FromSlash(rel))
		switch {
		case info.IsDir():
			if err := os.MkdirAll(target, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, e.path)
		case info.Mode().IsRegular():
			n, err := getFile(c, e.path, target, info, m)
			files++
			bytes += n
			if err != nil {
				return err
			}
		default:
			_, _ = fmt.Fprintf(a.stderr, "skipping %s: not a regular file or directory\n", e.path)
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		info, err := c.Stat(dirs[i])
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(dirs[i], src), "/")
		target := filepath.Join(dst, filepath.FromSlash(rel))
		if err := os.Chmod(target, info.Mode().Perm()); err != nil {
			return err
		}
		if err := os.Chtimes(target, info.ModTime(), info.ModTime()); err != nil {
			return err
		}
	}
	_, _ = fmt.Fprintf(a.stdout, "Downloaded %d file(s), %d bytes to %s\n", files, bytes, dst)
	return nil
}

func getFile(c *sftp.Client, remote, local string, info fs.FileInfo, m *meter) (int64, error) {
	in, err := c.Open(remote)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", remote, err)
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(local, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := in.WriteTo(meterWriter{w: out, m: m})
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, err
	}
	if err := os.Chmod(local, info.Mode().Perm()); err != nil {
		return n, err
	}
	return n, os.Chtimes(local, info.ModTime(), info.ModTime())
}
