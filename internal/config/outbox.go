package config

import (
	"fmt"
	"strings"
)

// Outbox describes the outbox table and what the relay streams it
// through, said once from the configuration (Config.Outbox): the decoder's
// mapping, the slot's set-up, the janitor, retention, the monitor and
// migrate all take it instead of restating the names. Every name is a
// real one (quotes removed, unquoted parts folded), to be quoted again
// with pgx.Identifier. An empty optional column name means the column is
// not mapped.
type Outbox struct {
	Schema, Table string
	// IDColumn, RoutingKeyColumn and PayloadColumn are required;
	// HeadersColumn, ExchangeColumn and TypeColumn are optional.
	IDColumn, RoutingKeyColumn, PayloadColumn string
	HeadersColumn, ExchangeColumn, TypeColumn string
	Publication                               string
	Slot                                      string
}

// Outbox returns the outbox description of a validated configuration.
func (c Config) Outbox() (Outbox, error) {
	schema, table, err := SplitTable(c.Table)
	if err != nil {
		return Outbox{}, err
	}
	return Outbox{
		Schema: schema, Table: table,
		IDColumn: c.IDColumn, RoutingKeyColumn: c.RoutingKeyColumn, PayloadColumn: c.PayloadColumn,
		HeadersColumn: c.HeadersColumn, ExchangeColumn: c.ExchangeColumn, TypeColumn: c.TypeColumn,
		Publication: c.Publication, Slot: c.Slot,
	}, nil
}

// Columns are the mapped column names in a fixed order (id, routing key,
// payload, headers, exchange, type), the optional ones as configured ("" when
// not mapped).
func (o Outbox) Columns() []string {
	return []string{o.IDColumn, o.RoutingKeyColumn, o.PayloadColumn, o.HeadersColumn, o.ExchangeColumn, o.TypeColumn}
}

// AdoptionSuffix ends every adoption marker's name (AdoptionMarkerName).
const AdoptionSuffix = "_adopting"

// AdoptionMarkerName names the adoption marker of slot slotName: a
// physical slot that reserves no WAL and exists only while the backlog of
// a new slot is being published (package adoption creates and drops it;
// slot.ReadSlot reports it). Its one spelling lives here, beside the rule
// that keeps it unique (CheckSlotName), so that the package that writes
// the marker and the one that reads it cannot disagree.
func AdoptionMarkerName(slotName string) string {
	return slotName + AdoptionSuffix
}

// MaxSlotNameLen is the longest slot name the relay accepts: its marker
// must fit PostgreSQL's 63-character limit whole (NAMEDATALEN - 1), or two
// slots sharing a long prefix would share a marker.
const MaxSlotNameLen = 63 - len(AdoptionSuffix)

// CheckSlotName refuses slot names that cannot get a marker of their own.
// With the name at most MaxSlotNameLen characters and not ending in
// AdoptionSuffix, AdoptionMarkerName is injective and no configured slot name
// equals another slot's marker, so one relay can never take another slot's
// marker for its own.
func CheckSlotName(name string) error {
	switch {
	case len(name) > MaxSlotNameLen:
		return fmt.Errorf("%q is %d characters; at most %d, so that its adoption marker %s<suffix> fits PostgreSQL's 63-character slot names", name, len(name), MaxSlotNameLen, AdoptionSuffix)
	case strings.HasSuffix(name, AdoptionSuffix):
		return fmt.Errorf("%q ends in %s, which names the adoption marker of another slot", name, AdoptionSuffix)
	}
	return nil
}
