// Command image (tools/image, cdcrelay-image in its messages) builds the
// relay's container image as an OCI image archive (an OCI image layout in
// one tar file: oci-layout, index.json, blobs) with the Go toolchain and
// standard library only: no container daemon and no base image to pull, so
// `make image` works on a fresh machine. It is a build tool, not a shipped
// binary, hence tools/ rather than cmd/.
//
// The image has one layer: the static relay binary at /cdcrelay (CGO_ENABLED=0,
// -trimpath, the version stamped into main.version), the host's CA bundle at
// /etc/ssl/certs/ca-certificates.crt, and an /etc/passwd and /etc/group naming
// the non-root user 65532 the chart runs as. It is reproducible: every time
// stamp is SOURCE_DATE_EPOCH (0 when unset), so the same sources, Go version and
// CA bundle give the same bytes.
//
//	go run ./tools/image -version v1.2.3 -o bin/cdcrelay-image.tar
//	skopeo copy oci-archive:bin/cdcrelay-image.tar docker://REGISTRY/cdcrelay:v1.2.3
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"time"
)

func main() {
	o := options{}
	flag.StringVar(&o.version, "version", "dev", "version stamped into the binary (main.version) and the image labels")
	flag.StringVar(&o.revision, "revision", "", "source revision for the org.opencontainers.image.revision label (optional)")
	flag.StringVar(&o.out, "o", "bin/cdcrelay-image.tar", "output OCI image archive")
	flag.StringVar(&o.pkg, "pkg", "github.com/cdcrelay/cdcrelay/cmd/cdcrelay", "package of the relay's main")
	flag.StringVar(&o.arch, "arch", runtime.GOARCH, "target architecture (GOARCH); the OS is linux")
	flag.StringVar(&o.caFile, "ca", "/etc/ssl/certs/ca-certificates.crt", "CA bundle copied into the image")
	flag.StringVar(&o.name, "name", "cdcrelay", "image name for the archive's reference annotation (docker/podman load tag it <name>:<version>)")
	flag.Parse()
	created, err := sourceDateEpoch(os.Getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cdcrelay-image:", err)
		os.Exit(2)
	}
	o.created = created
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "cdcrelay-image:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	digest, err := build(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "%s: %s:%s (%s/linux), manifest %s\n", o.out, o.name, o.version, o.arch, digest)
	return nil
}

// sourceDateEpoch reads SOURCE_DATE_EPOCH (reproducible-builds.org): seconds
// since 1970; empty means 0.
func sourceDateEpoch(v string) (time.Time, error) {
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	s, err := strconv.ParseInt(v, 10, 64)
	if err != nil || s < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", v)
	}
	return time.Unix(s, 0).UTC(), nil
}
