package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
)

// softLimitPercent is the share of the container's memory limit given to
// the Go runtime as its soft limit (debug.SetMemoryLimit). The runtime
// then collects garbage harder as the heap nears it instead of letting a
// burst (a backfill, a large row) run the pod into the OOM killer. The
// other 10% is headroom for what the cgroup charges but the Go runtime
// does not count or cannot promptly return: the binary's own pages and the
// page cache, kernel socket buffers of the replication and AMQP
// connections, and the overshoot while a collection runs. Memory sizing
// itself (CDCRELAY_MAX_IN_FLIGHT_BYTES, CDCRELAY_MAX_MESSAGE_BYTES) is
// described in docs/operations.md, "Memory".
const softLimitPercent = 90

// unlimitedV1 is the smallest value cgroup v1 memory.limit_in_bytes takes
// for "no limit" (the page-aligned maximum, 9223372036854771712, and
// nearby); no real container has a limit this large.
const unlimitedV1 = 1 << 62

// cgroupFiles says where the cgroup files are; tests point it elsewhere.
type cgroupFiles struct {
	self     string // /proc/self/cgroup
	v2Root   string // the cgroup2 mount, /sys/fs/cgroup
	v1Memory string // the cgroup v1 memory controller's mount, /sys/fs/cgroup/memory
}

var systemCgroup = cgroupFiles{self: "/proc/self/cgroup", v2Root: "/sys/fs/cgroup", v1Memory: "/sys/fs/cgroup/memory"}

// parseSelfCgroup reads /proc/self/cgroup: the process's cgroup v2 path
// (the "0::" line) and the path of its v1 memory controller, "" when absent.
func parseSelfCgroup(content string) (v2, v1Memory string) {
	sc := bufio.NewScanner(strings.NewReader(content))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case containsController(parts[1], "memory"):
			v1Memory = parts[2]
		}
	}
	return v2, v1Memory
}

func containsController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// parseLimit reads memory.max (v2: bytes or "max") or
// memory.limit_in_bytes (v1: bytes, a huge value when unlimited).
// limited is false for no limit.
func parseLimit(content string) (limit int64, limited bool, err error) {
	v := strings.TrimSpace(content)
	if v == "max" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, false, fmt.Errorf("unexpected memory limit %q", v)
	}
	if n >= unlimitedV1 {
		return 0, false, nil
	}
	return n, true, nil
}

// cgroupLimit returns the smallest memory limit on the process's cgroup
// and its ancestors (a parent's limit binds its children too) and the file
// it came from; limited is false when none is set or no cgroup memory
// controller is visible. Without a cgroup namespace the process's path may
// not exist under the mount (a container sees only its own cgroup at the
// mount's root); walking up to the mount reaches that root either way.
func cgroupLimit(f cgroupFiles) (limit int64, file string, limited bool, err error) {
	self, err := os.ReadFile(f.self)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, "", false, nil // not Linux
		}
		return 0, "", false, fmt.Errorf("read %s: %w", f.self, err)
	}
	v2, v1 := parseSelfCgroup(string(self))
	if v1 != "" {
		return smallestLimit(f.v1Memory, v1, "memory.limit_in_bytes")
	}
	if v2 != "" {
		return smallestLimit(f.v2Root, v2, "memory.max")
	}
	return 0, "", false, nil
}

// smallestLimit walks from root/cgroup up to root, reading name in each
// directory that has it.
func smallestLimit(root, cgroup, name string) (limit int64, file string, limited bool, err error) {
	dir := path.Clean("/" + cgroup)
	for {
		p := path.Join(root, dir, name)
		b, err := os.ReadFile(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return 0, "", false, fmt.Errorf("read %s: %w", p, err)
		default:
			n, ok, err := parseLimit(string(b))
			if err != nil {
				return 0, "", false, fmt.Errorf("%s: %w", p, err)
			}
			if ok && (!limited || n < limit) {
				limit, file, limited = n, p, true
			}
		}
		if dir == "/" {
			return limit, file, limited, nil
		}
		dir = path.Dir(dir)
	}
}

// setMemoryLimit gives the Go runtime a soft memory limit of
// softLimitPercent of the container's, unless GOMEMLIMIT is set (the
// operator's choice wins; the runtime has already applied it) or there is
// no limit. It logs what it did.
func setMemoryLimit(log *slog.Logger, getenv func(string) string, f cgroupFiles) {
	if v := getenv("GOMEMLIMIT"); v != "" {
		log.Info("Go memory limit from GOMEMLIMIT", "gomemlimit", v)
		return
	}
	limit, file, limited, err := cgroupLimit(f)
	switch {
	case err != nil:
		log.Warn("cannot read the container's memory limit; the Go runtime runs without a soft memory limit (set GOMEMLIMIT)", "error", err)
	case !limited:
		log.Info("no container memory limit: the Go runtime runs without a soft memory limit")
	default:
		debug.SetMemoryLimit(softLimit(limit))
		log.Info("Go soft memory limit set from the container's memory limit",
			"memory_limit_bytes", debug.SetMemoryLimit(-1), // read back from the runtime
			"container_limit_bytes", limit, "percent", softLimitPercent, "file", file)
	}
}

// softLimit is softLimitPercent of limit, without overflow.
func softLimit(limit int64) int64 { return limit / 100 * softLimitPercent }
