// Command fakesupervisor stands in for openshell-sandbox in the docker
// driver's tests. It writes what it observed to
// $OPENSHELL_WORKSPACE_DIR/report.json (appending one JSON line per start)
// and waits for SIGTERM (exit 0). FAKE_SUPERVISOR_EXIT=<n> makes it exit
// with n after the report.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

type report struct {
	PID        int               `json:"pid"`
	UID        int               `json:"uid"`
	Hostname   string            `json:"hostname"`
	Cwd        string            `json:"cwd"`
	Args       []string          `json:"args"`
	Env        map[string]string `json:"env"`
	TokenMode  string            `json:"token_mode"`
	TokenDir   string            `json:"token_dir_mode"`
	TokenUID   int               `json:"token_uid"`
	Token      string            `json:"token"`
	Interfaces []string          `json:"interfaces"`
	CapEff     string            `json:"cap_eff"`
	NoNewPrivs string            `json:"no_new_privs"`
	Callback   string            `json:"callback"` // "ok" or the dial error
	PidsMax    string            `json:"pids_max"`
}

func main() {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	r := report{PID: os.Getpid(), UID: os.Getuid(), Args: os.Args[1:], Env: map[string]string{}}
	r.Hostname, _ = os.Hostname()
	r.Cwd, _ = os.Getwd()
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		r.Env[k] = v
	}
	if p := os.Getenv("OPENSHELL_SANDBOX_TOKEN_FILE"); p != "" {
		if st, err := os.Stat(p); err == nil {
			r.TokenMode = fmt.Sprintf("%o", st.Mode().Perm())
			r.TokenUID = int(st.Sys().(*syscall.Stat_t).Uid)
		}
		if st, err := os.Stat(filepath.Dir(p)); err == nil {
			r.TokenDir = fmt.Sprintf("%o", st.Mode().Perm())
		}
		b, _ := os.ReadFile(p)
		r.Token = string(b)
	}
	if ifs, err := net.Interfaces(); err == nil {
		for _, i := range ifs {
			r.Interfaces = append(r.Interfaces, i.Name)
		}
	}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				switch k {
				case "CapEff":
					r.CapEff = strings.TrimSpace(v)
				case "NoNewPrivs":
					r.NoNewPrivs = strings.TrimSpace(v)
				}
			}
		}
	}
	if ep, ok := strings.CutPrefix(os.Getenv("OPENSHELL_ENDPOINT"), "unix://"); ok {
		if c, err := net.Dial("unix", ep); err != nil {
			r.Callback = err.Error()
		} else {
			r.Callback = "ok"
			c.Close()
		}
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/pids/pids.max"); err == nil {
		r.PidsMax = strings.TrimSpace(string(b))
	} else if b, err := os.ReadFile("/sys/fs/cgroup/pids.max"); err == nil {
		r.PidsMax = strings.TrimSpace(string(b))
	}
	line, _ := json.Marshal(r)
	if f, err := os.OpenFile(filepath.Join(os.Getenv("OPENSHELL_WORKSPACE_DIR"), "report.json"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
		_, _ = f.Write(append(line, '\n'))
		f.Close()
	}
	if v := os.Getenv("FAKE_SUPERVISOR_EXIT"); v != "" {
		n, _ := strconv.Atoi(v)
		os.Exit(n)
	}
	<-term
}
