package toolkit

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Percentile is the nearest-rank percentile of an ascending slice: the
// smallest value with at least p of the values at or below it; 0 for an
// empty slice.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Ms formats a duration in milliseconds: two decimals below 10 ms, one below
// a second, none above, so a latency reads at the precision it deserves.
func Ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case math.Abs(v) < 10:
		return fmt.Sprintf("%.2f ms", v)
	case math.Abs(v) < 1000:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%s ms", Thousands(int(math.Round(v))))
	}
}

// Thousands formats n with comma separators: 100000 → "100,000".
func Thousands(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}
