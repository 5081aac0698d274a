// Package slot holds the replication slot's lifecycle and the catalog
// rules around it: the publication, the slot lock, adoption and its
// snapshot backfill, failover and what blocks a slot's creation. How far a
// session's events are done, which moves the slot, is package progress's.
package slot
