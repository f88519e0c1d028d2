// Package mountinfo parses the kernel's mountinfo format
// (/proc/<pid>/mountinfo, proc(5)): one mount per line, fields separated
// by spaces, and a space, tab, newline or backslash in a path written as
// an octal escape (\040, \011, \012, \134).
//
// It reads only what this module needs (mount point, per-mount options
// and file system type) and nothing else, so it stays cheap on the supervisor's start
// path. The functions keep no state and are safe for concurrent use.
package mountinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Mount is one line of mountinfo.
type Mount struct {
	MountPoint string // field 5, unescaped
	Options    string // field 6, per-mount options, e.g. "rw,nosuid,relatime"
	FSType     string // the field after the "-" separator, e.g. "ext4", "cgroup2"
}

// Parse reads mountinfo lines from r. A line with fewer than six fields,
// or without the "-" separator followed by the file system type, is an
// error naming the line.
func Parse(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := 6 // the optional fields end at "-"
		for sep < len(f) && f[sep] != "-" {
			sep++
		}
		if len(f) < 6 || sep+1 >= len(f) {
			return nil, fmt.Errorf("malformed mountinfo line %q", sc.Text())
		}
		out = append(out, Mount{MountPoint: Unescape(f[4]), Options: f[5], FSType: f[sep+1]})
	}
	return out, sc.Err()
}

// Read parses the mountinfo file at path, e.g. "/proc/self/mountinfo".
func Read(path string) ([]Mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Parse(f)
}

// Unescape decodes the octal escapes the kernel writes in mountinfo
// paths. A backslash not followed by three octal digits (of a byte
// value) is kept as it is.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
