//go:build alerts

package alertlive_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Names from the contract between the chart's alerts and this test
// (monitoring.prometheusRule in deploy/helm/cdcrelay/values.yaml).
const (
	alertNoStreaming   = "CdcrelayNoStreamingRelay"
	alertMonitorStale  = "CdcrelayMonitorStale"
	ruleNamespace      = "alertlive" // the release namespace the rules select
	releaseName        = "cdcrelay"  // its full name is the service label
	monitorStaleSecond = 10          // monitorStale.threshold in the test
)

// tools are the programs the test runs besides the relay.
type tools struct {
	helm, prometheus, promtool string
}

// requireTools finds prometheus and promtool (Debian's prometheus package)
// and the helm binary the chart tests build; a missing one fails the test.
func requireTools(t *testing.T) tools {
	t.Helper()
	var tl tools
	for _, p := range []struct {
		name string
		dst  *string
	}{{"prometheus", &tl.prometheus}, {"promtool", &tl.promtool}} {
		path, err := exec.LookPath(p.name)
		if err != nil {
			t.Fatalf("%s not found (%v): install Debian's prometheus package "+
				"(DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus)", p.name, err)
		}
		*p.dst = path
	}
	tl.helm = helmPath(t)
	return tl
}

// helmPath is $HELM, or the helm `make -C deploy/helm helm` builds into
// <HELM_VERSION>/helm (the version pinned in that Makefile) under
// $CDCRELAY_HELM_CACHE, by default cdcrelay/helm in the user's cache folder.
func helmPath(t *testing.T) string {
	t.Helper()
	path := os.Getenv("HELM")
	if path == "" {
		mk, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "helm", "Makefile"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^HELM_VERSION \?= (\S+)$`).FindSubmatch(mk)
		if m == nil {
			t.Fatal("deploy/helm/Makefile: no HELM_VERSION line")
		}
		cache := os.Getenv("CDCRELAY_HELM_CACHE")
		if cache == "" {
			dir, err := os.UserCacheDir()
			if err != nil {
				t.Fatalf("no HELM, no CDCRELAY_HELM_CACHE and no user cache folder: %v", err)
			}
			cache = filepath.Join(dir, "cdcrelay", "helm")
		}
		path = filepath.Join(cache, string(m[1]), "helm")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("helm not found at %s (%v): run `make chart-test` (or `make -C deploy/helm helm`) first, or set HELM", path, err)
	}
	return path
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// ruleValues are the chart values of the test's release: one source of one
// replica (so no standby alert applies) streaming the test's slot, rules
// on, and short durations for the two alerts under test. The monitorStale
// threshold is short enough that a monitor that stopped refreshing during
// the outage would make the alert fire before the outage ends.
func ruleValues(slot string) []string {
	return []string{
		"source.database.secretName=unused",
		"defaults.amqp.secretName=unused",
		"image.repository=registry.example.com/cdcrelay",
		"source.slot=" + slot,
		"source.replicas=1",
		"monitoring.prometheusRule.enabled=true",
		"monitoring.prometheusRule.noStreamingRelay.for=2s",
		"monitoring.prometheusRule.monitorStale.for=0s",
		fmt.Sprintf("monitoring.prometheusRule.monitorStale.threshold=%d", monitorStaleSecond),
	}
}

// renderRules renders the chart's PrometheusRule for the test's slot,
// writes its spec (the groups) as a Prometheus rules file and checks that
// file with promtool. It returns the file's path.
func renderRules(t *testing.T, tl tools, slot string) string {
	t.Helper()
	args := []string{"template", releaseName, filepath.Join(repoRoot(t), "deploy", "helm", "cdcrelay"),
		"--namespace", ruleNamespace, "--show-only", "templates/prometheusrule.yaml"}
	for _, v := range ruleValues(slot) {
		args = append(args, "--set", v)
	}
	out, err := exec.Command(tl.helm, args...).Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderrOf(err))
	}
	groups, err := ruleGroups(string(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	path := filepath.Join(t.TempDir(), "cdcrelay.rules.yml")
	if err := os.WriteFile(path, []byte(groups), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tl.promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s\n%s", err, out, groups)
	}
	return path
}

// ruleGroups turns a rendered PrometheusRule into a rules file: its
// `spec:` block (which holds only `groups:`) moved two columns left. Text,
// not a YAML library, because the main module keeps its dependencies few
// and helm's output indents consistently; promtool checks the result.
func ruleGroups(manifest string) (string, error) {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(manifest, "\n") {
		switch {
		case line == "spec:":
			in = true
		case !in:
		case line == "" || strings.HasPrefix(line, "  "):
			b.WriteString(strings.TrimPrefix(line, "  ") + "\n")
		default:
			in = false // the next top-level key or document
		}
	}
	if !strings.HasPrefix(b.String(), "groups:") {
		return "", errors.New("rendered PrometheusRule has no spec.groups")
	}
	return b.String(), nil
}

// stderrOf returns what a failed exec.Cmd.Output wrote to stderr.
func stderrOf(err error) []byte {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return bytes.TrimSpace(ee.Stderr)
	}
	return nil
}
