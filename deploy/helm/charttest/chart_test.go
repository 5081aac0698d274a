package charttest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// goodValues are the values files every good-path check runs over.
var goodValues = []string{"single.yaml", "multi.yaml", "monitoring.yaml", "files.yaml", "quoted.yaml", "policy.yaml", "standby.yaml", "extras.yaml"}

var (
	slotName = regexp.MustCompile(`^[a-z0-9_]{1,54}$`)
	pgName   = regexp.MustCompile(`^([a-z_][a-z0-9_$]{0,62}|"([^"]|""){1,63}")$`)
)

// chartEnv is the whole env of a relay of single.yaml, which sets no relay
// setting: the URLs from their Secrets, what the chart itself owns (the slot and
// publication it names, and derives per source; the port its probes and Service
// use) and its one choice for a cluster (json logs). Every other variable is left
// unset, so the relay's own default applies and a relay release that changes a
// default brings it: the chart pins none.
var chartEnv = []string{"CDCRELAY_DATABASE_URL", "CDCRELAY_AMQP_URL", "CDCRELAY_SLOT", "CDCRELAY_PUBLICATION", "CDCRELAY_HTTP_ADDR", "CDCRELAY_LOG_FORMAT"}

// env returns the container's env as a map, failing on a duplicate name.
func env(t *testing.T, c corev1.Container) map[string]corev1.EnvVar {
	t.Helper()
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if _, dup := m[e.Name]; dup {
			t.Errorf("container %s: env %s is set twice", c.Name, e.Name)
		}
		m[e.Name] = e
	}
	return m
}

func envValue(t *testing.T, d *appsv1.Deployment, name string) string {
	t.Helper()
	e, ok := env(t, relay(t, d))[name]
	if !ok {
		t.Fatalf("Deployment %s: no env %s", d.Name, name)
	}
	if e.ValueFrom != nil {
		t.Fatalf("Deployment %s: env %s comes from valueFrom, want a value", d.Name, name)
	}
	return e.Value
}

// relay returns the Deployment's relay container: the first (kubectl's default
// container), the only one named relay; sidecars may follow it.
func relay(t *testing.T, d *appsv1.Deployment) corev1.Container {
	t.Helper()
	cs := d.Spec.Template.Spec.Containers
	if len(cs) == 0 || cs[0].Name != "relay" {
		t.Fatalf("Deployment %s: the first container is not relay (%d containers)", d.Name, len(cs))
	}
	for _, c := range cs[1:] {
		if c.Name == "relay" {
			t.Fatalf("Deployment %s: two containers named relay", d.Name)
		}
	}
	return cs[0]
}

func selectorOf(t *testing.T, ls *metav1.LabelSelector) labels.Selector {
	t.Helper()
	if ls == nil || (len(ls.MatchLabels) == 0 && len(ls.MatchExpressions) == 0) {
		t.Fatalf("empty label selector")
	}
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		t.Fatalf("label selector %v: %v", ls, err)
	}
	return s
}

func checkMeta(t *testing.T, kind string, m metav1.ObjectMeta) {
	t.Helper()
	if errs := validation.IsDNS1123Label(m.Name); len(errs) > 0 {
		t.Errorf("%s name %q: %v", kind, m.Name, errs)
	}
	if m.Namespace != namespace {
		t.Errorf("%s %s: namespace %q, want %q", kind, m.Name, m.Namespace, namespace)
	}
	for k, v := range m.Labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("%s %s: label key %q: %v", kind, m.Name, k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("%s %s: label %s value %q: %v", kind, m.Name, k, v, errs)
		}
	}
	if m.Labels["app.kubernetes.io/instance"] != releaseName {
		t.Errorf("%s %s: no app.kubernetes.io/instance=%s label", kind, m.Name, releaseName)
	}
}

// checkRelease checks what must hold for every rendered release: the hardened pod,
// probes, URLs from Secrets, a Service and a PDB per source, distinct slots.
func checkRelease(t *testing.T, r *Rendered) {
	t.Helper()
	slots, pubs := map[string]string{}, map[string]string{}
	for _, sa := range r.ServiceAccounts {
		checkMeta(t, "ServiceAccount", sa.ObjectMeta)
		if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			t.Errorf("ServiceAccount %s mounts its token", sa.Name)
		}
	}
	for _, s := range r.Services {
		checkMeta(t, "Service", s.ObjectMeta)
	}
	for _, p := range r.PDBs {
		checkMeta(t, "PodDisruptionBudget", p.ObjectMeta)
	}
	for _, n := range r.NetworkPolicies {
		checkMeta(t, "NetworkPolicy", n.ObjectMeta)
	}
	for _, p := range r.Pods {
		checkMeta(t, "Pod", p.ObjectMeta)
		checkTestPod(t, r, p)
	}
	for _, d := range r.Deployments {
		checkMeta(t, "Deployment", d.ObjectMeta)
		checkDeployment(t, r, d)
		slot := envValue(t, d, "CDCRELAY_SLOT")
		pub := envValue(t, d, "CDCRELAY_PUBLICATION")
		if !slotName.MatchString(slot) || strings.HasSuffix(slot, "_adopting") || !pgName.MatchString(pub) {
			t.Errorf("Deployment %s: slot %q or publication %q is not a valid name", d.Name, slot, pub)
		}
		if other, dup := slots[slot]; dup {
			t.Errorf("Deployments %s and %s share slot %s", other, d.Name, slot)
		}
		if other, dup := pubs[pub]; dup {
			t.Errorf("Deployments %s and %s share publication %s", other, d.Name, pub)
		}
		slots[slot], pubs[pub] = d.Name, d.Name
	}
}

func checkDeployment(t *testing.T, r *Rendered, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template
	sel := selectorOf(t, d.Spec.Selector)
	if !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("Deployment %s: selector %s does not match its pod labels %v", d.Name, sel, pod.Labels)
	}
	for _, other := range r.Deployments {
		if other != d && sel.Matches(labels.Set(other.Spec.Template.Labels)) {
			t.Errorf("Deployment %s's selector also matches the pods of %s", d.Name, other.Name)
		}
	}
	if d.Spec.Replicas == nil {
		t.Fatalf("Deployment %s: replicas unset", d.Name)
	}
	// A chart release must not roll the relays: no chart version on the pod.
	for _, l := range []string{"helm.sh/chart", "app.kubernetes.io/version"} {
		if _, ok := pod.Labels[l]; ok {
			t.Errorf("Deployment %s: pod template label %s changes with every chart release and would roll every relay", d.Name, l)
		}
	}

	// Pod security: the Pod Security Standard "restricted", as the admission
	// controller evaluates it, then the chart's own hardening beyond it.
	if v := restrictedViolations(&pod); len(v) > 0 {
		t.Errorf("Deployment %s: pod template violates the restricted Pod Security Standard: %s", d.Name, strings.Join(v, "; "))
	}
	ps := pod.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot {
		t.Errorf("Deployment %s: pod runAsNonRoot is not true", d.Name)
	}
	if ps != nil && (ps.RunAsUser == nil || *ps.RunAsUser == 0) {
		t.Errorf("Deployment %s: pod runAsUser unset or root", d.Name)
	}
	if ps == nil || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("Deployment %s: pod seccompProfile is not RuntimeDefault", d.Name)
	}
	if s := pod.Spec.AutomountServiceAccountToken; s == nil || *s {
		t.Errorf("Deployment %s: the service account token is mounted", d.Name)
	}
	if !slices.ContainsFunc(r.ServiceAccounts, func(sa *corev1.ServiceAccount) bool { return sa.Name == pod.Spec.ServiceAccountName }) {
		t.Errorf("Deployment %s: service account %q is not rendered", d.Name, pod.Spec.ServiceAccountName)
	}

	c := relay(t, d)
	if c.Image == "" || !slices.Equal(c.Command, []string{"/cdcrelay"}) || !slices.Equal(c.Args, []string{"run"}) {
		t.Errorf("Deployment %s: image %q command %v args %v, want /cdcrelay run", d.Name, c.Image, c.Command, c.Args)
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatalf("Deployment %s: no container securityContext", d.Name)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("Deployment %s: allowPrivilegeEscalation is not false", d.Name)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("Deployment %s: readOnlyRootFilesystem is not true", d.Name)
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Errorf("Deployment %s: container runAsNonRoot is not true", d.Name)
	case sc.Privileged != nil && *sc.Privileged:
		t.Errorf("Deployment %s: privileged", d.Name)
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("Deployment %s: capabilities %+v, want drop [ALL] and no add", d.Name, sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("Deployment %s: container seccompProfile is not RuntimeDefault", d.Name)
	}

	// Port and probes.
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != 8080 {
		t.Errorf("Deployment %s: ports %+v, want http 8080", d.Name, c.Ports)
	}
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("Deployment %s: no %s httpGet probe", d.Name, p.what)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("Deployment %s: %s probe %s on port %s, want %s on http", d.Name, p.what, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path)
		}
		if p.probe.PeriodSeconds < 1 || p.probe.FailureThreshold < 1 || p.probe.TimeoutSeconds < 1 {
			t.Errorf("Deployment %s: %s probe timings %+v", d.Name, p.what, p.probe)
		}
	}
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("Deployment %s: resources %+v lack cpu/memory requests or a memory limit", d.Name, c.Resources)
	}

	// Configuration.
	ev := env(t, c)
	for name, e := range ev {
		if !strings.HasPrefix(name, "CDCRELAY_") && name != "GOMEMLIMIT" {
			t.Errorf("Deployment %s: unexpected env %s", d.Name, name)
		}
		if strings.HasSuffix(name, "_URL") && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			t.Errorf("Deployment %s: %s is not from a secretKeyRef: a URL with a password in the pod spec", d.Name, name)
		}
	}
	if ev["CDCRELAY_HTTP_ADDR"].Value != ":8080" {
		t.Errorf("Deployment %s: CDCRELAY_HTTP_ADDR %q, want :8080", d.Name, ev["CDCRELAY_HTTP_ADDR"].Value)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	for name := range mounts {
		if _, ok := volumes[name]; !ok {
			t.Errorf("Deployment %s: mount %s has no volume", d.Name, name)
		}
	}
	for _, url := range []string{"CDCRELAY_DATABASE_URL", "CDCRELAY_AMQP_URL"} {
		direct, hasDirect := ev[url]
		file, hasFile := ev[url+"_FILE"]
		switch {
		case hasDirect == hasFile:
			t.Errorf("Deployment %s: want exactly one of %s and %s_FILE", d.Name, url, url)
		case hasDirect:
			ref := direct.ValueFrom.SecretKeyRef
			if ref.Name == "" || ref.Key == "" {
				t.Errorf("Deployment %s: %s secretKeyRef %+v", d.Name, url, ref)
			}
		case hasFile:
			checkFileSecret(t, d, file.Value, mounts, volumes)
		}
	}
	// The standby's URL (the slot on a standby) is optional: at most one of the two.
	if _, hasDirect := ev["CDCRELAY_REPLICATION_URL"]; hasDirect {
		if _, hasFile := ev["CDCRELAY_REPLICATION_URL_FILE"]; hasFile {
			t.Errorf("Deployment %s: both CDCRELAY_REPLICATION_URL and CDCRELAY_REPLICATION_URL_FILE", d.Name)
		}
	}
	for _, name := range []string{"CDCRELAY_REPLICATION_URL_FILE", "CDCRELAY_AMQP_TLS_CA", "CDCRELAY_AMQP_TLS_CERT", "CDCRELAY_AMQP_TLS_KEY"} {
		if e, ok := ev[name]; ok {
			checkFileSecret(t, d, e.Value, mounts, volumes)
		}
	}

	// Shutdown: the kubelet must wait longer than the relay's drain.
	stop := 15 * time.Second
	if s, ok := ev["CDCRELAY_SHUTDOWN_TIMEOUT"]; ok {
		var err error
		if stop, err = time.ParseDuration(s.Value); err != nil {
			t.Errorf("Deployment %s: CDCRELAY_SHUTDOWN_TIMEOUT %q: %v", d.Name, s.Value, err)
		}
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil {
		t.Errorf("Deployment %s: terminationGracePeriodSeconds unset", d.Name)
	} else if time.Duration(*g)*time.Second <= stop {
		t.Errorf("Deployment %s: terminationGracePeriodSeconds %d is not above the shutdown timeout %s", d.Name, *g, stop)
	}

	// A metrics Service that selects exactly these pods, standbys included.
	var svcs []*corev1.Service
	for _, s := range r.Services {
		if len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			svcs = append(svcs, s)
		}
	}
	if len(svcs) != 1 {
		t.Errorf("Deployment %s: %d Services select its pods, want 1", d.Name, len(svcs))
	} else {
		s := svcs[0]
		if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Name != "http" || s.Spec.Ports[0].TargetPort.String() != "http" {
			t.Errorf("Service %s: ports %+v, want http -> http", s.Name, s.Spec.Ports)
		}
		if !s.Spec.PublishNotReadyAddresses {
			t.Errorf("Service %s: a standby that is not ready would not be scraped", s.Name)
		}
	}

	// Two or more replicas (one streams, one waits): a PDB with maxUnavailable 1.
	var pdbs int
	for _, p := range r.PDBs {
		if selectorOf(t, p.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			pdbs++
			if p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 || p.Spec.MinAvailable != nil {
				t.Errorf("PDB %s: maxUnavailable %v minAvailable %v, want maxUnavailable 1", p.Name, p.Spec.MaxUnavailable, p.Spec.MinAvailable)
			}
		}
	}
	want := 0
	if *d.Spec.Replicas >= 2 {
		want = 1
	}
	if pdbs != want {
		t.Errorf("Deployment %s with %d replicas: %d PDBs, want %d", d.Name, *d.Spec.Replicas, pdbs, want)
	}
}

// checkFileSecret checks that a *_FILE path lies in a read-only mount of a Secret volume.
func checkFileSecret(t *testing.T, d *appsv1.Deployment, path string, mounts map[string]corev1.VolumeMount, volumes map[string]corev1.Volume) {
	t.Helper()
	for name, m := range mounts {
		if filepath.Dir(path) != m.MountPath {
			continue
		}
		v := volumes[name]
		if v.Secret == nil || v.Secret.SecretName == "" {
			t.Errorf("Deployment %s: %s is mounted from a volume that is not a Secret", d.Name, path)
			return
		}
		if !m.ReadOnly {
			t.Errorf("Deployment %s: Secret mount %s is writable", d.Name, m.MountPath)
		}
		if !slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool { return k.Path == filepath.Base(path) && k.Key != "" }) {
			t.Errorf("Deployment %s: Secret %s projects no key to %s", d.Name, v.Secret.SecretName, filepath.Base(path))
		}
		if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
			t.Errorf("Deployment %s: Secret %s file mode %v is readable by others", d.Name, v.Secret.SecretName, v.Secret.DefaultMode)
		}
		return
	}
	t.Errorf("Deployment %s: no volume mounted at %s", d.Name, filepath.Dir(path))
}

// TestLint: `helm lint --strict` passes on every values file of testdata/ (the
// ones `make -C deploy/helm lint` lints, each alone) without a "Fail:" line: in a
// lint helm only logs a template's `fail` ("[INFO] Fail: …") and passes, so a
// line of them means values that `helm install` would refuse.
func TestLint(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	for _, f := range goodValues {
		if !slices.Contains(names, f) {
			t.Fatalf("goodValues names %s, which testdata/ lacks", f)
		}
	}
	for _, f := range names {
		t.Run(f, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"lint", "--strict", chartDir, "--kube-version", kubeVersion}, valuesArgs([]string{f})...)
			out, stderr, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("helm lint: %v\n%s%s", err, out, stderr)
			}
			if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
				t.Fatalf("helm lint output:\n%s", out)
			}
			if strings.Contains(out+stderr, "Fail:") {
				t.Errorf("helm lint --strict -f %s reaches a template's fail:\n%s%s", f, out, stderr)
			}
		})
	}
}

// TestLintDefaults: `helm lint --strict` passes on the chart's own defaults, which
// name no source. A lint renders every template, NOTES.txt included, with `fail`
// made harmless, so a template that assumes a source exists must not index into
// an empty list (NOTES.txt once did: "error calling index: reflect: slice index
// out of range"); with the alerts, the ServiceMonitor and the dashboard on too.
func TestLintDefaults(t *testing.T) {
	t.Parallel()
	for name, set := range map[string][]string{
		"defaults": nil,
		"monitoring on": {"--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.serviceMonitor.enabled=true",
			"--set", "monitoring.grafanaDashboard.enabled=true"},
		// The templates of the community-chart additions with no source either.
		"network policy, pod monitor and tests on": {"--set", "networkPolicy.enabled=true", "--set", "monitoring.podMonitor.enabled=true",
			"--set", "tests.enabled=true", "--set", "probes.startup.enabled=true", "--set", "commonAnnotations.a=b"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"lint", "--strict", chartDir, "--kube-version", kubeVersion}, set...)
			out, stderr, err := runHelm(t, args...)
			if err != nil || !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
				t.Fatalf("helm lint --strict on the defaults: %v\n%s%s", err, out, stderr)
			}
			if strings.Contains(out+stderr, "[ERROR]") || strings.Contains(out+stderr, "[WARNING]") {
				t.Errorf("helm lint --strict on the defaults reports:\n%s%s", out, stderr)
			}
		})
	}
}

func TestSingleSource(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"single.yaml"})
	checkRelease(t, r)
	if len(r.Deployments) != 1 || len(r.Services) != 1 || len(r.PDBs) != 1 || len(r.ServiceAccounts) != 1 {
		t.Fatalf("got %d Deployments, %d Services, %d PDBs, %d ServiceAccounts; want 1 each",
			len(r.Deployments), len(r.Services), len(r.PDBs), len(r.ServiceAccounts))
	}
	if len(r.ServiceMonitors)+len(r.PrometheusRules) != 0 {
		t.Errorf("monitoring objects rendered though monitoring is off by default")
	}
	d := r.Deployment(t, "rel-cdcrelay")
	if *d.Spec.Replicas != 2 {
		t.Errorf("replicas %d, want 2 (one streaming, one standby)", *d.Spec.Replicas)
	}
	c := relay(t, d)
	ev := env(t, c)
	// Only set values reach the pod: every relay setting is null by default, so
	// the relay's own defaults apply (GOMEMLIMIT too is the relay's to derive).
	var names []string
	for _, e := range c.Env {
		names = append(names, e.Name)
	}
	if !slices.Equal(names, chartEnv) {
		t.Errorf("env %v, want exactly %v: a relay default rendered would pin it", names, chartEnv)
	}
	for name, want := range map[string]string{"CDCRELAY_SLOT": "cdcrelay_outbox", "CDCRELAY_PUBLICATION": "cdcrelay_outbox",
		"CDCRELAY_HTTP_ADDR": ":8080", "CDCRELAY_LOG_FORMAT": "json"} {
		if got := envValue(t, d, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	for name, secret := range map[string]string{"CDCRELAY_DATABASE_URL": "orders-db", "CDCRELAY_AMQP_URL": "rabbitmq"} {
		ref := ev[name].ValueFrom.SecretKeyRef
		if ref.Name != secret || ref.Key != "url" {
			t.Errorf("%s from secret %s key %s, want %s key url", name, ref.Name, ref.Key, secret)
		}
	}
	if g := *d.Spec.Template.Spec.TerminationGracePeriodSeconds; g != 30 {
		t.Errorf("terminationGracePeriodSeconds %d, want 15s shutdown + 15", g)
	}
	ps := d.Spec.Template.Spec.SecurityContext
	if *ps.RunAsUser != 65532 || *ps.RunAsGroup != 65532 || *ps.FSGroup != 65532 {
		t.Errorf("pod ids %d:%d fsGroup %d, want the image's 65532", *ps.RunAsUser, *ps.RunAsGroup, *ps.FSGroup)
	}
	if c.Image != "registry.example.com/cdcrelay:0.1.0" {
		t.Errorf("image %q, want single.yaml's repository with the chart's appVersion as tag", c.Image)
	}
	if d.Spec.Strategy.RollingUpdate == nil || d.Spec.Strategy.RollingUpdate.MaxSurge.IntValue() != 0 {
		t.Errorf("strategy %+v: a surge pod could only wait as a standby", d.Spec.Strategy)
	}
	pa := d.Spec.Template.Spec.Affinity
	if pa == nil || pa.PodAntiAffinity == nil || len(pa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("no preferred pod anti-affinity: %+v", pa)
	}
	term := pa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
	if term.TopologyKey != "kubernetes.io/hostname" || !selectorOf(t, term.LabelSelector).Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("anti-affinity term %+v does not spread the source's pods over nodes", term)
	}
	pdb := r.PDBs[0]
	if pdb.Spec.UnhealthyPodEvictionPolicy == nil || *pdb.Spec.UnhealthyPodEvictionPolicy != "AlwaysAllow" {
		t.Errorf("PDB unhealthyPodEvictionPolicy %v, want AlwaysAllow", pdb.Spec.UnhealthyPodEvictionPolicy)
	}
}

// TestQuotedNames: table, column and publication names follow the relay's
// identifier rules, quoted ones included, and reach it as written.
func TestQuotedNames(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"quoted.yaml"})
	d := r.Deployment(t, "rel-cdcrelay")
	for name, want := range map[string]string{
		"CDCRELAY_TABLE":              `"Billing"."Outbox Events"`,
		"CDCRELAY_PUBLICATION":        `"Billing Pub"`,
		"CDCRELAY_SLOT":               "billing_outbox",
		"CDCRELAY_ID_COLUMN":          `"EventId"`,
		"CDCRELAY_ROUTING_KEY_COLUMN": `"RoutingKey"`,
	} {
		if got := envValue(t, d, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

func TestMultiSource(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"multi.yaml"})
	checkRelease(t, r)
	if len(r.Deployments) != 4 || len(r.Services) != 4 {
		t.Fatalf("%d Deployments, %d Services, want 4 each (one per source)", len(r.Deployments), len(r.Services))
	}
	want := map[string]struct {
		slot, pub string
		replicas  int32
	}{
		"rel-cdcrelay-orders":     {"cdcrelay_orders", "cdcrelay_orders", 2},
		"rel-cdcrelay-billing-v2": {"cdcrelay_billing_v2", "cdcrelay_billing_v2", 1},
		"rel-cdcrelay-shipping":   {"shipping_outbox_slot", "shipping_outbox_pub", 2},
		"rel-cdcrelay-legacy":     {"cdcrelay_legacy", "cdcrelay_legacy", 0},
	}
	for name, w := range want {
		d := r.Deployment(t, name)
		if got := envValue(t, d, "CDCRELAY_SLOT"); got != w.slot {
			t.Errorf("%s: slot %q, want %q", name, got, w.slot)
		}
		if got := envValue(t, d, "CDCRELAY_PUBLICATION"); got != w.pub {
			t.Errorf("%s: publication %q, want %q", name, got, w.pub)
		}
		if *d.Spec.Replicas != w.replicas {
			t.Errorf("%s: replicas %d, want %d", name, *d.Spec.Replicas, w.replicas)
		}
		if d.Annotations["cdcrelay.io/slot"] != w.slot {
			t.Errorf("%s: slot annotation %q", name, d.Annotations["cdcrelay.io/slot"])
		}
		// defaults.extraEnv reaches every source; of two entries with one name
		// (billing-v2 sets it too) the source's, the later, wins.
		wantRetry := "5s"
		if name == "rel-cdcrelay-billing-v2" {
			wantRetry = "10s"
		}
		if got := envValue(t, d, "CDCRELAY_STANDBY_RETRY"); got != wantRetry {
			t.Errorf("%s: CDCRELAY_STANDBY_RETRY %q, want %q from extraEnv", name, got, wantRetry)
		}
		if _, ok := env(t, relay(t, d))["GOMEMLIMIT"]; ok {
			t.Errorf("%s: GOMEMLIMIT set: the relay derives it from the container's memory limit", name)
		}
	}
	if len(r.PDBs) != 2 {
		t.Errorf("%d PDBs, want 2 (orders and shipping have two replicas)", len(r.PDBs))
	}

	orders := r.Deployment(t, "rel-cdcrelay-orders")
	if got := envValue(t, orders, "CDCRELAY_LOG_LEVEL"); got != "debug" {
		t.Errorf("orders: log level %q, want defaults.logLevel debug", got)
	}
	if ref := env(t, relay(t, orders))["CDCRELAY_AMQP_URL"].ValueFrom.SecretKeyRef; ref.Name != "rabbitmq" || ref.Key != "amqp-url" {
		t.Errorf("orders: AMQP from %s/%s, want the defaults' rabbitmq/amqp-url", ref.Name, ref.Key)
	}

	billing := r.Deployment(t, "rel-cdcrelay-billing-v2")
	for name, want := range map[string]string{
		"CDCRELAY_EXCHANGE":           "billing",
		"CDCRELAY_ROUTING_KEY_COLUMN": "topic",
		"CDCRELAY_PAYLOAD_COLUMN":     "body", // columns merge key by key
		"CDCRELAY_SHUTDOWN_TIMEOUT":   "1m30s",
		"CDCRELAY_LOG_LEVEL":          "warn", // the source's logLevel replaces defaults.logLevel
	} {
		if got := envValue(t, billing, name); got != want {
			t.Errorf("billing-v2: %s = %q, want %q", name, got, want)
		}
	}
	// A column neither defaults nor the source sets is left to the relay.
	for _, d := range []*appsv1.Deployment{orders, billing} {
		ev := env(t, relay(t, d))
		for _, name := range []string{"CDCRELAY_ID_COLUMN", "CDCRELAY_HEADERS_COLUMN", "CDCRELAY_TABLE", "CDCRELAY_MAX_IN_FLIGHT_BYTES"} {
			if e, ok := ev[name]; ok {
				t.Errorf("%s: %s = %q rendered, though no value sets it", d.Name, name, e.Value)
			}
		}
	}
	if _, ok := env(t, relay(t, orders))["CDCRELAY_ROUTING_KEY_COLUMN"]; ok || envValue(t, orders, "CDCRELAY_PAYLOAD_COLUMN") != "body" {
		t.Errorf("orders: want CDCRELAY_PAYLOAD_COLUMN=body from defaults and no CDCRELAY_ROUTING_KEY_COLUMN")
	}
	if g := *billing.Spec.Template.Spec.TerminationGracePeriodSeconds; g != 105 {
		t.Errorf("billing-v2: terminationGracePeriodSeconds %d, want 90s shutdown + 15", g)
	}
	if ref := env(t, relay(t, billing))["CDCRELAY_DATABASE_URL"].ValueFrom.SecretKeyRef; ref.Name != "billing-db" || ref.Key != "DATABASE_URL" {
		t.Errorf("billing-v2: database URL from %s/%s", ref.Name, ref.Key)
	}
	if mem := relay(t, billing).Resources.Limits[corev1.ResourceMemory]; mem.String() != "128Mi" {
		t.Errorf("billing-v2: memory limit %s, want its own 128Mi", mem.String())
	}

	shipping := r.Deployment(t, "rel-cdcrelay-shipping")
	if ref := env(t, relay(t, shipping))["CDCRELAY_AMQP_URL"].ValueFrom.SecretKeyRef; ref.Name != "rabbitmq-shipping" || ref.Key != "url" {
		t.Errorf("shipping: AMQP from %s/%s, want its own rabbitmq-shipping/url", ref.Name, ref.Key)
	}
	if g := *shipping.Spec.Template.Spec.TerminationGracePeriodSeconds; g != 60 {
		t.Errorf("shipping: terminationGracePeriodSeconds %d, want 60", g)
	}
}

func TestFileMountedSecrets(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"files.yaml"})
	checkRelease(t, r)
	d := r.Deployment(t, "rel-cdcrelay-orders")
	ev := env(t, relay(t, d))
	for _, name := range []string{"CDCRELAY_DATABASE_URL", "CDCRELAY_AMQP_URL"} {
		if _, ok := ev[name]; ok {
			t.Errorf("%s set alongside %s_FILE", name, name)
		}
	}
	wantFiles := map[string][2]string{ // env -> Secret, key
		"CDCRELAY_DATABASE_URL_FILE": {"orders-db", "url"},
		"CDCRELAY_AMQP_URL_FILE":     {"rabbitmq", "uri"},
	}
	for name, sk := range wantFiles {
		path := envValue(t, d, name)
		var found bool
		for _, m := range relay(t, d).VolumeMounts {
			if m.MountPath != filepath.Dir(path) {
				continue
			}
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == sk[0] &&
					len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == sk[1] && v.Secret.Items[0].Path == filepath.Base(path) {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("%s=%s: no mount of Secret %s key %s there", name, path, sk[0], sk[1])
		}
	}
	if ps := d.Spec.Template.Spec.SecurityContext; ps.FSGroup == nil || *ps.FSGroup != 65532 {
		t.Errorf("fsGroup %v: the non-root user could not read the 0440 Secret files", ps.FSGroup)
	}
}

// promDuration is a Prometheus duration as PrometheusRule `for` accepts it.
var promDuration = regexp.MustCompile(`^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$`)

// balanced reports whether (), {} and [] nest properly outside "quoted" strings.
func balanced(expr string) bool {
	var stack []rune
	pairs := map[rune]rune{')': '(', '}': '{', ']': '['}
	inQuote := false
	for i, c := range expr {
		switch {
		case c == '"' && (i == 0 || expr[i-1] != '\\'):
			inQuote = !inQuote
		case inQuote:
		case c == '(' || c == '{' || c == '[':
			stack = append(stack, c)
		case pairs[c] != 0:
			if len(stack) == 0 || stack[len(stack)-1] != pairs[c] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0 && !inQuote
}

func TestMonitoring(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"monitoring.yaml"})
	checkRelease(t, r)
	if len(r.ServiceMonitors) != 1 || len(r.PrometheusRules) != 1 {
		t.Fatalf("%d ServiceMonitors, %d PrometheusRules, want 1 each", len(r.ServiceMonitors), len(r.PrometheusRules))
	}

	sm := r.ServiceMonitors[0]
	checkMeta(t, "ServiceMonitor", sm.ObjectMeta)
	if sm.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("ServiceMonitor labels %v lack monitoring.serviceMonitor.labels", sm.Labels)
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("ServiceMonitor namespaces %v", sm.Spec.NamespaceSelector.MatchNames)
	}
	sel := selectorOf(t, &sm.Spec.Selector)
	for _, s := range r.Services {
		if !sel.Matches(labels.Set(s.Labels)) {
			t.Errorf("ServiceMonitor selector %s misses Service %s (%v)", sel, s.Name, s.Labels)
		}
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v, want port http path /metrics", sm.Spec.Endpoints)
	}

	pr := r.PrometheusRules[0]
	checkMeta(t, "PrometheusRule", pr.ObjectMeta)
	if pr.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule labels %v lack monitoring.prometheusRule.labels", pr.Labels)
	}
	byAlert := map[string][]Rule{}
	for _, g := range pr.Spec.Groups {
		for _, rule := range g.Rules {
			byAlert[rule.Alert] = append(byAlert[rule.Alert], rule)
			if rule.Alert == "" || rule.Expr == "" || rule.Labels["severity"] == "" || rule.Annotations["summary"] == "" {
				t.Errorf("incomplete rule %+v", rule)
			}
			if !balanced(rule.Expr) {
				t.Errorf("%s: unbalanced expression %q", rule.Alert, rule.Expr)
			}
			if rule.For == "" || !promDuration.MatchString(rule.For) {
				t.Errorf("%s: for %q is not a Prometheus duration", rule.Alert, rule.For)
			}
			if rule.Labels["team"] != "platform" {
				t.Errorf("%s: alertLabels not applied: %v", rule.Alert, rule.Labels)
			}
			// Scoped to this release's Services, and every Service named exists.
			if !strings.Contains(rule.Expr, `namespace="`+namespace+`"`) {
				t.Errorf("%s: not scoped to namespace %s: %s", rule.Alert, namespace, rule.Expr)
			}
		}
	}
	wantExpr := map[string][]string{
		"CdcrelaySlotRetainedWalHigh":     {"cdcrelay_slot_retained_wal_bytes{", "> 1073741824", "by (namespace, service, source, slot)"},
		"CdcrelayOldestUnpublishedTooOld": {"cdcrelay_oldest_unpublished_age_seconds{", "> 300"},
		"CdcrelayUnroutableStall":         {"max by (namespace, service, source, slot, id, exchange, routing_key, cause) (cdcrelay_stalled_event_info{", "}) > 0"},
		"CdcrelayDeadLetterFailed":        {"sum by (namespace, service, source, slot, outcome) (increase(cdcrelay_dead_letter_failures_total{", "[15m])) > 0"},
		"CdcrelayForeignInsertsSkipped":   {"sum by (namespace, service, source, slot) (increase(cdcrelay_foreign_inserts_skipped_total{", "[15m])) > 0"},
		// The aggregated alerts keep the source's and the slot's labels.
		"CdcrelayMessagesNacked": {"sum by (namespace, service, source, slot) (increase(cdcrelay_nacks_total{", "[5m])) > 0"},
		"CdcrelayRestartStorm":   {"sum by (namespace, service, source, slot) (increase(cdcrelay_pipeline_restarts_total{", "unless on (namespace, service, source, slot) max_over_time(cdcrelay_stalled_event_info{"},
		"CdcrelayBrokerBlocked":  {"max by (namespace, service, source, slot) (cdcrelay_broker_blocked{"},
		"CdcrelayMarkingFailing": {"max by (namespace, service, source, slot) (cdcrelay_marks_failing_seconds{"},
		"CdcrelayRetentionFailing": {"sum by (namespace, service, source, slot) (increase(cdcrelay_retention_errors_total{",
			"max by (namespace, service, source, slot) (cdcrelay_retention_last_success_timestamp_seconds{", "> 10800", `role="streaming"`},
	}
	for alert, parts := range wantExpr {
		rules := byAlert[alert]
		if len(rules) != 1 {
			t.Errorf("%s: %d rules, want 1", alert, len(rules))
			continue
		}
		for _, p := range parts {
			if !strings.Contains(rules[0].Expr, p) {
				t.Errorf("%s: expression %q lacks %q", alert, rules[0].Expr, p)
			}
		}
	}
	// No streaming relay: exactly one `absent` rule per source, selecting that
	// source's Service and slot, with static labels, so that an outage is one alert.
	absent := map[string]int{}
	for _, rule := range byAlert["CdcrelayNoStreamingRelay"] {
		if !strings.HasPrefix(rule.Expr, "absent(cdcrelay_role{") || !strings.Contains(rule.Expr, `role="streaming"`) {
			t.Errorf("unexpected CdcrelayNoStreamingRelay rule %q", rule.Expr)
			continue
		}
		absent[rule.Labels["slot"]]++
		for _, m := range []string{fmt.Sprintf(`service=%q`, rule.Labels["service"]), fmt.Sprintf(`slot=%q`, rule.Labels["slot"])} {
			if !strings.Contains(rule.Expr, m) {
				t.Errorf("absent rule for slot %s does not select %s: %s", rule.Labels["slot"], m, rule.Expr)
			}
		}
		if rule.Labels["namespace"] != namespace || rule.Labels["source"] == "" {
			t.Errorf("absent rule for slot %s lacks its static labels: %v", rule.Labels["slot"], rule.Labels)
		}
		if !slices.ContainsFunc(r.Services, func(s *corev1.Service) bool { return s.Name == rule.Labels["service"] }) {
			t.Errorf("absent rule for slot %s selects service %q, which is not rendered", rule.Labels["slot"], rule.Labels["service"])
		}
	}
	if absent["cdcrelay_orders"] != 1 || absent["cdcrelay_billing"] != 1 || len(absent) != 2 {
		t.Errorf("CdcrelayNoStreamingRelay: absent rules per slot %v, want one for each of the two slots", absent)
	}
	svcNames := regexp.MustCompile(`service=~"([^"]*)"`)
	for _, g := range pr.Spec.Groups {
		for _, rule := range g.Rules {
			for _, m := range svcNames.FindAllStringSubmatch(rule.Expr, -1) {
				for _, name := range strings.Split(m[1], "|") {
					if !slices.ContainsFunc(r.Services, func(s *corev1.Service) bool { return s.Name == name }) {
						t.Errorf("%s selects service %q, which is not rendered", rule.Alert, name)
					}
				}
			}
		}
	}
}

func TestMonitoringRulesCanBeTurnedOff(t *testing.T) {
	t.Parallel()
	r := render(t, []string{"monitoring.yaml"},
		"--set", "monitoring.prometheusRule.unroutableStall.enabled=false",
		"--set", "monitoring.prometheusRule.slotRetainedWal.threshold=5368709120",
		"--set", "monitoring.serviceMonitor.enabled=false")
	if len(r.ServiceMonitors) != 0 || len(r.PrometheusRules) != 1 {
		t.Fatalf("%d ServiceMonitors, %d PrometheusRules, want 0 and 1", len(r.ServiceMonitors), len(r.PrometheusRules))
	}
	var alerts []string
	for _, rule := range r.PrometheusRules[0].Spec.Groups[0].Rules {
		alerts = append(alerts, rule.Alert)
		if rule.Alert == "CdcrelaySlotRetainedWalHigh" && !strings.HasSuffix(rule.Expr, "> 5368709120") {
			t.Errorf("threshold not applied (or printed as a float): %s", rule.Expr)
		}
	}
	if slices.Contains(alerts, "CdcrelayUnroutableStall") || !slices.Contains(alerts, "CdcrelayMessagesNacked") || !slices.Contains(alerts, "CdcrelayDeadLetterFailed") {
		t.Errorf("alerts %v: unroutableStall should be off, nacks and deadLetterFailed on", alerts)
	}
}

func TestImageAndSecurityOverrides(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("ab", 32)
	r := render(t, []string{"single.yaml"},
		"--set", "image.digest="+digest,
		"--set", "podSecurityContext.runAsUser=null",
		"--set", "podSecurityContext.fsGroup=null")
	checkReleaseNoUser(t, r)
	d := r.Deployment(t, "rel-cdcrelay")
	if img := relay(t, d).Image; img != "registry.example.com/cdcrelay@"+digest {
		t.Errorf("image %q, want the digest", img)
	}
	ps := d.Spec.Template.Spec.SecurityContext
	if ps.RunAsUser != nil || ps.FSGroup != nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot {
		t.Errorf("pod securityContext %+v: want ids left to the platform, runAsNonRoot kept", ps)
	}
}

// checkReleaseNoUser is checkRelease's container checks for a pod without a fixed uid.
func checkReleaseNoUser(t *testing.T, r *Rendered) {
	t.Helper()
	for _, d := range r.Deployments {
		sc := relay(t, d).SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("Deployment %s: container securityContext %+v lost its hardening", d.Name, sc)
		}
	}
}

func TestKubeVersionFloor(t *testing.T) {
	t.Parallel()
	args := []string{"template", releaseName, chartDir, "--kube-version", "v1.26.0", "-f", filepath.Join("testdata", "single.yaml")}
	_, stderr, err := runHelm(t, args...)
	if err == nil || !strings.Contains(stderr, "kubeVersion") {
		t.Fatalf("rendering for Kubernetes 1.26 (no unhealthyPodEvictionPolicy) succeeded or failed for another reason: %v\n%s", err, stderr)
	}
}

// renderNotes renders NOTES.txt (which `helm template` does not print) through a
// copy of the chart with one more template that includes it.
func renderNotes(t *testing.T, files []string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "cdcrelay")
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	capture := `apiVersion: v1
kind: ConfigMap
metadata:
  name: notes
  namespace: {{ .Release.Namespace }}
  labels: {app.kubernetes.io/instance: {{ .Release.Name }}}
data:
  notes: {{ include "cdcrelay/templates/NOTES.txt" . | toJson }}
`
	if err := os.WriteFile(filepath.Join(dir, "templates", "zz-notes.yaml"), []byte(capture), 0o644); err != nil {
		t.Fatal(err)
	}
	r := renderChart(t, dir, files)
	if len(r.ConfigMaps) != 1 {
		t.Fatalf("%d ConfigMaps, want the notes", len(r.ConfigMaps))
	}
	return r.ConfigMaps[0].Data["notes"]
}

// TestNotesQuotedAndOwnImage: migrate's line carries a quoted table and
// publication for the shell; an image of one's own with a quoted hex-like tag
// is used as written, and the notes carry no warning.
func TestNotesQuotedAndOwnImage(t *testing.T) {
	t.Parallel()
	notes := renderNotes(t, []string{"quoted.yaml"})
	want := `CDCRELAY_TABLE='"Billing"."Outbox Events"' CDCRELAY_PUBLICATION='"Billing Pub"' cdcrelay migrate`
	if !strings.Contains(notes, want) {
		t.Errorf("notes lack %q:\n%s", want, notes)
	}
	if strings.Contains(notes, "WARNING") {
		t.Errorf("notes warn about an image that is set:\n%s", notes)
	}
	if img := relay(t, render(t, []string{"quoted.yaml"}).Deployments[0]).Image; img != "registry.example.com/cdcrelay:0e23086" {
		t.Errorf("image %q, want quoted.yaml's registry.example.com/cdcrelay:0e23086", img)
	}
	// The table's schema is not public: the role needs USAGE on it, as a GRANT.
	if want := `GRANT USAGE ON SCHEMA "Billing" TO cdcrelay;`; !strings.Contains(notes, want) {
		t.Errorf("notes lack %q:\n%s", want, notes)
	}
	if plain := renderNotes(t, []string{"multi.yaml"}); strings.Contains(plain, "USAGE ON SCHEMA") {
		t.Errorf("notes grant USAGE on a schema for tables in public:\n%s", plain)
	}
}

// TestNotesDeadLetter: a dead-letter exchange is printed with the queue and the
// binding that make every parked row's copy routable (without them the broker
// returns the first copy), once however many sources use it; one that is also a
// source's main exchange is declared once, as a topic, with a warning instead.
func TestNotesDeadLetter(t *testing.T) {
	t.Parallel()
	notes := renderNotes(t, []string{"dead-letter.yaml"})
	dlx := "rabbitmqadmin declare exchange name=events.dead type=fanout durable=true && rabbitmqadmin declare queue name=events.dead durable=true && " +
		"rabbitmqadmin declare binding source=events.dead destination=events.dead"
	if strings.Count(notes, dlx) != 1 {
		t.Errorf("notes: want the dead-letter exchange, its queue and binding once (%q):\n%s", dlx, notes)
	}
	for x, n := range map[string]int{"events": 1, "billing": 1, "events.dead": 1} {
		if got := strings.Count(notes, "rabbitmqadmin declare exchange name="+x+" "); got != n {
			t.Errorf("notes declare exchange %s %d times, want %d:\n%s", x, got, n, notes)
		}
	}
	for _, want := range []string{"# events is also a dead-letter exchange: it must route every routing key",
		"A dead-letter exchange needs its queue", "CdcrelayDeadLetterFailed", "CdcrelayUnroutableStall"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	// Without a dead-letter exchange, nothing about one.
	if plain := renderNotes(t, []string{"multi.yaml"}); strings.Contains(plain, "dead-letter") || strings.Contains(plain, "fanout") &&
		!strings.Contains(plain, "events.unroutable type=fanout") {
		t.Errorf("notes speak of a dead-letter exchange none configured:\n%s", plain)
	}
}

func TestNotes(t *testing.T) {
	t.Parallel()
	notes := renderNotes(t, []string{"multi.yaml"})
	for _, pub := range []string{"cdcrelay_orders", "cdcrelay_billing_v2", "shipping_outbox_pub", "cdcrelay_legacy"} {
		want := "CREATE PUBLICATION " + pub + " FOR TABLE public.event_outbox WITH (publish = 'insert');"
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	for _, want := range []string{"owner of the outbox table", "cdcrelay migrate", "4 relay Deployment(s)",
		"GRANT UPDATE (published_at, attempts, last_error) ON public.event_outbox TO cdcrelay;", "publish_via_partition_root = true",
		"GRANT CONNECT ON DATABASE postgres TO cdcrelay;", "GRANT SELECT, DELETE ON public.event_outbox TO cdcrelay;", "ALTER ROLE cdcrelay REPLICATION;",
		// The exchanges, before install, and what an unbound routing key does.
		"rabbitmqadmin declare exchange name=events type=topic durable=true",
		"rabbitmqadmin declare exchange name=billing type=topic durable=true",
		"stream STOPS", `rabbitmqctl set_policy events-ae '^events$' '{"alternate-exchange":"events.unroutable"}' --apply-to exchanges`,
		// check and logs with the real names; a paused source has no pod to exec in.
		"kubectl -n svc exec deploy/rel-cdcrelay-orders -- /cdcrelay check",
		"kubectl -n svc exec deploy/rel-cdcrelay-shipping -- /cdcrelay check",
		"kubectl -n svc exec deploy/rel-cdcrelay-orders -- /cdcrelay tail '#'",
		"rel-cdcrelay-legacy is paused",
		"kubectl -n svc logs -l app.kubernetes.io/component=relay,app.kubernetes.io/instance=rel,app.kubernetes.io/name=cdcrelay,cdcrelay.io/source=billing-v2 --prefix -f"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	// migrate, one line per source with its table and publication; the image warning.
	for _, pub := range []string{"cdcrelay_orders", "cdcrelay_billing_v2", "shipping_outbox_pub", "cdcrelay_legacy"} {
		want := "CDCRELAY_DATABASE_URL='postgres://OWNER@HOST/DB' CDCRELAY_TABLE='public.event_outbox' CDCRELAY_PUBLICATION='" + pub + "' cdcrelay migrate"
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	if strings.Contains(notes, "<table>") || strings.Contains(notes, "<publication>") || strings.Contains(notes, "<role>") {
		t.Errorf("notes keep a placeholder the chart knows:\n%s", notes)
	}
	// The placeholder image fails the render (TestPlaceholderImageRefused): no warning.
	if strings.Contains(notes, "WARNING") {
		t.Errorf("notes carry a warning:\n%s", notes)
	}
	if strings.Contains(notes, "exec deploy/rel-cdcrelay-legacy") || strings.Count(notes, "rabbitmqadmin declare exchange name=events type=topic") != 1 {
		t.Errorf("notes: a check for the paused source, or an exchange listed twice:\n%s", notes)
	}
}

func TestRejectsBadValues(t *testing.T) {
	t.Parallel()
	cases := []struct {
		file string
		want string // in helm's error output
		// schema: the values schema rejects it, so `helm lint` fails too; the others
		// are caught by the templates' own checks when rendering.
		schema bool
	}{
		{"wrong-type.yaml", "at '/sources/0/replicas': got string, want integer", true},
		{"unknown-key.yaml", "additional properties 'slots' not allowed", true},
		{"unknown-top-key.yaml", "additional properties 'replicaCount' not allowed", true},
		{"bad-slot.yaml", "at '/sources/0/slot': 'Orders-Slot' does not match pattern", true},
		{"bad-publication.yaml", "at '/source/publication': '1pub' does not match pattern", true},
		{"long-slot.yaml", "at '/sources/0/slot': 'cdcrelay_orders_0123456789_0123456789_0123456789_012345' does not match pattern", true},
		{"marker-slot.yaml", "at '/sources/0/slot'", true},
		{"adopting-derived-slot.yaml", "must match ^[a-z0-9_]{1,54}$ and not end in _adopting", false},
		{"missing-database.yaml", "missing property 'database'", true},
		{"missing-name.yaml", "missing property 'name'", true},
		{"bad-source-name.yaml", "at '/sources/0/name'", true},
		{"bad-duration.yaml", "at '/defaults/confirmTimeout'", true},
		{"bad-log-format.yaml", "at '/defaults/logFormat'", true},
		{"root-user.yaml", "at '/podSecurityContext/runAsUser'", true},
		{"bad-extra-env.yaml", "additional properties 'val' not allowed", true},
		{"duplicate-slot.yaml", `slot "outbox" is used by another source`, false},
		{"duplicate-name.yaml", `name "orders" is used by another source`, false},
		{"no-amqp.yaml", "no AMQP Secret", false},
		{"both-forms.yaml", "not both", false},
		{"grace-too-short.yaml", "must be above shutdownTimeout (60s)", false},
		{"no-source.yaml", "no source configured", false},
		{"placeholder-image.yaml", "cdcrelay: the image ghcr.io/cdcrelay/cdcrelay is the chart's placeholder, and nothing publishes it", false},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			t.Parallel()
			expectRejected(t, c.file, c.want, c.schema)
		})
	}
}

// expectRejected renders testdata/bad/file and expects helm to fail with want in
// its error output; with schema, `helm lint` must fail the same way (the values
// schema catches it, not only the templates).
func expectRejected(t *testing.T, file, want string, schema bool) {
	t.Helper()
	files := []string{filepath.Join("bad", file)}
	out, stderr, err := runHelm(t, templateArgs(chartDir, files)...)
	if err == nil || !exitError(err) {
		t.Fatalf("helm template accepted %s (err %v):\n%s", file, err, out)
	}
	if !strings.Contains(stderr, want) {
		t.Errorf("helm template rejected %s, but not with %q:\n%s", file, want, stderr)
	}
	if !schema {
		return
	}
	args := append([]string{"lint", chartDir, "--kube-version", kubeVersion}, valuesArgs(files)...)
	lout, lerr, err := runHelm(t, args...)
	if err == nil {
		t.Errorf("helm lint accepted %s:\n%s", file, lout)
	}
	if !strings.Contains(lout+lerr, want) {
		t.Errorf("helm lint rejected %s, but not with %q:\n%s%s", file, want, lout, lerr)
	}
}

// TestGraceReadsGoDurations: the default terminationGracePeriodSeconds is
// shutdownTimeout rounded up plus 15s for every form the schema lets through,
// decimals and small units included.
func TestGraceReadsGoDurations(t *testing.T) {
	t.Parallel()
	for timeout, want := range map[string]int64{
		"1.5m": 105, "2500ms": 18, "0.5s": 16, "1h0.5s": 3616, "90000000000ns": 105, "1500000us": 17, "250µs": 16, "1m30s": 105, "0.1s0.2s": 16,
	} {
		r := render(t, []string{"single.yaml"}, "--set", "defaults.shutdownTimeout="+timeout)
		d := r.Deployment(t, "rel-cdcrelay")
		if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != want {
			t.Errorf("shutdownTimeout %s: terminationGracePeriodSeconds %v, want %d", timeout, g, want)
		}
	}
}
