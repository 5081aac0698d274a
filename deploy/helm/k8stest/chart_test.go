package k8stest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

const (
	ns = "relays"
	// The dry runs render into a namespace of their own, where the
	// ServiceAccounts the Pods name can exist before helm install creates
	// them in ns (the ServiceAccount admission plugin refuses a Pod whose
	// account does not exist, before PodSecurity looks at it).
	dryNS = "relays-dry-run"
	chart = "../cdcrelay"
	// The values files the chart tests use (read there, not copied).
	testdata = "../charttest/testdata"
)

// collections maps each kind the chart renders to its REST collection.
var collections = map[string]string{
	"Deployment":          "/apis/apps/v1/namespaces/%s/deployments",
	"Service":             "/api/v1/namespaces/%s/services",
	"ServiceAccount":      "/api/v1/namespaces/%s/serviceaccounts",
	"ConfigMap":           "/api/v1/namespaces/%s/configmaps",
	"Secret":              "/api/v1/namespaces/%s/secrets",
	"Pod":                 "/api/v1/namespaces/%s/pods",
	"PodDisruptionBudget": "/apis/policy/v1/namespaces/%s/poddisruptionbudgets",
	"NetworkPolicy":       "/apis/networking.k8s.io/v1/namespaces/%s/networkpolicies",
	"ServiceMonitor":      "/apis/monitoring.coreos.com/v1/namespaces/%s/servicemonitors",
	"PodMonitor":          "/apis/monitoring.coreos.com/v1/namespaces/%s/podmonitors",
	"PrometheusRule":      "/apis/monitoring.coreos.com/v1/namespaces/%s/prometheusrules",
}

func collection(t *testing.T, kind string) string {
	t.Helper()
	return collectionIn(t, ns, kind)
}

func collectionIn(t *testing.T, namespace, kind string) string {
	t.Helper()
	c, ok := collections[kind]
	if !ok {
		t.Fatalf("kind %s: no REST path known to the test; add it to collections", kind)
	}
	return fmt.Sprintf(c, namespace)
}

func objPath(t *testing.T, kind, name string) string {
	return collection(t, kind) + "/" + name
}

// object is one manifest as JSON with the fields the test reads.
type object struct {
	raw  []byte
	kind string
	name string
}

// objects splits a multi-document YAML stream into objects.
func objects(t *testing.T, stream string) []object {
	t.Helper()
	var out []object
	for _, doc := range strings.Split("\n"+stream, "\n---") {
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("manifest: %v\n%s", err, doc)
		}
		var m struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if string(js) == "null" || json.Unmarshal(js, &m) != nil || m.Kind == "" {
			continue
		}
		out = append(out, object{raw: js, kind: m.Kind, name: m.Metadata.Name})
	}
	return out
}

// installCRDs creates the prometheus-operator CRDs the chart's monitoring
// objects need, and waits until discovery serves them (helm maps kinds to
// resources through discovery, and a CRD is not served at once).
func installCRDs(t *testing.T, c *cluster) {
	t.Helper()
	dir := binary(t, "KUBE_CRDS", filepath.Join(cache, "crds"))
	for _, r := range []string{"servicemonitors", "podmonitors", "prometheusrules"} {
		b, err := os.ReadFile(filepath.Join(dir, "monitoring.coreos.com_"+r+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		js, err := yaml.YAMLToJSON(b)
		if err != nil {
			t.Fatal(err)
		}
		if code, body, _ := c.do(http.MethodPost, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", js, ""); code != http.StatusCreated {
			t.Fatalf("create CRD %s: %d %s", r, code, body)
		}
	}
	waitFor(t, "the monitoring.coreos.com/v1 CRDs", filepath.Join(c.dir, "kube-apiserver.log"), func() bool {
		code, body, _ := c.do(http.MethodGet, "/apis/monitoring.coreos.com/v1", nil, "")
		return code == http.StatusOK && strings.Contains(string(body), `"servicemonitors"`) &&
			strings.Contains(string(body), `"podmonitors"`) && strings.Contains(string(body), `"prometheusrules"`)
	})
}

// createNamespace creates a namespace with PodSecurity's restricted profile enforced.
func createNamespace(t *testing.T, c *cluster, ns string) {
	t.Helper()
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"Namespace","metadata":{"name":%q,"labels":{
		"pod-security.kubernetes.io/enforce":"restricted","pod-security.kubernetes.io/enforce-version":"latest",
		"pod-security.kubernetes.io/warn":"restricted","pod-security.kubernetes.io/audit":"restricted"}}}`, ns)
	if code, b, _ := c.do(http.MethodPost, "/api/v1/namespaces", []byte(body), ""); code != http.StatusCreated {
		t.Fatalf("create namespace: %d %s", code, b)
	}
}

// dryRunStrict sends every rendered object (hooks, such as the helm test
// Pods, included) to the server as a dry-run create with strict field
// validation: an unknown or duplicate field, a value the server's
// validation or a CRD schema rejects, or a PodSecurity violation fails, and
// so does any warning.
func dryRunStrict(t *testing.T, c *cluster, rendered string) {
	t.Helper()
	objs := objects(t, rendered)
	if len(objs) == 0 {
		t.Fatal("helm template rendered nothing")
	}
	for _, o := range objs {
		if o.kind != "ServiceAccount" {
			continue
		}
		// Made for real (a second time for the same release: 409, fine).
		if code, body, _ := c.do(http.MethodPost, collectionIn(t, dryNS, o.kind)+"?fieldValidation=Strict", o.raw, ""); code != http.StatusCreated && code != http.StatusConflict {
			t.Errorf("%s %s: %d %s", o.kind, o.name, code, body)
		}
	}
	for _, o := range objs {
		code, body, warnings := c.do(http.MethodPost, collectionIn(t, dryNS, o.kind)+"?dryRun=All&fieldValidation=Strict", o.raw, "")
		if o.kind == "ServiceAccount" && code == http.StatusConflict {
			continue
		}
		if code != http.StatusCreated {
			t.Errorf("%s %s: the server refuses it (dry run, strict): %d %s", o.kind, o.name, code, body)
		}
		for _, w := range warnings {
			t.Errorf("%s %s: the server warns: %s", o.kind, o.name, w)
		}
	}
}

// template is `helm template` of a release, into the dry-run namespace.
func template(t *testing.T, c *cluster, release string, flags ...string) string {
	t.Helper()
	out, err := c.helm(t, append([]string{"template", release, chart, "-n", dryNS, "--api-versions", "monitoring.coreos.com/v1"}, flags...)...)
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", release, err, out)
	}
	return out
}

var serverWarning = regexp.MustCompile(`^[IW]\d{4} .*warnings\.go:\d+\]`)

// helmOK runs helm and fails on an error or on any warning in its output
// from the server (PodSecurity's among them).
func helmOK(t *testing.T, c *cluster, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := c.helm(t, args...)
	t.Logf("helm %s (%.1f s):\n%s", strings.Join(args, " "), time.Since(start).Seconds(), out)
	if err != nil {
		t.Fatalf("helm %s: %v", args[0], err)
	}
	// The server's Warning headers reach helm's output through client-go's
	// warning handler, as klog lines (helm 3.22: `I1202 ... warnings.go:107] "Warning: ..."`); the
	// chart's NOTES have warnings of their own, for the reader, not these.
	for _, line := range strings.Split(out, "\n") {
		if serverWarning.MatchString(line) {
			t.Errorf("helm %s: the server warns: %s", args[0], line)
		}
	}
	return out
}

// wantObjects fails unless every kind/name exists (or, present false, none does).
func wantObjects(t *testing.T, c *cluster, present bool, want map[string][]string) {
	t.Helper()
	kinds := make([]string, 0, len(want))
	for k := range want {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, kind := range kinds {
		for _, name := range want[kind] {
			if got := c.exists(t, objPath(t, kind, name)); got != present {
				t.Errorf("%s %s: on the server %v, want %v", kind, name, got, present)
			}
		}
	}
}

// names lists a kind's objects in ns carrying the release's instance label.
func names(t *testing.T, c *cluster, kind, release string) []string {
	t.Helper()
	list := c.get(t, collection(t, kind)+"?labelSelector=app.kubernetes.io/instance%3D"+release)
	var out []string
	for _, it := range list["items"].([]any) {
		out = append(out, it.(map[string]any)["metadata"].(map[string]any)["name"].(string))
	}
	sort.Strings(out)
	return out
}
