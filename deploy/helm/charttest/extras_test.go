package charttest

import (
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The additions users of community charts expect (testdata/extras.yaml turns them
// all on): global.imageRegistry, commonAnnotations, extraEnvFrom, initContainers
// and sidecars, extraVolumes and mounts per source, the startupProbe, lifecycle
// hooks, the NetworkPolicy, the PodMonitor and the helm test.

// checkTestPod checks a helm test Pod (checkRelease calls it for every Pod): a
// test hook that runs `cdcrelay check` with exactly its source's configuration,
// restricted like the relays, and that no Deployment or Service takes for a relay.
func checkTestPod(t *testing.T, r *Rendered, p *corev1.Pod) {
	t.Helper()
	if p.Annotations["helm.sh/hook"] != "test" || p.Annotations["helm.sh/hook-delete-policy"] != "before-hook-creation" {
		t.Errorf("Pod %s: annotations %v, want a helm test hook kept until the next run (its logs)", p.Name, p.Annotations)
	}
	if p.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("Pod %s: restartPolicy %q, want Never (a check runs once)", p.Name, p.Spec.RestartPolicy)
	}
	if v := restrictedViolations(&corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}); len(v) > 0 {
		t.Errorf("Pod %s violates the restricted Pod Security Standard: %s", p.Name, strings.Join(v, "; "))
	}
	if s := p.Spec.AutomountServiceAccountToken; s == nil || *s {
		t.Errorf("Pod %s: the service account token is mounted", p.Name)
	}
	for _, d := range r.Deployments {
		if selectorOf(t, d.Spec.Selector).Matches(labels.Set(p.Labels)) {
			t.Errorf("Pod %s: Deployment %s's selector matches it: its ReplicaSet would adopt the test pod", p.Name, d.Name)
		}
	}
	for _, s := range r.Services {
		if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(p.Labels)) {
			t.Errorf("Pod %s: Service %s selects it", p.Name, s.Name)
		}
	}
	// Its source: the Deployment whose pods carry the same source label.
	var d *appsv1.Deployment
	for _, dd := range r.Deployments {
		if dd.Spec.Template.Labels["cdcrelay.io/source"] == p.Labels["cdcrelay.io/source"] {
			d = dd
		}
	}
	if d == nil {
		t.Errorf("Pod %s: no Deployment of source %q", p.Name, p.Labels["cdcrelay.io/source"])
		return
	}
	if len(p.Spec.Containers) != 1 {
		t.Fatalf("Pod %s: %d containers, want only the check (a sidecar would keep it from completing)", p.Name, len(p.Spec.Containers))
	}
	c, rc := p.Spec.Containers[0], relay(t, d)
	if c.Name != "check" || !slices.Equal(c.Command, []string{"/cdcrelay"}) || !slices.Equal(c.Args, []string{"check"}) {
		t.Errorf("Pod %s: container %s runs %v %v, want check: /cdcrelay check", p.Name, c.Name, c.Command, c.Args)
	}
	ps, ds := p.Spec, d.Spec.Template.Spec
	for what, pair := range map[string][2]any{
		"image":                     {c.Image, rc.Image},
		"env":                       {c.Env, rc.Env},
		"envFrom":                   {c.EnvFrom, rc.EnvFrom},
		"volumeMounts":              {c.VolumeMounts, rc.VolumeMounts},
		"container securityContext": {c.SecurityContext, rc.SecurityContext},
		"volumes":                   {ps.Volumes, ds.Volumes},
		"initContainers":            {ps.InitContainers, ds.InitContainers},
		"pod securityContext":       {ps.SecurityContext, ds.SecurityContext},
		"serviceAccountName":        {ps.ServiceAccountName, ds.ServiceAccountName},
		"imagePullSecrets":          {ps.ImagePullSecrets, ds.ImagePullSecrets},
		"nodeSelector":              {ps.NodeSelector, ds.NodeSelector},
		"tolerations":               {ps.Tolerations, ds.Tolerations},
	} {
		if !reflect.DeepEqual(pair[0], pair[1]) {
			t.Errorf("Pod %s: %s differs from Deployment %s's:\n%+v\n%+v", p.Name, what, d.Name, pair[0], pair[1])
		}
	}
}

// TestCommunityChartExtras renders extras.yaml and checks each addition.
func TestCommunityChartExtras(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"extras.yaml"})
	checkRelease(t, r)
	orders, billing := r.Deployment(t, "rel-cdcrelay-orders"), r.Deployment(t, "rel-cdcrelay-billing")

	// global.imageRegistry replaces the registry host of the relay's image, and of
	// nothing else (the sidecars' images are the user's).
	for _, d := range r.Deployments {
		if img := relay(t, d).Image; img != "mirror.example.com:5000/cdcrelay/cdcrelay:0.1.0" {
			t.Errorf("%s: image %q, want the mirror's", d.Name, img)
		}
	}
	if img := billing.Spec.Template.Spec.Containers[1].Image; img != "example.com/log-shipper:1" {
		t.Errorf("billing: sidecar image %q rewritten", img)
	}

	// commonAnnotations on every object, an object's own winning; not on the pod
	// template (a change there would roll the relays).
	type object struct {
		kind, name  string
		annotations map[string]string
	}
	var objects []object
	for _, d := range r.Deployments {
		objects = append(objects, object{"Deployment", d.Name, d.Annotations})
		if _, ok := d.Spec.Template.Annotations["owner"]; ok {
			t.Errorf("%s: commonAnnotations on the pod template", d.Name)
		}
		if d.Annotations["cdcrelay.io/slot"] == "" {
			t.Errorf("%s: lost its slot annotation", d.Name)
		}
	}
	for _, s := range r.Services {
		objects = append(objects, object{"Service", s.Name, s.Annotations})
	}
	for _, s := range r.ServiceAccounts {
		objects = append(objects, object{"ServiceAccount", s.Name, s.Annotations})
	}
	for _, p := range r.PDBs {
		objects = append(objects, object{"PodDisruptionBudget", p.Name, p.Annotations})
	}
	for _, n := range r.NetworkPolicies {
		objects = append(objects, object{"NetworkPolicy", n.Name, n.Annotations})
	}
	for _, p := range r.PodMonitors {
		objects = append(objects, object{"PodMonitor", p.Name, p.Annotations})
	}
	for _, p := range r.Pods {
		objects = append(objects, object{"Pod", p.Name, p.Annotations})
	}
	if len(objects) != 3+3+1+2+3+1+2 {
		t.Errorf("%d objects, want 15 (3 Deployments, Services and NetworkPolicies, 1 ServiceAccount and PodMonitor, 2 PDBs and test Pods)", len(objects))
	}
	for _, o := range objects {
		want := "platform@example.com"
		if o.kind == "Service" {
			want = "metrics@example.com" // service.annotations win
		}
		if o.annotations["owner"] != want {
			t.Errorf("%s %s: annotation owner %q, want %q", o.kind, o.name, o.annotations["owner"], want)
		}
	}

	// extraEnvFrom: the defaults', then the source's.
	wantFrom := map[string][]string{"rel-cdcrelay-orders": {"cm:relay-settings:"}, "rel-cdcrelay-billing": {"cm:relay-settings:", "secret:billing-extra:BILLING_"}}
	for name, want := range wantFrom {
		var got []string
		for _, e := range relay(t, r.Deployment(t, name)).EnvFrom {
			switch {
			case e.ConfigMapRef != nil:
				got = append(got, "cm:"+e.ConfigMapRef.Name+":"+e.Prefix)
			case e.SecretRef != nil:
				got = append(got, "secret:"+e.SecretRef.Name+":"+e.Prefix)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: envFrom %v, want %v", name, got, want)
		}
	}

	// initContainers and sidecars, per source; one without a securityContext gets
	// the relay's restricted one (checkRelease ran the restricted check over all).
	ic := orders.Spec.Template.Spec.InitContainers
	if len(ic) != 1 || ic[0].Name != "cloud-sql-proxy" || ic[0].RestartPolicy == nil || *ic[0].RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("orders: initContainers %+v, want the Cloud SQL proxy as a native sidecar", ic)
	}
	if !reflect.DeepEqual(ic[0].SecurityContext, relay(t, orders).SecurityContext) {
		t.Errorf("orders: the proxy's securityContext %+v is not the relay's %+v", ic[0].SecurityContext, relay(t, orders).SecurityContext)
	}
	if n := len(orders.Spec.Template.Spec.Containers); n != 1 {
		t.Errorf("orders: %d containers, want the relay only", n)
	}
	bc := billing.Spec.Template.Spec.Containers
	if len(billing.Spec.Template.Spec.InitContainers) != 0 || len(bc) != 2 || bc[1].Name != "log-shipper" {
		t.Fatalf("billing: initContainers %d, containers %d, want none and relay + log-shipper", len(billing.Spec.Template.Spec.InitContainers), len(bc))
	}
	if sc := bc[1].SecurityContext; sc == nil || sc.SeccompProfile != nil || sc.Privileged != nil {
		t.Errorf("billing: the sidecar's own securityContext %+v was replaced", sc)
	}

	// Volumes: the top-level ones, then the source's; billing's pg-ca replaces the
	// top-level one of that name.
	vols := func(d *appsv1.Deployment) map[string]string {
		m := map[string]string{}
		for _, v := range d.Spec.Template.Spec.Volumes {
			switch {
			case v.ConfigMap != nil:
				m[v.Name] = "cm:" + v.ConfigMap.Name
			case v.Secret != nil:
				m[v.Name] = "secret:" + v.Secret.SecretName
			case v.EmptyDir != nil:
				m[v.Name] = "emptyDir"
			}
		}
		return m
	}
	mounts := func(d *appsv1.Deployment) []string {
		var m []string
		for _, vm := range relay(t, d).VolumeMounts {
			m = append(m, vm.Name+":"+vm.MountPath)
		}
		return m
	}
	if got, want := vols(orders), map[string]string{"tmp": "emptyDir", "pg-ca": "cm:pg-ca"}; !reflect.DeepEqual(got, want) {
		t.Errorf("orders: volumes %v, want %v", got, want)
	}
	if got, want := vols(billing), map[string]string{"tmp": "emptyDir", "pg-ca": "cm:billing-pg-ca", "billing-certs": "secret:billing-certs", "amqp-tls": "secret:rabbitmq-ca"}; !reflect.DeepEqual(got, want) {
		t.Errorf("billing: volumes %v, want %v", got, want)
	}
	if got, want := mounts(orders), []string{"tmp:/tmp", "pg-ca:/etc/pg-ca"}; !slices.Equal(got, want) {
		t.Errorf("orders: mounts %v, want %v", got, want)
	}
	if got, want := mounts(billing), []string{"tmp:/tmp", "amqp-tls:/etc/cdcrelay/secrets/amqp-tls", "pg-ca:/etc/pg-ca", "billing-certs:/etc/billing-certs"}; !slices.Equal(got, want) {
		t.Errorf("billing: mounts %v, want %v", got, want)
	}

	// startupProbe on /healthz with the values' timings; lifecycle as given.
	for _, d := range r.Deployments {
		c := relay(t, d)
		sp := c.StartupProbe
		if sp == nil || sp.HTTPGet == nil || sp.HTTPGet.Path != "/healthz" || sp.HTTPGet.Port.String() != "http" || sp.PeriodSeconds != 2 || sp.FailureThreshold != 60 {
			t.Errorf("%s: startupProbe %+v, want /healthz on http every 2s, 60 times", d.Name, sp)
		}
		if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds != 5 {
			t.Errorf("%s: lifecycle %+v, want preStop sleep 5", d.Name, c.Lifecycle)
		}
	}

	// The helm test: one Pod per source that runs (legacy is paused), checked
	// against its source by checkTestPod; orders' gets the proxy, billing's not
	// the log shipper.
	var tested []string
	for _, p := range r.Pods {
		tested = append(tested, p.Name)
	}
	slices.Sort(tested)
	if !slices.Equal(tested, []string{"rel-cdcrelay-billing-check", "rel-cdcrelay-orders-check"}) {
		t.Errorf("test Pods %v, want one for orders and billing, none for the paused legacy", tested)
	}
}

// peerStrings renders NetworkPolicy peers for comparison.
func peerStrings(peers []networkingv1.NetworkPolicyPeer) []string {
	var out []string
	for _, p := range peers {
		var s []string
		if p.IPBlock != nil {
			s = append(s, "ip:"+p.IPBlock.CIDR)
		}
		if p.NamespaceSelector != nil {
			s = append(s, "ns:"+labels.Set(p.NamespaceSelector.MatchLabels).String())
		}
		if p.PodSelector != nil {
			s = append(s, "pod:"+labels.Set(p.PodSelector.MatchLabels).String())
		}
		out = append(out, strings.Join(s, "&"))
	}
	return out
}

func portStrings(ports []networkingv1.NetworkPolicyPort) []string {
	var out []string
	for _, p := range ports {
		out = append(out, string(*p.Protocol)+"/"+p.Port.String())
	}
	return out
}

// TestNetworkPolicy: one policy per source selecting its relay pods and its test
// pod and nothing of another source; ingress to the metrics port from the given
// peers; egress to DNS, PostgreSQL and the broker on derived or set ports, and the
// extra rules.
func TestNetworkPolicy(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"extras.yaml"})
	if len(r.NetworkPolicies) != len(r.Deployments) {
		t.Fatalf("%d NetworkPolicies for %d sources", len(r.NetworkPolicies), len(r.Deployments))
	}
	type egress struct{ ports, to []string }
	dns := egress{[]string{"UDP/53", "TCP/53"}, []string{"ns:kubernetes.io/metadata.name=kube-system"}}
	rabbit := []string{"ns:kubernetes.io/metadata.name=rabbitmq&pod:app.kubernetes.io/name=rabbitmq"}
	nodeLocal := egress{[]string{"UDP/53"}, []string{"ip:169.254.20.10/32"}}
	want := map[string][]egress{
		// its own postgresql (the proxy's 3307, any address), the defaults' broker
		// with the management ports (CDCRELAY_AMQP_MANAGEMENT_URL in extraEnv).
		"rel-cdcrelay-orders": {dns, {[]string{"TCP/3307"}, nil}, {[]string{"TCP/5672", "TCP/5671", "TCP/15672", "TCP/15671"}, rabbit}, nodeLocal, {[]string{"TCP/443"}, nil}},
		// the defaults' postgresql; its own broker replaces the defaults' whole.
		"rel-cdcrelay-billing": {dns, {[]string{"TCP/5432"}, []string{"ip:10.20.0.0/16"}}, {[]string{"TCP/5671", "TCP/15671"}, nil}, nodeLocal},
		"rel-cdcrelay-legacy":  {dns, {[]string{"TCP/5432"}, []string{"ip:10.20.0.0/16"}}, {[]string{"TCP/5672", "TCP/5671", "TCP/15672", "TCP/15671"}, rabbit}, nodeLocal},
	}
	for _, np := range r.NetworkPolicies {
		sel := selectorOf(t, &np.Spec.PodSelector)
		for _, d := range r.Deployments {
			if got := sel.Matches(labels.Set(d.Spec.Template.Labels)); got != (d.Name == np.Name) {
				t.Errorf("NetworkPolicy %s selects Deployment %s's pods: %v", np.Name, d.Name, got)
			}
		}
		for _, p := range r.Pods {
			if got := sel.Matches(labels.Set(p.Labels)); got != (p.Name == np.Name+"-check") {
				t.Errorf("NetworkPolicy %s selects test Pod %s: %v", np.Name, p.Name, got)
			}
		}
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
			t.Errorf("NetworkPolicy %s: policyTypes %v", np.Name, np.Spec.PolicyTypes)
		}
		in := np.Spec.Ingress
		if len(in) != 1 || !slices.Equal(portStrings(in[0].Ports), []string{"TCP/http"}) ||
			!slices.Equal(peerStrings(in[0].From), []string{"ns:kubernetes.io/metadata.name=monitoring"}) {
			t.Errorf("NetworkPolicy %s: ingress %+v, want the http port from the monitoring namespace only", np.Name, in)
		}
		var got []egress
		for _, e := range np.Spec.Egress {
			got = append(got, egress{portStrings(e.Ports), peerStrings(e.To)})
		}
		if !reflect.DeepEqual(got, want[np.Name]) {
			t.Errorf("NetworkPolicy %s: egress\n%v\nwant\n%v", np.Name, got, want[np.Name])
		}
	}
}

// TestNetworkPolicyDerivedPorts: with nothing set, PostgreSQL is 5432, the broker
// 5672 and 5671 (amqp or amqps, the chart cannot tell), 5671 alone with amqpTLS;
// metrics from anywhere, DNS to kube-system.
func TestNetworkPolicyDerivedPorts(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		set    []string
		broker []string
	}{
		"plain":     {nil, []string{"TCP/5672", "TCP/5671"}},
		"amqpTLS":   {[]string{"--set", "defaults.amqpTLS.secretName=ca", "--set", "defaults.amqpTLS.ca=ca.crt"}, []string{"TCP/5671"}},
		"set ports": {[]string{"--set", "defaults.networkPolicy.broker.ports[0]=5552"}, []string{"TCP/5552"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := render(t, []string{"single.yaml"}, append([]string{"--set", "networkPolicy.enabled=true"}, c.set...)...)
			if len(r.NetworkPolicies) != 1 {
				t.Fatalf("%d NetworkPolicies, want 1", len(r.NetworkPolicies))
			}
			np := r.NetworkPolicies[0]
			if in := np.Spec.Ingress; len(in) != 1 || len(in[0].From) != 0 || !slices.Equal(portStrings(in[0].Ports), []string{"TCP/http"}) {
				t.Errorf("ingress %+v, want the http port from anywhere", in)
			}
			eg := np.Spec.Egress
			if len(eg) != 3 {
				t.Fatalf("egress %+v, want DNS, PostgreSQL, the broker", eg)
			}
			if !slices.Equal(portStrings(eg[0].Ports), []string{"UDP/53", "TCP/53"}) || !slices.Equal(peerStrings(eg[0].To), []string{"ns:kubernetes.io/metadata.name=kube-system"}) {
				t.Errorf("DNS egress %+v", eg[0])
			}
			if !slices.Equal(portStrings(eg[1].Ports), []string{"TCP/5432"}) || len(eg[1].To) != 0 {
				t.Errorf("PostgreSQL egress %+v, want 5432 anywhere", eg[1])
			}
			if !slices.Equal(portStrings(eg[2].Ports), c.broker) || len(eg[2].To) != 0 {
				t.Errorf("broker egress %v, want %v", portStrings(eg[2].Ports), c.broker)
			}
		})
	}
}

// relabel applies Prometheus "replace" relabelings to a target's labels, as
// Prometheus does: source label values joined with ";", the regex anchored at
// both ends, the replacement ($1 by default) written to the target label.
func relabel(t *testing.T, rules []RelabelConfig, l map[string]string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range l {
		out[k] = v
	}
	for _, r := range rules {
		if r.Action != "replace" {
			continue
		}
		var vals []string
		for _, s := range r.SourceLabels {
			vals = append(vals, out[s])
		}
		re := "(.*)"
		if r.Regex != "" {
			re = r.Regex
		}
		rx := regexp.MustCompile("^(?:" + re + ")$")
		val := strings.Join(vals, ";")
		m := rx.FindStringSubmatchIndex(val)
		if m == nil {
			continue
		}
		repl := "$1"
		if r.Replacement != nil {
			repl = *r.Replacement
		}
		out[r.TargetLabel] = string(rx.ExpandString(nil, repl, val, m))
	}
	return out
}

// TestPodMonitor: the PodMonitor scrapes the relay pods (not the test pods) on
// http, and its relabelings give every pod's series the labels the ServiceMonitor
// would: source, and service and job equal to the name of the Service that selects
// the pod, which the alerts select; the user's relabelings come after the chart's.
func TestPodMonitor(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"extras.yaml"})
	if len(r.PodMonitors) != 1 || len(r.ServiceMonitors) != 0 {
		t.Fatalf("%d PodMonitors, %d ServiceMonitors, want 1 and 0", len(r.PodMonitors), len(r.ServiceMonitors))
	}
	pm := r.PodMonitors[0]
	if pm.Namespace != "monitoring" || pm.Labels["release"] != "kube-prometheus-stack" || pm.Labels["app.kubernetes.io/instance"] != releaseName {
		t.Errorf("PodMonitor %s/%s labels %v: want namespace monitoring and the release label", pm.Namespace, pm.Name, pm.Labels)
	}
	if !slices.Equal(pm.Spec.NamespaceSelector.MatchNames, []string{namespace}) || !slices.Equal(pm.Spec.PodTargetLabels, []string{"team"}) {
		t.Errorf("PodMonitor namespaceSelector %+v podTargetLabels %v", pm.Spec.NamespaceSelector, pm.Spec.PodTargetLabels)
	}
	sel := selectorOf(t, &pm.Spec.Selector)
	for _, d := range r.Deployments {
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("PodMonitor misses Deployment %s's pods", d.Name)
		}
	}
	for _, p := range r.Pods {
		if sel.Matches(labels.Set(p.Labels)) {
			t.Errorf("PodMonitor scrapes test Pod %s", p.Name)
		}
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("%d endpoints", len(pm.Spec.PodMetricsEndpoints))
	}
	ep := pm.Spec.PodMetricsEndpoints[0]
	if ep.Port != "http" || ep.Path != "/metrics" || ep.Interval != "30s" || ep.ScrapeTimeout != "10s" {
		t.Errorf("endpoint %+v", ep)
	}
	last := ep.RelabelConfigs[len(ep.RelabelConfigs)-1]
	if last.TargetLabel != "node" || !slices.Equal(last.SourceLabels, []string{"__meta_kubernetes_pod_node_name"}) {
		t.Errorf("the user's relabeling is not last: %+v", last)
	}
	if len(ep.MetricRelabelConfigs) != 1 || ep.MetricRelabelConfigs[0].Action != "drop" || ep.MetricRelabelConfigs[0].Regex != "go_gc_.*" {
		t.Errorf("metricRelabelings %+v", ep.MetricRelabelConfigs)
	}
	for _, d := range r.Deployments {
		meta := map[string]string{}
		for k, v := range d.Spec.Template.Labels {
			meta["__meta_kubernetes_pod_label_"+regexp.MustCompile(`[^a-zA-Z0-9_]`).ReplaceAllString(k, "_")] = v
		}
		got := relabel(t, ep.RelabelConfigs, meta)
		var svc string
		for _, s := range r.Services {
			if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
				svc = s.Name
			}
		}
		if svc == "" || got["service"] != svc || got["job"] != svc || got["source"] != d.Spec.Template.Labels["cdcrelay.io/source"] {
			t.Errorf("Deployment %s's pods: service %q job %q source %q, want service and job %q", d.Name, got["service"], got["job"], got["source"], svc)
		}
	}
}

// TestServiceMonitorOptions: namespace, targetLabels, relabelings after the
// chart's `source` one, and metricRelabelings reach the ServiceMonitor.
func TestServiceMonitorOptions(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"monitoring.yaml"},
		"--set", "monitoring.serviceMonitor.namespace=monitoring",
		"--set", "monitoring.serviceMonitor.targetLabels[0]=team",
		"--set", "monitoring.serviceMonitor.relabelings[0].action=replace",
		"--set", "monitoring.serviceMonitor.relabelings[0].sourceLabels[0]=__meta_kubernetes_pod_node_name",
		"--set", "monitoring.serviceMonitor.relabelings[0].targetLabel=node",
		"--set", "monitoring.serviceMonitor.metricRelabelings[0].action=drop",
		"--set", "monitoring.serviceMonitor.metricRelabelings[0].sourceLabels[0]=__name__",
		"--set", "monitoring.serviceMonitor.metricRelabelings[0].regex=go_.*")
	if len(r.ServiceMonitors) != 1 {
		t.Fatalf("%d ServiceMonitors", len(r.ServiceMonitors))
	}
	sm := r.ServiceMonitors[0]
	if sm.Namespace != "monitoring" || !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("ServiceMonitor in %q selecting %v, want monitoring selecting %s", sm.Namespace, sm.Spec.NamespaceSelector.MatchNames, namespace)
	}
	if !slices.Equal(sm.Spec.TargetLabels, []string{"team"}) {
		t.Errorf("targetLabels %v", sm.Spec.TargetLabels)
	}
	ep := sm.Spec.Endpoints[0]
	if len(ep.RelabelConfigs) != 2 || ep.RelabelConfigs[0].TargetLabel != "source" || ep.RelabelConfigs[1].TargetLabel != "node" {
		t.Errorf("relabelings %+v, want the chart's source, then node", ep.RelabelConfigs)
	}
	if len(ep.MetricRelabelConfigs) != 1 || ep.MetricRelabelConfigs[0].Regex != "go_.*" {
		t.Errorf("metricRelabelings %+v", ep.MetricRelabelConfigs)
	}
	// The PrometheusRule can go elsewhere too; its alerts still select the
	// release's namespace.
	pr := render(t, []string{"monitoring.yaml"}, "--set", "monitoring.prometheusRule.namespace=monitoring").PrometheusRules
	if len(pr) != 1 || pr[0].Namespace != "monitoring" {
		t.Fatalf("PrometheusRules %+v, want one in monitoring", pr)
	}
	if expr := pr[0].Spec.Groups[0].Rules[0].Expr; !strings.Contains(expr, `namespace="`+namespace+`"`) {
		t.Errorf("first rule %s does not select the release's namespace", expr)
	}
	if d := render(t, []string{"monitoring.yaml"}).PrometheusRules[0]; d.Namespace != namespace {
		t.Errorf("default PrometheusRule in %q, want %q", d.Namespace, namespace)
	}
	// The defaults: the release's namespace, the chart's relabeling alone.
	d := render(t, []string{"monitoring.yaml"}).ServiceMonitors[0]
	if d.Namespace != namespace || len(d.Spec.TargetLabels) != 0 || len(d.Spec.Endpoints[0].RelabelConfigs) != 1 || len(d.Spec.Endpoints[0].MetricRelabelConfigs) != 0 {
		t.Errorf("default ServiceMonitor changed: %+v", d)
	}
}

// TestImageRegistry: global.imageRegistry replaces the registry host of
// image.repository, or goes in front of a repository without one; a digest stays.
func TestImageRegistry(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("cd", 32)
	for _, c := range []struct {
		registry, repository, digest, want string
	}{
		{"", "registry.example.com/cdcrelay", "", "registry.example.com/cdcrelay:0.1.0"},
		// The placeholder's path on a registry of one's own, where one may have pushed it.
		{"mirror.local", "ghcr.io/cdcrelay/cdcrelay", "", "mirror.local/cdcrelay/cdcrelay:0.1.0"},
		{"mirror.local:5000/", "localhost:5000/cdcrelay", "", "mirror.local:5000/cdcrelay:0.1.0"},
		{"mirror.local/ghcr", "localhost/cdcrelay", digest, "mirror.local/ghcr/cdcrelay@" + digest},
		{"mirror.local", "cdcrelay", "", "mirror.local/cdcrelay:0.1.0"},
		{"mirror.local", "team/cdcrelay", "", "mirror.local/team/cdcrelay:0.1.0"},
	} {
		args := []string{"--set", "global.imageRegistry=" + c.registry, "--set", "image.repository=" + c.repository, "--set", "image.digest=" + c.digest, "--set", "tests.enabled=true"}
		r := render(t, []string{"single.yaml"}, args...)
		if got := relay(t, r.Deployments[0]).Image; got != c.want {
			t.Errorf("registry %q, repository %q: image %q, want %q", c.registry, c.repository, got, c.want)
		}
		if len(r.Pods) != 1 || r.Pods[0].Spec.Containers[0].Image != c.want {
			t.Errorf("registry %q, repository %q: the test Pod's image differs from the relay's", c.registry, c.repository)
		}
	}
}

// TestDefaultsAddNothing: with every addition at its default, the rendered objects
// are what they were: no NetworkPolicy, PodMonitor or test Pod, no annotations
// where there were none, one container without envFrom, init containers,
// startupProbe or lifecycle, and the volumes of the chart alone.
func TestDefaultsAddNothing(t *testing.T) {
	t.Parallel()
	for _, f := range []string{"single.yaml", "multi.yaml", "monitoring.yaml"} {
		r := render(t, []string{f})
		if len(r.NetworkPolicies)+len(r.PodMonitors)+len(r.Pods) != 0 {
			t.Errorf("%s: %d NetworkPolicies, %d PodMonitors, %d Pods rendered by default", f, len(r.NetworkPolicies), len(r.PodMonitors), len(r.Pods))
		}
		for _, s := range r.Services {
			if s.Annotations != nil {
				t.Errorf("%s: Service %s has annotations %v", f, s.Name, s.Annotations)
			}
		}
		for _, s := range r.ServiceAccounts {
			if s.Annotations != nil {
				t.Errorf("%s: ServiceAccount %s has annotations %v", f, s.Name, s.Annotations)
			}
		}
		for _, p := range r.PDBs {
			if p.Annotations != nil {
				t.Errorf("%s: PDB %s has annotations %v", f, p.Name, p.Annotations)
			}
		}
		for _, d := range r.Deployments {
			if len(d.Annotations) != 2 {
				t.Errorf("%s: Deployment %s annotations %v, want the slot and publication only", f, d.Name, d.Annotations)
			}
			s := d.Spec.Template.Spec
			c := relay(t, d)
			if len(s.Containers) != 1 || len(s.InitContainers) != 0 || len(c.EnvFrom) != 0 || c.StartupProbe != nil || c.Lifecycle != nil {
				t.Errorf("%s: Deployment %s: %d containers, %d initContainers, envFrom %v, startupProbe %v, lifecycle %v", f, d.Name,
					len(s.Containers), len(s.InitContainers), c.EnvFrom, c.StartupProbe, c.Lifecycle)
			}
			for _, v := range s.Volumes {
				if v.Name != "tmp" {
					t.Errorf("%s: Deployment %s: volume %s by default", f, d.Name, v.Name)
				}
			}
			if c.Image != "registry.example.com/cdcrelay:0.1.0" {
				t.Errorf("%s: image %q, want the file's repository with the appVersion tag", f, c.Image)
			}
		}
		for _, sm := range r.ServiceMonitors {
			if sm.Annotations != nil || sm.Namespace != namespace {
				t.Errorf("%s: ServiceMonitor annotations %v namespace %s", f, sm.Annotations, sm.Namespace)
			}
		}
	}
}

// TestHelmTestPods: tests.enabled renders one check Pod per running source, each
// with its source's Secrets (checkTestPod compares everything with the Deployment).
func TestHelmTestPods(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"multi.yaml"}, "--set", "tests.enabled=true")
	checkRelease(t, r)
	var names []string
	for _, p := range r.Pods {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	// legacy is paused (replicas: 0): no check.
	if want := []string{"rel-cdcrelay-billing-v2-check", "rel-cdcrelay-orders-check", "rel-cdcrelay-shipping-check"}; !slices.Equal(names, want) {
		t.Fatalf("test Pods %v, want %v", names, want)
	}
	for _, p := range r.Pods {
		src := p.Labels["cdcrelay.io/source"]
		var db string
		for _, e := range p.Spec.Containers[0].Env {
			if e.Name == "CDCRELAY_DATABASE_URL" {
				db = e.ValueFrom.SecretKeyRef.Name
			}
		}
		if want := map[string]string{"orders": "orders-db", "billing-v2": "billing-db", "shipping": "shipping-db"}[src]; db != want {
			t.Errorf("test Pod %s: database Secret %q, want %q", p.Name, db, want)
		}
	}
	// The notes point at it only when it exists.
	if notes := renderNotes(t, []string{"extras.yaml"}); !strings.Contains(notes, "helm test rel -n svc --logs") {
		t.Errorf("notes with tests.enabled lack `helm test`:\n%s", notes)
	}
	if notes := renderNotes(t, []string{"multi.yaml"}); strings.Contains(notes, "helm test") {
		t.Errorf("notes mention `helm test`, which is off:\n%s", notes)
	}
}

// TestRejectsBadExtras: the schema validates every new key, and the templates
// refuse what the schema cannot see: poison stop with a dead-letter exchange
// (however the two meet), two monitors, and names the chart uses itself.
func TestRejectsBadExtras(t *testing.T) {
	t.Parallel()
	refusal := `poison "stop" with deadLetterExchange "events.dead": with poison stop the relay exits at the first poison row`
	cases := []struct {
		file, want string
		schema     bool
	}{
		{"poison-stop-dead-letter.yaml", `source "orders": ` + refusal, false},
		{"poison-stop-inherited-dead-letter.yaml", `source "billing": ` + refusal, false},
		{"poison-stop-extra-env.yaml", `source "orders": ` + refusal, false},
		{"both-monitors.yaml", "monitoring.serviceMonitor and monitoring.podMonitor are both enabled", false},
		{"sidecar-named-relay.yaml", `sidecars "relay": the chart names its own containers relay and check`, false},
		{"extra-volume-chart-name.yaml", `extraVolumes "tmp": the chart uses that volume name itself`, false},
		{"network-policy-unknown-key.yaml", "at '/networkPolicy': additional properties 'egress' not allowed", true},
		{"network-policy-bad-port.yaml", "at '/sources/0/networkPolicy/postgresql/ports/0'", true},
		{"network-policy-bad-peer.yaml", "at '/defaults/networkPolicy/broker/to/0': additional properties 'ipBlok' not allowed", true},
		{"bad-env-from.yaml", "at '/defaults/extraEnvFrom/0'", true},
		{"sidecar-without-image.yaml", "at '/source/initContainers/0': missing property 'image'", true},
		{"bad-lifecycle.yaml", "at '/defaults/lifecycle': additional properties 'preStopp' not allowed", true},
		{"bad-startup-probe.yaml", "at '/probes/startup/periodSeconds'", true},
		{"bad-relabel-action.yaml", "at '/monitoring/serviceMonitor/relabelings/0/action'", true},
		{"bad-pod-monitor-key.yaml", "at '/monitoring/podMonitor': additional properties 'targetLabels' not allowed", true},
		{"bad-image-registry.yaml", "at '/global/imageRegistry'", true},
		{"bad-common-annotations.yaml", "at '/commonAnnotations/replicas'", true},
		{"bad-tests-key.yaml", "at '/tests': additional properties 'enable' not allowed", true},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			t.Parallel()
			expectRejected(t, c.file, c.want, c.schema)
		})
	}
	// A source's null dead-letter exchange lets it stop at poison (policy.yaml's
	// billing), and poison park keeps the exchange.
	r := render(t, []string{filepath.Join("bad", "poison-stop-inherited-dead-letter.yaml")}, "--set", "sources[1].deadLetterExchange=null")
	if _, ok := env(t, relay(t, r.Deployment(t, "rel-cdcrelay-billing")))["CDCRELAY_DEAD_LETTER_EXCHANGE"]; ok {
		t.Errorf("billing: the dead-letter exchange set to null is still rendered")
	}
	if got := envValue(t, r.Deployment(t, "rel-cdcrelay-orders"), "CDCRELAY_DEAD_LETTER_EXCHANGE"); got != "events.dead" {
		t.Errorf("orders: dead-letter exchange %q, want the defaults' events.dead", got)
	}
}
