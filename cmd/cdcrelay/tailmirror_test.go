package main

import (
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/brokerapi"
)

func TestMirrorPlan(t *testing.T) {
	q := func(dest, key string) brokerapi.Binding {
		return brokerapi.Binding{Destination: dest, DestinationType: "queue", RoutingKey: key}
	}
	topic := brokerapi.Exchange{Name: "events", Type: "topic"}
	for _, c := range []struct {
		name      string
		exchange  brokerapi.Exchange
		bindings  []brokerapi.Binding
		keys      []string // the plan's binding keys, in order
		notes     []string // a substring of each note, in order
		err       string
		routedBy  map[string]bool // routing key: whether matchedElsewhere says another queue takes it
		undecided bool            // matchedElsewhere cannot judge this type
	}{
		{name: "no binding: nothing to copy", exchange: topic,
			routedBy: map[string]bool{"orders.created": false, "": false}},
		{name: "queues' keys copied once each", exchange: topic,
			bindings: []brokerapi.Binding{q("billing", "orders.#"), q("audit", "orders.#"), q("mail", "*.created")},
			keys:     []string{"*.created", "orders.#"},
			routedBy: map[string]bool{"orders.shipped": true, "payments.created": true, "payments.failed": false}},
		{name: "other tails' bindings are not copied", exchange: topic,
			bindings: []brokerapi.Binding{q("cdcrelay.tail.0a1b2c", "#"), q("billing", "orders.#")},
			keys:     []string{"orders.#"},
			routedBy: map[string]bool{"payments.created": false}},
		{name: "exchange-to-exchange bindings are not copied", exchange: topic,
			bindings: []brokerapi.Binding{{Destination: "downstream", DestinationType: "exchange", RoutingKey: "#"}},
			notes:    []string{"1 exchange-to-exchange binding(s) are not copied"},
			routedBy: map[string]bool{"orders.created": false}},
		{name: "alternate exchange named", exchange: brokerapi.Exchange{Name: "events", Type: "topic", Arguments: map[string]any{"alternate-exchange": "unrouted"}},
			notes: []string{`alternate exchange "unrouted"`}},
		{name: "direct", exchange: brokerapi.Exchange{Name: "events", Type: "direct"},
			bindings: []brokerapi.Binding{q("billing", "orders.created")}, keys: []string{"orders.created"},
			routedBy: map[string]bool{"orders.created": true, "orders.#": false}},
		{name: "fanout: one binding", exchange: brokerapi.Exchange{Name: "events", Type: "fanout"},
			bindings: []brokerapi.Binding{q("a", "x"), q("b", "y")}, keys: []string{""},
			routedBy: map[string]bool{"anything": true}},
		{name: "headers: string arguments copied, others not", exchange: brokerapi.Exchange{Name: "events", Type: "headers"},
			bindings: []brokerapi.Binding{
				{Destination: "a", DestinationType: "queue", Arguments: map[string]any{"x-match": "all", "type": "order"}},
				{Destination: "b", DestinationType: "queue", Arguments: map[string]any{"x-match": "all", "version": 2.0}},
			},
			keys: []string{""}, notes: []string{`queue "b" is not copied`}, undecided: true},
		{name: "hashing exchange refused", exchange: brokerapi.Exchange{Name: "events", Type: "x-consistent-hash"},
			bindings: []brokerapi.Binding{q("a", "10")}, err: "a share of the events"},
		{name: "default exchange refused", exchange: brokerapi.Exchange{Name: "", Type: ""},
			bindings: []brokerapi.Binding{q("a", "a")}, err: "default exchange"},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan, notes, err := mirrorPlan(c.exchange, c.bindings)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, b := range plan {
				keys = append(keys, b.key)
			}
			if strings.Join(keys, "|") != strings.Join(c.keys, "|") || len(keys) != len(c.keys) {
				t.Errorf("plan keys = %q, want %q", keys, c.keys)
			}
			if len(notes) != len(c.notes) {
				t.Fatalf("notes = %q, want %d", notes, len(c.notes))
			}
			for i, want := range c.notes {
				if !strings.Contains(notes[i], want) {
					t.Errorf("note %d = %q, want it to contain %q", i, notes[i], want)
				}
			}
			for key, want := range c.routedBy {
				matched, ok := matchedElsewhere(c.exchange.Type, plan, key)
				if !ok || matched != want {
					t.Errorf("matchedElsewhere(%q) = %v, %v; want %v, true", key, matched, ok, want)
				}
			}
			if _, ok := matchedElsewhere(c.exchange.Type, plan, "k"); ok == c.undecided {
				t.Errorf("matchedElsewhere judged = %v for type %q", ok, c.exchange.Type)
			}
		})
	}
}

func TestTailPermissions(t *testing.T) {
	got := tailPermissions("prod", "relay user", "orders.events")
	for _, want := range []string{
		`vhost "prod"`,
		`rabbitmqctl set_permissions -p prod 'relay user' '^cdcrelay\.tail\.' '^cdcrelay\.tail\.' '^(cdcrelay\.tail\..*|orders\.events)$'`,
		"merge them",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("tailPermissions lacks %q:\n%s", want, got)
		}
	}
}
