package main

import "testing"

func TestMaxProcs(t *testing.T) {
	for _, tc := range []struct {
		name        string
		env         string
		procs, cpus int
		want        int
	}{
		{"the variable wins, even above the cap", "8", 8, 64, 0},
		{"the variable wins, even below the cap", "1", 1, 64, 0},
		{"a CPU limit of 4 on a 64-CPU node is kept", "", 4, 64, 0},
		{"a CPU limit of 1 is kept", "", 1, 64, 0},
		{"no limit on a 64-CPU node: capped", "", 64, 64, defaultMaxProcs},
		{"no limit on a 3-CPU node: capped", "", 3, 3, defaultMaxProcs},
		{"no limit on a 2-CPU node: as it is", "", 2, 2, 0},
		{"no limit on a 1-CPU node: as it is", "", 1, 1, 0},
	} {
		if got, why := maxProcs(tc.env, tc.procs, tc.cpus); got != tc.want || why == "" {
			t.Errorf("%s: maxProcs(%q, %d, %d) = %d (%q), want %d", tc.name, tc.env, tc.procs, tc.cpus, got, why, tc.want)
		}
	}
}
