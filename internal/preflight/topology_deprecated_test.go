package preflight

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// TestDeprecatedQueueFindings judges queues as the management API
// describes them (the JSON a broker answers, trimmed to what is read):
// each deprecated feature is one warning with its remedy, and a queue
// that uses none has no finding.
func TestDeprecatedQueueFindings(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer string   // GET /api/queues/<vhost>/orders
		want   []string // a fragment of each finding, in order
		remedy []string // a fragment of each finding's remedy
	}{
		{"durable classic queue", `{"durable":true,"exclusive":false,"arguments":{},"effective_policy_definition":{},"type":"classic"}`, nil, nil},
		{"exclusive transient queue", `{"durable":false,"exclusive":true,"arguments":{},"type":"classic"}`, nil, nil},
		{"transient queue", `{"durable":false,"exclusive":false,"auto_delete":true,"arguments":{},"type":"classic"}`,
			[]string{`queue "orders", bound to exchange "events", is transient (durable=false) and not exclusive: it loses its messages, events the relay counts as delivered, when its node restarts; RabbitMQ 4.3 as upstream ships it refuses to declare one (deprecated feature transient_nonexcl_queues: 541 INTERNAL_ERROR`},
			[]string{"declare it durable"}},
		{"lazy mode argument", `{"durable":true,"arguments":{"x-queue-mode":"lazy"},"type":"classic"}`,
			[]string{`queue "orders", bound to exchange "events", has deprecated classic queue settings x-queue-mode=lazy (argument): lazy mode is ignored since RabbitMQ 3.12`},
			[]string{"declare it again without the x-queue-mode argument"}},
		{"version 1 argument, lazy policy", `{"durable":true,"arguments":{"x-queue-version":1},"policy":"old","effective_policy_definition":{"queue-mode":"lazy"},"type":"classic"}`,
			[]string{`settings queue-mode=lazy (policy "old") and x-queue-version=1 (argument): lazy mode is ignored since RabbitMQ 3.12; storage version 1 is removed from RabbitMQ 4.3, which refuses to declare a queue with x-queue-version=1 (406 PRECONDITION_FAILED)`},
			[]string{`remove "queue-mode" from policy "old"; delete the queue (once drained) and declare it again without the x-queue-version argument`}},
		{"version 1 policy", `{"durable":true,"arguments":{},"policy":"old","effective_policy_definition":{"queue-version":1},"type":"classic"}`,
			[]string{`settings queue-version=1 (policy "old"): storage version 1 is removed`}, []string{`remove "queue-version" from policy "old"`}},
		{"version 2", `{"durable":true,"arguments":{"x-queue-version":2},"policy":"v2","effective_policy_definition":{"queue-version":2},"type":"classic"}`, nil, nil},
		{"master locator argument", `{"durable":true,"arguments":{"x-queue-master-locator":"min-masters"},"type":"classic"}`,
			[]string{`has x-queue-master-locator=min-masters (argument): deprecated (queue_master_locator), denied by default in RabbitMQ 4.3`},
			[]string{"queue-leader-locator"}},
		{"master locator policy", `{"durable":true,"arguments":{},"policy":"loc","effective_policy_definition":{"queue-master-locator":"client-local"},"type":"classic"}`,
			[]string{`has queue-master-locator=client-local (policy "loc")`}, []string{`remove "queue-master-locator" from policy "loc"`}},
		{"mirrored", `{"durable":true,"arguments":{},"policy":"ha","effective_policy_definition":{"ha-mode":"exactly","ha-params":2},"type":"classic"}`,
			[]string{`is mirrored by policy "ha" (ha-mode=exactly): classic queue mirroring is deprecated on RabbitMQ 3.x and removed from 4.0`},
			[]string{`use a quorum queue (x-queue-type=quorum) where events must survive a node, and drop the ha-* keys from policy "ha"`}},
		{"mirrored by an operator policy", `{"durable":true,"arguments":{},"policy":null,"operator_policy":"ops","effective_policy_definition":{"ha-mode":"all"},"type":"classic"}`,
			[]string{"is mirrored by an operator policy (ha-mode=all)"}, []string{"from an operator policy"}},
		{"all at once", `{"durable":false,"exclusive":false,"arguments":{"x-queue-mode":"lazy","x-queue-master-locator":"random"},"policy":"p","effective_policy_definition":{"ha-mode":"all"},"type":"classic"}`,
			[]string{"is transient", "x-queue-mode=lazy (argument)", "x-queue-master-locator=random (argument)", `mirrored by policy "p"`},
			[]string{"durable", "x-queue-mode", "x-queue-master-locator", "quorum queue"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var q queueInfo
			if err := json.Unmarshal([]byte(c.answer), &q); err != nil {
				t.Fatal(err)
			}
			q.Name = "orders"
			fs := deprecatedQueueFindings("/", "events", q)
			if len(fs) != len(c.want) {
				t.Fatalf("%d findings, want %d: %+v", len(fs), len(c.want), fs)
			}
			for i, f := range fs {
				if f.Severity != Warn || f.Check != checkTopology || !strings.Contains(f.Message, c.want[i]) || !strings.Contains(f.Remedy, c.remedy[i]) {
					t.Errorf("finding %d: %v %q remedy %q; want a warning with %q, remedy with %q", i, f.Severity, f.Message, f.Remedy, c.want[i], c.remedy[i])
				}
			}
		})
	}
}

// TestCheckDeprecatedUsed reads GET /api/deprecated-features/used as
// RabbitMQ answers it: each feature in use is a warning, a broker that
// predates the list (404) adds nothing, and no other answer fails check.
func TestCheckDeprecatedUsed(t *testing.T) {
	// RabbitMQ 4.3.6's answer with one transient non-exclusive queue
	// declared (permitted by deprecated_features.permit).
	const used43 = `[{"name":"transient_nonexcl_queues","desc":"","deprecation_phase":"permitted_by_default","doc_url":"https://blog.rabbitmq.com/posts/2021/08/4.0-deprecation-announcements/#removal-of-transient-non-exclusive-queues","provided_by":"rabbit"}]`
	for _, c := range []struct {
		name   string
		status int
		body   string
		want   []Finding // Message and Remedy fragments
	}{
		{"before 3.13", http.StatusNotFound, `{"error":"Object Not Found","reason":"Not Found"}`, nil},
		{"none in use", http.StatusOK, `[]`, nil},
		{"4.3.6", http.StatusOK, used43, []Finding{{Severity: Warn,
			Message: `deprecated feature "transient_nonexcl_queues" is in use on the broker (somewhere on it, not necessarily by the relay's queues; permitted_by_default, permitted by default, for now)`,
			Remedy:  "rabbitmq-diagnostics check_if_any_deprecated_features_are_used) and replace it before upgrading to a RabbitMQ that refuses it; see https://blog.rabbitmq.com/posts/2021/08/4.0-deprecation-announcements/#removal-of-transient-non-exclusive-queues"}}},
		{"with a description", http.StatusOK, `[{"name":"global_qos","desc":"global QoS is used","deprecation_phase":"denied_by_default"},{"name":"other","deprecation_phase":"some_new_phase"}]`, []Finding{
			{Severity: Warn, Message: `"global_qos" is in use on the broker (somewhere on it, not necessarily by the relay's queues; denied_by_default, denied by default: a new use fails unless the configuration permits it): global QoS is used`, Remedy: "check_if_any_deprecated_features_are_used"},
			{Severity: Warn, Message: `"other" is in use on the broker (somewhere on it, not necessarily by the relay's queues; some_new_phase)`, Remedy: "replace it"}}},
		{"administrators only", http.StatusUnauthorized, `{"error":"not_authorised","reason":"Not administrator user"}`, []Finding{
			{Severity: OK, Message: "the broker's deprecated features in use were not listed: GET /api/deprecated-features/used from"}}},
		{"server error", http.StatusInternalServerError, `{"error":"internal"}`, []Finding{
			{Severity: OK, Message: "500 Internal Server Error"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.EscapedPath() != "/api/deprecated-features/used" {
					http.Error(w, "unexpected "+r.URL.EscapedPath(), http.StatusBadRequest)
					return
				}
				w.WriteHeader(c.status)
				_, _ = w.Write([]byte(c.body))
			}))
			defer srv.Close()
			api, err := newManagementAPI(config.Config{}, srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			fs := api.checkDeprecatedUsed(context.Background())
			if len(fs) != len(c.want) {
				t.Fatalf("%d findings, want %d: %+v", len(fs), len(c.want), fs)
			}
			for i, f := range fs {
				w := c.want[i]
				if f.Check != checkTopology || f.Severity != w.Severity || !strings.Contains(f.Message, w.Message) || !strings.Contains(f.Remedy, w.Remedy) {
					t.Errorf("finding %d: %v %q remedy %q; want %v with %q, remedy with %q", i, f.Severity, f.Message, f.Remedy, w.Severity, w.Message, w.Remedy)
				}
			}
		})
	}
}
