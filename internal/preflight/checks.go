package preflight

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// This file is the database preflight as a table of checks, run in order
// over one session; the order is the order Run reports them in. What more
// than one check judges (the settings, the role, the table, the
// publication, the slot) is a fact, read once by its loader before the
// first check that needs it; a loader names the facts it needs in turn.
// A fact that could not be read keeps the error, and the check that owns
// it reports it.

// A dbCheck is one concern: it reads what only it needs and returns its
// findings, having the facts it needs loaded first.
type dbCheck struct {
	needs []fact
	run   func(ctx context.Context, s *session) []Finding
}

// dbChecks are the database checks, in report order.
var dbChecks = []dbCheck{
	{nil, standbyCheck},
	{[]fact{factSettings}, serverCheck},
	{[]fact{factSettings, factCounts}, headroomCheck},
	{[]fact{factSettings}, walRetentionCheck},
	{[]fact{factRole, factTable}, privilegesCheck},
	{[]fact{factRole, factSettings, factCounts}, replicationConnectionCheck},
	{[]fact{factTable}, tableCheck},
	{[]fact{factTable}, retentionCheck},
	{[]fact{factTable}, marksCheck},
	{[]fact{factTable, factPublication}, publicationCheck},
	{[]fact{factTable, factPublication}, generatedCheck},
	{[]fact{factRole, factPublication, factSlot}, slotCheck},
	{nil, failoverCheck},
	{nil, originCheck},
	{nil, otherSlotsCheck},
	{[]fact{factSlot}, transactionsCheck},
	{nil, slotLockCheck},
}

// A fact is what several checks judge, read once.
type fact int

const (
	factSettings    fact = iota // the pg_settings the checks judge
	factCounts                  // replication slots and WAL senders in use
	factRole                    // the role's attributes
	factTable                   // the outbox table, its columns, the role's grants on it
	factPublication             // as the relay reads it (slot.ReadPublication)
	factSlot                    // as the relay reads it (slot.ReadSlot), on the slot's server
)

// loaders read each fact into the session, after the facts they need.
var loaders = map[fact]struct {
	needs []fact
	load  func(ctx context.Context, s *session)
}{
	factSettings:    {nil, loadSettings},
	factCounts:      {nil, loadCounts},
	factRole:        {nil, loadRole},
	factTable:       {[]fact{factRole}, loadTable}, // records the role's grants on it
	factPublication: {[]fact{factTable}, loadPublication},
	factSlot:        {nil, loadSlot},
}

// session holds the check connections and the facts read so far.
type session struct {
	db     *pgx.Conn
	ss     *session // the slot's server: this session, or CDCRELAY_REPLICATION_URL's
	t      target
	cfg    config.Config
	opts   Options
	loaded map[fact]bool

	settings    map[string]setting
	settingsErr error
	counts      counts
	countsErr   error
	role        roleFacts
	roleErr     Finding // not ok when the role could not be read
	table       tableFacts
	tableErr    Finding // not ok when the table could not be read
	// canCreatePublication: the role owns the table and may CREATE in
	// the database.
	canCreatePublication bool
	pub                  slot.PublicationFacts
	pubErr               error
	slot                 slotFacts
	slotErr              error
	// caps is the server's version and role, probed once per check run
	// by the first check that needs them (probe).
	caps     pgcaps.Caps
	capsErr  error
	capsRead bool
}

// probe returns the session's server capabilities (pgcaps.Probe), read
// once per check run and shared by the checks that need them.
func (s *session) probe(ctx context.Context) (pgcaps.Caps, error) {
	if !s.capsRead {
		s.capsRead = true
		s.caps, s.capsErr = pgcaps.Probe(ctx, s.db)
	}
	return s.caps, s.capsErr
}

// need loads the facts not loaded yet, each after those it needs.
func (s *session) need(ctx context.Context, facts []fact) {
	for _, f := range facts {
		if s.loaded[f] {
			continue
		}
		s.loaded[f] = true
		l := loaders[f]
		s.need(ctx, l.needs)
		l.load(ctx, s)
	}
}

// runChecks runs dbChecks in order.
func (s *session) runChecks(ctx context.Context) []Finding {
	var fs []Finding
	for _, c := range dbChecks {
		s.need(ctx, c.needs)
		fs = append(fs, c.run(ctx, s)...)
	}
	return fs
}
