// Package slot holds the replication slot's lifecycle and the catalog
// rules around it: the publication, the slot lock, failover and what
// blocks a slot's creation. The adoption of a new slot's backlog (its
// marker, its lock and the snapshot backfill) is package adoption's, which
// builds on this one; how far a session's events are done, which moves the
// slot, is package progress's.
package slot
