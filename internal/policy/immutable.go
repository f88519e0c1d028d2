package policy

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// ValidateUpdate checks next as the new policy of a live sandbox whose
// baseline (the policy it was started with, spec.policy) is baseline.
// Only the network sections may change: the filesystem, Landlock and
// process sections are applied once, when the agent starts, and stay as
// they are. It reports every static change and every safety violation in
// one errdefs.InvalidArgument error, or returns nil. A nil baseline means
// the sandbox has no policy yet; then only the safety rules apply.
func ValidateUpdate(baseline, next *sandboxv1.SandboxPolicy) error {
	var msgs []string
	if baseline != nil {
		msgs = StaticChanges(baseline, next)
	}
	if v := Violations(next); len(v) > 0 {
		msgs = append(msgs, unsafePrefix+strings.Join(v, "; "))
	}
	if len(msgs) > 0 {
		return errdefs.InvalidArgument(strings.Join(msgs, "; "))
	}
	return nil
}

// StaticChanges lists the changes from baseline to next that a live
// sandbox cannot take, with OpenShell's texts. Unlike OpenShell, which
// lets filesystem paths be added (they would only apply after a restart),
// any filesystem change is refused: a stored path that no running agent is
// confined by would be a policy that is not true.
func StaticChanges(baseline, next *sandboxv1.SandboxPolicy) []string {
	var msgs []string
	msgs = append(msgs, filesystemChanges(baseline.GetFilesystem(), next.GetFilesystem())...)
	if !sameSection(baseline.GetLandlock(), next.GetLandlock()) {
		msgs = append(msgs, "landlock policy cannot be changed on a live sandbox (applied at startup)")
	}
	if !sameSection(baseline.GetProcess(), next.GetProcess()) {
		msgs = append(msgs, "process policy cannot be changed on a live sandbox (applied at startup)")
	}
	return msgs
}

// sameSection reports whether two policy sections are equal, an absent
// section being the same as an empty one.
func sameSection(a, b proto.Message) bool {
	return proto.Equal(a, b) || proto.Size(a) == 0 && proto.Size(b) == 0
}

func filesystemChanges(base, next *sandboxv1.FilesystemPolicy) []string {
	if next == nil && proto.Size(base) > 0 {
		return []string{"filesystem policy cannot be removed on a live sandbox"}
	}
	var msgs []string
	if base.GetIncludeWorkdir() != next.GetIncludeWorkdir() {
		msgs = append(msgs, "filesystem include_workdir cannot be changed on a live sandbox")
	}
	for _, l := range []struct {
		kind       string
		base, next []string
	}{
		{"read_only", base.GetReadOnly(), next.GetReadOnly()},
		{"read_write", base.GetReadWrite(), next.GetReadWrite()},
	} {
		for _, p := range l.base {
			if !slices.Contains(l.next, p) {
				msgs = append(msgs, fmt.Sprintf("filesystem %s path '%s' cannot be removed on a live sandbox", l.kind, p))
			}
		}
		for _, p := range l.next {
			if !slices.Contains(l.base, p) {
				msgs = append(msgs, fmt.Sprintf("filesystem %s path '%s' cannot be added on a live sandbox", l.kind, p))
			}
		}
	}
	return msgs
}
