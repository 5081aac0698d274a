package preflight

import (
	"fmt"
	"strings"
)

// parkColumns are the columns a parked poison row's attempts and last
// error are written to; the outbox schema has them, but they are optional.
var parkColumns = []string{"attempts", "last_error"}

// classifyParkColumns warns when the table lacks a poison-bookkeeping
// column: parked rows are then skipped without a record (the relay reports
// that once in its log). A missing grant on existing columns is reported by
// classifyPrivileges.
func classifyParkColumns(t target, tf tableFacts) []Finding {
	var absent []string
	for _, name := range parkColumns {
		if _, ok := tf.column(name); !ok {
			absent = append(absent, name)
		}
	}
	if len(absent) == 0 {
		return nil
	}
	return []Finding{{Check: checkMapping, Severity: Warn,
		Message: fmt.Sprintf("%s has no %s column: a parked poison row (CDCRELAY_POISON=park) is still skipped and logged, but its attempts and last_error are not recorded",
			t.qualified(), strings.Join(absent, " or ")),
		Remedy: fmt.Sprintf("ALTER TABLE %s ADD COLUMN attempts int NOT NULL DEFAULT 0, ADD COLUMN last_error text; (only the missing ones; the schema in migrations/0001_event_outbox.sql has them)", t.qualified())}}
}
