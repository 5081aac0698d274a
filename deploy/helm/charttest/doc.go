// Package charttest tests the cdcrelay Helm chart (../cdcrelay) without a cluster:
// it runs `helm lint` and `helm template` over the values files in testdata/ and
// decodes every rendered manifest strictly into its Kubernetes API type, so that
// a misspelt or misplaced field fails the test. The helm binary comes from the
// HELM environment variable, by default v3.22.0/helm under $CDCRELAY_HELM_CACHE
// (cdcrelay/helm in the user's cache folder), which `make -C deploy/helm test`
// builds from the Go module proxy at a pinned version.
package charttest
