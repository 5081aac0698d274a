package toolkit

import "strings"

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(parts[max(0, len(parts)-n):], "\n")
}
