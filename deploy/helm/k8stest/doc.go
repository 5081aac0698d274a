// Package k8stest installs the cdcrelay Helm chart (../cdcrelay) on a real
// kube-apiserver backed by etcd, both started by the tests on free ports, so
// that what only a server checks (object validation, strict field
// validation, PodSecurity admission under the restricted profile, the CRD
// schemas of prometheus-operator) is checked on what the chart renders.
// No controller-manager, scheduler or kubelet runs: no Pod ever starts.
//
// The binaries come from .ci/install-kube (make test-k8s runs it), which
// caches them in /var/cache/cdcrelay/kube; KUBE_APISERVER, ETCD, KUBE_CRDS and
// HELM point elsewhere. A missing binary fails the tests, never skips them.
package k8stest
