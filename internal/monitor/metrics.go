package monitor

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// staleAfter is how many intervals a refresh's readings stay exported: a
// holder that cannot refresh for longer exports nothing rather than old
// values (docs/operations.md, Metrics).
const staleAfter = 3

// reading is one successful refresh.
type reading struct {
	unpublished, parked float64
	oldest              float64 // NaN without enqueued_at
	retained, lag       float64
	safeWAL             float64 // -1: max_slot_wal_keep_size unlimited
	walStatus           string  // "" when the slot does not exist
	otherRelays         float64 // other pgoutput slots of the database a cdcrelay streams
}

// collector exports the readings only while they are fresh and this
// replica holds the monitor lock, so a blind or demoted replica's series
// disappear instead of freezing at their last value. The timestamp of the
// last success and the holder flag are always exported: they are what
// tells a stale monitor apart from a missing one.
type collector struct {
	interval time.Duration
	now      func() time.Time

	unpublished, parked, oldest, retained, lag, safeWAL, walStatus *prometheus.Desc
	otherRelays                                                    *prometheus.Desc
	lastSuccess, holder                                            *prometheus.Desc
	descs                                                          []*prometheus.Desc // all of the above
	names                                                          []string           // their names

	mu     sync.Mutex
	held   bool
	last   time.Time // zero until the first successful refresh
	latest reading
}

func newCollector(slot string, interval time.Duration, now func() time.Time) *collector {
	labels := prometheus.Labels{"slot": slot}
	c := &collector{interval: interval, now: now}
	d := func(name, help string, variable ...string) *prometheus.Desc {
		desc := prometheus.NewDesc(name, help, variable, labels)
		c.descs, c.names = append(c.descs, desc), append(c.names, name)
		return desc
	}
	c.unpublished = d("cdcrelay_outbox_unpublished", "Outbox rows with published_at IS NULL that are not parked (last_error IS NULL). Exported only by the monitor lock's holder, while fresh.")
	c.parked = d("cdcrelay_outbox_parked", "Parked poison rows: published_at IS NULL AND last_error IS NOT NULL (0 without a last_error column). Exported only by the monitor lock's holder, while fresh.")
	c.oldest = d("cdcrelay_oldest_unpublished_age_seconds", "Age of the oldest unpublished, not parked outbox row (0 when none; NaN when the table has no enqueued_at column). Exported only by the monitor lock's holder, while fresh.")
	c.retained = d("cdcrelay_slot_retained_wal_bytes", "WAL the slot makes PostgreSQL keep: current WAL position minus restart_lsn. Exported only by the monitor lock's holder, while fresh.")
	c.lag = d("cdcrelay_slot_lag_bytes", "Current WAL position minus the slot's confirmed_flush_lsn. Exported only by the monitor lock's holder, while fresh.")
	c.safeWAL = d("cdcrelay_slot_safe_wal_size_bytes", "WAL that can still be written before the slot is invalidated (-1: max_slot_wal_keep_size unlimited). Exported only by the monitor lock's holder, while fresh.")
	c.walStatus = d("cdcrelay_slot_wal_status", "1 for the slot's current wal_status (reserved, extended, unreserved, lost), 0 for the others. Exported only by the monitor lock's holder, while fresh.", "status")
	c.otherRelays = d("cdcrelay_other_relay_slots", "Other logical slots of this database, on the primary and, with the slot on a standby (CDCRELAY_REPLICATION_URL), on that standby, that pgoutput streams to a connection named like a relay (application_name cdcrelay, or one of this relay's own): another relay on the same database, which publishes every event of a shared outbox a second time. The names are logged. Exported only by the monitor lock's holder, while fresh.")
	c.lastSuccess = d("cdcrelay_monitor_last_success_timestamp_seconds", "Unix time of this process's last successful backlog and slot refresh (0: none yet).")
	c.holder = d("cdcrelay_monitor_holder", "1 while this replica holds the monitor lock and so refreshes the backlog and slot gauges.")
	return c
}

// Describe sends every metric the collector can export, the conditional
// ones included, so that the registry checks them once at registration.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// ValueTypes names the type of every metric the collector can export,
// those hidden now included: a Desc does not carry its type, and listings of
// the registry (docs/metrics.txt) must not depend on whether this replica
// holds the lock when they are made.
func (c *collector) ValueTypes() map[string]prometheus.ValueType {
	out := make(map[string]prometheus.ValueType, len(c.names))
	for _, name := range c.names {
		out[name] = prometheus.GaugeValue // all of them
	}
	return out
}

// Collect exports the state as of now.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	held, last, r := c.held, c.last, c.latest
	c.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ts := 0.0
	if !last.IsZero() {
		ts = float64(last.UnixNano()) / 1e9
	}
	gauge(c.lastSuccess, ts)
	gauge(c.holder, boolValue(held))
	if !c.fresh(held, last) {
		return
	}
	gauge(c.unpublished, r.unpublished)
	gauge(c.parked, r.parked)
	gauge(c.oldest, r.oldest)
	gauge(c.retained, r.retained)
	gauge(c.lag, r.lag)
	gauge(c.safeWAL, r.safeWAL)
	gauge(c.otherRelays, r.otherRelays)
	for _, s := range walStatuses {
		gauge(c.walStatus, boolValue(r.walStatus == s), s)
	}
}

// fresh is the export rule: this replica holds the lock and its last
// successful refresh is at most staleAfter intervals old.
func (c *collector) fresh(held bool, last time.Time) bool {
	return held && !last.IsZero() && c.now().Sub(last) <= staleAfter*c.interval
}

func (c *collector) setHolder(held bool) {
	c.mu.Lock()
	c.held = held
	c.mu.Unlock()
}

// succeeded records a refresh's readings, taken now.
func (c *collector) succeeded(r reading) {
	c.mu.Lock()
	c.latest, c.last = r, c.now()
	c.mu.Unlock()
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// nan stands for a NULL float column.
func nan(v *float64) float64 {
	if v == nil {
		return math.NaN()
	}
	return *v
}
