package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cdcrelay/cdcrelay/internal/svckit/pgcluster"
)

// tourDatabase is the database -serve creates for the README's tour.
const tourDatabase = "app"

// serveDatabase is -serve (`make tour-db`): the demo's throwaway cluster
// alone, with wal_level=logical and a database for the tour, kept until
// ctx ends (Ctrl-C, or SIGTERM from the stop command it prints), then
// stopped and removed with everything in it, the tour's slot included.
func serveDatabase(ctx context.Context) error {
	step("starting a throwaway PostgreSQL cluster (wal_level=logical)")
	pg, err := pgcluster.StartPostgres(ctx, pgcluster.PostgresOptions{Log: os.Stderr})
	if err != nil {
		return err
	}
	defer cleanup("remove PostgreSQL cluster", func(context.Context) error { return pg.Close() })
	if err := pg.CreateDatabase(ctx, tourDatabase); err != nil {
		return err
	}
	step("PostgreSQL ready on 127.0.0.1:%d, database %s, user postgres without a password (data in %s)",
		pg.Port(), tourDatabase, pg.DataDir())
	fmt.Printf("\nIn each shell of the tour (README.md, \"A five-minute tour\"):\n\n"+
		"  export CDCRELAY_DATABASE_URL='%s'\n\n", pg.URL(tourDatabase))
	step("keeping it until Ctrl-C here (or: kill %d); that stops the cluster and removes it, data and slot included", os.Getpid())
	<-ctx.Done()
	return nil
}
