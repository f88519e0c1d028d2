package placeholder

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

var testNow = time.UnixMilli(1_700_000_000_000)

func testResolver(t testing.TB) *Resolver {
	t.Helper()
	set, err := NewSet([]Credential{
		{Key: "GITHUB_TOKEN", Value: "ghp_secret", Endpoints: []Endpoint{{Host: "api.github.com", Port: 443}, {Host: "github.com", Port: 443}}},
		{Key: "GRAPHQL_TOKEN", Value: "gql_secret", Endpoints: []Endpoint{{Host: "api.github.com", Port: 443, Path: "/graphql"}}},
		{Key: "BOT", Value: "123:ABC", Endpoints: []Endpoint{{Host: "api.telegram.org", Port: 443}}},
		{Key: "QUOTE", Value: `q"uo\te`, Endpoints: []Endpoint{{Host: "api.telegram.org", Port: 443}}},
		{Key: "S3", Value: "s3 secret/x", Endpoints: []Endpoint{{Host: "*.s3.amazonaws.com", Port: 443}}},
		{Key: "OLD", Value: "old_secret", ExpiresAtMs: testNow.UnixMilli(), Endpoints: []Endpoint{{Host: "api.github.com", Port: 443}}},
		{Key: "LATER", Value: "later_secret", ExpiresAtMs: testNow.UnixMilli() + 1, Endpoints: []Endpoint{{Host: "api.github.com", Port: 443}}},
		{Key: "SPLIT", Value: "a\r\nX-Injected: 1", Endpoints: []Endpoint{{Host: "api.github.com", Port: 443}}},
		{Key: "PLAIN", Value: "plain_secret", Endpoints: []Endpoint{{Host: "upstream.test", Port: 8080, Path: "/v1/**"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &Resolver{Now: func() time.Time { return testNow }}
	r.Install(set)
	return r
}

// parse reads a raw HTTP/1.1 request as the proxy does.
func parse(t testing.TB, raw string) *http.Request {
	t.Helper()
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
	if err != nil {
		t.Fatalf("ReadRequest(%q): %v", raw, err)
	}
	return req
}

// wire is req as the proxy forwards it.
func wire(t testing.TB, req *http.Request) string {
	t.Helper()
	var b strings.Builder
	req.RequestURI = ""
	if err := req.Write(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func basic(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestResolve(t *testing.T) {
	gh := For("GITHUB_TOKEN")
	for _, tc := range []struct {
		name   string
		host   string
		port   uint32
		raw    string
		status int
		want   []string // substrings of the forwarded request
	}{
		{name: "bearer header", host: "api.github.com", port: 443,
			raw:  "GET /user HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer " + gh + "\r\n\r\n",
			want: []string{"Authorization: Bearer ghp_secret\r\n"}},
		{name: "whole header value", host: "api.github.com", port: 443,
			raw:  "GET /user HTTP/1.1\r\nHost: api.github.com\r\nX-Api-Key: " + gh + "\r\n\r\n",
			want: []string{"X-Api-Key: ghp_secret\r\n"}},
		{name: "basic auth", host: "github.com", port: 443,
			raw:  "GET /x.git HTTP/1.1\r\nHost: github.com\r\nAuthorization: Basic " + basic("x-access-token:"+gh) + "\r\n\r\n",
			want: []string{"Authorization: Basic " + basic("x-access-token:ghp_secret") + "\r\n"}},
		{name: "query value", host: "api.telegram.org", port: 443,
			raw:  "GET /api?key=" + For("BOT") + "&n=1 HTTP/1.1\r\nHost: api.telegram.org\r\n\r\n",
			want: []string{"GET /api?key=123%3AABC&n=1 HTTP/1.1"}},
		{name: "percent-encoded query value", host: "api.telegram.org", port: 443,
			raw:  "GET /api?key=openshell%3Aresolve%3Aenv%3ABOT HTTP/1.1\r\nHost: api.telegram.org\r\n\r\n",
			want: []string{"GET /api?key=123%3AABC HTTP/1.1"}},
		{name: "path segment concatenated", host: "api.telegram.org", port: 443,
			raw:  "POST /bot" + For("BOT") + "/sendMessage HTTP/1.1\r\nHost: api.telegram.org\r\nContent-Length: 0\r\n\r\n",
			want: []string{"POST /bot123:ABC/sendMessage HTTP/1.1"}},
		{name: "wildcard host", host: "bucket.s3.amazonaws.com", port: 443,
			raw:  "GET / HTTP/1.1\r\nHost: bucket.s3.amazonaws.com\r\nX-Key: k=" + For("S3") + "\r\n\r\n",
			want: []string{"X-Key: k=s3 secret/x\r\n"}},
		{name: "two placeholders concatenated", host: "api.github.com", port: 443,
			raw:  "GET /user HTTP/1.1\r\nHost: api.github.com\r\nX-Both: " + gh + For("LATER") + "\r\n\r\n",
			want: []string{"X-Both: ghp_secretlater_secret\r\n"}},
		{name: "path-bound endpoint", host: "api.github.com", port: 443,
			raw:  "POST /graphql HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer " + For("GRAPHQL_TOKEN") + "\r\nContent-Length: 0\r\n\r\n",
			want: []string{"Authorization: Bearer gql_secret\r\n"}},
		{name: "path prefix endpoint", host: "upstream.test", port: 8080,
			raw:  "GET /v1/models HTTP/1.1\r\nHost: upstream.test\r\nAuthorization: Bearer " + For("PLAIN") + "\r\n\r\n",
			want: []string{"Authorization: Bearer plain_secret\r\n"}},
		{name: "no placeholder", host: "example.com", port: 80,
			raw:  "GET /a%2Fb?q=%41 HTTP/1.1\r\nHost: example.com\r\nAuthorization: Basic " + basic("u:p") + "\r\n\r\n",
			want: []string{"GET /a%2Fb?q=%41 HTTP/1.1", "Authorization: Basic " + basic("u:p")}},

		{name: "other host", host: "evil.example.com", port: 443, status: 403,
			raw: "GET / HTTP/1.1\r\nHost: evil.example.com\r\nAuthorization: Bearer " + gh + "\r\n\r\n"},
		{name: "other port", host: "api.github.com", port: 8443, status: 403,
			raw: "GET / HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer " + gh + "\r\n\r\n"},
		{name: "path outside the endpoint's path", host: "api.github.com", port: 443, status: 403,
			raw: "GET /user HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer " + For("GRAPHQL_TOKEN") + "\r\n\r\n"},
		{name: "path outside a prefix", host: "upstream.test", port: 8080, status: 403,
			raw: "GET /v10 HTTP/1.1\r\nHost: upstream.test\r\nAuthorization: Bearer " + For("PLAIN") + "\r\n\r\n"},
		{name: "other host in the query", host: "evil.example.com", port: 443, status: 403,
			raw: "GET /?k=" + gh + " HTTP/1.1\r\nHost: evil.example.com\r\n\r\n"},
		{name: "unknown key", host: "api.github.com", port: 443, status: 500,
			raw: "GET / HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer " + For("NOPE") + "\r\n\r\n"},
		{name: "malformed", host: "api.github.com", port: 443, status: 500,
			raw: "GET / HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer " + Prefix + "-x\r\n\r\n"},
		{name: "key starting with a digit", host: "api.github.com", port: 443, status: 500,
			raw: "GET / HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer " + Prefix + "1X\r\n\r\n"},
		{name: "expired", host: "api.github.com", port: 443, status: 500,
			raw: "GET / HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer " + For("OLD") + "\r\n\r\n"},
		{name: "header splitting value", host: "api.github.com", port: 443, status: 500,
			raw: "GET / HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer " + For("SPLIT") + "\r\n\r\n"},
		{name: "value unfit for a path", host: "bucket.s3.amazonaws.com", port: 443, status: 500,
			raw: "GET /" + For("S3") + " HTTP/1.1\r\nHost: bucket.s3.amazonaws.com\r\n\r\n"},
		{name: "cookie", host: "api.github.com", port: 443, status: 500,
			raw: "GET / HTTP/1.1\r\nHost: api.github.com\r\nCookie: t=" + gh + "\r\n\r\n"},
		{name: "header name", host: "api.github.com", port: 443, status: 500,
			raw: "GET / HTTP/1.1\r\nHost: api.github.com\r\nX-openshell%3Aresolve%3Aenv%3AGITHUB_TOKEN: 1\r\n\r\n"},
		{name: "percent-encoded in a header", host: "api.github.com", port: 443, status: 500,
			raw: "GET / HTTP/1.1\r\nHost: api.github.com\r\nX-Key: openshell%3Aresolve%3Aenv%3AGITHUB_TOKEN\r\n\r\n"},
		{name: "query parameter name", host: "api.github.com", port: 443, status: 500,
			raw: "GET /?" + gh + "=1 HTTP/1.1\r\nHost: api.github.com\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testResolver(t)
			req := parse(t, tc.raw)
			before := wire(t, parse(t, tc.raw))
			status, code, detail := r.Resolve(req, tc.host, tc.port)
			if status != tc.status {
				t.Fatalf("Resolve = %d %s %q, want %d", status, code, detail, tc.status)
			}
			got := wire(t, req)
			if tc.status != 0 {
				if got != before {
					t.Errorf("a refused request was changed:\n%s\nwant\n%s", got, before)
				}
				for _, secret := range []string{"secret", "GITHUB", "BOT", "OLD", Prefix, "123:ABC"} {
					if strings.Contains(code+detail, secret) {
						t.Errorf("refusal %q %q names %q", code, detail, secret)
					}
				}
				return
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("forwarded request lacks %q:\n%s", w, got)
				}
			}
			if strings.Contains(got, Prefix) {
				t.Errorf("forwarded request still holds a placeholder:\n%s", got)
			}
		})
	}
}

// TestResolveUpdates: an installed set replaces the previous one (a
// provider update resolves to the new value; a detached credential no
// longer resolves), and the zero Resolver refuses every placeholder.
func TestResolveUpdates(t *testing.T) {
	raw := "GET / HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer " + For("GITHUB_TOKEN") + "\r\n\r\n"
	var r Resolver
	if st, _, _ := r.Resolve(parse(t, raw), "api.github.com", 443); st != 500 {
		t.Errorf("zero Resolver = %d, want 500", st)
	}
	for _, v := range []string{"v1", "v2"} {
		set, err := NewSet([]Credential{{Key: "GITHUB_TOKEN", Value: v, Endpoints: []Endpoint{{Host: "api.github.com", Port: 443}}}})
		if err != nil {
			t.Fatal(err)
		}
		r.Install(set)
		req := parse(t, raw)
		if st, _, _ := r.Resolve(req, "API.GitHub.com.", 443); st != 0 || req.Header.Get("Authorization") != "Bearer "+v {
			t.Errorf("after installing %s: %d %q", v, st, req.Header.Get("Authorization"))
		}
	}
	empty, _ := NewSet(nil)
	r.Install(empty)
	if st, _, _ := r.Resolve(parse(t, raw), "api.github.com", 443); st != 500 {
		t.Errorf("after detaching = %d, want 500", st)
	}
}

func TestNewSetRefuses(t *testing.T) {
	ep := []Endpoint{{Host: "h", Port: 1}}
	for name, creds := range map[string][]Credential{
		"bad key":      {{Key: "A-B", Value: "topsecret", Endpoints: ep}},
		"no endpoints": {{Key: "A", Value: "topsecret"}},
		"no port":      {{Key: "A", Value: "topsecret", Endpoints: []Endpoint{{Host: "h"}}}},
		"no host":      {{Key: "A", Value: "topsecret", Endpoints: []Endpoint{{Port: 1}}}},
		"twice":        {{Key: "A", Value: "topsecret", Endpoints: ep}, {Key: "A", Value: "topsecret", Endpoints: ep}},
	} {
		_, err := NewSet(creds)
		if err == nil {
			t.Errorf("%s: NewSet succeeded", name)
			continue
		}
		if strings.Contains(err.Error(), "topsecret") {
			t.Errorf("%s: error %q names the value", name, err)
		}
	}
	set, _ := NewSet([]Credential{{Key: "A", Value: "topsecret", Endpoints: ep}})
	if s := fmt.Sprintf("%v %+v %#v %s", set, set, set, set); strings.Contains(s, "topsecret") {
		t.Errorf("formatting a Set shows the value: %s", s)
	}
}

func TestResolveBody(t *testing.T) {
	for _, tc := range []struct {
		name, ctype, body string
		status            int
		want              string
	}{
		{name: "json", ctype: "application/json", body: `{"token":"` + For("QUOTE") + `"}`, want: `{"token":"q\"uo\\te"}`},
		{name: "form", ctype: "application/x-www-form-urlencoded", body: "a=1&token=openshell%3Aresolve%3Aenv%3ABOT", want: "a=1&token=123%3AABC"},
		{name: "text", ctype: "text/plain; charset=utf-8", body: "key " + For("BOT"), want: "key 123:ABC"},
		{name: "binary is left alone", ctype: "application/octet-stream", body: For("BOT"), want: For("BOT")},
		{name: "other host", ctype: "text/plain", body: For("GITHUB_TOKEN"), status: 403},
		{name: "unknown", ctype: "application/json", body: `"` + For("NOPE") + `"`, status: 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testResolver(t)
			raw := fmt.Sprintf("POST /bot HTTP/1.1\r\nHost: api.telegram.org\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", tc.ctype, len(tc.body), tc.body)
			req := parse(t, raw)
			status, _, _ := r.ResolveBody(req, "api.telegram.org", 443)
			if status != tc.status {
				t.Fatalf("ResolveBody = %d, want %d", status, tc.status)
			}
			if status != 0 {
				return
			}
			b, _ := io.ReadAll(req.Body)
			if string(b) != tc.want || req.ContentLength != int64(len(tc.want)) {
				t.Errorf("body = %q (length %d), want %q", b, req.ContentLength, tc.want)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	var r Resolver
	for in, want := range map[string]string{
		"/bot" + For("BOT") + "/send":          "/bot[CREDENTIAL]/send",
		"/a/" + For("A") + For("B"):            "/a/[CREDENTIAL][CREDENTIAL]",
		"/plain":                               "/plain",
		"/x/openshell%3Aresolve%3Aenv%3ABOT/y": "[CREDENTIAL]",
		"/" + Prefix:                           "/[CREDENTIAL]",
	} {
		if got := r.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
