package toolkit

import (
	"strings"
	"sync"
)

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(parts[max(0, len(parts)-n):], "\n")
}

// Buffer collects a child process's output. Writes come from the goroutines
// exec starts for stdout and stderr while the tool reads it, hence the lock.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
