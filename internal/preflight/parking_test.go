package preflight

import (
	"strings"
	"testing"
)

func TestClassifyParkColumns(t *testing.T) {
	tg := target{schema: "public", table: "event_outbox"}
	cols := func(names ...string) tableFacts {
		tf := tableFacts{kind: "r"}
		for _, n := range names {
			tf.columns = append(tf.columns, column{name: n})
		}
		return tf
	}
	for _, c := range []struct {
		name string
		tf   tableFacts
		want string // "" = no finding
	}{
		{"both present", cols("id", "attempts", "last_error"), ""},
		{"no attempts", cols("id", "last_error"), "has no attempts column"},
		{"neither", cols("id"), "has no attempts or last_error column"},
	} {
		fs := classifyParkColumns(tg, c.tf)
		switch {
		case c.want == "" && len(fs) != 0:
			t.Errorf("%s: unexpected %+v", c.name, fs)
		case c.want != "" && (len(fs) != 1 || fs[0].Severity != Warn || !strings.Contains(fs[0].Message, c.want) || fs[0].Remedy == ""):
			t.Errorf("%s: got %+v, want one warning containing %q", c.name, fs, c.want)
		}
	}
}
