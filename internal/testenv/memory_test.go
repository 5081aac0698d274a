package testenv

import (
	"os"
	"runtime"
	"testing"
)

// TestMemory reads the test process's own memory: it is resident, so both
// figures are positive, and the peak is never below the current size.
func TestMemory(t *testing.T) {
	rss, peak, err := Memory(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if rss <= 0 || peak < rss {
		t.Fatalf("rss %d KiB, peak %d KiB: want 0 < rss <= peak", rss, peak)
	}
	// Touch 32 MiB: the peak must grow to cover it.
	buf := make([]byte, 32<<20)
	for i := range buf {
		if i%4096 == 0 {
			buf[i] = 1
		}
	}
	_, after, err := Memory(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after < peak || after < 32<<10 {
		t.Fatalf("peak %d KiB after touching 32 MiB (before %d KiB)", after, peak)
	}
	runtime.KeepAlive(buf)
	if _, _, err := Memory(-1); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}
