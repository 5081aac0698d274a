package charttest

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestReplicationURL: a source's `replication` reaches the relay as
// CDCRELAY_REPLICATION_URL from its Secret, or as CDCRELAY_REPLICATION_URL_FILE
// from the Secret mounted read-only, like the database URL; the database URL
// stays the primary's; a source without it gets neither variable nor volume.
func TestReplicationURL(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"standby.yaml"})
	checkRelease(t, r)

	orders := r.Deployment(t, "rel-cdcrelay-orders")
	ev := env(t, relay(t, orders))
	if ref := ev["CDCRELAY_REPLICATION_URL"].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "orders-standby" || ref.SecretKeyRef.Key != "url" {
		t.Errorf("orders: CDCRELAY_REPLICATION_URL %+v, want Secret orders-standby key url", ev["CDCRELAY_REPLICATION_URL"])
	}
	if ref := ev["CDCRELAY_DATABASE_URL"].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "orders-db" {
		t.Errorf("orders: CDCRELAY_DATABASE_URL %+v, want the primary's Secret orders-db", ev["CDCRELAY_DATABASE_URL"])
	}
	if _, ok := ev["CDCRELAY_REPLICATION_URL_FILE"]; ok {
		t.Errorf("orders: CDCRELAY_REPLICATION_URL_FILE beside CDCRELAY_REPLICATION_URL")
	}
	if hasVolume(orders, "replication-url") {
		t.Errorf("orders: a replication-url volume without mountAsFile")
	}
	// The variables keep the chart's order: the database, then the standby, then the broker.
	var names []string
	for _, e := range relay(t, orders).Env {
		names = append(names, e.Name)
	}
	if db, rep, amqp := slices.Index(names, "CDCRELAY_DATABASE_URL"), slices.Index(names, "CDCRELAY_REPLICATION_URL"), slices.Index(names, "CDCRELAY_AMQP_URL"); db >= rep || rep >= amqp {
		t.Errorf("orders: env order %v", names)
	}

	billing := r.Deployment(t, "rel-cdcrelay-billing")
	ev = env(t, relay(t, billing))
	if _, ok := ev["CDCRELAY_REPLICATION_URL"]; ok {
		t.Errorf("billing: CDCRELAY_REPLICATION_URL beside the mounted file")
	}
	path := envValue(t, billing, "CDCRELAY_REPLICATION_URL_FILE")
	if path != "/etc/cdcrelay/secrets/replication/url" {
		t.Errorf("billing: CDCRELAY_REPLICATION_URL_FILE = %q", path)
	}
	i := slices.IndexFunc(billing.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "replication-url" })
	if i < 0 || billing.Spec.Template.Spec.Volumes[i].Secret == nil {
		t.Fatalf("billing: no replication-url Secret volume")
	}
	v := billing.Spec.Template.Spec.Volumes[i].Secret
	if v.SecretName != "billing-standby" || len(v.Items) != 1 || v.Items[0].Key != "standby-url" || v.Items[0].Path != "url" {
		t.Errorf("billing: replication-url volume %+v, want Secret billing-standby key standby-url as url", v)
	}
	// The database URL keeps its own file beside the standby's.
	if got := envValue(t, billing, "CDCRELAY_DATABASE_URL_FILE"); got != "/etc/cdcrelay/secrets/database/url" {
		t.Errorf("billing: CDCRELAY_DATABASE_URL_FILE = %q", got)
	}

	shipping := r.Deployment(t, "rel-cdcrelay-shipping")
	ev = env(t, relay(t, shipping))
	for _, name := range []string{"CDCRELAY_REPLICATION_URL", "CDCRELAY_REPLICATION_URL_FILE"} {
		if _, ok := ev[name]; ok {
			t.Errorf("shipping: %s set with replication: null", name)
		}
	}
	if hasVolume(shipping, "replication-url") {
		t.Errorf("shipping: a replication-url volume without replication")
	}
}

// TestMarkOrigin: markOrigin reaches CDCRELAY_MARK_ORIGIN from defaults, a
// source's own replaces it, and null (the default) leaves the relay's auto
// (TestSingleSource); auto and "off" are its only values (bare off is a YAML
// boolean, TestRejectsBadPolicyValues).
func TestMarkOrigin(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"standby.yaml"})
	for name, want := range map[string]string{"rel-cdcrelay-orders": "auto", "rel-cdcrelay-billing": "off", "rel-cdcrelay-shipping": "off"} {
		if got := envValue(t, r.Deployment(t, name), "CDCRELAY_MARK_ORIGIN"); got != want {
			t.Errorf("%s: CDCRELAY_MARK_ORIGIN = %q, want %q", name, got, want)
		}
	}
	for v, ok := range map[string]bool{"auto": true, "off": true, "on": false, "Auto": false, "": false} {
		args := templateArgs(chartDir, []string{"single.yaml"}, "--set-string", "source.markOrigin="+v)
		out, stderr, err := runHelm(t, args...)
		if !ok {
			if err == nil || !strings.Contains(stderr, "at '/source/markOrigin'") {
				t.Errorf("markOrigin %q accepted or refused for another reason (err %v):\n%s", v, err, stderr)
			}
			continue
		}
		if err != nil {
			t.Errorf("markOrigin %q refused: %v\n%s", v, err, stderr)
			continue
		}
		rr, derr := decodeManifests(out)
		if derr != nil {
			t.Fatal(derr)
		}
		if got := envValue(t, rr.Deployment(t, "rel-cdcrelay"), "CDCRELAY_MARK_ORIGIN"); got != v {
			t.Errorf("markOrigin %q: CDCRELAY_MARK_ORIGIN = %q", v, got)
		}
	}
}

// TestRejectsBadReplication: replication is a Secret reference (never the URL
// itself), and slotFailover "on" cannot go with it, as the relay refuses both
// together; without the schema the template still names a missing secretName.
func TestRejectsBadReplication(t *testing.T) {
	t.Parallel()
	cases := []struct {
		file, want string
		schema     bool
	}{
		{"bad-replication.yaml", "at '/sources/0/replication'", true},
		{"replication-url-string.yaml", "at '/sources/0/replication'", true},
		{"replication-failover-on.yaml", `source "orders": slotFailover "on" with replication (CDCRELAY_REPLICATION_URL)`, false},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			t.Parallel()
			expectRejected(t, c.file, c.want, c.schema)
		})
	}
	_, stderr, err := runHelm(t, templateArgs(chartDir, []string{"bad/bad-replication.yaml"}, "--skip-schema-validation")...)
	if want := `source "orders": replication.secretName is required`; err == nil || !strings.Contains(stderr, want) {
		t.Errorf("helm template --skip-schema-validation: want %q (err %v):\n%s", want, err, stderr)
	}
	// A source's "off" (or auto) lifts the defaults' "on" for that source.
	r := render(t, []string{"bad/replication-failover-on.yaml"}, "--set-string", "sources[0].slotFailover=off")
	if got := envValue(t, r.Deployment(t, "rel-cdcrelay-orders"), "CDCRELAY_SLOT_FAILOVER"); got != "off" {
		t.Errorf("CDCRELAY_SLOT_FAILOVER = %q, want the source's off", got)
	}
}

// TestNotesStandby: a source whose slot is on a standby gets the grant that lets
// the relay ask the primary for a standby snapshot; the origin grants are listed
// as optional while a source may use them (markOrigin not "off").
func TestNotesStandby(t *testing.T) {
	t.Parallel()
	notes := renderNotes(t, []string{"standby.yaml"})
	if n := strings.Count(notes, "GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO cdcrelay;"); n != 2 {
		t.Errorf("notes grant pg_log_standby_snapshot() %d times, want 2 (orders and billing):\n%s", n, notes)
	}
	for _, want := range []string{"the standby of Secret orders-standby", "the standby of Secret billing-standby",
		"pg_replication_origin_create(text), pg_replication_origin_session_setup(text)"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	if plain := renderNotes(t, []string{"multi.yaml"}); strings.Contains(plain, "pg_log_standby_snapshot") {
		t.Errorf("notes grant pg_log_standby_snapshot() without a standby:\n%s", plain)
	}
}

// hasVolume reports whether d's pod has a volume called name.
func hasVolume(d *appsv1.Deployment, name string) bool {
	return slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name })
}
