package relay

import (
	"slices"
	"testing"
)

// TestBrokerNodesRotate: the nodes are tried in one shuffled order, each
// session starting with the node after the previous session's (after the
// one it connected to, or one further when none answered), and a session
// on another node than the previous one counts as a switch.
func TestBrokerNodesRotate(t *testing.T) {
	nodes := []string{"amqp://r1", "amqp://r2", "amqp://r3"}
	var b brokerNodes
	first := b.order(nodes)
	if len(first) != 3 || !sameSet(first, nodes) {
		t.Fatalf("order = %q, want a permutation of %q", first, nodes)
	}
	rotated := func(k int) []string { return append(slices.Clone(first[k:]), first[:k]...) }
	if b.connected(0, "r-a") {
		t.Fatal("the first session counted as a switch")
	}
	if got := b.order(nodes); !slices.Equal(got, rotated(1)) {
		t.Fatalf("after a session on node 0: order %q, want %q", got, rotated(1))
	}
	// The session after starts on node 1, which refuses; node 2 answers.
	if !b.connected(1, "r-c") {
		t.Fatal("a session on another node was not counted as a switch")
	}
	if got := b.order(nodes); !slices.Equal(got, rotated(0)) {
		t.Fatalf("after a session on node 2: order %q, want %q", got, rotated(0))
	}
	b.failed()
	if got := b.order(nodes); !slices.Equal(got, rotated(1)) {
		t.Fatalf("after no node answered: order %q, want %q", got, rotated(1))
	}
	if b.connected(2, "r-c") {
		t.Fatal("a session on the same node as the previous one counted as a switch")
	}
	var one brokerNodes
	if got := one.order(nodes[:1]); !slices.Equal(got, nodes[:1]) || one.connected(0, "r1") || one.connected(0, "r1") {
		t.Fatalf("one node: order %q, or a switch counted", got)
	}
	var none brokerNodes
	if got := none.order(nil); got != nil {
		t.Fatalf("no nodes: order %q, want nil (Dial falls back to the URL)", got)
	}
	none.failed()
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
