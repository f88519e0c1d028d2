package k8stest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"
)

// ImageFile is one entry of a locally built image's single layer.
type ImageFile struct {
	// Path inside the image, without a leading slash ("bin/busybox").
	Path string
	// Mode is the permission bits (0o755 for executables).
	Mode int64
	// Data is the content of a regular file; ignored for links and dirs.
	Data []byte
	// Link makes the entry a symlink to Link.
	Link string
	// Dir makes the entry a directory.
	Dir bool
}

// Image describes an image built on the machine, never pulled.
type Image struct {
	// Name is the full reference, "docker.io/openshell-test/busybox:local".
	Name       string
	Files      []ImageFile
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
}

// epoch keeps the archives byte-for-byte reproducible.
var epoch = time.Unix(0, 0).UTC()

// WriteOCIArchive writes img as an OCI image-layout tar archive (one
// uncompressed layer, platform linux/GOARCH) that `ctr images import`
// accepts; the index carries the name in the io.containerd.image.name
// annotation.
func WriteOCIArchive(dst string, img Image) error {
	layer, err := layerTar(img.Files)
	if err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	layerDigest := digest(layer)
	env := img.Env
	if env == nil {
		env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	config, err := json.Marshal(map[string]any{
		"created":      epoch.Format(time.RFC3339),
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": img.Entrypoint,
			"Cmd":        img.Cmd,
			"Env":        env,
			"WorkingDir": img.WorkingDir,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config, nil),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar", layer, nil)},
	})
	if err != nil {
		return err
	}
	tag := img.Name[strings.LastIndex(img.Name, ":")+1:]
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []any{descriptor("application/vnd.oci.image.manifest.v1+json", manifest, map[string]any{
			"annotations": map[string]string{
				"io.containerd.image.name":          img.Name,
				"org.opencontainers.image.ref.name": tag,
			},
			"platform": map[string]string{"architecture": runtime.GOARCH, "os": "linux"},
		})},
	})
	if err != nil {
		return err
	}

	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	blobs := [][]byte{layer, config, manifest}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add("index.json", index); err != nil {
		return err
	}
	for _, b := range blobs {
		if err := add("blobs/sha256/"+strings.TrimPrefix(digest(b), "sha256:"), b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(dst, out.Bytes(), 0o644)
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func descriptor(mediaType string, b []byte, extra map[string]any) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
	for k, v := range extra {
		d[k] = v
	}
	return d
}

// layerTar builds the layer with parent directories created as needed, in
// path order.
func layerTar(files []ImageFile) ([]byte, error) {
	entries := map[string]ImageFile{}
	for _, f := range files {
		p := strings.Trim(path.Clean("/"+f.Path), "/")
		if p == "" {
			return nil, fmt.Errorf("image file %q: empty path", f.Path)
		}
		f.Path = p
		entries[p] = f
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			if _, ok := entries[dir]; !ok {
				entries[dir] = ImageFile{Path: dir, Dir: true, Mode: 0o755}
			}
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		f := entries[n]
		h := &tar.Header{Name: n, Mode: f.Mode, ModTime: epoch}
		switch {
		case f.Dir:
			h.Typeflag, h.Name = tar.TypeDir, n+"/"
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		case f.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
			if h.Mode == 0 {
				h.Mode = 0o644
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, bytes.NewReader(f.Data)); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BusyboxFiles returns /bin/busybox (from the host's busybox-static,
// /bin/busybox) with a /bin symlink per applet, plus /tmp and /etc/passwd.
func BusyboxFiles() ([]ImageFile, error) {
	const bb = "/bin/busybox"
	data, err := os.ReadFile(bb)
	if err != nil {
		return nil, fmt.Errorf("busybox-static: %w (apt-get install busybox-static)", err)
	}
	files := []ImageFile{
		{Path: "bin/busybox", Mode: 0o755, Data: data},
		{Path: "tmp", Dir: true, Mode: 0o1777},
		{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		{Path: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	for _, applet := range []string{"sh", "sleep", "cat", "echo", "ls", "id", "env", "test", "true", "false", "mkdir", "rm", "wc", "head", "tail", "grep", "hostname", "ps", "kill", "touch", "date", "uname", "nc", "wget"} {
		files = append(files, ImageFile{Path: "bin/" + applet, Link: "busybox"})
	}
	return files, nil
}
