package config

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Known returns, sorted, the names (with Prefix) of every variable the
// relay reads: one per Config field. The Helm chart's list of accepted
// CDCRELAY_* names is compared with it by the chart tests.
func Known() []string {
	out := make([]string, 0, len(keys()))
	for _, k := range keys() {
		out = append(out, Prefix+k)
	}
	slices.Sort(out)
	return out
}

// UnknownVariable is a CDCRELAY_* environment variable the relay does not
// read, usually a typo that silently leaves a setting at its default.
type UnknownVariable struct {
	Name       string
	Suggestion string // the closest known name, "" when none is close
}

func (u UnknownVariable) String() string {
	if u.Suggestion == "" {
		return u.Name
	}
	return fmt.Sprintf("%s (did you mean %s?)", u.Name, u.Suggestion)
}

// Unknown returns the variables of environ (NAME=value entries, as
// os.Environ gives them) that start with Prefix, in any case, and are
// neither Known nor in extra (names read elsewhere, such as the failpoint
// variable of test builds), sorted by name.
func Unknown(environ []string, extra ...string) []UnknownVariable {
	known := append(Known(), extra...)
	var out []UnknownVariable
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(strings.ToUpper(name), Prefix) || slices.Contains(known, name) || serviceLink.MatchString(name) {
			continue
		}
		out = append(out, UnknownVariable{Name: name, Suggestion: closest(name, known)})
	}
	slices.SortFunc(out, func(a, b UnknownVariable) int { return strings.Compare(a.Name, b.Name) })
	return slices.CompactFunc(out, func(a, b UnknownVariable) bool { return a.Name == b.Name })
}

// closest returns the known name nearest to name by edit distance (case
// ignored), if it is near enough to be a typo: at most 2 edits, or a
// fifth of the name's length for long names.
func closest(name string, known []string) string {
	upper := strings.ToUpper(name)
	best, bestDist := "", -1
	for _, k := range known {
		d := editDistance(strings.TrimPrefix(upper, Prefix), strings.TrimPrefix(k, Prefix))
		if bestDist < 0 || d < bestDist {
			best, bestDist = k, d
		}
	}
	limit := max(2, len(strings.TrimPrefix(upper, Prefix))/5)
	if bestDist < 0 || bestDist > limit {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes: the
// names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// checkListenAddr checks a host:port to listen on: the port a number in
// 0..65535 (0: any free port), the host empty (every interface), an IP
// address or a name.
func checkListenAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: want host:port or :port (e.g. :8080, 0.0.0.0:8080, [::1]:8080)", addr)
	}
	digits := port != "" && strings.Trim(port, "0123456789") == ""
	if n, err := strconv.Atoi(port); !digits || err != nil || n > 65535 {
		return fmt.Errorf("%q: the port must be a number from 0 to 65535", addr)
	}
	if strings.ContainsAny(host, " \t/") {
		return fmt.Errorf("%q: %q is not a host name or address", addr, host)
	}
	return nil
}

// serviceLink matches the variables Kubernetes sets in every pod for a
// Service named cdcrelay in its namespace (CDCRELAY_SERVICE_HOST,
// CDCRELAY_PORT_8080_TCP_ADDR, ...) unless the pod spec turns service
// links off: not the user's settings, so no warning.
var serviceLink = regexp.MustCompile(`^CDCRELAY_(SERVICE_(HOST|PORT)(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?)$`)
