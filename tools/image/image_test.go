package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// readArchive returns the regular files of a tar stream by name, and fails on
// an entry whose time is not want (nil: any).
func readArchive(t *testing.T, r io.Reader, want *time.Time) (map[string][]byte, map[string]*tar.Header) {
	t.Helper()
	files, headers := map[string][]byte{}, map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, headers
		}
		if err != nil {
			t.Fatalf("tar: %v", err)
		}
		if want != nil && !h.ModTime.Equal(*want) {
			t.Errorf("%s: mtime %s, want SOURCE_DATE_EPOCH %s", h.Name, h.ModTime, *want)
		}
		headers[h.Name] = h
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatalf("tar %s: %v", h.Name, err)
			}
			files[h.Name] = b
		}
	}
}

// blobOf returns the blob a descriptor points at, checking its digest and size.
func blobOf(t *testing.T, files map[string][]byte, d descriptor) []byte {
	t.Helper()
	hex, ok := strings.CutPrefix(d.Digest, "sha256:")
	if !ok {
		t.Fatalf("descriptor %+v: not a sha256 digest", d)
	}
	b, ok := files["blobs/sha256/"+hex]
	if !ok {
		t.Fatalf("descriptor %+v: no such blob", d)
	}
	if int64(len(b)) != d.Size {
		t.Errorf("blob %s: %d bytes, descriptor says %d", d.Digest, len(b), d.Size)
	}
	return b
}

func decode(t *testing.T, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

// TestIntegrationImage builds the image as `make image` does, checks the OCI layout, every
// digest and size, the configuration the chart relies on, and runs the binary
// from the unpacked layer.
func TestIntegrationImage(t *testing.T) {
	created := time.Unix(1700000000, 0).UTC()
	dir := t.TempDir()
	o := options{version: "v9.8.7-test", revision: "abc123", pkg: "github.com/cdcrelay/cdcrelay/cmd/cdcrelay",
		arch: runtime.GOARCH, caFile: "/etc/ssl/certs/ca-certificates.crt", name: "cdcrelay", created: created,
		out: filepath.Join(dir, "a", "image.tar")}
	digest, err := build(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	archive, err := os.ReadFile(o.out)
	if err != nil {
		t.Fatal(err)
	}

	// Reproducible: a second build gives the same bytes.
	o2 := o
	o2.out = filepath.Join(dir, "b", "image.tar")
	if _, err := build(context.Background(), o2); err != nil {
		t.Fatal(err)
	}
	if again, err := os.ReadFile(o2.out); err != nil || !bytes.Equal(again, archive) {
		t.Errorf("two builds of the same sources differ (err %v)", err)
	}

	files, _ := readArchive(t, bytes.NewReader(archive), &created)
	if got := string(files["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout %q", got)
	}
	for name, b := range files {
		if hex, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && digestOf(b) != "sha256:"+hex {
			t.Errorf("blob %s holds content of digest %s", name, digestOf(b))
		}
	}
	var index manifest
	decode(t, files["index.json"], &index)
	if index.SchemaVersion != 2 || index.MediaType != mediaIndex || len(index.Manifests) != 1 {
		t.Fatalf("index %+v: want one manifest", index)
	}
	md := index.Manifests[0]
	if md.Digest != digest || md.MediaType != mediaManifest || md.Annotations["org.opencontainers.image.ref.name"] != o.version ||
		md.Platform == nil || md.Platform.OS != "linux" || md.Platform.Architecture != runtime.GOARCH {
		t.Errorf("index entry %+v", md)
	}
	var man manifest
	decode(t, blobOf(t, files, md), &man)
	if man.SchemaVersion != 2 || man.MediaType != mediaManifest || man.Config == nil || man.Config.MediaType != mediaConfig ||
		len(man.Layers) != 1 || man.Layers[0].MediaType != mediaLayer {
		t.Fatalf("manifest %+v", man)
	}
	var cfg imageConfig
	decode(t, blobOf(t, files, *man.Config), &cfg)
	checkConfig(t, cfg, o)

	zr, err := gzip.NewReader(bytes.NewReader(blobOf(t, files, man.Layers[0])))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.RootFS.DiffIDs, []string{digestOf(layer)}) {
		t.Errorf("diff_ids %v, want the uncompressed layer's %s", cfg.RootFS.DiffIDs, digestOf(layer))
	}
	checkLayer(t, layer, o, &created)
}

func checkConfig(t *testing.T, cfg imageConfig, o options) {
	t.Helper()
	c := cfg.Config
	if cfg.OS != "linux" || cfg.Architecture != o.arch || cfg.Created != "2023-11-14T22:13:20Z" {
		t.Errorf("config os %s arch %s created %s", cfg.OS, cfg.Architecture, cfg.Created)
	}
	if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/cdcrelay"}) || !slices.Equal(c.Cmd, []string{"run"}) {
		t.Errorf("config user %q entrypoint %v cmd %v, want 65532:65532 /cdcrelay run", c.User, c.Entrypoint, c.Cmd)
	}
	if _, ok := c.ExposedPorts["8080/tcp"]; !ok || len(c.ExposedPorts) != 1 {
		t.Errorf("exposed ports %v, want 8080/tcp", c.ExposedPorts)
	}
	for k, v := range map[string]string{
		"org.opencontainers.image.version":  o.version,
		"org.opencontainers.image.source":   repoURL,
		"org.opencontainers.image.revision": o.revision,
	} {
		if c.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
		}
	}
}

// checkLayer unpacks the layer and checks its files, then runs the binary.
func checkLayer(t *testing.T, layer []byte, o options, created *time.Time) {
	t.Helper()
	files, headers := readArchive(t, bytes.NewReader(layer), created)
	root := t.TempDir()
	for name, b := range files {
		if !filepath.IsLocal(name) {
			t.Fatalf("layer entry %q leaves the root", name)
		}
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, os.FileMode(headers[name].Mode)&0o777); err != nil {
			t.Fatal(err)
		}
	}
	ca, err := os.ReadFile(o.caFile)
	if err != nil || !bytes.Equal(files[caPath], ca) {
		t.Errorf("%s differs from the host's CA bundle (err %v)", caPath, err)
	}
	if !strings.Contains(string(files["etc/passwd"]), "nonroot:x:65532:65532:") || !strings.Contains(string(files["etc/group"]), "nonroot:x:65532:") {
		t.Errorf("passwd %q / group %q lack the user 65532", files["etc/passwd"], files["etc/group"])
	}
	if h := headers["cdcrelay"]; h == nil || h.Mode != 0o755 || h.Uid != 0 {
		t.Fatalf("/cdcrelay header %+v: want a root-owned 0755 file", h)
	}
	bin := filepath.Join(root, "cdcrelay")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("/cdcrelay has a program interpreter: not a static binary")
		}
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || string(out) != o.version+"\n" {
		t.Errorf("/cdcrelay version: %q (err %v), want %q", out, err, o.version)
	}
}

func TestSourceDateEpoch(t *testing.T) {
	for v, want := range map[string]int64{"": 0, "0": 0, "1700000000": 1700000000} {
		if got, err := sourceDateEpoch(v); err != nil || got.Unix() != want {
			t.Errorf("SOURCE_DATE_EPOCH=%q: %v (err %v), want %d", v, got, err, want)
		}
	}
	for _, v := range []string{"x", "-1", "1.5"} {
		if _, err := sourceDateEpoch(v); err == nil {
			t.Errorf("SOURCE_DATE_EPOCH=%q accepted", v)
		}
	}
}
