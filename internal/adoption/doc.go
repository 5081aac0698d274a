// Package adoption holds the adoption of a new slot's backlog: the rows
// with published_at IS NULL committed before the slot's consistent point,
// which the relay publishes from the slot's snapshot before it streams
// (invariant 7, docs/architecture.md). That is its marker in the database
// (named by config.AdoptionMarkerName), its lock (Begin, End) and the
// snapshot backfill (Backfill).
//
// It is apart from package slot, which holds the slot itself (its
// creation, drop, lock, publication and catalog rules): an adoption is one
// use of a slot, with its own state and its own reading of the outbox
// table. It builds on slot (slot.Created, slot.Drop, slot.ErrBusy); slot
// never imports it. slot.ReadSlot reports the marker (Info.Adopting) by
// the same config.AdoptionMarkerName.
package adoption
