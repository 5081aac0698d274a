package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Memory reads the resident set size (VmRSS) and its peak (VmHWM) of the
// process pid from /proc, both in KiB. It fails if either is missing, as
// for a process that already exited, so a test never compares against a
// silent zero.
func Memory(pid int) (rss, peak int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read memory of process %d: %w", pid, err)
	}
	var haveRSS, havePeak bool
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || (f[0] != "VmRSS:" && f[0] != "VmHWM:") {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("process %d: parse %q: %w", pid, line, err)
		}
		if f[0] == "VmRSS:" {
			rss, haveRSS = v, true
		} else {
			peak, havePeak = v, true
		}
	}
	if !haveRSS || !havePeak {
		return 0, 0, fmt.Errorf("process %d: no VmRSS/VmHWM in /proc/%d/status", pid, pid)
	}
	return rss, peak, nil
}
