package server

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/openshell-go/openshell/internal/citest"
)

// TestHTTP2SettingsNeverChangeNoRFC7540Priorities speaks HTTP/2 frame by
// frame, as nghttp2 (curl) checks it: a server must not change
// SETTINGS_NO_RFC7540_PRIORITIES after its first SETTINGS frame (RFC 9218
// §2.1). The listener's sniffing SETTINGS frame comes first, the HTTP/2
// server's own frame second; they must agree.
func TestHTTP2SettingsNeverChangeNoRFC7540Priorities(t *testing.T) {
	f := newFixture(t)
	_, addr := startServer(t, f.fullOptions(t, true))
	for _, useTLS := range []bool{false, true} {
		name := "h2c"
		if useTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			var c net.Conn
			var err error
			if useTLS {
				conf := f.clientTLS()
				conf.NextProtos = []string{"h2"}
				c, err = tls.Dial("tcp", addr, conf)
			} else {
				c, err = net.Dial("tcp", addr)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
				t.Fatal(err)
			}
			fr := http2.NewFramer(c, c)
			fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			if err := fr.WriteSettings(); err != nil {
				t.Fatal(err)
			}
			var hb strings.Builder
			enc := hpack.NewEncoder(&hb)
			for _, hf := range []hpack.HeaderField{
				{Name: ":method", Value: "GET"}, {Name: ":path", Value: "/healthz"},
				{Name: ":scheme", Value: "http"}, {Name: ":authority", Value: addr},
			} {
				if err := enc.WriteField(hf); err != nil {
					t.Fatal(err)
				}
			}
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte(hb.String()), EndStream: true, EndHeaders: true}); err != nil {
				t.Fatal(err)
			}
			var first map[http2.SettingID]uint32
			for {
				fm, err := fr.ReadFrame()
				if err != nil {
					t.Fatalf("ReadFrame() = %v before the response", err)
				}
				switch fm := fm.(type) {
				case *http2.SettingsFrame:
					if fm.IsAck() {
						continue
					}
					if err := fr.WriteSettingsAck(); err != nil {
						t.Fatal(err)
					}
					if first == nil {
						first = map[http2.SettingID]uint32{}
						_ = fm.ForeachSetting(func(s http2.Setting) error { first[s.ID] = s.Val; return nil })
						continue
					}
					if v, ok := fm.Value(http2.SettingNoRFC7540Priorities); ok && v != first[http2.SettingNoRFC7540Priorities] {
						t.Fatalf("server changed SETTINGS_NO_RFC7540_PRIORITIES from %d (first SETTINGS) to %d", first[http2.SettingNoRFC7540Priorities], v)
					}
				case *http2.MetaHeadersFrame:
					if got := fm.PseudoValue("status"); got != "200" {
						t.Fatalf("GET /healthz over HTTP/2 = %s, want 200", got)
					}
					return
				case *http2.GoAwayFrame:
					t.Fatalf("server sent GOAWAY %v before the response", fm.ErrCode)
				}
			}
		})
	}
}

// TestHTTPEndpointsWithCurl runs the real curl binary with its default
// protocol negotiation (ALPN h2 over TLS, with and without a client
// certificate) and with HTTP/2 prior knowledge and HTTP/1.1 on plaintext.
func TestHTTPEndpointsWithCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		citest.SkipOrFail(t, "curl not found: %v", err)
	}
	f := newFixture(t)
	_, addr := startServer(t, f.fullOptions(t, true))
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	writePEM(t, caFile, "CERTIFICATE", f.ca.cert.Raw)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writePEM(t, certFile, "CERTIFICATE", f.userCert.Certificate[0])
	keyDER, err := x509.MarshalPKCS8PrivateKey(f.userCert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)

	cases := []struct {
		name      string
		args      []string
		wantProto string
	}{
		{"tls-default", []string{"--cacert", caFile}, "2"},
		{"mtls-default", []string{"--cacert", caFile, "--cert", certFile, "--key", keyFile}, "2"},
		{"tls-http1.1", []string{"--cacert", caFile, "--http1.1"}, "1.1"},
		{"h2c-prior-knowledge", []string{"--http2-prior-knowledge"}, "2"},
		{"plaintext-default", nil, "1.1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			scheme := "http"
			if strings.Contains(tc.name, "tls") {
				scheme = "https"
			}
			for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
				args := append([]string{"-sS", "--max-time", "10", "-o", os.DevNull, "-w", "%{http_code} %{http_version}"}, tc.args...)
				out, err := exec.CommandContext(t.Context(), curl, append(args, scheme+"://"+addr+p)...).CombinedOutput()
				if got, want := strings.TrimSpace(string(out)), "200 "+tc.wantProto; err != nil || got != want {
					t.Errorf("curl %s %s = %q, %v, want %q", strings.Join(tc.args, " "), p, got, err, want)
				}
			}
		})
	}
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSeparateListenersSpeakH2C: the optional health and metrics
// listeners answer HTTP/1.1 and HTTP/2 with prior knowledge too.
func TestSeparateListenersSpeakH2C(t *testing.T) {
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ml, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	startServer(t, Options{HealthListener: hl, MetricsListener: ml})
	h2c := &http.Protocols{}
	h2c.SetUnencryptedHTTP2(true)
	h1 := &http.Protocols{}
	h1.SetHTTP1(true)
	for _, tc := range []struct {
		protos *http.Protocols
		want   string
	}{{h1, "HTTP/1.1"}, {h2c, "HTTP/2.0"}} {
		tr := &http.Transport{Protocols: tc.protos}
		t.Cleanup(tr.CloseIdleConnections)
		c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		for _, u := range []string{"http://" + hl.Addr().String() + "/readyz", "http://" + ml.Addr().String() + "/metrics"} {
			if code, _, proto := httpGet(t, c, u); code != http.StatusOK || proto != tc.want {
				t.Errorf("GET %s = %d %s, want 200 %s", u, code, proto, tc.want)
			}
		}
	}
}
