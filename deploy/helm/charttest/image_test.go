package charttest

import (
	"path/filepath"
	"strings"
	"testing"
)

// placeholderMessage is how the chart refuses its placeholder image: it names
// the image, why it cannot be used and what to do instead.
const placeholderMessage = "cdcrelay: the image ghcr.io/cdcrelay/cdcrelay is the chart's placeholder, and nothing publishes it " +
	"(the pods would never pull it): build the image with `make image`, push it to a registry your cluster pulls from, " +
	"and set image.repository and image.tag (or image.digest) to it"

// TestPlaceholderImageRefused: the chart's default repository, which nothing
// publishes, fails `helm template` (and so install and upgrade) instead of
// pods stuck in ImagePullBackOff, whatever tag or digest goes with it and
// with the helm test's Pod on; `helm lint` only logs a template's fail, so
// its output carries the message as a "Fail:" line, which `make -C
// deploy/helm lint` refuses.
func TestPlaceholderImageRefused(t *testing.T) {
	t.Parallel()
	placeholder := []string{"--set", "image.repository=ghcr.io/cdcrelay/cdcrelay"}
	for name, extra := range map[string][]string{
		"default tag":  nil,
		"a tag":        {"--set-string", "image.tag=0e23086"},
		"a digest":     {"--set", "image.digest=sha256:" + strings.Repeat("ab", 32)},
		"helm test on": {"--set", "tests.enabled=true"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			args := templateArgs(chartDir, []string{"single.yaml"}, append(append([]string{}, placeholder...), extra...)...)
			out, stderr, err := runHelm(t, args...)
			if err == nil || !exitError(err) {
				t.Fatalf("helm template rendered the placeholder image (err %v):\n%s", err, out)
			}
			if !strings.Contains(stderr, placeholderMessage) {
				t.Errorf("helm template refused the placeholder image, but not with %q:\n%s", placeholderMessage, stderr)
			}
		})
	}
	t.Run("lint", func(t *testing.T) {
		t.Parallel()
		args := append([]string{"lint", "--strict", chartDir, "--kube-version", kubeVersion}, valuesArgs([]string{filepath.Join("bad", "placeholder-image.yaml")})...)
		out, stderr, _ := runHelm(t, args...)
		if !strings.Contains(out+stderr, "Fail: "+placeholderMessage) {
			t.Errorf("helm lint of the placeholder image: no Fail line with the message:\n%s%s", out, stderr)
		}
	})
	// An image of one's own renders, with the tag as given.
	r := render(t, []string{"single.yaml"}, "--set-string", "image.tag=0e23086")
	if img := relay(t, r.Deployments[0]).Image; img != "registry.example.com/cdcrelay:0e23086" {
		t.Errorf("image %q, want registry.example.com/cdcrelay:0e23086", img)
	}
}
