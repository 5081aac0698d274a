package svckit

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// UniqueName returns prefix + "_" + 12 random hex digits. With a prefix of
// lower-case letters, digits and underscores the result is a valid
// replication slot, database, exchange and queue name, so parallel runs and
// reruns against a shared broker never collide.
func UniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return prefix + "_" + hex.EncodeToString(b[:])
}

// Tail returns the last n lines of s: the part of a long log worth
// showing when something failed.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
