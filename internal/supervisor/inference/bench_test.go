package inference

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
)

// BenchmarkRouter measures what the router adds to a request: each
// iteration sends the same chat completion to a loopback fake upstream
// directly and through the router (body and header shaping, the second
// hop; the proxy in front is the tests' stand-in, which reads requests as
// the egress proxy does, without its caller identification per
// connection), interleaved, over kept-alive connections. It
// reports both p50s, the added time and the ratio; "stream" measures the
// time to the first body byte of an SSE answer.
func BenchmarkRouter(b *testing.B) {
	const reqBody = `{"model":"client-model","messages":[{"role":"user","content":"hello"}],"max_tokens":16}`
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.Contains(r.URL.RawQuery, "stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		_, _ = io.WriteString(w, `{"id":"x","choices":[{"message":{"role":"assistant","content":"hi"}}]}`)
	}))
	b.Cleanup(upstream.Close)
	r := New(Options{})
	r.Set(bundleOf(&inferencev1.ResolvedRoute{Name: "inference.local", BaseUrl: upstream.URL + "/v1",
		Protocols: []string{"openai_chat_completions"}, ApiKey: "sk-bench", ModelId: "gpt-bench", ProviderType: "openai"}))
	proxied := agentClient(serveProxy(b, r))
	direct := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	b.Cleanup(proxied.CloseIdleConnections)
	b.Cleanup(direct.CloseIdleConnections)

	// once sends one request and returns the time to the first body byte
	// (stream) or to the end of the body.
	once := func(c *http.Client, url string, stream bool) time.Duration {
		req, _ := http.NewRequestWithContext(b.Context(), http.MethodPost, url, strings.NewReader(reqBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer sandbox-fake")
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		var d time.Duration
		if stream {
			br := bufio.NewReader(resp.Body)
			if _, err := br.ReadByte(); err != nil {
				b.Fatal(err)
			}
			d = time.Since(start)
			_, _ = io.Copy(io.Discard, br)
		} else {
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				b.Fatal(err)
			}
			d = time.Since(start)
		}
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return d
	}
	for _, tc := range []struct {
		name   string
		stream bool
	}{{"request", false}, {"stream-first-byte", true}} {
		b.Run(tc.name, func(b *testing.B) {
			q := ""
			if tc.stream {
				q = "?stream=1"
			}
			var ds, rs []time.Duration
			for b.Loop() {
				ds = append(ds, once(direct, upstream.URL+"/v1/chat/completions"+q, tc.stream))
				rs = append(rs, once(proxied, "http://inference.local/v1/chat/completions"+q, tc.stream))
			}
			dp, rp := p50(ds), p50(rs)
			b.ReportMetric(float64(dp)/1e3, "direct-p50-µs")
			b.ReportMetric(float64(rp)/1e3, "router-p50-µs")
			b.ReportMetric(float64(rp-dp)/1e3, "added-p50-µs")
			b.ReportMetric(float64(rp)/float64(dp), "ratio")
		})
	}
}

func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
