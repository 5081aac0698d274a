package relay_test

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationMigrate runs `cdcrelay migrate` twice on an empty
// database with a publication name of its own: the table, its index and
// the configured publication exist, insert only, no stray default
// publication is left beside it, and the second run changes nothing.
func TestIntegrationMigrate(t *testing.T) {
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		cmd := exec.Command(relayBinary(t), "migrate")
		cmd.Env = append(os.Environ(), config.Prefix+"DATABASE_URL="+pg.URL("orders"), config.Prefix+"PUBLICATION=cdcrelay_orders")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("migrate: %v\n%s", err, out)
		}
	}
	db, err := pgx.Connect(ctx, pg.URL("orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	var index bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE indexname = 'event_outbox_unpublished_idx')`).Scan(&index); err != nil || !index {
		t.Fatalf("partial index missing (%v)", err)
	}
	rows, err := db.Query(ctx, `SELECT p.pubname, p.pubinsert AND NOT (p.pubupdate OR p.pubdelete OR p.pubtruncate), t.tablename
		FROM pg_publication p JOIN pg_publication_tables t USING (pubname) ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var name, table string
		var insertOnly bool
		if err := rows.Scan(&name, &insertOnly, &table); err != nil {
			t.Fatal(err)
		}
		if !insertOnly || table != "event_outbox" {
			t.Fatalf("publication %s: insert only %v, table %s", name, insertOnly, table)
		}
		got = append(got, name)
	}
	if len(got) != 1 || got[0] != "cdcrelay_orders" {
		t.Fatalf("publications %v", got)
	}
}

// TestIntegrationPublicationBeforeSlot: on a database with the outbox
// table but neither publication nor slot, a relay whose role may create the
// publication creates it first, then the slot, and streams (invariant 7,
// docs/architecture.md: decoding a slot whose publication is missing fails).
func TestIntegrationPublicationBeforeSlot(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `DROP PUBLICATION cdcrelay_outbox`); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(map[string]string{"DATABASE_URL": e.dbURL}) // the table's owner
	r.waitStreaming(t)
	var insertOnly bool
	err := e.db.QueryRow(ctx, `
		SELECT p.pubinsert AND NOT (p.pubupdate OR p.pubdelete OR p.pubtruncate)
		FROM pg_publication p JOIN pg_publication_tables t USING (pubname)
		WHERE pubname = 'cdcrelay_outbox' AND t.tablename = 'event_outbox'`).Scan(&insertOnly)
	if err != nil {
		t.Fatalf("publication for event_outbox not created: %v", err)
	}
	if !insertOnly {
		t.Fatal("the relay created a publication that is not insert-only")
	}
	if !strings.Contains(r.logs.String(), "created publication") ||
		strings.Index(r.logs.String(), "created publication") > strings.Index(r.logs.String(), "created replication slot") {
		t.Fatalf("publication not created before the slot:\n%s", r.logs.String())
	}
	rows, _ := insertTxns(t, e.db, "k", 10)
	waitAll(t, e.consumer, rows, 30*time.Second)
}

// TestIntegrationMigrateAsRelayRole: migrate run as a role that may not
// create the table (the relay's own, by mistake) fails saying who should run it.
func TestIntegrationMigrateAsRelayRole(t *testing.T) {
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(ctx, pg.URL("orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	relayURL := leastPrivilegeRoleWithoutTable(t, db, pg.URL("orders"))
	cmd := exec.Command(relayBinary(t), "migrate")
	cmd.Env = append(os.Environ(), config.Prefix+"DATABASE_URL="+relayURL)
	out, err := cmd.CombinedOutput()
	if !isExit(err, 1) || !strings.Contains(string(out), "(SQLSTATE 42501): run migrate as the outbox table's owner (or a role that may create it)") {
		t.Fatalf("migrate as the relay's role: %v\n%s", err, out)
	}
	if strings.Contains(string(out), relayRolePassword) {
		t.Errorf("migrate printed the password:\n%s", out)
	}
}

// leastPrivilegeRoleWithoutTable is the relay's login role in a database
// whose outbox does not exist yet; it returns the URL to connect as it.
func leastPrivilegeRoleWithoutTable(t *testing.T, db *pgx.Conn, superURL string) string {
	t.Helper()
	if _, err := db.Exec(context.Background(), `CREATE ROLE cdcrelay_app LOGIN REPLICATION PASSWORD '`+relayRolePassword+`'`); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	u, err := url.Parse(superURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("cdcrelay_app", relayRolePassword)
	return u.String()
}
