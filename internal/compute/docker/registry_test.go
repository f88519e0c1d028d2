package docker_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serveImage serves a one-layer image (a file in /etc) as name:tag from a
// minimal registry (the Registry HTTP API v2, read-only) on loopback, which
// the Engine pulls from without TLS, and returns its reference. With hold
// non-nil, blob downloads wait until it is closed.
func serveImage(t *testing.T, name, tag string, hold <-chan struct{}) string {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	content := []byte("served by the test registry\n")
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "etc/", Mode: 0o755, ModTime: time.Now()})
	_ = tw.WriteHeader(&tar.Header{Name: "etc/served", Mode: 0o644, Size: int64(len(content)), ModTime: time.Now()})
	_, _ = tw.Write(content)
	_ = tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(raw.Bytes())
	_ = zw.Close()
	digest := func(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "config": map[string]any{},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{digest(raw.Bytes())}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.docker.distribution.manifest.v2+json",
		"config":        map[string]any{"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(cfg), "digest": digest(cfg)},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": gz.Len(), "digest": digest(gz.Bytes())}},
	})
	blobs := map[string][]byte{digest(cfg): cfg, digest(gz.Bytes()): gz.Bytes()}
	mux := http.NewServeMux()
	mux.HandleFunc("/v2/", func(w http.ResponseWriter, r *http.Request) {
		p := strings.TrimPrefix(r.URL.Path, "/v2/")
		switch {
		case p == "":
			w.WriteHeader(http.StatusOK)
		case p == name+"/manifests/"+tag || p == name+"/manifests/"+digest(manifest):
			w.Header().Set("Content-Type", "application/vnd.docker.distribution.manifest.v2+json")
			w.Header().Set("Docker-Content-Digest", digest(manifest))
			w.Header().Set("Content-Length", fmt.Sprint(len(manifest)))
			if r.Method != http.MethodHead {
				_, _ = w.Write(manifest)
			}
		case strings.HasPrefix(p, name+"/blobs/"):
			if hold != nil {
				select {
				case <-hold:
				case <-r.Context().Done():
					return
				}
			}
			b, ok := blobs[strings.TrimPrefix(p, name+"/blobs/")]
			if !ok {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			if r.Method != http.MethodHead {
				_, _ = w.Write(b)
			}
		default:
			http.NotFound(w, r)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String() + "/" + name + ":" + tag
}
