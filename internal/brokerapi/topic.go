package brokerapi

import "strings"

// TopicMatch reports whether a topic exchange routes routingKey through a
// binding with pattern: both split into words at ".", "*" matches exactly
// one word and "#" zero or more. The broker splits "" into no word at all
// (not one empty word), so "*" does not match an empty key and "#" does;
// TestIntegrationTopicMatchAgreesWithBroker compares with a real broker.
func TopicMatch(pattern, routingKey string) bool {
	return wordsMatch(Words(pattern), Words(routingKey))
}

// Words splits a topic key or pattern as RabbitMQ does: "" is no word at
// all, anything else its "."-separated words.
func Words(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ".")
}

// wordsMatch is the classic wildcard match over words, kept linear in
// practice by trying a "#" against the fewest words first and remembering
// only the last "#" (as glob matchers do): a later "#" can absorb whatever
// an earlier one would have, so backtracking further is never needed.
func wordsMatch(p, k []string) bool {
	pi, ki := 0, 0
	star, mark := -1, 0 // the last "#" seen and the key word it was tried at
	for ki < len(k) {
		switch {
		case pi < len(p) && p[pi] == "#":
			star, mark = pi, ki
			pi++
		case pi < len(p) && (p[pi] == "*" || p[pi] == k[ki]):
			pi++
			ki++
		case star >= 0:
			mark++
			pi, ki = star+1, mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == "#" {
		pi++
	}
	return pi == len(p)
}
