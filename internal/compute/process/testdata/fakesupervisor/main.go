// Command fakesupervisor stands in for openshell-sandbox in the process
// driver's tests. It performs the hostname part of the start contract,
// writes a report of what it observed to
// $OPENSHELL_WORKSPACE_DIR/report-$OPENSHELL_INSTANCE_ID.json, and waits for
// SIGTERM (exit 0). FAKE_SUPERVISOR_EXIT=<n> makes it exit with n after the
// report; FAKE_SUPERVISOR_IGNORE_TERM=1 makes it ignore SIGTERM.
package main

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type report struct {
	PID         int               `json:"pid"`
	UIDMap      string            `json:"uid_map"`
	Hostname    string            `json:"hostname"`
	Cwd         string            `json:"cwd"`
	Args        []string          `json:"args"`
	Env         map[string]string `json:"env"`
	TokenMode   string            `json:"token_mode"`
	TokenLen    int               `json:"token_len"`
	HostnameErr string            `json:"hostname_err,omitempty"`
	NetNS       string            `json:"net_ns"`     // readlink /proc/self/ns/net
	Interfaces  []string          `json:"interfaces"` // names of the network interfaces it sees
}

func main() {
	term := make(chan os.Signal, 1)
	if os.Getenv("FAKE_SUPERVISOR_IGNORE_TERM") == "1" {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signal.Notify(term, syscall.SIGTERM)
	}
	r := report{PID: os.Getpid(), Args: os.Args[1:], Env: map[string]string{}}
	if h := os.Getenv("OPENSHELL_SANDBOX_HOSTNAME"); h != "" {
		if err := syscall.Sethostname([]byte(h)); err != nil {
			r.HostnameErr = err.Error()
		}
	}
	r.Hostname, _ = os.Hostname()
	r.NetNS, _ = os.Readlink("/proc/self/ns/net")
	if ifs, err := net.Interfaces(); err == nil {
		for _, i := range ifs {
			r.Interfaces = append(r.Interfaces, i.Name)
		}
	}
	if b, err := os.ReadFile("/proc/self/uid_map"); err == nil {
		r.UIDMap = strings.Join(strings.Fields(string(b)), " ")
	}
	r.Cwd, _ = os.Getwd()
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		r.Env[k] = v
	}
	if p := os.Getenv("OPENSHELL_SANDBOX_TOKEN_FILE"); p != "" {
		if st, err := os.Stat(p); err == nil {
			r.TokenMode = st.Mode().Perm().String()
		}
		// Like openshell-sandbox: a handed-over fd is read, not re-opened.
		if n, err := strconv.Atoi(strings.TrimPrefix(p, "/proc/self/fd/")); err == nil && strings.HasPrefix(p, "/proc/self/fd/") {
			if b, err := io.ReadAll(os.NewFile(uintptr(n), p)); err == nil {
				r.TokenLen = len(b)
			}
		} else if b, err := os.ReadFile(p); err == nil {
			r.TokenLen = len(b)
		}
	}
	data, _ := json.Marshal(r)
	dir := os.Getenv("OPENSHELL_WORKSPACE_DIR")
	name := filepath.Join(dir, "report-"+os.Getenv("OPENSHELL_INSTANCE_ID")+".json")
	_ = os.WriteFile(name+".tmp", data, 0o644)
	_ = os.Rename(name+".tmp", name)
	if s := os.Getenv("FAKE_SUPERVISOR_EXIT"); s != "" {
		n, _ := strconv.Atoi(s)
		os.Exit(n)
	}
	if os.Getenv("FAKE_SUPERVISOR_IGNORE_TERM") == "1" {
		for {
			time.Sleep(time.Hour)
		}
	}
	<-term
}
