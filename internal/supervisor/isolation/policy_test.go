package isolation_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/supervisor/isolation"
)

func fakeRoot(t *testing.T, passwd, group string) string {
	t.Helper()
	root := t.TempDir()
	must(t, os.Mkdir(filepath.Join(root, "etc"), 0o755))
	if passwd != "" {
		must(t, os.WriteFile(filepath.Join(root, "etc/passwd"), []byte(passwd), 0o644))
	}
	if group != "" {
		must(t, os.WriteFile(filepath.Join(root, "etc/group"), []byte(group), 0o644))
	}
	return root
}

func TestResolveUser(t *testing.T) {
	withSandbox := fakeRoot(t,
		"root:x:0:0:root:/root:/bin/sh\nsandbox:x:1234:1235::/home/sandbox:/bin/sh\napp:x:1500:1501::/srv/app:/bin/sh\n",
		"root:x:0:\nsandbox:x:1236:\n")
	bare := fakeRoot(t, "", "")
	tests := []struct {
		name        string
		root        string
		user, group string
		want        isolation.User
		wantErr     string
	}{
		{name: "default from passwd", root: withSandbox, want: isolation.User{UID: 1234, GID: 1235, Name: "sandbox", Home: "/home/sandbox"}},
		{name: "default without passwd", root: bare, want: isolation.User{UID: 1000, GID: 1000, Name: "sandbox"}},
		{name: "sandbox by name", root: withSandbox, user: "sandbox", want: isolation.User{UID: 1234, GID: 1235, Name: "sandbox", Home: "/home/sandbox"}},
		{name: "sandbox group from etc/group", root: withSandbox, group: "sandbox", want: isolation.User{UID: 1234, GID: 1236, Name: "sandbox", Home: "/home/sandbox"}},
		{name: "numeric user in passwd", root: withSandbox, user: "1500", want: isolation.User{UID: 1500, GID: 1501, Name: "app", Home: "/srv/app"}},
		{name: "numeric user not in passwd", root: bare, user: "2000", want: isolation.User{UID: 2000, GID: 2000}},
		{name: "numeric user and group", root: bare, user: "2000", group: "3000", want: isolation.User{UID: 2000, GID: 3000}},
		{name: "root by name", root: withSandbox, user: "root", wantErr: "run_as_user must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got 'root'"},
		{name: "root by id", root: withSandbox, user: "0", wantErr: "got '0'"},
		{name: "root group", root: withSandbox, group: "0", wantErr: "run_as_group must be"},
		{name: "out of range", root: bare, user: "4294967295", wantErr: "got '4294967295'"},
		{name: "sandbox mapped to root in passwd", root: fakeRoot(t, "sandbox:x:0:0::/:/bin/sh\n", ""), wantErr: "never runs as root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := isolation.ResolveUser(tt.root, tt.user, tt.group)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ResolveUser(%q, %q) = %+v, %v; want error containing %q", tt.user, tt.group, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ResolveUser(%q, %q) (-want +got):\n%s", tt.user, tt.group, diff)
			}
		})
	}
}

func TestFromPolicy(t *testing.T) {
	paths := func(ps []isolation.Path) []string {
		var out []string
		for _, p := range ps {
			if !p.Optional {
				out = append(out, p.Path)
			}
		}
		return out
	}
	t.Run("no filesystem section: defaults plus the workdir", func(t *testing.T) {
		c, err := isolation.FromPolicy(nil, "/nonexistent", "/sandbox")
		if err != nil {
			t.Fatal(err)
		}
		if !c.DefaultFilesystem || c.HardLandlock {
			t.Errorf("FromPolicy(nil) = default %v hard %v, want default best effort", c.DefaultFilesystem, c.HardLandlock)
		}
		if diff := cmp.Diff([]string{"/sandbox"}, paths(c.ReadWrite)); diff != "" {
			t.Errorf("required read-write paths (-want +got):\n%s", diff)
		}
	})
	t.Run("a workdir of / is never added read-write", func(t *testing.T) {
		for _, p := range []*sandboxv1.SandboxPolicy{nil, {Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true, ReadOnly: []string{"/usr"}}}} {
			c, err := isolation.FromPolicy(p, "/nonexistent", "/")
			if err != nil {
				t.Fatal(err)
			}
			if got := paths(c.ReadWrite); slices.Contains(got, "/") {
				t.Errorf("FromPolicy(%v, workdir /) required read-write = %v, want no /", p, got)
			}
		}
	})
	t.Run("policy paths are required, include_workdir adds the workdir", func(t *testing.T) {
		p := &sandboxv1.SandboxPolicy{
			Filesystem: &sandboxv1.FilesystemPolicy{IncludeWorkdir: true, ReadOnly: []string{"/usr"}, ReadWrite: []string{"/data"}},
			Landlock:   &sandboxv1.LandlockPolicy{Compatibility: "hard_requirement"},
		}
		c, err := isolation.FromPolicy(p, "/nonexistent", "/sandbox")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"/usr"}, paths(c.ReadOnly)); diff != "" {
			t.Errorf("read-only (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"/data", "/sandbox"}, paths(c.ReadWrite)); diff != "" {
			t.Errorf("read-write (-want +got):\n%s", diff)
		}
		if !c.HardLandlock {
			t.Error("hard_requirement not kept")
		}
	})
	for _, tt := range []struct {
		name    string
		policy  *sandboxv1.SandboxPolicy
		wantErr string
	}{
		{"relative path", &sandboxv1.SandboxPolicy{Filesystem: &sandboxv1.FilesystemPolicy{ReadOnly: []string{"usr"}}}, "must be absolute"},
		{"traversal", &sandboxv1.SandboxPolicy{Filesystem: &sandboxv1.FilesystemPolicy{ReadOnly: []string{"/usr/../etc/shadow"}}}, "path contains '..' traversal component: /usr/../etc/shadow"},
		{"root read-write", &sandboxv1.SandboxPolicy{Filesystem: &sandboxv1.FilesystemPolicy{ReadWrite: []string{"/"}}}, "read-write path is overly broad: /"},
		{"unknown compatibility", &sandboxv1.SandboxPolicy{Landlock: &sandboxv1.LandlockPolicy{Compatibility: "strict"}}, `got "strict"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := isolation.FromPolicy(tt.policy, "/nonexistent", "/sandbox")
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("FromPolicy() error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// isolationConfinement is the default confinement (no policy) with the
// filesystem root as working directory.
func isolationConfinement() (*isolation.Confinement, error) {
	return isolation.FromPolicy(nil, "/nonexistent-root", "")
}
