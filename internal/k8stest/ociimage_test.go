package k8stest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteOCIArchive checks the layout `ctr images import` reads: every blob
// is stored under its own digest, the index names the image, and the
// manifest's config and layer point at stored blobs whose diff_id matches.
func TestWriteOCIArchive(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "img.tar")
	img := Image{
		Name:       "docker.io/openshell-test/x:local",
		Entrypoint: []string{"/bin/x"},
		Files: []ImageFile{
			{Path: "/bin/x", Mode: 0o755, Data: []byte("#!x")},
			{Path: "bin/sh", Link: "x"},
		},
	}
	if err := WriteOCIArchive(dst, img); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
	for name, b := range files {
		if d, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			sum := sha256.Sum256(b)
			if hex.EncodeToString(sum[:]) != d {
				t.Errorf("blob %s holds content of digest %x", name, sum)
			}
		}
	}
	blob := func(digest string) []byte {
		t.Helper()
		b, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
		if !ok {
			t.Fatalf("blob %s missing", digest)
		}
		return b
	}
	type desc struct {
		Digest      string            `json:"digest"`
		Size        int               `json:"size"`
		Annotations map[string]string `json:"annotations"`
	}
	var index struct{ Manifests []desc }
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json = %s (%v)", files["index.json"], err)
	}
	if got := index.Manifests[0].Annotations["io.containerd.image.name"]; got != img.Name {
		t.Errorf("image name annotation = %q, want %q", got, img.Name)
	}
	var manifest struct {
		Config desc
		Layers []desc
	}
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v", err)
	}
	var config struct {
		Config struct{ Entrypoint []string }
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(blob(manifest.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	if len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != manifest.Layers[0].Digest {
		t.Errorf("diff_ids %v do not match the layer %s", config.RootFS.DiffIDs, manifest.Layers[0].Digest)
	}
	if strings.Join(config.Config.Entrypoint, " ") != "/bin/x" {
		t.Errorf("entrypoint = %v", config.Config.Entrypoint)
	}
	layer := tar.NewReader(bytes.NewReader(blob(manifest.Layers[0].Digest)))
	var entries []string
	for {
		h, err := layer.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, h.Name+"->"+h.Linkname)
	}
	if got, want := strings.Join(entries, " "), "bin/-> bin/sh->x bin/x->"; got != want {
		t.Errorf("layer entries = %q, want %q (parents first)", got, want)
	}
}
