package gatewaytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// fakeModel is a loopback OpenAI- or Anthropic-compatible upstream. It
// records the credential and model of every request and, for streaming
// requests, sends its first event and then waits for release before
// finishing the stream.
type fakeModel struct {
	srv      *httptest.Server
	seen     chan string // "<path> <credential> <model>"
	release  chan struct{}
	finished atomic.Bool // a streaming answer completed
}

func newFakeModel(t *testing.T, credHeader string) *fakeModel {
	t.Helper()
	f := &fakeModel{seen: make(chan string, 64), release: make(chan struct{})}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		model, _ := body["model"].(string)
		f.seen <- r.URL.Path + " " + r.Header.Get(credHeader) + " " + model
		if stream, _ := body["stream"].(bool); !stream {
			fmt.Fprintf(w, `{"answer":"from %s"}`, r.URL.Path)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: chunk-1\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-f.release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: chunk-2\n\ndata: [DONE]\n\n")
		f.finished.Store(true)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// next returns the next recorded request or fails after 10 s.
func (f *fakeModel) next(t *testing.T) string {
	t.Helper()
	select {
	case s := <-f.seen:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("the fake upstream saw no request")
		return ""
	}
}

// TestInferenceLocal: a real gateway, supervisor and sandbox whose policy
// has no network rule at all. curl http://inference.local (and
// https://, TLS terminated by the proxy) inside the sandbox reaches the
// loopback fake OpenAI upstream with the provider's
// real key (the agent's key is dropped, the route's model applied) while
// the sandbox environment never holds the key; a streamed answer reaches
// the agent chunk by chunk (the first event is read inside the sandbox
// while the upstream still holds the rest); pointing the route at an
// Anthropic provider takes effect in the running sandbox; after the
// route is deleted the router answers 503. Each request is logged as an
// inference decision.
func TestInferenceLocal(t *testing.T) {
	curl := requireCurl(t)
	openai := newFakeModel(t, "Authorization")
	anthropic := newFakeModel(t, "X-Api-Key")
	g := Start(t, Options{})
	c := g.Client()
	inf := inferencev1.NewInferenceClient(g.Conn())
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const openaiKey, anthropicKey = "sk-e2e-openai-real-4711", "ak-e2e-anthropic-real-0815"
	for _, p := range []*datamodelv1.Provider{
		{Metadata: &datamodelv1.ObjectMeta{Name: "oa"}, Type: "openai",
			Credentials: map[string]string{"OPENAI_API_KEY": openaiKey}, Config: map[string]string{"OPENAI_BASE_URL": openai.srv.URL + "/v1"}},
		{Metadata: &datamodelv1.ObjectMeta{Name: "an"}, Type: "anthropic",
			Credentials: map[string]string{"ANTHROPIC_API_KEY": anthropicKey}, Config: map[string]string{"ANTHROPIC_BASE_URL": anthropic.srv.URL + "/v1"}},
	} {
		if _, err := c.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: p}); err != nil {
			t.Fatalf("CreateProvider %s: %v", p.GetMetadata().GetName(), err)
		}
	}
	// Verified: the gateway probes the fake with the real key.
	set, err := inf.SetInferenceRoute(ctx, &inferencev1.SetInferenceRouteRequest{ProviderName: "oa", ModelId: "gpt-e2e"})
	if err != nil {
		t.Fatalf("SetInferenceRoute: %v", err)
	}
	if !set.GetValidationPerformed() || openai.next(t) != "/v1/chat/completions Bearer "+openaiKey+" gpt-e2e" {
		t.Errorf("verification: performed=%v", set.GetValidationPerformed())
	}

	id := createEgressSandbox(ctx, t, c, "inf", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: egressPolicy(nil)})
	waitEgressLoaded(ctx, t, c, "inf", "")
	sh := func(script string) string {
		t.Helper()
		out, errOut, _, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatalf("exec %q: %v (stderr %q)", script, err, errOut)
		}
		return strings.TrimSpace(out)
	}
	if env := sh("env"); strings.Contains(env, openaiKey) || strings.Contains(env, anthropicKey) {
		t.Fatalf("the sandbox environment holds a provider key:\n%s", env)
	}
	chat := curl + ` -s -w ' %{http_code}' http://inference.local/v1/chat/completions -H 'Authorization: Bearer sandbox-fake' -H 'Content-Type: application/json' -d '{"model":"anything","messages":[]}'`
	if out := sh(chat); out != `{"answer":"from /v1/chat/completions"} 200` {
		t.Errorf("chat completions = %q", out)
	}
	if s := openai.next(t); s != "/v1/chat/completions Bearer "+openaiKey+" gpt-e2e" {
		t.Errorf("the upstream saw %q, want the real key and the route's model", s)
	}
	// https://inference.local: the proxy terminates TLS with the sandbox
	// CA, which curl trusts through CURL_CA_BUNDLE.
	if out := sh(strings.Replace(chat, "http://", "https://", 1)); out != `{"answer":"from /v1/chat/completions"} 200` {
		t.Errorf("chat completions over https = %q", out)
	}
	if s := openai.next(t); s != "/v1/chat/completions Bearer "+openaiKey+" gpt-e2e" {
		t.Errorf("the upstream saw %q over https", s)
	}

	t.Run("streaming", func(t *testing.T) {
		stream, err := c.ExecSandbox(ctx, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c",
			curl + ` -sN http://inference.local/v1/chat/completions -d '{"stream":true,"messages":[]}'`}})
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		released := false
		for {
			ev, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("exec stream: %v (stdout so far %q)", err, out.String())
			}
			out.Write(ev.GetStdout().GetData())
			if !released && strings.Contains(out.String(), "data: chunk-1") {
				if openai.finished.Load() {
					t.Error("the first event arrived only after the upstream finished")
				}
				released = true
				close(openai.release)
			}
			if x := ev.GetExit(); x != nil && x.GetExitCode() != 0 {
				t.Errorf("streaming curl exited %d", x.GetExitCode())
			}
		}
		if !released {
			t.Fatalf("the first event never arrived; stdout %q", out.String())
		}
		if out.String() != "data: chunk-1\n\ndata: chunk-2\n\ndata: [DONE]\n\n" {
			t.Errorf("stream = %q", out.String())
		}
		openai.next(t)
	})

	// The route moves to the Anthropic provider: the running sandbox
	// follows without a restart.
	if _, err := inf.SetInferenceRoute(ctx, &inferencev1.SetInferenceRouteRequest{ProviderName: "an", ModelId: "claude-e2e", NoVerify: true}); err != nil {
		t.Fatalf("SetInferenceRoute an: %v", err)
	}
	messages := curl + ` -s -w ' %{http_code}' http://inference.local/v1/messages -H 'x-api-key: sandbox-fake' -d '{"model":"x","max_tokens":1,"messages":[]}'`
	var out string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if out = sh(messages); strings.HasSuffix(out, " 200") {
			break
		}
	}
	if out != `{"answer":"from /v1/messages"} 200` {
		t.Fatalf("messages after the route change = %q", out)
	}
	if s := anthropic.next(t); s != "/v1/messages "+anthropicKey+" claude-e2e" {
		t.Errorf("the Anthropic upstream saw %q", s)
	}
	if out := sh(chat); !strings.Contains(out, "no compatible inference route available") || !strings.HasSuffix(out, " 400") {
		t.Errorf("chat completions on an Anthropic route = %q, want 400", out)
	}

	if _, err := inf.DeleteInferenceRoute(ctx, &inferencev1.DeleteInferenceRouteRequest{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if out = sh(messages); strings.HasSuffix(out, " 503") {
			break
		}
	}
	if !strings.Contains(out, `"error":"cluster inference is not configured"`) || !strings.HasSuffix(out, " 503") {
		t.Errorf("after delete = %q, want 503 cluster inference is not configured", out)
	}
	waitInferenceEvents(ctx, t, c, id, []string{openaiKey, anthropicKey}, map[string]func(map[string]string) bool{
		"allow chat": func(f map[string]string) bool {
			return f["decision"] == "allow" && f["path"] == "/v1/chat/completions" && f["status"] == "200" && f["binary"] == curl
		},
		"deny after delete": func(f map[string]string) bool { return f["decision"] == "deny" && f["status"] == "503" },
	})
}

// waitInferenceEvents polls the sandbox's log stream for up to 30 s until
// every matcher has matched an inference decision event, failing on an
// event that carries one of the secrets.
func waitInferenceEvents(ctx context.Context, t *testing.T, c openshellv1.OpenShellClient, id string, secrets []string, want map[string]func(map[string]string) bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); len(want) > 0 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		resp, err := c.GetSandboxLogs(ctx, &openshellv1.GetSandboxLogsRequest{SandboxId: id, Sources: []string{"sandbox"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range resp.GetLogs() {
			text := fmt.Sprint(l.GetMessage(), l.GetFields())
			for _, s := range secrets {
				if strings.Contains(text, s) {
					t.Fatalf("a sandbox log line carries a provider key: %v", l)
				}
			}
			if l.GetTarget() != "openshell_sandbox::inference" {
				continue
			}
			for k, match := range want {
				if match(l.GetFields()) {
					delete(want, k)
				}
			}
		}
	}
	for k := range want {
		t.Errorf("no %q inference decision in GetSandboxLogs", k)
	}
}
