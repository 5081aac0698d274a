package charttest

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// restrictedEvaluator is the Pod Security admission controller's own evaluator.
var restrictedEvaluator = sync.OnceValues(func() (policy.Evaluator, error) {
	return policy.NewEvaluator(policy.DefaultChecks(), nil)
})

// restrictedViolations evaluates a pod template against the latest "restricted"
// Pod Security Standard and returns the reasons it would be refused.
func restrictedViolations(pod *corev1.PodTemplateSpec) []string {
	ev, err := restrictedEvaluator()
	if err != nil {
		return []string{"pod security evaluator: " + err.Error()}
	}
	lv := psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}
	var out []string
	for _, r := range ev.EvaluatePod(lv, &pod.ObjectMeta, &pod.Spec) {
		if !r.Allowed {
			out = append(out, r.ForbiddenReason+" ("+r.ForbiddenDetail+")")
		}
	}
	return out
}

// TestRestrictedCheckBites shows that the restricted check every render goes
// through refuses what it should: a volume a value lets in, and pod specs with one
// hardening setting undone.
func TestRestrictedCheckBites(t *testing.T) {
	t.Parallel()
	hostPath := render(t, []string{"single.yaml"},
		"--set", "extraVolumes[0].name=host", "--set", "extraVolumes[0].hostPath.path=/var/run")
	if v := restrictedViolations(&hostPath.Deployments[0].Spec.Template); len(v) == 0 {
		t.Errorf("a hostPath extraVolume passed the restricted check")
	}

	base := render(t, []string{"single.yaml"}).Deployments[0].Spec.Template
	if v := restrictedViolations(&base); len(v) > 0 {
		t.Fatalf("the chart's own pod fails restricted: %v", v)
	}
	yes, no := true, false
	mutations := map[string]func(*corev1.PodSpec){
		"privileged":           func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.Privileged = &yes },
		"privilege escalation": func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes },
		"capabilities kept":    func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.Capabilities = nil },
		"runs as root": func(s *corev1.PodSpec) {
			s.SecurityContext.RunAsNonRoot, s.Containers[0].SecurityContext.RunAsNonRoot = &no, &no
		},
		"no seccomp profile": func(s *corev1.PodSpec) {
			s.SecurityContext.SeccompProfile, s.Containers[0].SecurityContext.SeccompProfile = nil, nil
		},
		"host network": func(s *corev1.PodSpec) { s.HostNetwork = true },
		"NET_RAW capability added": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_RAW"}
		},
	}
	for name, mutate := range mutations {
		pod := base.DeepCopy()
		mutate(&pod.Spec)
		if v := restrictedViolations(pod); len(v) == 0 {
			t.Errorf("%s: passed the restricted check", name)
		}
	}
}

// TestPolicyValues: policy settings from defaults reach every source, a source's
// own replace them, and a null leaves the variable to extraEnv or the relay.
func TestPolicyValues(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"policy.yaml"})
	checkRelease(t, r)
	inherited := map[string]string{
		"CDCRELAY_POISON":               "park",
		"CDCRELAY_UNROUTABLE":           "park",
		"CDCRELAY_DEAD_LETTER_EXCHANGE": "events.dead",
		"CDCRELAY_SLOT_LOST":            "stop",
		"CDCRELAY_SLOT_FAILOVER":        "off",
		"CDCRELAY_MARK_ORIGIN":          "off",
		"CDCRELAY_RETENTION":            "14d",
		"CDCRELAY_RETENTION_INTERVAL":   "30m",
		"CDCRELAY_RETENTION_BATCH":      "2000",
		"CDCRELAY_MARK_INTERVAL":        "250ms",
		"CDCRELAY_MARK_BATCH":           "500",
		"CDCRELAY_MONITOR_INTERVAL":     "1m30s",
		"CDCRELAY_CONFIRM_TIMEOUT":      "1.5m",
		"CDCRELAY_AMQP_HEARTBEAT":       "0s",
		"CDCRELAY_PUBLISH_CHANNELS":     "4",
		"CDCRELAY_MAX_MESSAGE_BYTES":    "8MiB",
		"CDCRELAY_MAX_IN_FLIGHT":        "2000",
		"CDCRELAY_MAX_IN_FLIGHT_BYTES":  "32MiB",
		"CDCRELAY_AMQP_TLS_CA":          "/etc/cdcrelay/secrets/amqp-tls/ca.pem",
	}
	orders := r.Deployment(t, "rel-cdcrelay-orders")
	for name, want := range inherited {
		if got := envValue(t, orders, name); got != want {
			t.Errorf("orders: %s = %q, want %q from defaults", name, got, want)
		}
	}
	for _, name := range []string{"CDCRELAY_AMQP_TLS_CERT", "CDCRELAY_AMQP_TLS_KEY", "GOMEMLIMIT"} {
		if _, ok := env(t, relay(t, orders))[name]; ok {
			t.Errorf("orders: %s set, but neither defaults nor the source set it", name)
		}
	}
	checkTLSVolume(t, orders, "rabbitmq-ca", map[string]string{"ca.crt": "ca.pem"})

	billing := r.Deployment(t, "rel-cdcrelay-billing")
	for name, want := range map[string]string{
		"CDCRELAY_POISON":            "stop",
		"CDCRELAY_UNROUTABLE":        "stall",
		"CDCRELAY_RETENTION":         "1d12h",
		"CDCRELAY_MAX_MESSAGE_BYTES": "1048576", // an integer, not 1.048576e+06
		"CDCRELAY_SLOT_LOST":         "stop",    // still from defaults
		"CDCRELAY_SLOT_FAILOVER":     "on",
		"CDCRELAY_MARK_ORIGIN":       "auto",
		"CDCRELAY_AMQP_TLS_CA":       "/etc/cdcrelay/secrets/amqp-tls/ca.pem",
		"CDCRELAY_AMQP_TLS_CERT":     "/etc/cdcrelay/secrets/amqp-tls/cert.pem",
		"CDCRELAY_AMQP_TLS_KEY":      "/etc/cdcrelay/secrets/amqp-tls/key.pem",
		"CDCRELAY_LOCK_DATABASE":     "relay_locks",
		"GOMEMLIMIT":                 "100MiB", // overrides the relay's own derivation
	} {
		if got := envValue(t, billing, name); got != want {
			t.Errorf("billing: %s = %q, want %q", name, got, want)
		}
	}
	checkTLSVolume(t, billing, "billing-tls", map[string]string{"ca.crt": "ca.pem", "tls.crt": "cert.pem", "tls.key": "key.pem"})
	// Its null dead-letter exchange drops the one of defaults (poison stop would refuse it).
	if e, ok := env(t, relay(t, billing))["CDCRELAY_DEAD_LETTER_EXCHANGE"]; ok {
		t.Errorf("billing: CDCRELAY_DEAD_LETTER_EXCHANGE = %q, but the source set it to null", e.Value)
	}

	shipping := r.Deployment(t, "rel-cdcrelay-shipping")
	ev := env(t, relay(t, shipping))
	if e := ev["CDCRELAY_POISON"]; e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil || e.ValueFrom.ConfigMapKeyRef.Name != "shipping-relay" {
		t.Errorf("shipping: CDCRELAY_POISON %+v, want extraEnv's ConfigMap reference", e)
	}
	for _, name := range []string{"CDCRELAY_RETENTION", "CDCRELAY_AMQP_TLS_CA"} {
		if e, ok := ev[name]; ok {
			t.Errorf("shipping: %s = %q, but the source set it to null", name, e.Value)
		}
	}
	if slices.ContainsFunc(shipping.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "amqp-tls" }) {
		t.Errorf("shipping: amqp-tls volume without amqpTLS")
	}
}

// checkTLSVolume checks that the amqp-tls volume projects exactly keys (Secret key
// -> file) of secret, mounted read-only where CDCRELAY_AMQP_TLS_* point.
func checkTLSVolume(t *testing.T, d *appsv1.Deployment, secret string, keys map[string]string) {
	t.Helper()
	i := slices.IndexFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "amqp-tls" })
	if i < 0 || d.Spec.Template.Spec.Volumes[i].Secret == nil {
		t.Fatalf("%s: no amqp-tls Secret volume", d.Name)
	}
	v := d.Spec.Template.Spec.Volumes[i].Secret
	got := map[string]string{}
	for _, it := range v.Items {
		got[it.Key] = it.Path
	}
	if v.SecretName != secret || !reflect.DeepEqual(got, keys) {
		t.Errorf("%s: amqp-tls volume from %s projects %v, want %s projecting %v", d.Name, v.SecretName, got, secret, keys)
	}
	for _, m := range relay(t, d).VolumeMounts {
		if m.Name == "amqp-tls" && (!m.ReadOnly || m.MountPath != "/etc/cdcrelay/secrets/amqp-tls") {
			t.Errorf("%s: amqp-tls mounted at %s, read-only %v", d.Name, m.MountPath, m.ReadOnly)
		}
	}
}

// TestTopologySpread: constraints pass through as given, a source's replacing the
// defaults', and their selectors pick the source's own pods.
func TestTopologySpread(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"policy.yaml"})
	want := map[string]string{
		"rel-cdcrelay-orders":   "topology.kubernetes.io/zone",
		"rel-cdcrelay-shipping": "topology.kubernetes.io/zone",
		"rel-cdcrelay-billing":  "kubernetes.io/hostname",
	}
	for name, key := range want {
		d := r.Deployment(t, name)
		tsc := d.Spec.Template.Spec.TopologySpreadConstraints
		if len(tsc) != 1 || tsc[0].TopologyKey != key || tsc[0].MaxSkew != 1 {
			t.Errorf("%s: topologySpreadConstraints %+v, want one on %s", name, tsc, key)
			continue
		}
		if !selectorOf(t, tsc[0].LabelSelector).Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("%s: spread selector %v misses its own pods %v", name, tsc[0].LabelSelector, d.Spec.Template.Labels)
		}
		if key == "topology.kubernetes.io/zone" && !slices.Equal(tsc[0].MatchLabelKeys, []string{"cdcrelay.io/source"}) {
			t.Errorf("%s: matchLabelKeys %v lost", name, tsc[0].MatchLabelKeys)
		}
	}
	if tsc := render(t, []string{"single.yaml"}).Deployments[0].Spec.Template.Spec.TopologySpreadConstraints; len(tsc) != 0 {
		t.Errorf("topologySpreadConstraints %+v rendered by default", tsc)
	}
}

// TestChartBumpKeepsPodTemplate: a new chart version with the same appVersion
// renders the very same pod templates, so `helm upgrade` rolls no relay (each
// roll is a slot failover). The chart's labels stay on the Deployment itself.
func TestChartBumpKeepsPodTemplate(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "cdcrelay")
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	chartYAML := filepath.Join(dir, "Chart.yaml")
	b, err := os.ReadFile(chartYAML)
	if err != nil {
		t.Fatal(err)
	}
	bumped := regexp.MustCompile(`(?m)^version: .*$`).ReplaceAll(b, []byte("version: 99.1.0"))
	if err := os.WriteFile(chartYAML, bumped, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"multi.yaml", "policy.yaml"} {
		before, after := render(t, []string{f}), renderChart(t, dir, []string{f})
		for _, d := range before.Deployments {
			a := after.Deployment(t, d.Name)
			if a.Labels["helm.sh/chart"] == d.Labels["helm.sh/chart"] {
				t.Fatalf("%s: chart label %q unchanged: the bump did not happen", d.Name, a.Labels["helm.sh/chart"])
			}
			if !reflect.DeepEqual(a.Spec.Template, d.Spec.Template) {
				t.Errorf("%s (%s): the pod template changes with the chart version: a chart upgrade would roll the relay", d.Name, f)
			}
		}
	}
}

func TestRejectsBadPolicyValues(t *testing.T) {
	t.Parallel()
	cases := []struct {
		file, want string
		schema     bool
	}{
		{"bad-poison.yaml", "at '/defaults/poison'", true},
		{"bad-slot-lost.yaml", "at '/sources/0/slotLost'", true},
		{"bad-slot-failover.yaml", "at '/sources/0/slotFailover'", true},
		{"bad-mark-origin.yaml", "at '/defaults/markOrigin'", true},
		{"bad-unroutable.yaml", "at '/sources/0/unroutable'", true},
		{"bad-retention.yaml", "at '/defaults/retention'", true},
		{"bad-mark-interval.yaml", "at '/defaults/markInterval'", true},
		{"zero-monitor-interval.yaml", "at '/defaults/monitorInterval'", true},
		{"bad-byte-size.yaml", "at '/defaults/maxMessageBytes'", true},
		{"bad-publish-channels.yaml", "at '/defaults/publishChannels'", true},
		{"amqp-tls-cert-without-key.yaml", "at '/source/amqpTLS'", true},
		{"extra-env-typo.yaml", "at '/sources/0/extraEnv/0/name'", true},
		{"zero-confirmTimeout.yaml", "at '/defaults/confirmTimeout'", true},
		{"zero-statusInterval.yaml", "at '/defaults/statusInterval'", true},
		{"zero-shutdownTimeout.yaml", "at '/defaults/shutdownTimeout'", true},
		{"zero-backoffMin.yaml", "at '/defaults/backoffMin'", true},
		{"zero-backoffMax.yaml", "at '/defaults/backoffMax'", true},
		{"small-in-flight-bytes.yaml", "at '/defaults/maxInFlightBytes'", true},
		{"backoff-max-below-min.yaml", `source "orders": backoffMax (1.5s) is below backoffMin (2s)`, false},
		{"extra-env-shadows-value.yaml", "extraEnv CDCRELAY_POISON is already set by the chart value `poison`: set `poison`", false},
		{"extra-env-http-addr.yaml", "extraEnv CDCRELAY_HTTP_ADDR is fixed by the chart to :8080", false},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			t.Parallel()
			expectRejected(t, c.file, c.want, c.schema)
		})
	}
}

// TestUnroutableChoices: the schema offers the relay's two unroutable policies
// (CDCRELAY_UNROUTABLE: stall, the relay's default, or park) and null, in
// defaults and on a source; null renders no variable (TestSingleSource), and
// extraEnv may set the variable only when the value is null.
func TestUnroutableChoices(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"defaults.unroutable", "source.unroutable"} {
		for v, ok := range map[string]bool{"stall": true, "park": true, "Stall": false, "drop": false, "": false} {
			args := templateArgs(chartDir, []string{"single.yaml"}, "--set-string", where+"="+v)
			out, stderr, err := runHelm(t, args...)
			if ok {
				if err != nil {
					t.Errorf("%s=%q refused: %v\n%s", where, v, err, stderr)
					continue
				}
				r, derr := decodeManifests(out)
				if derr != nil {
					t.Fatal(derr)
				}
				if got := envValue(t, r.Deployment(t, "rel-cdcrelay"), "CDCRELAY_UNROUTABLE"); got != v {
					t.Errorf("%s=%q: CDCRELAY_UNROUTABLE=%q", where, v, got)
				}
			} else if err == nil || !strings.Contains(stderr, "unroutable") {
				t.Errorf("%s=%q accepted or refused for another reason (err %v):\n%s", where, v, err, stderr)
			}
		}
	}
	extra := []string{"--set", "source.extraEnv[0].name=CDCRELAY_UNROUTABLE", "--set", "source.extraEnv[0].value=park"}
	r := render(t, []string{"single.yaml"}, extra...)
	if got := envValue(t, r.Deployment(t, "rel-cdcrelay"), "CDCRELAY_UNROUTABLE"); got != "park" {
		t.Errorf("extraEnv CDCRELAY_UNROUTABLE with unroutable null: %q, want park", got)
	}
	args := templateArgs(chartDir, []string{"single.yaml"}, append(extra, "--set", "defaults.unroutable=stall")...)
	if _, stderr, err := runHelm(t, args...); err == nil || !strings.Contains(stderr, "extraEnv CDCRELAY_UNROUTABLE is already set by the chart value `unroutable`") {
		t.Errorf("extraEnv CDCRELAY_UNROUTABLE beside unroutable: stall was not refused (err %v):\n%s", err, stderr)
	}
}

// TestExtraEnvTypo: a misspelt CDCRELAY_ name fails `helm lint --strict` (the
// schema knows the relay's names), and the template's clearer message, which
// lists them, still guards a render without the schema.
func TestExtraEnvTypo(t *testing.T) {
	t.Parallel()
	files := []string{filepath.Join("bad", "extra-env-typo.yaml")}
	args := append([]string{"lint", "--strict", chartDir, "--kube-version", kubeVersion}, valuesArgs(files)...)
	out, stderr, err := runHelm(t, args...)
	if err == nil || !strings.Contains(out+stderr, "at '/sources/0/extraEnv/0/name'") {
		t.Errorf("helm lint --strict did not refuse CDCRELAY_POISSON (err %v):\n%s%s", err, out, stderr)
	}
	out, stderr, err = runHelm(t, templateArgs(chartDir, files, "--skip-schema-validation")...)
	want := `source "orders": extraEnv CDCRELAY_POISSON is not a variable the relay reads (misspelt?)`
	if err == nil || !strings.Contains(stderr, want) {
		t.Errorf("helm template --skip-schema-validation: want %q (err %v):\n%s%s", want, err, out, stderr)
	}
}

// TestExtraEnvKnowsEveryRelayVariable: every CDCRELAY_ variable of the chart's list
// passes extraEnv's check when no value sets it (the list itself is compared with
// the relay's in the main module, internal/config/chart_test.go).
func TestExtraEnvKnowsEveryRelayVariable(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(chartDir, "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\{\{- define "cdcrelay.relayVariables" -\}\}\n(.*?)\n\{\{- end \}\}`).FindSubmatch(b)
	if m == nil {
		t.Fatal(`no "cdcrelay.relayVariables" template in _helpers.tpl`)
	}
	names := strings.Split(string(m[1]), "\n")
	// Values that set variables, nulled, so that extraEnv may set them all; the
	// URLs, slot, publication and HTTP address stay the chart's.
	args := []string{}
	for _, v := range []string{"exchange", "table", "maxInFlight", "maxInFlightBytes", "confirmTimeout", "statusInterval", "shutdownTimeout",
		"backoffMin", "backoffMax", "amqpHeartbeat", "logLevel", "logFormat", "columns.id", "columns.routingKey", "columns.payload",
		"columns.headers", "columns.exchange", "columns.type"} {
		args = append(args, "--set", "defaults."+v+"=null")
	}
	chartOwned := []string{"DATABASE_URL", "DATABASE_URL_FILE", "REPLICATION_URL", "REPLICATION_URL_FILE", "AMQP_URL", "AMQP_URL_FILE", "SLOT", "PUBLICATION", "HTTP_ADDR"}
	i := 0
	for _, n := range names {
		if slices.Contains(chartOwned, n) {
			continue
		}
		args = append(args, "--set", "defaults.extraEnv["+strconv.Itoa(i)+"].name=CDCRELAY_"+n, "--set-string", "defaults.extraEnv["+strconv.Itoa(i)+"].value=x")
		i++
	}
	d := render(t, []string{"single.yaml"}, args...).Deployments[0]
	ev := env(t, relay(t, d))
	for _, n := range names {
		if _, ok := ev["CDCRELAY_"+n]; !ok && !slices.Contains(chartOwned, n) {
			t.Errorf("CDCRELAY_%s is neither set by the chart nor accepted in extraEnv", n)
		}
	}
	// The chart's own: refused in extraEnv, each naming the value to use.
	for _, n := range chartOwned {
		set := []string{"--set", "defaults.extraEnv[0].name=CDCRELAY_" + n, "--set", "defaults.extraEnv[0].value=x"}
		_, stderr, err := runHelm(t, templateArgs(chartDir, []string{"single.yaml"}, set...)...)
		if err == nil || !strings.Contains(stderr, "extraEnv CDCRELAY_"+n+" ") {
			t.Errorf("extraEnv CDCRELAY_%s: not refused (err %v): %s", n, err, stderr)
		}
	}
}

// TestNotesPolicy: the notes follow the values: a lock database set through
// extraEnv, and the dead-letter exchange, which must exist too, with a queue
// bound to it (a fanout: every parked row's key), or every copy is returned.
func TestNotesPolicy(t *testing.T) {
	t.Parallel()
	notes := renderNotes(t, []string{"policy.yaml"})
	for _, want := range []string{
		"-- rel-cdcrelay-billing (Secret billing-db)\n  ALTER ROLE cdcrelay REPLICATION;\n  GRANT SELECT, DELETE ON public.event_outbox TO cdcrelay;\n" +
			"  GRANT UPDATE (published_at, attempts, last_error) ON public.event_outbox TO cdcrelay;\n  GRANT CONNECT ON DATABASE relay_locks TO cdcrelay;",
		"-- rel-cdcrelay-orders (Secret orders-db)\n  ALTER ROLE cdcrelay REPLICATION;\n  GRANT SELECT, DELETE ON public.event_outbox TO cdcrelay;\n" +
			"  GRANT UPDATE (published_at, attempts, last_error) ON public.event_outbox TO cdcrelay;\n  GRANT CONNECT ON DATABASE postgres TO cdcrelay;",
		"rabbitmqadmin declare exchange name=events.dead type=fanout durable=true && rabbitmqadmin declare queue name=events.dead durable=true && " +
			"rabbitmqadmin declare binding source=events.dead destination=events.dead",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}
