package svckit

import (
	"strings"
	"sync"
)

// Buffer collects a process's or a logger's output. Writes come from the
// goroutines exec starts for stdout and stderr (or from the relay's own)
// while the test or the tool reads it, hence the lock.
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
