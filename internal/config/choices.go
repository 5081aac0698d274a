package config

// The values of the settings that choose between behaviours.

// What to do when the slot was invalidated (wal_status lost).
const (
	SlotLostRecreate = "recreate" // drop it, create a new one and publish unpublished rows from its snapshot
	SlotLostStop     = "stop"     // exit with an error and leave the slot for an operator
)

// Whether the slot is a failover slot (PostgreSQL 17+), which standbys
// with sync_replication_slots keep in step, so that after a promotion the
// relay resumes where it was instead of adopting the backlog again.
const (
	SlotFailoverAuto = "auto" // a failover slot where the server is 17+ and a primary
	SlotFailoverOn   = "on"   // a failover slot; a server that cannot keep one is an error
	SlotFailoverOff  = "off"  // a slot without failover (an existing failover slot is converted back)
)

// Whether the janitor's and retention's transactions carry a replication
// origin that the stream skips (PostgreSQL 16+), so the walsender does not
// decode them.
const (
	MarkOriginAuto = "auto" // where the server is 16+ and the role has the origin grants
	MarkOriginOff  = "off"
)

// What to do with a poison event (one that can never become a valid message).
const (
	PoisonPark = "park" // mark the row attempts+1 / last_error, dead-letter it if configured, go on
	PoisonStop = "stop" // exit with an error naming the event
)

// What to do with a row the broker cannot route: a NO_ROUTE return, or a
// per-row exchange that does not exist.
const (
	UnroutableStall = "stall" // retry it until a binding or the exchange appears; keeps commit order
	UnroutablePark  = "park"  // treat it as poison (CDCRELAY_POISON)
)
