package k8stest

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The two releases: the chart tests' multi-source values (with the helm
// test Pods and the Grafana dashboard ConfigMap on), and their monitoring
// values (ServiceMonitor and PrometheusRule). Two releases rather than one
// because both files set sources, and helm replaces a list from an earlier
// file with a later one's.
var (
	multiFlags = []string{"-f", testdata + "/multi.yaml", "--set", "tests.enabled=true", "--set", "monitoring.grafanaDashboard.enabled=true"}
	monFlags   = []string{"-f", testdata + "/monitoring.yaml"}
)

func prefixed(p string, names ...string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p + n
	}
	return out
}

var (
	multiSources = prefixed("multi-cdcrelay-", "billing-v2", "legacy", "orders", "shipping")
	multiWant    = map[string][]string{
		"Deployment":          multiSources,
		"Service":             multiSources,
		"PodDisruptionBudget": prefixed("multi-cdcrelay-", "orders", "shipping"), // two replicas or more
		"ServiceAccount":      {"multi-cdcrelay"},
		"ConfigMap":           {"multi-cdcrelay-dashboard"},
		"Secret":              {"sh.helm.release.v1.multi.v1"},
	}
	monWant = map[string][]string{
		"Deployment":          prefixed("mon-cdcrelay-", "billing", "orders"),
		"Service":             prefixed("mon-cdcrelay-", "billing", "orders"),
		"PodDisruptionBudget": prefixed("mon-cdcrelay-", "billing", "orders"),
		"ServiceAccount":      {"mon-cdcrelay"},
		"ServiceMonitor":      {"mon-cdcrelay"},
		"PrometheusRule":      {"mon-cdcrelay"},
		"Secret":              {"sh.helm.release.v1.mon.v1"},
	}
)

// TestIntegrationChartOnAPIServer installs, upgrades and uninstalls the
// chart on a real kube-apiserver in a namespace that enforces PodSecurity's
// restricted profile. No Pod runs here (no scheduler, no kubelet), so helm
// test, which waits for its Pods to finish, is not run; its Pods are
// created instead, to be admitted.
func TestIntegrationChartOnAPIServer(t *testing.T) {
	start := time.Now()
	c := startCluster(t)
	t.Logf("etcd and kube-apiserver ready in %.1f s", time.Since(start).Seconds())
	installCRDs(t, c)
	createNamespace(t, c, ns)
	createNamespace(t, c, dryNS)

	t.Run("strict dry run of every rendered object", func(t *testing.T) {
		dryRunStrict(t, c, template(t, c, "multi", multiFlags...))
		dryRunStrict(t, c, template(t, c, "mon", monFlags...))
		dryRunStrict(t, c, template(t, c, "mon", append(monFlags, "--set", "monitoring.serviceMonitor.enabled=false", "--set", "monitoring.podMonitor.enabled=true")...))
	})
	t.Run("strict field validation refuses an unknown field", func(t *testing.T) {
		refusesUnknownField(t, c, template(t, c, "multi", multiFlags...))
	})
	if t.Failed() {
		t.FailNow()
	}

	helmOK(t, c, "install", "multi", chart, "-n", ns, "--timeout", "2m", multiFlags[0], multiFlags[1], multiFlags[2], multiFlags[3], multiFlags[4], multiFlags[5])
	helmOK(t, c, append([]string{"install", "mon", chart, "-n", ns, "--timeout", "2m"}, monFlags...)...)
	wantObjects(t, c, true, multiWant)
	wantObjects(t, c, true, monWant)
	// Nothing beyond what is expected: the Deployments by release label.
	if got := names(t, c, "Deployment", "multi"); !reflect.DeepEqual(got, multiSources) {
		t.Errorf("multi's Deployments: %v, want %v", got, multiSources)
	}

	t.Run("PodSecurity restricted admits the relays' Pods", func(t *testing.T) {
		admitDeploymentPods(t, c, "multi")
		admitDeploymentPods(t, c, "mon")
		admitHookPods(t, c, "multi")
	})
	t.Run("PodSecurity restricted rejects a privileged Pod", func(t *testing.T) {
		rejectPrivileged(t, c)
	})

	t.Run("a chart change that breaks restricted is caught", func(t *testing.T) {
		breaksRestricted(t, c)
	})

	t.Run("upgrade", func(t *testing.T) {
		helmOK(t, c, append(append([]string{"upgrade", "multi", chart, "-n", ns, "--timeout", "2m"}, multiFlags...), "--set", "defaults.replicas=3")...)
		// orders and shipping take the default; billing-v2 and legacy set their own.
		for name, want := range map[string]float64{"orders": 3, "shipping": 3, "billing-v2": 1, "legacy": 0} {
			d := c.get(t, objPath(t, "Deployment", "multi-cdcrelay-"+name))
			if got := d["spec"].(map[string]any)["replicas"]; got != want {
				t.Errorf("after upgrade, Deployment multi-cdcrelay-%s has replicas %v, want %v", name, got, want)
			}
		}
		if !c.exists(t, objPath(t, "Secret", "sh.helm.release.v1.multi.v2")) {
			t.Error("after upgrade, no release Secret for revision 2")
		}
		// The monitoring release from ServiceMonitor to PodMonitor: helm
		// deletes the one and creates the other.
		helmOK(t, c, append(append([]string{"upgrade", "mon", chart, "-n", ns, "--timeout", "2m"}, monFlags...),
			"--set", "monitoring.serviceMonitor.enabled=false", "--set", "monitoring.podMonitor.enabled=true")...)
		wantObjects(t, c, false, map[string][]string{"ServiceMonitor": {"mon-cdcrelay"}})
		wantObjects(t, c, true, map[string][]string{"PodMonitor": {"mon-cdcrelay"}, "PrometheusRule": {"mon-cdcrelay"}})
	})

	t.Run("uninstall", func(t *testing.T) {
		helmOK(t, c, "uninstall", "multi", "-n", ns, "--timeout", "2m")
		helmOK(t, c, "uninstall", "mon", "-n", ns, "--timeout", "2m")
		wantObjects(t, c, false, multiWant)
		wantObjects(t, c, false, monWant)
		wantObjects(t, c, false, map[string][]string{"PodMonitor": {"mon-cdcrelay"}, "Secret": {"sh.helm.release.v1.multi.v2", "sh.helm.release.v1.mon.v2"}})
	})
	t.Logf("whole test %.1f s", time.Since(start).Seconds())
}

// createPod creates a Pod for real (the admission chain runs only on
// create; on a Deployment PodSecurity merely warns), requires it admitted
// without warnings, then deletes it (unscheduled, it goes at once).
func createPod(t *testing.T, c *cluster, what string, pod map[string]any) {
	t.Helper()
	js, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	code, body, warnings := c.do(http.MethodPost, collection(t, "Pod"), js, "")
	if code != http.StatusCreated {
		t.Errorf("%s: Pod not admitted: %d %s", what, code, body)
		return
	}
	for _, w := range warnings {
		t.Errorf("%s: the server warns: %s", what, w)
	}
	name := pod["metadata"].(map[string]any)["name"].(string)
	if code, body, _ := c.do(http.MethodDelete, objPath(t, "Pod", name)+"?gracePeriodSeconds=0", nil, ""); code != http.StatusOK {
		t.Errorf("delete Pod %s: %d %s", name, code, body)
	}
	t.Logf("%s: admitted", what)
}

// admitDeploymentPods makes a Pod of each of the release's Deployments'
// templates, as the server stored them (defaults filled in).
func admitDeploymentPods(t *testing.T, c *cluster, release string) {
	t.Helper()
	list := c.get(t, collection(t, "Deployment")+"?labelSelector=app.kubernetes.io/instance%3D"+release)
	items := list["items"].([]any)
	if len(items) == 0 {
		t.Fatalf("release %s has no Deployments", release)
	}
	for _, it := range items {
		d := it.(map[string]any)
		name := d["metadata"].(map[string]any)["name"].(string)
		tmpl := d["spec"].(map[string]any)["template"].(map[string]any)
		meta := tmpl["metadata"].(map[string]any)
		createPod(t, c, "Deployment "+name+"'s pod template", map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": name + "-admission", "labels": meta["labels"], "annotations": meta["annotations"]},
			"spec":     tmpl["spec"],
		})
	}
}

// admitHookPods creates the helm test Pods the release rendered (helm
// creates hooks only when `helm test` runs).
func admitHookPods(t *testing.T, c *cluster, release string) {
	t.Helper()
	hooks := helmOK(t, c, "get", "hooks", release, "-n", ns)
	n := 0
	for _, o := range objects(t, hooks) {
		if o.kind != "Pod" {
			continue
		}
		var pod map[string]any
		if err := json.Unmarshal(o.raw, &pod); err != nil {
			t.Fatal(err)
		}
		createPod(t, c, "helm test Pod "+o.name, pod)
		n++
	}
	if n == 0 {
		t.Errorf("release %s renders no helm test Pod (tests.enabled=true)", release)
	}
}

// rejectPrivileged shows the admission check above is real: the namespace
// does refuse a Pod that breaks the restricted profile.
func rejectPrivileged(t *testing.T, c *cluster) {
	t.Helper()
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"privileged"},"spec":{"serviceAccountName":"multi-cdcrelay",
		"containers":[{"name":"c","image":"cdcrelay:privileged-test","securityContext":{"privileged":true}}]}}`
	code, body, _ := c.do(http.MethodPost, collection(t, "Pod"), []byte(pod), "")
	if code != http.StatusForbidden || !strings.Contains(string(body), `violates PodSecurity \"restricted:latest\"`) {
		t.Fatalf("a privileged Pod: %d %s; want 403, violates PodSecurity restricted", code, body)
	}
	t.Logf("privileged Pod rejected: %s", body)
}

// breaksRestricted shows the two checks above catch the chart's own output
// going wrong: with a hostPath volume (which restricted forbids) the server
// warns at helm install (the Deployment is stored; PodSecurity only warns on
// it), and refuses a Pod made from the template.
func breaksRestricted(t *testing.T, c *cluster) {
	t.Helper()
	out, err := c.helm(t, "install", "bad", chart, "-n", ns, "-f", testdata+"/single.yaml",
		"--set-json", `extraVolumes=[{"name":"host","hostPath":{"path":"/tmp"}}]`)
	if err != nil {
		t.Fatalf("helm install bad: %v\n%s", err, out)
	}
	defer func() {
		if out, err := c.helm(t, "uninstall", "bad", "-n", ns); err != nil {
			t.Errorf("helm uninstall bad: %v\n%s", err, out)
		}
	}()
	warned := false
	for _, line := range strings.Split(out, "\n") {
		if serverWarning.MatchString(line) && strings.Contains(line, "would violate PodSecurity") {
			warned = true
			t.Logf("server warning seen, as expected: %s", line)
		}
	}
	if !warned {
		t.Errorf("helm install with a hostPath volume: no PodSecurity warning recognised in its output:\n%s", out)
	}
	d := c.get(t, objPath(t, "Deployment", "bad-cdcrelay"))
	tmpl := d["spec"].(map[string]any)["template"].(map[string]any)
	js, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "bad-admission"}, "spec": tmpl["spec"]})
	if err != nil {
		t.Fatal(err)
	}
	code, body, _ := c.do(http.MethodPost, collection(t, "Pod"), js, "")
	if code != http.StatusForbidden || !strings.Contains(string(body), `restricted volume type \"hostPath\"`) {
		t.Errorf("a Pod with a hostPath volume: %d %s; want 403 naming the hostPath volume", code, body)
	}
}

// refusesUnknownField shows the dry runs are strict: the first rendered
// Deployment with a misspelt field is refused, naming it.
func refusesUnknownField(t *testing.T, c *cluster, rendered string) {
	t.Helper()
	for _, o := range objects(t, rendered) {
		if o.kind != "Deployment" {
			continue
		}
		var d map[string]any
		if err := json.Unmarshal(o.raw, &d); err != nil {
			t.Fatal(err)
		}
		d["spec"].(map[string]any)["replicaz"] = 2
		js, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		code, body, _ := c.do(http.MethodPost, collectionIn(t, dryNS, "Deployment")+"?dryRun=All&fieldValidation=Strict", js, "")
		if code != http.StatusBadRequest || !strings.Contains(string(body), `unknown field \"spec.replicaz\"`) {
			t.Fatalf("Deployment %s with spec.replicaz: %d %s; want 400 naming the field", o.name, code, body)
		}
		t.Logf("refused, as expected: %s", body)
		return
	}
	t.Fatal("no Deployment rendered")
}
