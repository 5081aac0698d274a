package preflight_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// stallMgmtPassword is the management user's password; no finding may
// show it.
const stallMgmtPassword = "Stall-Mgmt-Secret-5b1"

// TestIntegrationCheckSeesStalls runs `cdcrelay check` against a real
// PostgreSQL and a private RabbitMQ node with the management plugin, read
// by a user with the monitoring tag only, for what stalls the stream or
// doubles it: an exchange with no binding (an Error; a warning with
// CDCRELAY_UNROUTABLE=park), the same exchange with an alternate exchange
// by policy that has a queue (OK), recent rows whose routing key no
// binding routes (an Error naming the key and its rows), a broker user
// without write permission on the exchange (an Error) or without what
// `cdcrelay tail` needs (a warning), and a second relay's slot on the same
// outbox (an Error whose remedy reuses that slot and never drops it).
// Each Error makes check exit non-zero (Write counts it).
func TestIntegrationCheckSeesStalls(t *testing.T) {
	node := testenv.MustRabbitMQManagement(t, testenv.RabbitMQOptions{})
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{Settings: map[string]string{"max_slot_wal_keep_size": "1GB"}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ctl := func(args ...string) {
		t.Helper()
		if out, err := node.Ctl(ctx, args...); err != nil {
			t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ctl("add_user", "monitor", stallMgmtPassword)
	ctl("set_user_tags", "monitor", "monitoring")
	ctl("set_permissions", "-p", "/", "monitor", "", "", ".*")
	mgmtURL := strings.Replace(node.ManagementURL(), "guest:guest@", "monitor:"+stallMgmtPassword+"@", 1)
	// The subtests' queues are exclusive to ch, whose connection lasts the
	// whole test: check reaches them only through the management API and
	// the exchanges, and RabbitMQ 4.3 refuses a transient queue that is not
	// exclusive.
	_, ch := testenv.MustChannel(t, node.URL())

	// errorsOf runs check and returns its findings and how many errors
	// Write counts (check's exit status is non-zero when any).
	errorsOf := func(t *testing.T, f *fixture, extra map[string]string) ([]preflight.Finding, int) {
		t.Helper()
		vars := map[string]string{"AMQP_MANAGEMENT_URL": mgmtURL}
		for k, v := range extra {
			vars[k] = v
		}
		fs, out := f.check(vars)
		if strings.Contains(out, stallMgmtPassword) {
			t.Fatal("the report shows the management password")
		}
		return fs, preflight.Write(&bytes.Buffer{}, fs)
	}

	t.Run("exchange with no binding", func(t *testing.T) {
		f := newFixture(t, pg, node.URL())
		fs, n := errorsOf(t, f, nil)
		want(t, fs, [2]string{"topology", `exchange "` + f.exchange + `" (CDCRELAY_EXCHANGE) has no binding and no alternate exchange`})
		e := has(t, fs, "topology", preflight.Error, "the stream stops on it")
		if !strings.Contains(e.Remedy, "rabbitmqadmin -V / declare binding source="+f.exchange) || !strings.Contains(e.Remedy, "alternate-exchange") {
			t.Errorf("remedy %q", e.Remedy)
		}
		if n != 1 {
			t.Errorf("Write counts %d errors, want 1", n)
		}
		fs, n = errorsOf(t, f, map[string]string{"UNROUTABLE": "park"})
		want(t, fs)
		has(t, fs, "topology", preflight.Warn, "every row would be parked")
		if n != 0 {
			t.Errorf("with park, Write counts %d errors", n)
		}

		// An alternate exchange set by a policy, with a queue bound to it:
		// every message reaches a queue.
		ae := f.exchange + ".unrouted"
		if err := ch.ExchangeDeclare(ae, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		ctl("set_policy", "-p", "/", "--apply-to", "exchanges", "ae-"+f.exchange, "^"+strings.ReplaceAll(f.exchange, ".", `\.`)+"$", `{"alternate-exchange":"`+ae+`"}`)
		t.Cleanup(func() { _, _ = node.Ctl(context.Background(), "clear_policy", "-p", "/", "ae-"+f.exchange) })
		fs, _ = errorsOf(t, f, nil)
		want(t, fs, [2]string{"topology", `its alternate exchange "` + ae + `" (policy "ae-` + f.exchange + `") reaches no queue either`})
		q := f.exchange + ".parked"
		if _, err := ch.QueueDeclare(q, false, true, true, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "", ae, false, nil); err != nil {
			t.Fatal(err)
		}
		fs, n = errorsOf(t, f, nil)
		want(t, fs)
		has(t, fs, "topology", preflight.OK, `exchange "`+f.exchange+`" has no binding; its alternate exchange "`+ae+`" (policy "ae-`+f.exchange+`") takes every message and reaches 1 queue(s)`)
		if n != 0 {
			t.Errorf("Write counts %d errors", n)
		}
	})

	t.Run("recent rows with an unbound key", func(t *testing.T) {
		f := newFixture(t, pg, node.URL())
		q := f.exchange + ".orders"
		if _, err := ch.QueueDeclare(q, false, true, true, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "orders.*", f.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		f.exec(
			`INSERT INTO event_outbox (routing_key, payload, published_at) SELECT 'orders.created', '{}', now() FROM generate_series(1, 3)`,
			`INSERT INTO event_outbox (routing_key, payload) VALUES ('payments.created', '{}'), ('payments.created', '{}'), ('orders.created.eu', '{}')`,
		)
		fs, n := errorsOf(t, f, nil)
		want(t, fs,
			[2]string{"topology", `no binding routes routing key "payments.created" on exchange "` + f.exchange + `" to a queue, and 2 of the 6 rows read (2 of them unpublished) carry it`},
			[2]string{"topology", `no binding routes routing key "orders.created.eu" on exchange "` + f.exchange + `" to a queue, and 1 of the 6 rows read (1 of them unpublished) carry it`})
		has(t, fs, "topology", preflight.OK, "1 of the 3 distinct routing key(s) of the 6 rows read")
		has(t, fs, "topology", preflight.Error, "remedy:routing_key='payments.created'")
		if n != 2 {
			t.Errorf("Write counts %d errors, want 2", n)
		}
		if err := ch.QueueBind(q, "#", f.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		fs, _ = errorsOf(t, f, nil)
		want(t, fs)
		has(t, fs, "topology", preflight.OK, "3 of the 3 distinct routing key(s) of the 6 rows read")
	})

	t.Run("broker user permissions", func(t *testing.T) {
		f := newFixture(t, pg, node.URL())
		q := f.exchange + ".all"
		if _, err := ch.QueueDeclare(q, false, true, true, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "#", f.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		exact := "^" + strings.ReplaceAll(f.exchange, ".", `\.`) + "$"
		users := map[string][3]string{ // configure, write, read
			"readonly": {"", "", ".*"},
			"writer":   {"", exact, ""},
			"tailer":   {`^cdcrelay\.tail\.`, `^cdcrelay\.tail\.|` + exact, `^cdcrelay\.tail\.|` + exact},
		}
		for u, p := range users {
			ctl("add_user", u, "Pw-"+u)
			ctl("set_permissions", "-p", "/", u, p[0], p[1], p[2])
		}
		as := func(u string) map[string]string {
			return map[string]string{"AMQP_URL": strings.Replace(node.URL(), "guest:guest@", u+":Pw-"+u+"@", 1)}
		}

		fs, n := errorsOf(t, f, as("readonly"))
		want(t, fs, [2]string{"permissions", `user readonly may not publish to exchange "` + f.exchange + `" (CDCRELAY_EXCHANGE): it has no write permission on it`})
		has(t, fs, "permissions", preflight.Error, `remedy:rabbitmqctl set_permissions -p / readonly '<configure>' '<write>|^`+strings.ReplaceAll(f.exchange, ".", `\.`)+`$' '<read>'`)
		has(t, fs, "permissions", preflight.Warn, `it lacks configure on queues ^cdcrelay\.tail\., write on queues ^cdcrelay\.tail\. (`)
		if n != 1 {
			t.Errorf("Write counts %d errors, want 1", n)
		}

		fs, n = errorsOf(t, f, as("writer"))
		want(t, fs)
		has(t, fs, "permissions", preflight.OK, `user writer may publish to exchange "`+f.exchange+`"`)
		has(t, fs, "permissions", preflight.Warn, `user writer cannot run `+"`cdcrelay tail`"+` on exchange "`+f.exchange+`": it lacks configure on queues ^cdcrelay\.tail\., write on queues ^cdcrelay\.tail\., read on queues ^cdcrelay\.tail\. (`)
		has(t, fs, "permissions", preflight.Warn, `not checked: read on exchange "`+f.exchange+`" (the broker refused the queue first)`)
		if n != 0 {
			t.Errorf("Write counts %d errors", n)
		}

		fs, _ = errorsOf(t, f, as("tailer"))
		want(t, fs)
		has(t, fs, "permissions", preflight.OK, "user tailer may run `cdcrelay tail`")
		if w := warnings(fs); len(w) != 0 {
			t.Errorf("warnings for a user with every permission: %+v", w)
		}

		// What tail's permissions are checked for does work: a queue
		// cdcrelay.tail.… declared, bound and consumed by that user.
		conn, err := amqp.Dial(as("tailer")["AMQP_URL"])
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		tch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		tq, err := tch.QueueDeclare("cdcrelay.tail.test", false, true, true, false, nil)
		if err == nil {
			err = tch.QueueBind(tq.Name, "#", f.exchange, false, nil)
		}
		if err == nil {
			_, err = tch.Consume(tq.Name, "", true, true, false, false, nil)
		}
		if err != nil {
			t.Fatalf("a user check says may run tail cannot: %v", err)
		}

		// The probes changed nothing: no queue, binding or exchange of
		// theirs is left, and no message reached the bound queue.
		var leftovers []map[string]any
		if err := getJSON(ctx, node.ManagementURL()+"/api/bindings/%2F", &leftovers); err != nil {
			t.Fatal(err)
		}
		for _, b := range leftovers {
			if d, _ := b["destination"].(string); strings.HasPrefix(d, "cdcrelay.tail.check-") || strings.Contains(b["source"].(string), "cdcrelay.check.") {
				t.Errorf("a probe left a binding: %v", b)
			}
		}
		if st, err := ch.QueueDeclarePassive(q, false, true, true, false, nil); err != nil || st.Messages != 0 {
			t.Errorf("queue %s after the probes: %d messages, %v", q, st.Messages, err)
		}
	})

	t.Run("second relay slot", func(t *testing.T) {
		f := newFixture(t, pg, node.URL())
		if _, err := ch.QueueDeclare(f.exchange+".all", false, true, true, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(f.exchange+".all", "#", f.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		prod := testenv.UniqueName("cdcrelay_orders")
		stream(t, f.url(), prod) // the relay in production, streaming
		fs, n := errorsOf(t, f, map[string]string{"SLOT": testenv.UniqueName("cdcrelay_orders_copy")})
		want(t, fs, [2]string{"other_slots", "another relay streams public.event_outbox from its own slot; this configuration would publish every event twice"})
		e := has(t, fs, "other_slots", preflight.Error, "slot "+prod+" (plugin pgoutput, active")
		for _, w := range []string{"stop the other relay and reuse its slot: CDCRELAY_SLOT=" + prod, "fix CDCRELAY_SLOT, CDCRELAY_PUBLICATION and CDCRELAY_TABLE", "Keep slot " + prod} {
			if !strings.Contains(e.Remedy, w) {
				t.Errorf("remedy %q lacks %q", e.Remedy, w)
			}
		}
		if strings.Contains(e.Remedy, "pg_drop_replication_slot") {
			t.Errorf("remedy %q says to drop the production relay's slot", e.Remedy)
		}
		if n != 1 {
			t.Errorf("Write counts %d errors, want 1", n)
		}
	})
}

// getJSON decodes the answer to GET url (its user and password as basic
// authentication).
func getJSON(ctx context.Context, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", req.URL.Path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
