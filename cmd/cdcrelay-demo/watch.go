package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/svckit/brokernode"
	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// stats summarises what the consumer received.
type stats struct {
	delivered  int // distinct expected orders received
	duplicates int // further copies of an order already received
	unexpected int // messages that are not one of this run's orders
	seen       map[int]bool
	latencies  []time.Duration // first copy of each order only
}

// watch prints deliveries as they arrive until want distinct orders have
// been received or ctx ends, and returns what it saw.
func watch(ctx context.Context, c *brokernode.Consumer, want int) *stats {
	st := &stats{seen: make(map[int]bool, want)}
	next := 0
	for st.delivered < want {
		if err := c.WaitCount(ctx, next+1); err != nil {
			return st
		}
		for _, d := range c.DeliveriesFrom(next) {
			st.add(d, want)
			next++
		}
	}
	return st
}

func (st *stats) add(d brokernode.Delivery, want int) {
	var ev orderEvent
	if err := json.Unmarshal(d.Body, &ev); err != nil || ev.OrderID < 1 || ev.OrderID > want {
		st.unexpected++
		fmt.Printf("recv  | UNEXPECTED id=%s key=%s body=%s\n", d.MessageID, d.RoutingKey, d.Body)
		return
	}
	latency := d.ReceivedAt.Sub(ev.SentAt)
	note := ""
	if st.seen[ev.OrderID] {
		st.duplicates++
		note = "  DUPLICATE"
	} else {
		st.seen[ev.OrderID] = true
		st.delivered++
		st.latencies = append(st.latencies, latency)
	}
	if d.Redelivered {
		note += " (redelivered)"
	}
	fmt.Printf("recv  | order %-4d id=%s key=%s latency=%s body=%s%s\n",
		ev.OrderID, d.MessageID, d.RoutingKey, toolkit.Ms(latency), d.Body, note)
}

func (st *stats) print(expected int) {
	fmt.Printf("demo  | delivered %d/%d events, %d duplicates, %d unexpected\n",
		st.delivered, expected, st.duplicates, st.unexpected)
	if len(st.latencies) == 0 {
		return
	}
	sorted := slices.Clone(st.latencies)
	slices.Sort(sorted)
	fmt.Printf("demo  | latency insert->consumer: p50 %s, p99 %s, max %s\n",
		toolkit.Ms(toolkit.Percentile(sorted, 0.50)), toolkit.Ms(toolkit.Percentile(sorted, 0.99)), toolkit.Ms(sorted[len(sorted)-1]))
}
