package testenv

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Family gathers g and returns the metric family named name, nil when g has
// none: tests read a relay's or a monitor's registry in-process rather than
// scraping it, and each decides whether a missing family is a failure.
func Family(tb testing.TB, g prometheus.Gatherer, name string) *dto.MetricFamily {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

// Series gathers g and returns the value of each gauge and counter series
// (other types read as 0) keyed by the family's name followed by
// labels(series), so that each package keeps the key format its tests spell.
func Series(tb testing.TB, g prometheus.Gatherer, labels func(*dto.Metric) string) map[string]float64 {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			out[mf.GetName()+labels(m)] = Value(m)
		}
	}
	return out
}

// Value is a series' value whether it is a gauge or a counter.
func Value(m *dto.Metric) float64 {
	if m.GetGauge() != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetCounter().GetValue()
}
