package brokerapi

import "testing"

func TestTopicMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, key string
		want         bool
	}{
		{"#", "", true},
		{"#", "orders.created", true},
		{"*", "", false},
		{"#.#", "", true},
		{"#.*", "", false},
		{".", "", false},
		{"*", "a", true},
		{"#.*", "a", true},
		{"*.", "a.", true},
		{"*", "orders", true},
		{"*", "orders.created", false},
		{"orders.#", "orders", true},
		{"orders.#", "orders.created.eu", true},
		{"orders.#", "payments.created", false},
		{"orders.*", "orders", false},
		{"orders.*", "orders.created", true},
		{"orders.*", "orders.created.eu", false},
		{"#.created", "created", true},
		{"#.created", "orders.created", true},
		{"#.created", "orders.created.eu", false},
		{"a.#.b.#.c", "a.b.c", true},
		{"a.#.b.#.c", "a.x.b.y.z.c", true},
		{"a.#.b.#.c", "a.x.c", false},
		{"a.*.#", "a", false},
		{"a.*.#", "a.b", true},
		{"#.#", "a.b", true},
		{"", "", true},
		{"", "a", false},
		{"orders.created", "orders.created", true},
		{"orders.created", "orders.createdx", false},
		{"a..b", "a..b", true},
		{"a.*.b", "a..b", true},
	} {
		if got := TopicMatch(c.pattern, c.key); got != c.want {
			t.Errorf("TopicMatch(%q, %q) = %v, want %v", c.pattern, c.key, got, c.want)
		}
	}
}

// reference is the definition, by plain recursion over the words.
func reference(p, k []string) bool {
	if len(p) == 0 {
		return len(k) == 0
	}
	if p[0] == "#" {
		for i := 0; i <= len(k); i++ {
			if reference(p[1:], k[i:]) {
				return true
			}
		}
		return false
	}
	return len(k) > 0 && (p[0] == "*" || p[0] == k[0]) && reference(p[1:], k[1:])
}

func FuzzTopicMatch(f *testing.F) {
	for _, s := range [][2]string{{"a.#.b", "a.x.b"}, {"#.*.#", "a"}, {"*.#.*", "a.b.c"}, {"", ""}, {"*", ""}, {".", "."}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, key string) {
		if len(pattern) > 64 || len(key) > 64 {
			return // the reference is exponential in the number of "#"
		}
		want := reference(Words(pattern), Words(key))
		if got := TopicMatch(pattern, key); got != want {
			t.Fatalf("TopicMatch(%q, %q) = %v, the definition says %v", pattern, key, got, want)
		}
	})
}
