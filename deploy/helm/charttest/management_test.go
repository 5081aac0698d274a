package charttest

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestAmqpManagement: amqpManagement gives `cdcrelay check` the management
// API's URL from a Secret (key url unless set), in the helm test's Pod and in
// the relays (for kubectl exec … check); a source's replaces the defaults';
// with a NetworkPolicy the broker's egress opens the management ports; an
// extraEnv of the same variable is refused with the value to use.
func TestAmqpManagement(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"multi.yaml"},
		"--set", "defaults.amqpManagement.secretName=rabbitmq-monitoring",
		"--set", "sources[1].amqpManagement.secretName=billing-rabbitmq",
		"--set", "sources[1].amqpManagement.key=management-url",
		"--set", "tests.enabled=true", "--set", "networkPolicy.enabled=true")
	checkRelease(t, r)
	want := map[string][2]string{ // Deployment -> Secret, key
		"rel-cdcrelay-orders":     {"rabbitmq-monitoring", "url"},
		"rel-cdcrelay-billing-v2": {"billing-rabbitmq", "management-url"},
		"rel-cdcrelay-shipping":   {"rabbitmq-monitoring", "url"},
	}
	ref := func(where string, c corev1.Container) [2]string {
		t.Helper()
		for _, e := range c.Env {
			if e.Name == "CDCRELAY_AMQP_MANAGEMENT_URL" {
				if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					t.Fatalf("%s: CDCRELAY_AMQP_MANAGEMENT_URL not from a Secret: %+v", where, e)
				}
				return [2]string{e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key}
			}
		}
		t.Fatalf("%s: no CDCRELAY_AMQP_MANAGEMENT_URL", where)
		return [2]string{}
	}
	for name, w := range want {
		if got := ref(name, relay(t, r.Deployment(t, name))); got != w {
			t.Errorf("%s: management URL from %v, want %v", name, got, w)
		}
		var pod *corev1.Pod
		for _, p := range r.Pods {
			if p.Name == name+"-check" {
				pod = p
			}
		}
		if pod == nil {
			t.Fatalf("no helm test Pod %s-check", name)
		}
		if got := ref(pod.Name, pod.Spec.Containers[0]); got != w {
			t.Errorf("%s: management URL from %v, want %v", pod.Name, got, w)
		}
	}
	for _, np := range r.NetworkPolicies {
		var ports []string
		for _, e := range np.Spec.Egress {
			ports = append(ports, portStrings(e.Ports)...)
		}
		if !slices.Contains(ports, "TCP/15672") || !slices.Contains(ports, "TCP/15671") {
			t.Errorf("NetworkPolicy %s: egress ports %v lack the management API's 15672 and 15671", np.Name, ports)
		}
	}
	// Without it, none of that.
	plain := render(t, []string{"multi.yaml"}, "--set", "networkPolicy.enabled=true")
	for _, d := range plain.Deployments {
		if _, ok := env(t, relay(t, d))["CDCRELAY_AMQP_MANAGEMENT_URL"]; ok {
			t.Errorf("%s: CDCRELAY_AMQP_MANAGEMENT_URL without amqpManagement", d.Name)
		}
	}
	for _, np := range plain.NetworkPolicies {
		for _, e := range np.Spec.Egress {
			if slices.Contains(portStrings(e.Ports), "TCP/15672") {
				t.Errorf("NetworkPolicy %s opens 15672 without a management URL", np.Name)
			}
		}
	}
	// The variable in extraEnv as well: refused, naming the value.
	out, stderr, err := runHelm(t, templateArgs(chartDir, []string{"single.yaml"},
		"--set", "defaults.amqpManagement.secretName=rabbitmq-monitoring",
		"--set", "defaults.extraEnv[0].name=CDCRELAY_AMQP_MANAGEMENT_URL", "--set", "defaults.extraEnv[0].value=http://h:15672")...)
	if want := "extraEnv CDCRELAY_AMQP_MANAGEMENT_URL is already set by the chart value `amqpManagement`"; err == nil || !strings.Contains(stderr, want) {
		t.Errorf("amqpManagement and an extraEnv of its variable: err %v, want %q:\n%s%s", err, want, out, stderr)
	}
}
