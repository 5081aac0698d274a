package charttest

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The alerts and docs/runbook.md hold together: every alert links to its own
// section, every link resolves, and the alert's description and its section say the
// same thing about losing events.

// runbook is docs/runbook.md read for the checks: the anchors of its headings and the
// text of each `## ` section (its `### ` subsections included), by heading.
type runbook struct {
	anchors  map[string]string // GitHub anchor -> heading
	sections map[string]string // `## ` heading -> its text, the heading line excluded
	links    []string          // the fragments of its own links, `](#fragment)`
}

var runbookLink = regexp.MustCompile(`\]\(#([^)]+)\)`)

func readRunbook(t *testing.T) runbook {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	rb := runbook{anchors: map[string]string{}, sections: map[string]string{}}
	var cur string
	var body []string
	flush := func() {
		if cur != "" {
			rb.sections[cur] = strings.Join(body, "\n")
		}
	}
	fenced := false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if !fenced {
			for _, m := range runbookLink.FindAllStringSubmatch(line, -1) {
				rb.links = append(rb.links, m[1])
			}
			if h, ok := strings.CutPrefix(line, "## "); ok {
				flush()
				cur, body = strings.TrimSpace(h), nil
				rb.anchors[githubAnchor(cur)] = cur
				continue
			}
			if h, ok := strings.CutPrefix(line, "### "); ok {
				rb.anchors[githubAnchor(strings.TrimSpace(h))] = strings.TrimSpace(h)
			}
		}
		body = append(body, line)
	}
	flush()
	if len(rb.sections) < 20 {
		t.Fatalf("docs/runbook.md: %d sections: not the runbook the test expects", len(rb.sections))
	}
	return rb
}

// runbookRef matches a link to the runbook inside an annotation.
var runbookRef = regexp.MustCompile(regexp.QuoteMeta(runbookBase) + `#([a-z0-9_-]+)`)

// TestRunbookAnchors checks that every alert's runbook_url points at its own
// `## <AlertName>` heading of docs/runbook.md (by GitHub's anchor rule: lower case,
// spaces to hyphens, punctuation dropped), that every runbook link in an
// annotation resolves, and that every link of the runbook to itself does.
func TestRunbookAnchors(t *testing.T) {
	t.Parallel()
	rb := readRunbook(t)
	for _, file := range []string{"alerts.yaml", "multi.yaml"} {
		groups := ruleGroups(t, []string{file}, "--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.prometheusRule.endToEndSlow.enabled=true")
		names := alertNames(groups)
		if len(names) != len(defaultSeverity) {
			t.Fatalf("%s renders alerts %v, want all %d", file, names, len(defaultSeverity))
		}
		for _, g := range groups {
			for _, r := range g.Rules {
				base, frag, ok := strings.Cut(r.Annotations["runbook_url"], "#")
				if !ok || base != runbookBase || rb.anchors[frag] != r.Alert {
					t.Errorf("%s (%s): runbook_url %q: no `## %s` heading with that anchor in docs/runbook.md (it names %q)",
						r.Alert, file, r.Annotations["runbook_url"], r.Alert, rb.anchors[frag])
				}
				for key, text := range r.Annotations {
					for _, m := range runbookRef.FindAllStringSubmatch(text, -1) {
						if rb.anchors[m[1]] == "" {
							t.Errorf("%s (%s): %s links to #%s, which docs/runbook.md does not have", r.Alert, file, key, m[1])
						}
					}
				}
			}
		}
	}
	if len(rb.links) < 20 {
		t.Fatalf("docs/runbook.md: only %d links to itself found", len(rb.links))
	}
	for _, frag := range rb.links {
		if rb.anchors[frag] == "" {
			t.Errorf("docs/runbook.md links to #%s, which it does not have", frag)
		}
	}
}

// githubAnchor is the id GitHub gives a Markdown heading.
func githubAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestGithubAnchor pins the anchor rule the runbook check relies on.
func TestGithubAnchor(t *testing.T) {
	t.Parallel()
	for h, want := range map[string]string{
		"CdcrelayNoStreamingRelay":               "cdcrelaynostreamingrelay",
		"PostgreSQL failover and major upgrade":  "postgresql-failover-and-major-upgrade",
		"Rolling back an adoption (and pausing)": "rolling-back-an-adoption-and-pausing",
	} {
		if got := githubAnchor(h); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", h, got, want)
		}
	}
}

// lossClaim is what an alert's texts must say about losing events.
type lossClaim string

const (
	noLoss       lossClaim = "none"     // no event is lost: it waits, is delayed or is duplicated
	lossPossible lossClaim = "possible" // events can be lost
)

// alertLoss says, for every alert, whether events can be lost in the situation it
// reports. None can: nothing committed to the outbox is lost while its row has
// published_at IS NULL (docs/runbook.md, docs/architecture.md). A slot that is
// invalidated or lost costs a backfill and duplicates, not events; a parked row stays
// in the outbox; a dead-letter copy the broker did not take leaves its row parked.
var alertLoss = map[string]lossClaim{
	"CdcrelayNoStreamingRelay":        noLoss,
	"CdcrelayNoStandby":               noLoss,
	"CdcrelaySlotRetainedWalHigh":     noLoss,
	"CdcrelaySlotNearInvalidation":    noLoss,
	"CdcrelaySlotLost":                noLoss,
	"CdcrelayOtherRelayOnDatabase":    noLoss,
	"CdcrelaySlotForeignHolder":       noLoss,
	"CdcrelayOldestUnpublishedTooOld": noLoss,
	"CdcrelayParkedRows":              noLoss,
	"CdcrelayUnroutableStall":         noLoss,
	"CdcrelayDeadLetterFailed":        noLoss,
	"CdcrelayForeignInsertsSkipped":   noLoss,
	"CdcrelayMessagesNacked":          noLoss,
	"CdcrelayRestartStorm":            noLoss,
	"CdcrelayBrokerBlocked":           noLoss,
	"CdcrelayMonitorStale":            noLoss,
	"CdcrelayMarkingFailing":          noLoss,
	"CdcrelayEndToEndSlow":            noLoss,
	"CdcrelayRetentionFailing":        noLoss,
}

var (
	// saysNoLoss: a statement that no event is lost.
	saysNoLoss = regexp.MustCompile(`(?i)\b(no event is lost|nothing is lost|none is lost|not lost|costs no event|loses nothing|no loss)\b`)
	// saysLoss: a statement that events are, or can be, lost (looked for after the
	// no-loss statements are taken out, so "no event is lost" is not one).
	saysLoss = regexp.MustCompile(`(?i)\b((are|were|will be|can be|may be|could be|gets?) (then |also |all )?lost\b|(event|row|message) is (then )?lost\b|lost to the stream|may never (have been|be) (streamed|published|delivered)|find and republish|can lose events|events? can be dropped)`)
	// lossLine is a runbook section's loss statement.
	lossLine = regexp.MustCompile(`(?m)^\*\*Loss:\*\* (none|possible)\b`)
	spaces   = regexp.MustCompile(`\s+`)
)

// lossClaims reports what text says about losing events.
func lossClaims(text string) (none, lost bool) {
	text = spaces.ReplaceAllString(text, " ")
	return saysNoLoss.MatchString(text), saysLoss.MatchString(saysNoLoss.ReplaceAllString(text, " "))
}

// lossProblems checks an alert's description and its runbook section against want:
// the description must state it (and not the opposite), and the section must carry
// one `**Loss:** none|possible` line that agrees, with no sentence saying the opposite.
func lossProblems(want lossClaim, description, section string) []string {
	var out []string
	none, lost := lossClaims(description)
	switch {
	case want == noLoss && lost:
		out = append(out, "the description says events can be lost")
	case want == noLoss && !none:
		out = append(out, "the description does not say that no event is lost")
	case want == lossPossible && none:
		out = append(out, "the description says no event is lost")
	case want == lossPossible && !lost:
		out = append(out, "the description does not say that events can be lost")
	}
	lines := lossLine.FindAllStringSubmatch(section, -1)
	switch {
	case len(lines) != 1:
		out = append(out, fmt.Sprintf("the runbook section has %d `**Loss:** none|possible` lines, want 1", len(lines)))
	case lossClaim(lines[0][1]) != want:
		out = append(out, "the runbook section says **Loss:** "+lines[0][1])
	}
	secNone, secLost := lossClaims(section)
	if want == noLoss && secLost {
		out = append(out, "the runbook section says events can be lost")
	}
	if want == lossPossible && !secLost {
		out = append(out, "the runbook section does not say how events can be lost")
	}
	if descNone, descLost := none, lost; (descNone && secLost) || (descLost && secNone && !secLost) {
		out = append(out, "the description and the runbook section contradict each other")
	}
	return out
}

// TestAlertsAndRunbookAgreeOnLoss: for every alert the chart renders, its
// description and its runbook section make the claim about losing events that
// alertLoss holds, and so never contradict each other.
func TestAlertsAndRunbookAgreeOnLoss(t *testing.T) {
	t.Parallel()
	rb := readRunbook(t)
	groups := ruleGroups(t, []string{"alerts.yaml"})
	names := alertNames(groups)
	for _, n := range slices.Sorted(maps.Keys(alertLoss)) {
		if !slices.Contains(names, n) {
			t.Errorf("alertLoss names %s, which alerts.yaml does not render", n)
		}
	}
	checked := 0
	for _, g := range groups {
		for _, r := range g.Rules {
			want, ok := alertLoss[r.Alert]
			if !ok {
				t.Errorf("%s: not in alertLoss; say whether events can be lost when it fires", r.Alert)
				continue
			}
			section, ok := rb.sections[r.Alert]
			if !ok {
				t.Errorf("%s: docs/runbook.md has no `## %s` section", r.Alert, r.Alert)
				continue
			}
			for _, p := range lossProblems(want, r.Annotations["description"], section) {
				t.Errorf("%s (loss %s): %s\ndescription: %s", r.Alert, want, p, r.Annotations["description"])
			}
			checked++
		}
	}
	if checked < len(alertLoss) {
		t.Errorf("only %d rules checked, want at least %d", checked, len(alertLoss))
	}
}

// TestLossCheckCatchesContradictions: the check fails on the contradictions the
// operations review found (SlotLost's "may never have been streamed ... find and
// republish them" against its section's "nothing to repair"; SlotNearInvalidation's
// "lost to the stream" against "Invalidation costs no event"), on a text silent about
// loss and on a section that claims the opposite, and passes agreeing texts.
func TestLossCheckCatchesContradictions(t *testing.T) {
	t.Parallel()
	const (
		oldSlotLost = "The slot of svc/rel has wal_status lost, or the relay found it invalidated within the last hour: the WAL it needed is gone, and events committed meanwhile may never have been streamed. Follow the runbook to find and republish them."
		oldNearInv  = "The replication slot s (svc/rel) has wal_status unreserved or little WAL left before max_slot_wal_keep_size: PostgreSQL will soon invalidate it, and the events it still holds are then lost to the stream."
		noneSection = "**Means:** PostgreSQL invalidated the slot.\n\n**Loss:** none. Every row with `published_at IS NULL` is published again.\n\n**Do:** `slotLost: recreate` (default): nothing to repair."
		nearSection = "**Means:** wal_status is unreserved.\n\n**Loss:** none. Invalidation costs a backfill and duplicates, no event.\n\n- Invalidation costs no event: the relay backfills."
		goodDesc    = "The slot was invalidated. No event is lost: every unpublished row is published again from the new slot's snapshot."
		lossSection = "**Means:** the queue drops messages.\n\n**Loss:** possible. Events are lost when the queue overflows with drop-head."
		lossDesc    = "The queue drops its oldest messages: events can be lost."
	)
	for _, c := range []struct {
		name              string
		want              lossClaim
		description, sect string
		ok                bool
	}{
		{"SlotLost before the fix", noLoss, oldSlotLost, noneSection, false},
		{"SlotNearInvalidation before the fix", noLoss, oldNearInv, nearSection, false},
		{"a description silent about loss", noLoss, "The slot was invalidated.", noneSection, false},
		{"a section that says events can be lost", noLoss, goodDesc, lossSection, false},
		{"a section without a loss line", noLoss, goodDesc, "**Means:** the slot was invalidated; nothing is lost.", false},
		{"no loss, agreeing", noLoss, goodDesc, noneSection, true},
		{"no loss, agreeing (near invalidation)", noLoss, "It will be invalidated. No event is lost: the relay backfills.", nearSection, true},
		{"possible loss, agreeing", lossPossible, lossDesc, lossSection, true},
		{"possible loss, the section says none", lossPossible, lossDesc, noneSection, false},
		{"possible loss, the description says none", lossPossible, goodDesc, lossSection, false},
	} {
		got := lossProblems(c.want, c.description, c.sect)
		if (len(got) == 0) != c.ok {
			t.Errorf("%s: problems %q, want ok=%v", c.name, got, c.ok)
		}
	}
	// The phrases the check reads, one by one.
	for text, want := range map[string][2]bool{
		"events are delayed, not lost":          {true, false},
		"no event is lost":                      {true, false},
		"events committed meanwhile are lost":   {false, true},
		"they are then lost to the stream":      {false, true},
		"what is lost is the notification":      {false, false},
		"Each nack restarts the relay from the": {false, false},
	} {
		if none, lost := lossClaims(text); none != want[0] || lost != want[1] {
			t.Errorf("lossClaims(%q) = %v, %v, want %v", text, none, lost, want)
		}
	}
}
