package charttest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "../cdcrelay"
	releaseName = "rel"
	namespace   = "svc"
	// kubeVersion is passed to every helm call, so that the tests do not depend on
	// the default a particular helm build was linked with.
	kubeVersion = "v1.31.0"
)

// helmBin returns the helm binary: $HELM, or v3.22.0/helm in the folder
// `make -C deploy/helm helm` builds it into ($CDCRELAY_HELM_CACHE, by default
// cdcrelay/helm in the user's cache folder). A missing binary fails the test:
// it never skips.
func helmBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("HELM")
	if bin == "" {
		cache := os.Getenv("CDCRELAY_HELM_CACHE")
		if cache == "" {
			dir, err := os.UserCacheDir() // as the Makefile picks it
			if err != nil {
				t.Fatalf("no HELM, no CDCRELAY_HELM_CACHE and no user cache folder: %v", err)
			}
			cache = filepath.Join(dir, "cdcrelay", "helm")
		}
		bin = filepath.Join(cache, "v3.22.0", "helm")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatalf("helm path %q: %v", bin, err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatalf("no helm binary at %s (%v): run `make -C deploy/helm test`, which installs it, or set HELM", abs, err)
	}
	return abs
}

// runHelm runs helm with args and returns its stdout and stderr.
func runHelm(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	// No kubeconfig, no cache outside the test's own temporary directory.
	home := t.TempDir()
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "kubeconfig-none"),
	)
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// valuesArgs turns values file names (relative to testdata/) into -f flags.
func valuesArgs(files []string) []string {
	var args []string
	for _, f := range files {
		args = append(args, "-f", filepath.Join("testdata", f))
	}
	return args
}

// templateArgs is `helm template` of the chart at dir with the given values files.
func templateArgs(dir string, files []string, extra ...string) []string {
	args := []string{"template", releaseName, dir, "--namespace", namespace, "--kube-version", kubeVersion}
	args = append(args, valuesArgs(files)...)
	return append(args, extra...)
}

// ServiceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the chart
// uses. Field names follow the Prometheus Operator CRD; a field the chart renders
// that is not here fails the strict decode.
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ServiceMonitorSpec `json:"spec"`
}

// ServiceMonitorSpec is monitoring.coreos.com/v1 ServiceMonitorSpec, in part.
type ServiceMonitorSpec struct {
	JobLabel          string               `json:"jobLabel,omitempty"`
	TargetLabels      []string             `json:"targetLabels,omitempty"`
	PodTargetLabels   []string             `json:"podTargetLabels,omitempty"`
	Endpoints         []Endpoint           `json:"endpoints"`
	Selector          metav1.LabelSelector `json:"selector"`
	NamespaceSelector NamespaceSelector    `json:"namespaceSelector,omitempty"`
	SampleLimit       *uint64              `json:"sampleLimit,omitempty"`
}

// NamespaceSelector is monitoring.coreos.com/v1 NamespaceSelector.
type NamespaceSelector struct {
	Any        bool     `json:"any,omitempty"`
	MatchNames []string `json:"matchNames,omitempty"`
}

// Endpoint is monitoring.coreos.com/v1 Endpoint, in part.
type Endpoint struct {
	Port                 string          `json:"port,omitempty"`
	TargetPort           *string         `json:"targetPort,omitempty"`
	Path                 string          `json:"path,omitempty"`
	Scheme               string          `json:"scheme,omitempty"`
	Interval             string          `json:"interval,omitempty"`
	ScrapeTimeout        string          `json:"scrapeTimeout,omitempty"`
	HonorLabels          bool            `json:"honorLabels,omitempty"`
	RelabelConfigs       []RelabelConfig `json:"relabelings,omitempty"`
	MetricRelabelConfigs []RelabelConfig `json:"metricRelabelings,omitempty"`
}

// RelabelConfig is monitoring.coreos.com/v1 RelabelConfig.
type RelabelConfig struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// PodMonitor is the part of monitoring.coreos.com/v1 PodMonitor the chart uses.
type PodMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              PodMonitorSpec `json:"spec"`
}

// PodMonitorSpec is monitoring.coreos.com/v1 PodMonitorSpec, in part.
type PodMonitorSpec struct {
	JobLabel            string               `json:"jobLabel,omitempty"`
	PodTargetLabels     []string             `json:"podTargetLabels,omitempty"`
	PodMetricsEndpoints []PodMetricsEndpoint `json:"podMetricsEndpoints"`
	Selector            metav1.LabelSelector `json:"selector"`
	NamespaceSelector   NamespaceSelector    `json:"namespaceSelector,omitempty"`
	SampleLimit         *uint64              `json:"sampleLimit,omitempty"`
}

// PodMetricsEndpoint is monitoring.coreos.com/v1 PodMetricsEndpoint, in part.
type PodMetricsEndpoint struct {
	Port                 string          `json:"port,omitempty"`
	Path                 string          `json:"path,omitempty"`
	Scheme               string          `json:"scheme,omitempty"`
	Interval             string          `json:"interval,omitempty"`
	ScrapeTimeout        string          `json:"scrapeTimeout,omitempty"`
	HonorLabels          bool            `json:"honorLabels,omitempty"`
	RelabelConfigs       []RelabelConfig `json:"relabelings,omitempty"`
	MetricRelabelConfigs []RelabelConfig `json:"metricRelabelings,omitempty"`
}

// PrometheusRule is monitoring.coreos.com/v1 PrometheusRule.
type PrometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              PrometheusRuleSpec `json:"spec"`
}

// PrometheusRuleSpec is monitoring.coreos.com/v1 PrometheusRuleSpec.
type PrometheusRuleSpec struct {
	Groups []RuleGroup `json:"groups,omitempty"`
}

// RuleGroup is monitoring.coreos.com/v1 RuleGroup, in part.
type RuleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []Rule `json:"rules"`
}

// Rule is monitoring.coreos.com/v1 Rule.
type Rule struct {
	Record        string            `json:"record,omitempty"`
	Alert         string            `json:"alert,omitempty"`
	Expr          string            `json:"expr"`
	For           string            `json:"for,omitempty"`
	KeepFiringFor string            `json:"keep_firing_for,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// Rendered is the decoded output of one `helm template`.
type Rendered struct {
	Deployments     []*appsv1.Deployment
	Services        []*corev1.Service
	ServiceAccounts []*corev1.ServiceAccount
	PDBs            []*policyv1.PodDisruptionBudget
	ServiceMonitors []*ServiceMonitor
	PodMonitors     []*PodMonitor
	PrometheusRules []*PrometheusRule
	ConfigMaps      []*corev1.ConfigMap
	NetworkPolicies []*networkingv1.NetworkPolicy
	// Pods are the helm test hooks (tests.enabled).
	Pods []*corev1.Pod
}

// Deployment returns the Deployment called name, failing the test if there is none.
func (r *Rendered) Deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	for _, d := range r.Deployments {
		if d.Name == name {
			return d
		}
	}
	var names []string
	for _, d := range r.Deployments {
		names = append(names, d.Name)
	}
	t.Fatalf("no Deployment %q; rendered: %v", name, names)
	return nil
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeManifests splits a multi-document YAML stream and decodes every document
// strictly (unknown or duplicate fields are errors) into its API type.
func decodeManifests(stream string) (*Rendered, error) {
	r := &Rendered{}
	for i, doc := range docSeparator.Split(stream, -1) {
		if isBlankDoc(doc) {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w\n%s", i, err, doc)
		}
		var obj any
		switch tm.APIVersion + "/" + tm.Kind {
		case "apps/v1/Deployment":
			d := &appsv1.Deployment{}
			r.Deployments, obj = append(r.Deployments, d), d
		case "v1/Service":
			s := &corev1.Service{}
			r.Services, obj = append(r.Services, s), s
		case "v1/ServiceAccount":
			s := &corev1.ServiceAccount{}
			r.ServiceAccounts, obj = append(r.ServiceAccounts, s), s
		case "v1/ConfigMap":
			c := &corev1.ConfigMap{}
			r.ConfigMaps, obj = append(r.ConfigMaps, c), c
		case "policy/v1/PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			r.PDBs, obj = append(r.PDBs, p), p
		case "monitoring.coreos.com/v1/ServiceMonitor":
			s := &ServiceMonitor{}
			r.ServiceMonitors, obj = append(r.ServiceMonitors, s), s
		case "monitoring.coreos.com/v1/PodMonitor":
			p := &PodMonitor{}
			r.PodMonitors, obj = append(r.PodMonitors, p), p
		case "networking.k8s.io/v1/NetworkPolicy":
			n := &networkingv1.NetworkPolicy{}
			r.NetworkPolicies, obj = append(r.NetworkPolicies, n), n
		case "v1/Pod":
			p := &corev1.Pod{}
			r.Pods, obj = append(r.Pods, p), p
		case "monitoring.coreos.com/v1/PrometheusRule":
			p := &PrometheusRule{}
			r.PrometheusRules, obj = append(r.PrometheusRules, p), p
		default:
			return nil, fmt.Errorf("document %d: unexpected %s %s: add it to the test's decoder\n%s", i, tm.APIVersion, tm.Kind, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): strict decode: %w\n%s", i, tm.Kind, err, doc)
		}
	}
	return r, nil
}

// isBlankDoc reports whether a document holds only comments and white space.
func isBlankDoc(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			return false
		}
	}
	return true
}

// render runs `helm template` over values files and decodes the result strictly.
func render(t *testing.T, files []string, extra ...string) *Rendered {
	t.Helper()
	return renderChart(t, chartDir, files, extra...)
}

func renderChart(t *testing.T, dir string, files []string, extra ...string) *Rendered {
	t.Helper()
	out, stderr, err := runHelm(t, templateArgs(dir, files, extra...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", files, err, stderr)
	}
	r, err := decodeManifests(out)
	if err != nil {
		t.Fatalf("helm template %v: %v", files, err)
	}
	if len(r.Deployments) == 0 {
		t.Fatalf("helm template %v rendered no Deployment", files)
	}
	return r
}

// TestDecodeIsStrict shows that the decoder the other tests rely on rejects a
// misspelt field, a misplaced field and a duplicate key, and an unknown kind.
func TestDecodeIsStrict(t *testing.T) {
	t.Parallel()
	good := `apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: x}
spec: {maxUnavailable: 1}
`
	if _, err := decodeManifests(good); err != nil {
		t.Fatalf("valid manifest rejected: %v", err)
	}
	bad := map[string]string{
		"misspelt field": strings.Replace(good, "maxUnavailable", "maxUnavaliable", 1),
		"misplaced field": `apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  template:
    spec:
      containers:
        - name: relay
          readOnlyRootFilesystem: true
`,
		"duplicate key": good + "metadata: {name: y}\n",
		"unknown kind":  "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n",
		"podmonitor typo": `apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata: {name: x}
spec:
  selector: {}
  podMetricsEndpoints: [{port: http, relabellings: []}]
`,
		"networkpolicy misplaced ports": `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x}
spec:
  podSelector: {}
  egress: [{port: 53}]
`,
		"servicemonitor typo": `apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: x}
spec:
  selector: {}
  endpoints: [{port: http, intervall: 30s}]
`,
	}
	for name, doc := range bad {
		if _, err := decodeManifests(good + "---\n" + doc); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// exitError reports whether err is helm exiting non-zero, as opposed to helm not running at all.
func exitError(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}
