package gatewaytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/securityevent"
)

// TestOCSFJSONFile: a real sandbox (process driver) whose policy lets the
// agent read /var/log. With ocsf_json_enabled unset, a denied request
// leaves a shorthand line in /var/log/openshell.<UTC date>.log and no
// /var/log/openshell-ocsf.*.log. Set on the sandbox through
// UpdateConfig, the running supervisor picks it up: a denied forward
// request and a denied CONNECT appear in /var/log/openshell-ocsf.<UTC
// date>.log, read from inside the sandbox, as OCSF HTTP and Network
// Activity records of openshell-sandbox with the sandbox as subject; the
// header secret, the query string and the credential placeholder the
// request carried are not in the file. The agent (uid sandbox) can read
// the files but cannot append to, truncate, replace, rename or remove
// them, nor create a file next to them. Set false again, new denials add nothing.
func TestOCSFJSONFile(t *testing.T) {
	const (
		headerSecret = "planted-header-secret-7a41"
		querySecret  = "planted-query-secret-c93e"
		placeholder  = "openshell:resolve:env:PLANTED_OCSF_KEY"
	)
	curl, port, portN := egressUpstream(t)
	g := Start(t, Options{Env: []string{"OPENSHELL_EGRESS_TEST_HOSTS=allowed.test=127.0.0.1,denied.ocsf.test=127.0.0.1,after.ocsf.test=127.0.0.1"}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"upstream": {
			Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: portN, AllowedIps: []string{"127.0.0.1"}}},
			Binaries:  []*sandboxv1.NetworkBinary{{Path: curl}},
		},
	})
	pol.Filesystem.ReadOnly = append(pol.Filesystem.ReadOnly, "/var/log")
	const name = "ocsf-file"
	id := createEgressSandbox(ctx, t, c, name, &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol})
	waitEgressLoaded(ctx, t, c, name, "")
	sh := func(script string) (string, int) {
		t.Helper()
		out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatalf("exec %q: %v (stderr %q)", script, err, errOut)
		}
		return strings.TrimSpace(out), int(code)
	}
	denyHTTP := fmt.Sprintf("%s -s -o /dev/null -w '%%{http_code}' -H 'Authorization: Bearer %s' -H 'X-Key: %s' 'http://denied.ocsf.test:%s/ocsf-path/?token=%s&key=%s'", curl, headerSecret, placeholder, port, querySecret, placeholder)
	denyConnect := fmt.Sprintf("%s -s -p -o /dev/null -w '%%{http_connect}' 'http://denied.ocsf.test:%s/'", curl, port)
	setOCSF := func(on bool) {
		t.Helper()
		if _, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: name, SettingKey: "ocsf_json_enabled",
			SettingValue: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: on}}}); err != nil {
			t.Fatalf("UpdateConfig(ocsf_json_enabled %v): %v", on, err)
		}
	}

	// waitShort polls the shorthand file(s) for a line containing want.
	waitShort := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if out, _ := sh("cat /var/log/openshell.*.log 2>/dev/null"); strings.Contains(out, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no shorthand line with %q in /var/log within 30s", want)
			}
		}
	}

	// Off: the decision reaches the gateway and the shorthand file, no
	// OCSF file.
	day0 := time.Now().UTC().Format(time.DateOnly)
	if out, _ := sh(denyHTTP); out != "403" {
		t.Fatalf("denied request = %q, want 403", out)
	}
	waitEgressEvents(ctx, t, c, id, map[string]func(map[string]string) bool{
		"deny": func(f map[string]string) bool { return f["decision"] == "deny" && f["host"] == "denied.ocsf.test" },
	})
	wantShort := "DENIED http " + curl + " -> denied.ocsf.test:" + port + " GET reason: "
	waitShort(wantShort)
	day1 := time.Now().UTC().Format(time.DateOnly)
	short := "openshell." + day1 + ".log"
	if out, code := sh("ls -A /var/log"); code != 0 || (out != short && out != "openshell."+day0+".log") {
		t.Fatalf("/var/log with ocsf_json_enabled unset: %q (exit %d), want only %s", out, code, short)
	} else {
		short = "/var/log/" + out
	}

	// On: the running supervisor reads it from its config poll.
	setOCSF(true)
	var data string
	for deadline := time.Now().Add(30 * time.Second); ; {
		if out, _ := sh(denyHTTP); out != "403" {
			t.Fatalf("denied request = %q, want 403", out)
		}
		out, code := sh("cat /var/log/openshell-ocsf.*.log 2>/dev/null")
		if code == 0 && strings.Contains(out, `"hostname":"denied.ocsf.test"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no OCSF line in /var/log within 30s of setting ocsf_json_enabled (ls: %q)", func() string { s, _ := sh("ls -la /var/log"); return s }())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, _ := sh(denyConnect); out != "403" {
		t.Fatalf("denied CONNECT = %q, want 403", out)
	}
	before := time.Now().UTC().Format(time.DateOnly)
	var recs []securityevent.Record
	var connect, httpDeny *securityevent.Record
	for deadline := time.Now().Add(30 * time.Second); connect == nil; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no Network Activity record of the denied CONNECT in the OCSF file:\n%s", data)
		}
		data, _ = sh("cat /var/log/openshell-ocsf.*.log")
		recs, connect, httpDeny = nil, nil, nil
		for _, line := range bytes.Split([]byte(data), []byte("\n")) {
			var r securityevent.Record
			if err := json.Unmarshal(line, &r); err != nil {
				t.Fatalf("OCSF file line %q: %v", line, err)
			}
			recs = append(recs, r)
			if r.DstEndpoint == nil || r.DstEndpoint.Hostname != "denied.ocsf.test" || r.Action != "Denied" {
				continue
			}
			switch r.ClassUID {
			case int(securityevent.NetworkActivity):
				connect = &recs[len(recs)-1]
			case int(securityevent.HTTPActivity):
				httpDeny = &recs[len(recs)-1]
			}
		}
	}
	after := time.Now().UTC().Format(time.DateOnly)
	file, _ := sh("ls /var/log/openshell-ocsf.*")
	if file != "/var/log/openshell-ocsf."+before+".log" && file != "/var/log/openshell-ocsf."+after+".log" {
		t.Errorf("OCSF files %q, want only /var/log/openshell-ocsf.%s.log", file, after)
	}
	for _, r := range recs {
		if r.Metadata.Product.Name != securityevent.SandboxProduct || r.Unmapped["sandbox_id"] != id || r.Metadata.Version != securityevent.OCSFVersion {
			t.Errorf("record %+v: want product %s, sandbox %s, OCSF %s", r, securityevent.SandboxProduct, id, securityevent.OCSFVersion)
		}
	}
	if httpDeny == nil || httpDeny.ClassName != "HTTP Activity" || httpDeny.Disposition != "Blocked" || httpDeny.StatusDetail == "" ||
		httpDeny.HTTPRequest == nil || httpDeny.HTTPRequest.Method != "GET" || httpDeny.HTTPRequest.URL == nil ||
		httpDeny.HTTPRequest.URL.Hostname != "denied.ocsf.test" || httpDeny.DstEndpoint.Port != int(portN) ||
		httpDeny.Actor == nil || httpDeny.Actor.Process == nil || httpDeny.Actor.Process.Name != curl {
		t.Errorf("denied HTTP record = %+v, want HTTP Activity, Blocked with a reason, GET denied.ocsf.test, port %d, actor %s", httpDeny, portN, curl)
	}
	if connect.ClassName != "Network Activity" || connect.Disposition != "Blocked" || connect.Unmapped["kind"] != "connect" {
		t.Errorf("denied CONNECT record = %+v, want Network Activity, Blocked, kind connect", connect)
	}
	for _, s := range []string{headerSecret, querySecret, "token=", "PLANTED_OCSF_KEY", "openshell:resolve:", "Authorization"} {
		if strings.Contains(data, s) {
			t.Errorf("the OCSF file contains %q", s)
		}
	}

	// The agent reads the file; it cannot change it or the directory.
	if out, _ := sh("id -un; stat -c '%a %u' /var/log " + file + " " + short); out != "sandbox\n755 0\n644 0\n644 0" {
		t.Errorf("agent user, modes and owners of /var/log, the OCSF and the shorthand file = %q, want sandbox, 755 0, 644 0, 644 0", out)
	}
	ls, _ := sh("ls -A /var/log")
	sizes, _ := sh("wc -c " + file + " " + short)
	for _, attempt := range []string{
		"echo forged >> " + file,
		"echo forged >> " + short,
		": > " + file,
		"truncate -s 0 " + file,
		"rm -f " + file,
		"mv " + file + " /var/log/moved.log",
		"echo forged > /var/log/openshell-ocsf.2099-01-01.log",
		"ln -s /tmp/x /var/log/openshell-ocsf.2099-01-02.log",
		"mkdir /var/log/sub",
		"umount /var/log",
	} {
		if out, code := sh("(" + attempt + ") 2>/dev/null; echo $?"); code != 0 || out == "0" {
			t.Errorf("agent %q: status %q (exit %d), want it refused", attempt, out, code)
		}
	}
	if now, _ := sh("wc -c " + file + " " + short); now != sizes {
		t.Errorf("file sizes after the agent's attempts = %q, were %q", now, sizes)
	}
	if now, _ := sh("ls -A /var/log"); now != ls {
		t.Errorf("/var/log after the agent's attempts = %q, was %q", now, ls)
	}

	// Off again: new denials are not written to the OCSF file.
	setOCSF(false)
	waitLogLine(ctx, t, c, id, "OCSF JSON log disabled")
	lines, _ := sh("cat /var/log/openshell-ocsf.*.log | wc -l")
	if out, _ := sh(strings.Replace(denyHTTP, "denied.ocsf.test", "after.ocsf.test", 1)); out != "403" {
		t.Fatalf("denied request = %q, want 403", out)
	}
	// The supervisor's writer handles a decision's OCSF line before its
	// shorthand line.
	waitShort("DENIED http " + curl + " -> after.ocsf.test:")
	if now, _ := sh("cat /var/log/openshell-ocsf.*.log | wc -l"); now != lines {
		t.Errorf("OCSF file lines after ocsf_json_enabled false = %s, was %s", now, lines)
	}
}

// waitLogLine polls the sandbox's supervisor log lines for up to 30 s for
// one whose message is msg.
func waitLogLine(ctx context.Context, t testing.TB, c openshellv1.OpenShellClient, id, msg string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := c.GetSandboxLogs(ctx, &openshellv1.GetSandboxLogsRequest{SandboxId: id, Sources: []string{"sandbox"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range resp.GetLogs() {
			if l.GetMessage() == msg {
				return
			}
		}
	}
	t.Fatalf("no supervisor log line %q within 30s", msg)
}
