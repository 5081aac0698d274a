package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat and
// /proc/stat. The kernel reports them in 1/100 s on every architecture Go
// runs Linux on (sysconf(_SC_CLK_TCK) would need cgo).
const clockTicks = 100

// procStat is what the bench reads from /proc/<pid>/stat.
type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime uint64 // clock ticks
}

// parseProcStat parses /proc/<pid>/stat. The command name (field 2) is in
// parentheses and may itself hold spaces and parentheses, so the fields are
// counted from the last ')'.
func parseProcStat(s string) (procStat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("stat: no ')' in %q", s)
	}
	// After ')': state(3) ppid(4) pgrp(5) session(6) tty_nr(7) tpgid(8)
	// flags(9) minflt(10) cminflt(11) majflt(12) cmajflt(13) utime(14)
	// stime(15) cutime(16) cstime(17) ...
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("stat: %d fields after the command name, want at least 15", len(f))
	}
	var st procStat
	var err error
	if st.ppid, err = strconv.Atoi(f[1]); err != nil {
		return procStat{}, fmt.Errorf("stat: ppid: %w", err)
	}
	for k, dst := range []*uint64{&st.utime, &st.stime, &st.cutime, &st.cstime} {
		if *dst, err = strconv.ParseUint(f[11+k], 10, 64); err != nil {
			return procStat{}, fmt.Errorf("stat: field %d: %w", 14+k, err)
		}
	}
	return st, nil
}

// cpu is the process's own user+system time.
func (s procStat) cpu() time.Duration { return ticks(s.utime + s.stime) }

// reaped is the user+system time of its children that have exited and been
// waited for.
func (s procStat) reaped() time.Duration { return ticks(s.cutime + s.cstime) }

func ticks(n uint64) time.Duration { return time.Duration(n) * time.Second / clockTicks }

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(string(b))
}

// processCPU is a process's own CPU time so far.
func processCPU(pid int) (time.Duration, error) {
	st, err := readProcStat(pid)
	if err != nil {
		return 0, err
	}
	return st.cpu(), nil
}

// treeCPU is the CPU time of a PostgreSQL cluster so far: the postmaster,
// every live child (backends, walsenders, checkpointer, autovacuum, ...) and
// the children that already exited (the postmaster reaps them, which adds
// their time to its cutime/cstime). Sampled before and after a phase, the
// difference is what the cluster spent on it.
func treeCPU(postmaster int) (time.Duration, error) {
	pm, err := readProcStat(postmaster)
	if err != nil {
		return 0, fmt.Errorf("postmaster %d: %w", postmaster, err)
	}
	total := pm.cpu() + pm.reaped()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil || st.ppid != postmaster {
			continue // gone meanwhile, or not ours
		}
		total += st.cpu()
	}
	return total, nil
}

// postmasterPID reads the first line of postmaster.pid in the data directory.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	return pid, nil
}

// parseVmHWM returns the peak resident set size ("high water mark") from
// /proc/<pid>/status, in bytes.
func parseVmHWM(status string) (int64, error) {
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("status: VmHWM line %q", sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("status: VmHWM: %w", err)
		}
		return kb * 1024, nil
	}
	return 0, fmt.Errorf("status: no VmHWM line")
}

func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseVmHWM(string(b))
}

// machineCPU is the first line of /proc/stat: time spent by all CPUs.
type machineCPU struct{ busy, total uint64 } // clock ticks

// parseMachineCPU parses the aggregate "cpu" line of /proc/stat. Busy is
// everything but idle and iowait; guest time is already inside user.
func parseMachineCPU(stat string) (machineCPU, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return machineCPU{}, fmt.Errorf("/proc/stat: first line %q", line)
	}
	var m machineCPU
	for i, s := range f[1:] {
		if i >= 8 { // guest, guest_nice are counted in user, nice
			break
		}
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return machineCPU{}, fmt.Errorf("/proc/stat: %w", err)
		}
		m.total += v
		if i != 3 && i != 4 { // idle, iowait
			m.busy += v
		}
	}
	return m, nil
}

func readMachineCPU() (machineCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}, err
	}
	return parseMachineCPU(string(b))
}

// busyCores is how many CPUs were busy on average between two samples.
func busyCores(a, b machineCPU, cpus int) float64 {
	if b.total <= a.total {
		return 0
	}
	return float64(b.busy-a.busy) / float64(b.total-a.total) * float64(cpus)
}

// parseCPUModel returns the first "model name" of /proc/cpuinfo.
func parseCPUModel(cpuinfo string) string {
	sc := bufio.NewScanner(strings.NewReader(cpuinfo))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// listenInode finds the socket inode listening on TCP port in the text of
// /proc/net/tcp or /proc/net/tcp6 (state 0A is LISTEN).
func listenInode(netTCP string, port int) (string, bool) {
	suffix := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(strings.NewReader(netTCP))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 10 && strings.HasSuffix(f[1], suffix) && f[3] == "0A" {
			return f[9], true
		}
	}
	return "", false
}

// listenerPID returns the process listening on TCP port, by matching the
// listening socket's inode against every process's open files. It is how
// the bench finds the broker's CPU counters without touching the broker.
func listenerPID(port int) (int, error) {
	var inode string
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		if i, ok := listenInode(string(b), port); ok {
			inode = i
			break
		}
	}
	if inode == "" {
		return 0, fmt.Errorf("no local listener on port %d", port)
	}
	target := "socket:[" + inode + "]"
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && link == target {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no process holds the listener on port %d", port)
}
