package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// options describe one image build.
type options struct {
	version, revision string
	out               string // the OCI image archive to write
	pkg               string // the relay's main package
	arch              string // GOARCH of the binary and the image
	caFile            string // CA bundle to copy in
	name              string // image name for the reference annotation
	created           time.Time
}

// OCI media types (image-spec v1.1).
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// The user the chart runs the relay as (podSecurityContext), named in /etc/passwd.
const (
	uid     = 65532
	caPath  = "etc/ssl/certs/ca-certificates.crt"
	repoURL = "https://github.com/cdcrelay/cdcrelay"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// manifest is an image manifest, or with Manifests instead of Config and
// Layers an image index.
type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        *descriptor  `json:"config,omitempty"`
	Layers        []descriptor `json:"layers,omitempty"`
	Manifests     []descriptor `json:"manifests,omitempty"`
}

type imageConfig struct {
	Created      string    `json:"created"`
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Config       runConfig `json:"config"`
	RootFS       struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
	History []history `json:"history"`
}

type runConfig struct {
	User         string              `json:"User"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts"`
	Env          []string            `json:"Env"`
	Entrypoint   []string            `json:"Entrypoint"`
	Cmd          []string            `json:"Cmd"`
	WorkingDir   string              `json:"WorkingDir"`
	Labels       map[string]string   `json:"Labels"`
}

type history struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

// blob is one content-addressed file of the layout.
type blob struct {
	desc descriptor
	data []byte
}

func newBlob(mediaType string, data []byte) blob {
	return blob{desc: descriptor{MediaType: mediaType, Digest: digestOf(data), Size: int64(len(data))}, data: data}
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// build compiles the relay, assembles the image and writes the archive; it
// returns the manifest's digest.
func build(ctx context.Context, o options) (string, error) {
	tmp, err := os.MkdirTemp("", "cdcrelay-image-")
	if err != nil {
		return "", fmt.Errorf("temporary directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(tmp) }() // a leftover temporary binary is harmless
	bin := filepath.Join(tmp, "cdcrelay")
	if err := buildBinary(ctx, o, bin); err != nil {
		return "", err
	}
	layerTar, err := rootfs(o, bin)
	if err != nil {
		return "", err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression) // a zero header: no name, no time
	if err != nil {
		return "", fmt.Errorf("gzip: %w", err)
	}
	if _, err := zw.Write(layerTar); err != nil {
		return "", fmt.Errorf("gzip: %w", err)
	}
	if err := zw.Close(); err != nil {
		return "", fmt.Errorf("gzip: %w", err)
	}
	layer := newBlob(mediaLayer, gz.Bytes())
	cfg, err := json.Marshal(configFor(o, digestOf(layerTar)))
	if err != nil {
		return "", fmt.Errorf("image config: %w", err)
	}
	config := newBlob(mediaConfig, cfg)
	m, err := json.Marshal(manifest{SchemaVersion: 2, MediaType: mediaManifest, Config: &config.desc, Layers: []descriptor{layer.desc}})
	if err != nil {
		return "", fmt.Errorf("manifest: %w", err)
	}
	man := newBlob(mediaManifest, m)
	return man.desc.Digest, writeLayout(o, []blob{layer, config, man})
}

// buildBinary compiles a static relay for linux/o.arch with the version stamped.
func buildBinary(ctx context.Context, o options, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath",
		"-ldflags", "-s -w -X main.version="+o.version, "-o", out, o.pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.arch)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", o.pkg, err, msg)
	}
	return nil
}

// rootfs is the image's one layer, uncompressed: every entry owned by root
// (the home directory by the user) and stamped o.created.
func rootfs(o options, bin string) ([]byte, error) {
	relay, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("read the built binary: %w", err)
	}
	ca, err := os.ReadFile(o.caFile)
	if err != nil {
		return nil, fmt.Errorf("CA bundle (-ca): %w", err)
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", uid, uid)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", uid)
	entries := []struct {
		name string
		mode int64
		id   int
		data []byte // nil: a directory
	}{
		{"cdcrelay", 0o755, 0, relay},
		{"etc/", 0o755, 0, nil},
		{"etc/group", 0o644, 0, []byte(group)},
		{"etc/passwd", 0o644, 0, []byte(passwd)},
		{"etc/ssl/", 0o755, 0, nil},
		{"etc/ssl/certs/", 0o755, 0, nil},
		{caPath, 0o644, 0, ca},
		{"home/", 0o755, 0, nil},
		{"home/nonroot/", 0o700, uid, nil},
		{"tmp/", 0o1777, 0, nil},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.id, Gid: e.id, ModTime: o.created, Format: tar.FormatUSTAR, Typeflag: tar.TypeDir}
		if e.data != nil {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("layer %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}

// configFor is the image configuration: how the chart (and docker run) start it.
func configFor(o options, diffID string) imageConfig {
	created := o.created.Format(time.RFC3339)
	labels := map[string]string{
		"org.opencontainers.image.title":       "cdcrelay",
		"org.opencontainers.image.description": "Streams outbox-table INSERTs from PostgreSQL logical replication to RabbitMQ",
		"org.opencontainers.image.version":     o.version,
		"org.opencontainers.image.source":      repoURL,
		"org.opencontainers.image.created":     created,
	}
	if o.revision != "" {
		labels["org.opencontainers.image.revision"] = o.revision
	}
	c := imageConfig{Created: created, Architecture: o.arch, OS: "linux",
		Config: runConfig{
			User:         fmt.Sprintf("%d:%d", uid, uid),
			ExposedPorts: map[string]struct{}{"8080/tcp": {}},
			Env:          []string{"PATH=/", "SSL_CERT_FILE=/" + caPath}, // PATH=/: `kubectl exec … -- cdcrelay check` finds it
			Entrypoint:   []string{"/cdcrelay"},
			Cmd:          []string{"run"},
			WorkingDir:   "/",
			Labels:       labels,
		},
		History: []history{{Created: created, CreatedBy: "cdcrelay-image -version " + o.version}},
	}
	c.RootFS.Type = "layers"
	c.RootFS.DiffIDs = []string{diffID}
	return c
}

// writeLayout writes the OCI image layout as a tar archive; the last blob is
// the manifest the index points at.
func writeLayout(o options, blobs []blob) error {
	man := blobs[len(blobs)-1]
	idx := manifest{SchemaVersion: 2, MediaType: mediaIndex, Manifests: []descriptor{{
		MediaType: mediaManifest, Digest: man.desc.Digest, Size: man.desc.Size,
		Platform: &platform{Architecture: o.arch, OS: "linux"},
		Annotations: map[string]string{
			"org.opencontainers.image.ref.name": o.version,
			"io.containerd.image.name":          o.name + ":" + o.version,
		},
	}}}
	index, err := json.Marshal(idx)
	if err != nil {
		return fmt.Errorf("index: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, data []byte) error {
		h := &tar.Header{Name: name, Mode: 0o644, ModTime: o.created, Format: tar.FormatUSTAR, Typeflag: tar.TypeReg, Size: int64(len(data))}
		if data == nil {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("archive %s: %w", name, err)
		}
		_, err := tw.Write(data)
		return err
	}
	files := []struct {
		name string
		data []byte
	}{{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}, {"index.json", index}, {"blobs/", nil}, {"blobs/sha256/", nil}}
	for _, b := range blobs {
		files = append(files, struct {
			name string
			data []byte
		}{"blobs/sha256/" + b.desc.Digest[len("sha256:"):], b.data})
	}
	for _, f := range files {
		if err := add(f.name, f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	if err := os.WriteFile(o.out, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", o.out, err)
	}
	return nil
}
