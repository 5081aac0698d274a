package inbox_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/inbox"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// consumerPage is the page a service outside this repository follows to
// depend on the package: the tests below build its module from it, so that
// what it says is what works.
const consumerPage = "../docs/consumers.md"

// cloneInPage is the path of the relay's clone in the page's recipe; the
// tests put this repository's absolute path in its place.
const cloneInPage = "../cdcrelay"

// pageBlock returns the fenced code block right after the marker
// <!-- consumer-module: name --> in the page.
func pageBlock(t *testing.T, page, name string) string {
	t.Helper()
	marker := "<!-- consumer-module: " + name + " -->\n"
	_, rest, ok := strings.Cut(page, marker)
	if !ok {
		t.Fatalf("%s has no %q marker", consumerPage, strings.TrimSpace(marker))
	}
	fence, rest, ok := strings.Cut(rest, "\n")
	if !ok || !strings.HasPrefix(fence, "```") {
		t.Fatalf("%s: the %s marker is not followed by a code block", consumerPage, name)
	}
	body, _, ok := strings.Cut(rest, "\n```\n")
	if !ok {
		t.Fatalf("%s: the %s code block is not closed", consumerPage, name)
	}
	return body + "\n"
}

// goLine is a go.mod's go directive.
var goLine = regexp.MustCompile(`(?m)^go (\S+)$`)

// consumerModule is the page's module, written into a folder outside the
// repository.
type consumerModule struct {
	dir, gomod, commands string
	repo                 string // this repository, the clone
}

// writeConsumer writes the page's main.go and go.mod (the latter through
// edit, which gets the page's go.mod with the clone's path put in) into a
// new temporary folder, outside the repository.
func writeConsumer(t *testing.T, edit func(gomod string) string) *consumerModule {
	t.Helper()
	b, err := os.ReadFile(consumerPage)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	m := &consumerModule{dir: t.TempDir(), repo: repo, commands: pageBlock(t, page, "commands")}
	if rel, err := filepath.Rel(repo, m.dir); err == nil && !strings.HasPrefix(rel, "..") {
		t.Fatalf("the consumer's folder %s is inside the repository %s", m.dir, repo)
	}
	gomod := pageBlock(t, page, "go.mod")
	for _, want := range []string{"module ", "\nrequire github.com/cdcrelay/cdcrelay v0.0.0-00010101000000-000000000000\n",
		"\nreplace github.com/cdcrelay/cdcrelay => " + cloneInPage + "\n"} {
		if !strings.Contains(gomod, want) {
			t.Fatalf("the page's go.mod lacks %q:\n%s", strings.TrimSpace(want), gomod)
		}
	}
	m.gomod = edit(strings.ReplaceAll(gomod, "=> "+cloneInPage+"\n", "=> "+repo+"\n"))
	if err := os.WriteFile(filepath.Join(m.dir, "go.mod"), []byte(m.gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.dir, "main.go"), []byte(pageBlock(t, page, "main.go")), 0o644); err != nil {
		t.Fatal(err)
	}
	return m
}

// goCmd runs the go command in the consumer's folder with env added to the
// test's environment (whose GOFLAGS and GOWORK it replaces).
func (m *consumerModule) goCmd(t *testing.T, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = m.dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOFLAGS=") && !strings.HasPrefix(kv, "GOWORK=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s in %s: %v\n%s\ngo.mod:\n%s", strings.Join(args, " "), m.dir, err, out, m.gomod)
	}
}

// buildConsumer builds the page's module with its replace recipe: the
// page's commands, in order, as a service's build runs them (the module
// cache and the proxy at hand, -mod=mod). It checks that the consumer's go
// directive is the one the page gives, not one the relay's module forces,
// and returns the folder and the binary.
func buildConsumer(t *testing.T) (*consumerModule, string) {
	t.Helper()
	m := writeConsumer(t, func(gomod string) string { return gomod })
	ran := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(m.commands), "\n") {
		args := strings.Fields(line)
		if len(args) < 2 || args[0] != "go" {
			t.Fatalf("the page's commands hold %q, which is not a go command", line)
		}
		m.goCmd(t, []string{"GOFLAGS=-mod=mod", "GOWORK=off"}, args[1:]...)
		ran[args[1]] = true
	}
	for _, want := range []string{"mod", "build", "vet"} {
		if !ran[want] {
			t.Fatalf("the page's commands run no go %s:\n%s", want, m.commands)
		}
	}
	before := goLine.FindStringSubmatch(m.gomod)
	b, err := os.ReadFile(filepath.Join(m.dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	after := goLine.FindStringSubmatch(string(b))
	if before == nil || after == nil || before[1] != after[1] {
		t.Fatalf("the consumer's go directive moved from %v to %v: the relay's module forces a newer Go on its consumers:\n%s", before, after, b)
	}
	for _, dep := range []string{"github.com/jackc/pgx/v5 ", "github.com/rabbitmq/amqp091-go ", "github.com/prometheus/client_golang "} {
		if !strings.Contains(string(b), dep) {
			t.Errorf("go mod tidy did not add %s to the consumer's go.mod:\n%s", dep, b)
		}
	}
	bin := filepath.Join(m.dir, "billing")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("the page's go build made no ./billing: %v", err)
	}
	return m, bin
}

// TestConsumerModuleBuilds: a service outside the repository that follows
// docs/consumers.md alone (its go.mod with the replace, its main.go, its
// commands) builds and vets, and keeps the go directive it declares.
func TestConsumerModuleBuilds(t *testing.T) {
	t.Parallel()
	buildConsumer(t)
}

// TestConsumerWorkspaceBuilds: the page's other recipe, a workspace with
// the clone (go work init . ../cdcrelay) and a go.mod without the require
// and the replace, builds and vets the same main.go, and leaves go.mod as
// it was.
func TestConsumerWorkspaceBuilds(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(consumerPage)
	if err != nil {
		t.Fatal(err)
	}
	const recipe = "`go work init . " + cloneInPage + "`"
	if !strings.Contains(string(b), recipe) {
		t.Fatalf("%s does not give the workspace recipe %s", consumerPage, recipe)
	}
	m := writeConsumer(t, func(gomod string) string {
		var keep []string
		for _, l := range strings.Split(gomod, "\n") {
			if !strings.HasPrefix(l, "require ") && !strings.HasPrefix(l, "replace ") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	})
	work := []string{"GOWORK=" + filepath.Join(m.dir, "go.work")}
	m.goCmd(t, []string{"GOWORK="}, "work", "init", ".", m.repo)
	m.goCmd(t, work, "build", "-o", "billing", ".")
	m.goCmd(t, work, "vet", "./...")
	got, err := os.ReadFile(filepath.Join(m.dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != m.gomod {
		t.Errorf("the workspace build rewrote the consumer's go.mod:\n%s\nwas:\n%s", got, m.gomod)
	}
}

// TestIntegrationConsumerFromDocs runs the page's consumer, built as
// TestConsumerModuleBuilds builds it, against a throwaway database and the
// broker: it declares its queue and dead-letter queue and binds the queue
// to the relay's exchange (a unique one here), books an event once though
// it comes twice, and stops on SIGTERM with nothing left unacknowledged.
func TestIntegrationConsumerFromDocs(t *testing.T) {
	_, bin := buildConsumer(t)
	ctx := t.Context()
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	if err := pg.CreateDatabase(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	amqpURL := testenv.RequireAMQP(t)
	conn, ch := testenv.MustChannel(t, amqpURL)
	exchange, queue := testenv.UniqueName("inbox_doc_events"), testenv.UniqueName("inbox_doc_billing")
	dlq := queue + ".dlq"
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, q := range []string{queue, dlq} {
			if err := testenv.DeleteQueue(ctx, amqpURL, q); err != nil {
				t.Errorf("delete queue: %v", err)
			}
		}
		if err := testenv.DeleteExchange(ctx, amqpURL, exchange); err != nil {
			t.Errorf("delete exchange: %v", err)
		}
	})

	var logs testenv.Buffer
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "BILLING_DATABASE_URL="+pg.URL("billing"), "AMQP_URL="+amqpURL,
		"RELAY_EXCHANGE="+exchange, "BILLING_QUEUE="+queue)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	// wait polls cond, failing with the consumer's log when it does not
	// hold in time or the consumer exits.
	wait := func(within time.Duration, what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !cond() {
			select {
			case err := <-exited:
				waited = true
				t.Fatalf("%s: the consumer exited (%v):\n%s", what, err, logs.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v; the consumer's log:\n%s", what, within, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// queueState is the queue's ready messages and consumers, -1 while it
	// does not exist (a passive declare of a missing queue closes its channel).
	queueState := func(name string) (messages, consumers int) {
		c, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		q, err := c.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			return -1, -1
		}
		return q.Messages, q.Consumers
	}
	wait(60*time.Second, "the consumer's queue declared and consumed", func() bool {
		_, consumers := queueState(queue)
		return consumers == 1
	})
	if n, _ := queueState(dlq); n != 0 {
		t.Fatalf("dead-letter queue %s: %d messages, want it declared and empty", dlq, n)
	}
	publish := func(id, lsn string) {
		t.Helper()
		// mandatory: an unbound routing key fails the test instead of vanishing.
		if err := ch.PublishWithContext(ctx, exchange, "orders.created", true, false, amqp.Publishing{
			MessageId: id, DeliveryMode: amqp.Persistent, ContentType: "application/json",
			Headers: amqp.Table{inbox.HeaderCommitLSN: lsn, inbox.HeaderTxIndex: int64(0)},
			Body:    []byte(`{"order":"` + id + `"}`),
		}); err != nil {
			t.Fatal(err)
		}
	}
	publish("order-1", "0/10")
	publish("order-1", "0/10") // a redelivery by the relay: the same message_id
	publish("order-2", "0/20")

	db, err := pgx.Connect(ctx, pg.URL("billing"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close(context.Background()) }()
	bookings := func() string {
		var got string
		if err := db.QueryRow(ctx, `SELECT coalesce(string_agg(order_event || ':' || n, ' ' ORDER BY order_event), '')
			FROM (SELECT order_event, count(*) AS n FROM bookings GROUP BY 1) b`).Scan(&got); err != nil {
			return err.Error()
		}
		return got
	}
	// One consume loop handles the deliveries in order: order-2 booked means
	// the copy before it was settled.
	wait(30*time.Second, "both orders booked", func() bool { return bookings() == "order-1:1 order-2:1" })

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		waited = true
		if err != nil {
			t.Fatalf("the consumer exited with %v after SIGTERM:\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the consumer did not stop within 30 s of SIGTERM:\n%s", logs.String())
	}
	if got := bookings(); got != "order-1:1 order-2:1" {
		t.Errorf("bookings %q, want each order once", got)
	}
	var done int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM cdcrelay_inbox WHERE handler = 'billing.book' AND state = 'done'`).Scan(&done); err != nil {
		t.Fatal(err)
	}
	if done != 2 {
		t.Errorf("%d done claims, want 2", done)
	}
	// Its connection closed: whatever it had not acked would be back in the queue.
	if n, _ := queueState(queue); n != 0 {
		t.Errorf("queue %s holds %d messages after the consumer stopped, want 0 (every delivery acked)", queue, n)
	}
	if n, _ := queueState(dlq); n != 0 {
		t.Errorf("dead-letter queue %s holds %d messages, want 0", dlq, n)
	}
	if !strings.Contains(logs.String(), `"msg":"consuming"`) {
		t.Errorf("the consumer did not log that it consumes:\n%s", logs.String())
	}
}
