package preflight

import (
	"fmt"
	"slices"
	"strings"
)

// classifyColumnList judges a publication's column list: the relay needs the
// id, routing key and payload, and can use the optional columns.
func classifyColumnList(t target, tf tableFacts, p pubFacts) []Finding {
	pub := quoteIdent(t.publication)
	var fs []Finding
	bad := func(sev Severity, msg, remedy string) {
		fs = append(fs, Finding{Check: checkPublication, Severity: sev, Message: msg, Remedy: remedy})
	}
	var dropped, droppedOptional []string
	// Columns missing from the table are the mapping check's to report.
	for _, c := range []string{t.id, t.key, t.payload} {
		if _, inTable := tf.column(c); inTable && !slices.Contains(p.columns, c) {
			dropped = append(dropped, c)
		}
	}
	for _, c := range []string{t.headers, t.exch, t.msgType} {
		if _, inTable := tf.column(c); c != "" && inTable && !slices.Contains(p.columns, c) {
			droppedOptional = append(droppedOptional, c)
		}
	}
	if len(dropped) > 0 {
		bad(Error, fmt.Sprintf("publication %s's column list leaves out %s: the relay stops at the first row", t.publication, strings.Join(dropped, ", ")),
			fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s; (all columns)", pub, t.qualified()))
	}
	if len(droppedOptional) > 0 {
		bad(Warn, fmt.Sprintf("publication %s's column list leaves out %s: the relay cannot use them", t.publication, strings.Join(droppedOptional, ", ")),
			fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s; (all columns)", pub, t.qualified()))
	}
	return fs
}
