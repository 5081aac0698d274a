// Package alertlive holds only one live test, behind the build tag
// `alerts` (`make test-alerts`; `make test` runs it after the chart tests):
// a real Prometheus server (Debian's prometheus package) scrapes a running
// relay and evaluates the alert rules the Helm chart renders, a broker
// outage (a cut proxy between relay and broker, never the shared broker
// itself) makes CdcrelayNoStreamingRelay fire while CdcrelayMonitorStale
// stays quiet, and recovery resolves it with every event committed during
// the outage delivered. It needs the helm binary `make chart-test` builds
// into the user's cache folder, which plain `go test ./...` does not,
// hence the tag.
//
// There is no library code here.
package alertlive
