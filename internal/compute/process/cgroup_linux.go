//go:build linux

package process

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/mountinfo"
)

// limits are parsed resources; zero means unset.
type limits struct {
	cpuRequestMilli int64
	cpuLimitMilli   int64
	memRequest      int64
	memLimit        int64
}

func (l limits) empty() bool { return l == limits{} }

func parseLimits(r compute.Resources) (limits, error) {
	var l limits
	var err error
	if l.cpuRequestMilli, err = parseCPU("cpu request", r.CPURequest); err != nil {
		return l, err
	}
	if l.cpuLimitMilli, err = parseCPU("cpu limit", r.CPULimit); err != nil {
		return l, err
	}
	if l.memRequest, err = parseMemory("memory request", r.MemoryRequest); err != nil {
		return l, err
	}
	if l.memLimit, err = parseMemory("memory limit", r.MemoryLimit); err != nil {
		return l, err
	}
	if l.cpuLimitMilli > 0 && l.cpuRequestMilli > l.cpuLimitMilli {
		return l, errdefs.InvalidArgument(fmt.Sprintf("cpu request %q exceeds cpu limit %q", r.CPURequest, r.CPULimit))
	}
	if l.memLimit > 0 && l.memRequest > l.memLimit {
		return l, errdefs.InvalidArgument(fmt.Sprintf("memory request %q exceeds memory limit %q", r.MemoryRequest, r.MemoryLimit))
	}
	return l, nil
}

// parseCPU parses "500m", "2" or "0.5" into millicores.
func parseCPU(what, q string) (int64, error) {
	if q == "" {
		return 0, nil
	}
	bad := errdefs.InvalidArgument(fmt.Sprintf("%s %q is not a valid cpu quantity", what, q))
	if s, ok := strings.CutSuffix(q, "m"); ok {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return 0, bad
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(q, 64)
	if err != nil || f <= 0 || f > 1e6 || math.IsNaN(f) {
		return 0, bad
	}
	return max(1, int64(math.Round(f*1000))), nil
}

var memSuffixes = []struct {
	s string
	m int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50},
	{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
}

// parseMemory parses "512Mi", "1G" or "1048576" into bytes.
func parseMemory(what, q string) (int64, error) {
	if q == "" {
		return 0, nil
	}
	bad := errdefs.InvalidArgument(fmt.Sprintf("%s %q is not a valid memory quantity", what, q))
	mult := int64(1)
	num := q
	for _, s := range memSuffixes {
		if n, ok := strings.CutSuffix(q, s.s); ok {
			num, mult = n, s.m
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f <= 0 || math.IsNaN(f) || f*float64(mult) > math.MaxInt64/2 {
		return 0, bad
	}
	return int64(f * float64(mult)), nil
}

// cgroupRoot returns the configured cgroup root or the host's cgroup2 mount.
func (c config) findCgroupRoot() (string, error) {
	if c.cgroupRoot != "" {
		return c.cgroupRoot, nil
	}
	mounts, err := mountinfo.Read("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			return m.MountPoint, nil
		}
	}
	return "", errors.New("no cgroup2 filesystem is mounted")
}

// controllersFor lists the cgroup v2 controllers l needs, each with what
// asked for it.
func (l limits) controllers() [][2]string {
	var out [][2]string
	switch {
	case l.cpuLimitMilli > 0:
		out = append(out, [2]string{"cpu", "cpu limit"})
	case l.cpuRequestMilli > 0:
		out = append(out, [2]string{"cpu", "cpu request"})
	}
	switch {
	case l.memLimit > 0:
		out = append(out, [2]string{"memory", "memory limit"})
	case l.memRequest > 0:
		out = append(out, [2]string{"memory", "memory request"})
	}
	return out
}

// checkCgroup reports, as FailedPrecondition, why the host cannot enforce l.
func (c config) checkCgroup(l limits) (string, error) {
	ctrls := l.controllers()
	if len(ctrls) == 0 {
		return "", nil
	}
	root, err := c.findCgroupRoot()
	if err != nil {
		return "", errdefs.FailedPrecondition(fmt.Sprintf("%s requested but cgroup v2 is not available: %v", ctrls[0][1], err))
	}
	data, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return "", errdefs.FailedPrecondition(fmt.Sprintf("%s requested but %s is not a cgroup v2 hierarchy: %v", ctrls[0][1], root, err))
	}
	have := strings.Fields(string(data))
	for _, c := range ctrls {
		if !contains(have, c[0]) {
			return "", errdefs.FailedPrecondition(fmt.Sprintf("%s requested but cgroup v2 controller %q is not available: %s lists %q",
				c[1], c[0], filepath.Join(root, "cgroup.controllers"), strings.Join(have, " ")))
		}
	}
	if err := unix.Access(root, unix.W_OK); err != nil {
		return "", errdefs.FailedPrecondition(fmt.Sprintf("%s requested but cgroup root %s is not writable: %v", ctrls[0][1], root, err))
	}
	return root, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// setupCgroup creates <root>/openshell/<id> with l applied and returns the
// directory, opened, for CLONE_INTO_CGROUP.
func setupCgroup(root, id string, l limits) (dir string, fd *os.File, err error) {
	parent := filepath.Join(root, "openshell")
	dir = filepath.Join(parent, id)
	var enable []string
	for _, c := range l.controllers() {
		enable = append(enable, "+"+c[0])
	}
	ctl := strings.Join(enable, " ")
	fail := func(step string, err error) (string, *os.File, error) {
		_ = os.Remove(dir)
		return "", nil, errdefs.FailedPrecondition(fmt.Sprintf("cgroup %s: %s: %v", dir, step, err))
	}
	if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte(ctl), 0); err != nil {
		return fail("enable controllers in "+root, err)
	}
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fail("create parent", err)
	}
	if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte(ctl), 0); err != nil {
		return fail("enable controllers in "+parent, err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fail("create", err)
	}
	writes := map[string]string{}
	if l.cpuLimitMilli > 0 {
		writes["cpu.max"] = fmt.Sprintf("%d 100000", max(1000, l.cpuLimitMilli*100))
	}
	if l.cpuRequestMilli > 0 {
		shares := max(2, l.cpuRequestMilli*1024/1000)
		writes["cpu.weight"] = strconv.FormatInt(min(10000, 1+((shares-2)*9999)/262142), 10)
	}
	if l.memLimit > 0 {
		writes["memory.max"] = strconv.FormatInt(l.memLimit, 10)
	}
	if l.memRequest > 0 {
		writes["memory.low"] = strconv.FormatInt(l.memRequest, 10)
	}
	for f, v := range writes {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0); err != nil {
			return fail("write "+f, err)
		}
	}
	fd, err = os.Open(dir)
	if err != nil {
		return fail("open", err)
	}
	return dir, fd, nil
}

// removeCgroup removes an (emptied) sandbox cgroup, waiting briefly for the
// kernel to finish reaping its processes.
func removeCgroup(dir string) error {
	if dir == "" {
		return nil
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		var fs unix.Statfs_t
		if errors.Is(err, unix.ENOTEMPTY) && unix.Statfs(dir, &fs) == nil && fs.Type != unix.CGROUP2_SUPER_MAGIC {
			// Not a cgroupfs (a configured cgroup_root under test): its
			// interface files are plain files.
			return os.RemoveAll(dir)
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
