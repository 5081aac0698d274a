package charttest

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// firesAfter is the line of a runbook alert section that states the alert's
// window: "**Fires after:** 5 minutes (`for: 5m`) of …", or, for an alert
// without one, "**Fires after:** no wait (`for: 0m`): …".
var firesAfter = regexp.MustCompile(`(?m)^\*\*Fires after:\*\* (.*)$`)

// windowWords is how a runbook line says a Prometheus `for` of whole
// minutes: "no wait", "1 minute", "15 minutes".
func windowWords(t *testing.T, alert, d string) string {
	t.Helper()
	var m int
	if _, err := fmt.Sscanf(d, "%dm", &m); err != nil || fmt.Sprintf("%dm", m) != d {
		t.Fatalf("%s: default for %q is not whole minutes; teach windowWords its words", alert, d)
	}
	switch m {
	case 0:
		return "no wait"
	case 1:
		return "1 minute"
	}
	return fmt.Sprintf("%d minutes", m)
}

// TestRunbookStatesEachWindow: the `## <Alert>` section of docs/runbook.md of
// every alert the chart renders states the alert's default `for` as the
// chart renders it, in a "**Fires after:**" line that gives it in words and
// as `for: …`, so that the runbook and the rule cannot drift apart.
func TestRunbookStatesEachWindow(t *testing.T) {
	t.Parallel()
	rb := readRunbook(t)
	// alerts.yaml: every alert enabled (endToEndSlow too), each at its default for.
	groups := ruleGroups(t, []string{"alerts.yaml"})
	seen := map[string]string{}
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if prev, ok := seen[r.Alert]; ok {
				if prev != r.For {
					t.Errorf("%s renders with for %q and %q: one default, one runbook line", r.Alert, prev, r.For)
				}
				continue // a per-source alert: one rule per source
			}
			seen[r.Alert] = r.For
			section, ok := rb.sections[r.Alert]
			if !ok {
				t.Errorf("docs/runbook.md has no `## %s` section", r.Alert)
				continue
			}
			lines := firesAfter.FindAllStringSubmatch(section, -1)
			if len(lines) != 1 {
				t.Errorf("docs/runbook.md, %s: %d \"**Fires after:**\" lines, want one stating `for: %s`", r.Alert, len(lines), r.For)
				continue
			}
			line := lines[0][1]
			if want := "`for: " + r.For + "`"; !strings.Contains(line, want) {
				t.Errorf("docs/runbook.md, %s: \"**Fires after:** %s\" does not state the chart's default %s", r.Alert, line, want)
			}
			if words := windowWords(t, r.Alert, r.For); !strings.HasPrefix(line, words+" (`for: ") {
				t.Errorf("docs/runbook.md, %s: \"**Fires after:** %s\" should begin %q (`for: %s`)", r.Alert, line, words, r.For)
			}
		}
	}
	if len(seen) != len(defaultSeverity) {
		t.Fatalf("alerts.yaml renders %d alerts, want all %d", len(seen), len(defaultSeverity))
	}
}
