package main

import (
	"log/slog"
	"runtime"
)

// defaultMaxProcs is the relay's GOMAXPROCS when nothing else sets it:
// neither the GOMAXPROCS variable nor a container CPU limit (which the Go
// runtime follows by itself). Go would otherwise run one scheduler slot per
// core of the node, and a relay that shares a large node pays for every
// idle slot: each wake-up of a goroutine (several per event at a low
// rate) may wake an idle thread to look for work. On the bench machine,
// relay CPU per event at 1,000 events/s was about 230 µs with 1 slot, 290
// with 2 and 335 with 8; one core drains 30,000 to 57,000 events/s, several
// times one broker channel's ceiling, so two slots leave headroom for the
// AMQP connection's and the janitor's goroutines without paying for a
// node's worth (docs/performance.md, "What changed the figures").
const defaultMaxProcs = 2

// maxProcs decides the GOMAXPROCS to set: 0 to leave the runtime's choice.
// env is the GOMAXPROCS variable; procs the runtime's current setting;
// cpus the CPUs the process may use (runtime.NumCPU). A setting below cpus
// that the variable did not make is the runtime following a CPU limit; a
// limit equal to cpus (exclusive cores) cannot be told from none and is
// capped too, which docs/configuration.md says (set GOMAXPROCS there).
func maxProcs(env string, procs, cpus int) (set int, why string) {
	switch {
	case env != "":
		return 0, "from GOMAXPROCS"
	case procs < cpus:
		return 0, "from the container's CPU limit"
	case procs <= defaultMaxProcs:
		return 0, "one per CPU"
	default:
		return defaultMaxProcs, "no CPU limit: capped (set GOMAXPROCS or a CPU limit for more)"
	}
}

// setMaxProcs applies maxProcs and logs the outcome.
func setMaxProcs(log *slog.Logger, getenv func(string) string) {
	cpus := runtime.NumCPU()
	set, why := maxProcs(getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0), cpus)
	if set > 0 {
		runtime.GOMAXPROCS(set)
	}
	log.Info("Go scheduler slots (GOMAXPROCS)", "gomaxprocs", runtime.GOMAXPROCS(0), "cpus", cpus, "why", why)
}
