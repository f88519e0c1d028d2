package mountinfo

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestUnescape(t *testing.T) {
	tests := []struct{ in, want string }{
		{`/plain/path`, "/plain/path"},
		{`/tmp/a\040b/c`, "/tmp/a b/c"},
		{`/tmp/tab\011x`, "/tmp/tab\tx"},
		{`/tmp/nl\012x`, "/tmp/nl\nx"},
		{`/tmp/back\134slash`, `/tmp/back\slash`},
		{`/tmp/end\040`, "/tmp/end "},
		{`\040\011\012\134`, " \t\n\\"},
		// Not an escape the kernel writes: kept as it is.
		{`/tmp/short\04`, `/tmp/short\04`},
		{`/tmp/notoctal\089`, `/tmp/notoctal\089`},
		{`/tmp/toobig\400`, `/tmp/toobig\400`},
		{`/tmp/trailing\`, `/tmp/trailing\`},
	}
	for _, tt := range tests {
		if got := Unescape(tt.in); got != tt.want {
			t.Errorf("Unescape(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParse(t *testing.T) {
	in := `22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
28 27 0:25 / /mnt/with\040space ro,nosuid,nodev,relatime shared:1 - tmpfs x ro
29 27 0:26 / /mnt/tab\011nl\012back\134 rw,noexec - tmpfs y\040z rw
`
	got, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{MountPoint: "/proc", Options: "rw,relatime", FSType: "proc"},
		{MountPoint: "/", Options: "rw,relatime", FSType: "ext4"},
		{MountPoint: "/mnt/with space", Options: "ro,nosuid,nodev,relatime", FSType: "tmpfs"},
		{MountPoint: "/mnt/tab\tnl\nback\\", Options: "rw,noexec", FSType: "tmpfs"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Parse (-want +got):\n%s", d)
	}
	for _, bad := range []string{"1 2 3", "22 27 0:21 / /proc rw,relatime", "22 27 0:21 / /proc rw,relatime shared:1 -"} {
		if _, err := Parse(strings.NewReader(bad + "\n")); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("Parse(%q) error = %v, want one naming the line", bad, err)
		}
	}
	if got, err := Parse(strings.NewReader("")); err != nil || len(got) != 0 {
		t.Errorf("Parse(empty) = %v, %v; want no mounts, no error", got, err)
	}
}
