// Package wal is the PostgreSQL side of the relay: it owns the logical
// replication connection and turns the pgoutput stream into outbox events.
//
// Three layers, from bytes to the network:
//
//   - Parse reads one pgoutput message (protocol version 1) into a typed
//     value. It is pure and fuzzed: every read is bounds-checked, and a short
//     or corrupt message is an error, never a panic.
//   - Decoder follows the stream's transactions and relations and maps each
//     INSERT into the outbox table onto an Event (id, routing key, payload,
//     headers, commit LSN, index in the transaction). It refuses what the
//     relay cannot handle safely: an unknown message, a row it cannot map, an
//     insert into another table.
//   - Reader is the only goroutine that reads from or writes to the
//     replication connection. It hands events to the publisher, records the
//     stream's shape for the ack watermark (package slot), and sends the
//     status updates that move the slot: never past an event the broker has
//     not acknowledged, and never later than the status interval, even while
//     the broker holds the publisher back.
//
// docs/architecture.md draws the whole flow and numbers the invariants the
// comments here cite.
package wal
